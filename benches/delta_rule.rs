//! The gated delta rule of the linear-attention layers at the Qwen3.6-35B-A3B
//! shape (32 value heads of 128 over keys of 128): a 512-token prefill
//! through the recurrent form (token by token) and through the chunked form
//! (blocks of 64), and one decode token through the recurrent form. The
//! ratio of the two prefill lines is what choosing the chunked form for
//! prefill buys; per token, the decode line is the layer's recurrent cost,
//! to set against its projections (the matvec bench).

use std::hint::black_box;
use std::time::Duration;

use colibri::model::qwen3_next::delta_rule::{DeltaInputs, DeltaShape, chunked, recurrent};
use criterion::{Criterion, SamplingMode};

const SHAPE: DeltaShape = DeltaShape {
    heads: 32,
    dk: 128,
    dv: 128,
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

struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

impl Inputs {
    /// Unit-norm keys and queries (queries scaled by dk^-1/2), decays in
    /// (0.5, 1), strengths in (0.25, 0.75): what the layer feeds the rule.
    fn new(n: usize) -> Self {
        let mut r = Lcg(7);
        let mut unit = |len: usize, scale: f32| -> Vec<f32> {
            let mut x: Vec<f32> = (0..len).map(|_| r.next()).collect();
            for c in x.chunks_mut(SHAPE.dk) {
                let norm = c.iter().map(|a| a * a).sum::<f32>().sqrt();
                c.iter_mut().for_each(|a| *a *= scale / norm);
            }
            x
        };
        let q = unit(n * SHAPE.heads * SHAPE.dk, (SHAPE.dk as f32).powf(-0.5));
        let k = unit(n * SHAPE.heads * SHAPE.dk, 1.0);
        let mut r = Lcg(11);
        let v = (0..n * SHAPE.heads * SHAPE.dv).map(|_| r.next()).collect();
        let g = (0..n * SHAPE.heads).map(|_| -0.35 + 0.6 * r.next()).collect();
        let beta = (0..n * SHAPE.heads).map(|_| 0.5 + r.next() * 0.5).collect();
        Self { q, k, v, g, beta }
    }

    fn view(&self) -> DeltaInputs<'_> {
        DeltaInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
        }
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("delta_rule");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let n = 512;
    let prefill = Inputs::new(n);
    let mut state = vec![0f32; SHAPE.state_len()];
    let mut out = vec![0f32; n * SHAPE.heads * SHAPE.dv];
    group.bench_function("prefill_512/recurrent", |b| {
        b.iter(|| {
            state.fill(0.0);
            recurrent(SHAPE, black_box(prefill.view()), &mut state, &mut out);
            black_box(&out);
        })
    });
    group.bench_function("prefill_512/chunked", |b| {
        b.iter(|| {
            state.fill(0.0);
            chunked(SHAPE, black_box(prefill.view()), 0, &mut state, &mut out);
            black_box(&out);
        })
    });
    let one = Inputs::new(1);
    group.bench_function("decode_1/recurrent", |b| {
        b.iter(|| {
            recurrent(
                SHAPE,
                black_box(one.view()),
                &mut state,
                &mut out[..SHAPE.heads * SHAPE.dv],
            );
            black_box(&out);
        })
    });
    group.finish();
}
