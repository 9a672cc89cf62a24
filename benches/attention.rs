//! Causal attention over a long cached past: `attend` for one decode row
//! and for one 32-row prefill block (one `ROW_BLOCK`) against 2,048 and
//! 8,192 cached positions, with an f32 and an f16 KV cache.
//!
//! The attention shape is OLMoE-1B-7B's (16 query heads and 16 KV heads of
//! 128), and, as `gqa`, Qwen3-30B-A3B's (32 query heads sharing 4 KV heads
//! of 128, f16 cache only), but the model width feeding the q/k/v/o projections is kept at 64:
//! the projections are matrix products the matvec bench measures, and at
//! the real width (2,048) they would hide the part this bench is about,
//! the scores, softmax and weighted sum over the past (which do not depend
//! on the width at all). Each iteration appends the new rows' keys and
//! values and truncates them away again, so every pass sees the same past.
//!
//! `COLI_KERNELS=scalar` runs the same cases on the scalar reference
//! kernels (see `colibri::kernels::dispatch`).

use std::hint::black_box;
use std::time::Duration;

use colibri::model::attention::{AttnBias, AttnSpec, AttnWeights, QkNorm, attend};
use colibri::model::kv_cache::{KvCache, KvType, KvTypes};
use colibri::model::ops::Rope;
use colibri::quant::QMatrix;
use criterion::{Criterion, SamplingMode};
use half::f16;

const HIDDEN: usize = 64;
const HEAD_DIM: usize = 128;

/// Query heads and KV heads of a case.
#[derive(Clone, Copy)]
struct Shape {
    heads: usize,
    kv_heads: usize,
}

const MHA: Shape = Shape {
    heads: 16,
    kv_heads: 16,
};
const GQA: Shape = Shape {
    heads: 32,
    kv_heads: 4,
};

/// Small deterministic generator of values in [-0.5, 0.5).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

fn matrix(rng: &mut Lcg, rows: usize, cols: usize) -> QMatrix {
    let w = (0..rows * cols).map(|_| rng.next() * 0.3).collect();
    match QMatrix::from_f32(rows, cols, w) {
        Ok(m) => m,
        Err(e) => panic!("bench matrix: {e}"),
    }
}

fn block(rng: &mut Lcg, shape: Shape) -> (AttnSpec, AttnWeights, Rope) {
    let Shape { heads, kv_heads } = shape;
    let spec = AttnSpec {
        hidden: HIDDEN,
        heads,
        kv_heads,
        head_dim: HEAD_DIM,
        eps: 1e-5,
        qk_norm: QkNorm::None,
        clip: None,
        window: None,
    };
    let w = AttnWeights {
        q: matrix(rng, heads * HEAD_DIM, HIDDEN),
        k: matrix(rng, kv_heads * HEAD_DIM, HIDDEN),
        v: matrix(rng, kv_heads * HEAD_DIM, HIDDEN),
        o: matrix(rng, HIDDEN, heads * HEAD_DIM),
        q_norm: Vec::new(),
        k_norm: Vec::new(),
        bias: AttnBias::default(),
        sinks: Vec::new(),
        gate: None,
    };
    (spec, w, Rope::new(HEAD_DIM, 10000.0))
}

/// A one-layer cache of `t` holding `past` positions of random keys and values.
fn cache(rng: &mut Lcg, t: KvType, past: usize, shape: Shape) -> KvCache {
    let d = shape.kv_heads * HEAD_DIM;
    let mut kv = KvCache::with_types(1, d, KvTypes::both(t));
    let mut rec = Vec::with_capacity(kv.record_bytes());
    for _ in 0..past {
        rec.clear();
        for _ in 0..2 * d {
            let x = rng.next() * 2.0;
            match t {
                KvType::F32 => rec.extend_from_slice(&x.to_le_bytes()),
                KvType::F16 => rec.extend_from_slice(&f16::from_f32(x).to_le_bytes()),
                KvType::Q8 => unreachable!("the bench builds f32 and f16 caches"),
            }
        }
        assert!(kv.push_position_bytes(&rec), "bench record size");
    }
    kv
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let mut rng = Lcg(0x9e37_79b9_7f4a_7c15);
    let xs: Vec<f32> = (0..32 * HIDDEN).map(|_| rng.next()).collect();
    eprintln!("attention bench: kernels {}", colibri::kernels::dispatch().name);
    let cases = [
        ("", MHA, KvType::F32),
        ("", MHA, KvType::F16),
        ("gqa/", GQA, KvType::F16),
    ];
    for (label, shape, t) in cases {
        let (spec, w, rope) = block(&mut rng, shape);
        for past in [2048usize, 8192] {
            let mut kv = cache(&mut rng, t, past, shape);
            let mut group = c.benchmark_group(format!("attend/{label}{t}/{past}"));
            group
                .sampling_mode(SamplingMode::Flat)
                .sample_size(10)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(2));
            for rows in [1usize, 32] {
                let name = if rows == 1 { "decode1" } else { "prefill32" };
                group.bench_function(name, |b| {
                    b.iter(|| {
                        let out = attend(&spec, &w, &rope, 0, &xs[..rows * HIDDEN], &mut [(rows, &mut kv)]);
                        kv.truncate(past);
                        black_box(out)
                    })
                });
            }
            group.finish();
        }
    }
    c.final_summary();
}
