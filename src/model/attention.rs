//! Causal multi-head attention with grouped KV heads over the plain KV
//! cache, shared by the families with Llama-style attention (OLMoE,
//! Qwen3-MoE, Mixtral, GLM-4.x, gpt-oss): optional projection biases,
//! optional q/k RMSNorm (over the whole projection or per head), optional
//! q/k/v clipping, rotate-half RoPE over all or the first part of each head,
//! an optional sliding window and optional attention sinks.
//!
//! One call serves a batch of sequences: the projections run once over every
//! new row of every sequence (each weight row is read once per step), while
//! rope positions, the cache and the causal mask stay per sequence.

use rayon::prelude::*;

use crate::kernels::dispatch;
use crate::model::kv_cache::{KvCache, KvRows};
use crate::model::ops::{Rope, rms_norm_inplace, softmax_inplace};
use crate::quant::QMatrix;

/// Where q/k RMSNorm applies, if anywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// No q/k norm (Mixtral, Llama).
    None,
    /// One norm over the whole q (`heads * head_dim`) and k
    /// (`kv_heads * head_dim`) projection (OLMoE).
    Full,
    /// One norm of size `head_dim`, applied to each head separately (Qwen3).
    PerHead,
}

/// The shape and options of one attention block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnSpec {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    pub qk_norm: QkNorm,
    /// q, k and v are clamped to `[-c, c]` after the norms (OLMoE `clip_qkv`).
    pub clip: Option<f32>,
    /// A query at position `i` sees keys `j` with `i - window < j <= i`
    /// (transformers' sliding-window mask); `None`: every earlier key.
    pub window: Option<usize>,
}

/// The projections of one attention block; the norms are empty with
/// [`QkNorm::None`], and every bias and the sinks are empty when the
/// checkpoint has none.
#[derive(Debug)]
pub struct AttnWeights {
    pub q: QMatrix,
    pub k: QMatrix,
    pub v: QMatrix,
    pub o: QMatrix,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub bias: AttnBias,
    /// One learned logit per query head that joins every softmax and is
    /// then dropped (gpt-oss): attention may give weight to "nothing".
    pub sinks: Vec<f32>,
}

/// Biases of the q/k/v/o projections (GLM-4.x has q/k/v, gpt-oss all four);
/// an empty vector is no bias.
#[derive(Debug, Default)]
pub struct AttnBias {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub o: Vec<f32>,
}

impl AttnBias {
    fn bytes(&self) -> usize {
        (self.q.len() + self.k.len() + self.v.len() + self.o.len()) * 4
    }
}

/// Adds `bias` (length `dim`, or empty) to every row of `rows`.
pub(crate) fn add_bias(rows: &mut [f32], bias: &[f32]) {
    if bias.is_empty() {
        return;
    }
    for row in rows.chunks_exact_mut(bias.len()) {
        for (x, b) in row.iter_mut().zip(bias) {
            *x += b;
        }
    }
}

impl AttnWeights {
    pub fn resident_bytes(&self) -> usize {
        [&self.q, &self.k, &self.v, &self.o]
            .iter()
            .map(|m| m.resident_bytes())
            .sum::<usize>()
            + (self.q_norm.len() + self.k_norm.len() + self.sinks.len()) * 4
            + self.bias.bytes()
    }
}

/// Rows of one sequence that share one pass over its keys and values.
const ROW_BLOCK: usize = 32;

/// One row's visible keys `first..=pos` within a work item, and the
/// offset of its scores in the item's flat score buffer.
#[derive(Clone, Copy, Debug)]
struct Span {
    first: usize,
    pos: usize,
    at: usize,
}

/// Buffers a worker reuses from one work item to the next (rayon's
/// `map_init`); every value is overwritten before it is read, so reuse
/// cannot change a result.
#[derive(Default)]
struct BlockBuffers {
    spans: Vec<Span>,
    scores: Vec<f32>,
    /// A compact cache's key or value head slice as f32.
    scratch: Vec<f32>,
}

/// Runs attention for the new rows of several sequences. `xn` holds the
/// normalised inputs of every sequence's new tokens back to back
/// (`[Σ n_i, hidden]`); `seqs[i] = (n_i, cache_i)` says how many rows are
/// sequence `i`'s and where its past is. Their K/V are appended to layer
/// `layer` of each cache (committed by the caller after the last layer).
/// Returns the o_proj output `[Σ n_i, hidden]`.
pub fn attend(
    spec: &AttnSpec,
    w: &AttnWeights,
    rope: &Rope,
    layer: usize,
    xn: &[f32],
    seqs: &mut [(usize, &mut KvCache)],
) -> Vec<f32> {
    let AttnSpec {
        hidden,
        heads,
        kv_heads,
        head_dim: hd,
        eps,
        ..
    } = *spec;
    let q_dim = heads * hd;
    let kv_dim = kv_heads * hd;
    let n: usize = seqs.iter().map(|(m, _)| *m).sum();

    let mut q = vec![0f32; n * q_dim];
    let mut k = vec![0f32; n * kv_dim];
    let mut v = vec![0f32; n * kv_dim];
    w.q.matmul(xn, n, &mut q);
    w.k.matmul(xn, n, &mut k);
    w.v.matmul(xn, n, &mut v);
    add_bias(&mut q, &w.bias.q);
    add_bias(&mut k, &w.bias.k);
    add_bias(&mut v, &w.bias.v);
    match spec.qk_norm {
        QkNorm::None => {}
        QkNorm::Full => {
            for t in 0..n {
                rms_norm_inplace(&mut q[t * q_dim..(t + 1) * q_dim], &w.q_norm, eps);
                rms_norm_inplace(&mut k[t * kv_dim..(t + 1) * kv_dim], &w.k_norm, eps);
            }
        }
        QkNorm::PerHead => {
            for head in q.chunks_exact_mut(hd) {
                rms_norm_inplace(head, &w.q_norm, eps);
            }
            for head in k.chunks_exact_mut(hd) {
                rms_norm_inplace(head, &w.k_norm, eps);
            }
        }
    }
    if let Some(c) = spec.clip {
        for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
            *x = x.clamp(-c, c);
        }
    }
    // Per row: which sequence, and its position in that sequence.
    let mut row_seq = Vec::with_capacity(n);
    let mut row0 = 0;
    for (s, (m, kv)) in seqs.iter_mut().enumerate() {
        let (m, start) = (*m, kv.len());
        for t in 0..m {
            let r = row0 + t;
            for h in 0..heads {
                rope.apply_half(&mut q[r * q_dim + h * hd..r * q_dim + (h + 1) * hd], start + t);
            }
            for h in 0..kv_heads {
                rope.apply_half(&mut k[r * kv_dim + h * hd..r * kv_dim + (h + 1) * hd], start + t);
            }
            row_seq.push((s, start + t));
        }
        kv.k[layer].push_rows(&k[row0 * kv_dim..(row0 + m) * kv_dim], kv_dim);
        kv.v[layer].push_rows(&v[row0 * kv_dim..(row0 + m) * kv_dim], kv_dim);
        row0 += m;
    }
    let caches: Vec<(&KvRows, &KvRows)> = seqs.iter().map(|(_, kv)| (&kv.k[layer], &kv.v[layer])).collect();

    let group = heads / kv_heads;
    let scale = (hd as f32).powf(-0.5);
    let window = spec.window;
    let first_of = |pos: usize| window.map_or(0, |w| (pos + 1).saturating_sub(w));
    // Work items: a block of one sequence's consecutive rows against one
    // head. The rows of a block share its keys and values, so each key and
    // value row is read once per block rather than once per row (a prefill
    // chunk or a multi-token turn reads the past ROW_BLOCK times less).
    // Every row's scores, softmax and weighted sum are computed in the same
    // order as one row alone, so the results do not depend on the blocking.
    // A compact (f16, q8) cache converts each key and value head slice to
    // f32 inside the work item, once per block, before the same arithmetic:
    // the results depend on neither the blocking nor the thread count, and
    // an f32 cache is read in place. The q·k dot products and the weighted
    // sums run on the SIMD kernels (`Kernels::dot_f32`, `Kernels::axpy`),
    // which are bit-identical to `ops::dot` and `o += w * v`, so the kernel
    // set does not change a token either.
    let mut blocks = Vec::new();
    let mut row0 = 0;
    for (s, (m, _)) in seqs.iter().enumerate() {
        for b0 in (0..*m).step_by(ROW_BLOCK) {
            let rows = row0 + b0..row0 + (*m).min(b0 + ROW_BLOCK);
            for h in 0..heads {
                blocks.push((s, h, rows.clone()));
            }
        }
        row0 += m;
    }
    let kern = dispatch();
    let outs: Vec<Vec<f32>> = blocks
        .par_iter()
        .map_init(BlockBuffers::default, |buf, (s, h, rows)| {
            let (keys, vals) = caches[*s];
            let (h, kvh) = (*h, *h / group);
            let BlockBuffers {
                spans,
                scores,
                scratch,
            } = buf;
            // Each row's visible keys `first..=pos` and where its scores
            // start in `scores` (one flat buffer, every slot written below).
            spans.clear();
            let mut total = 0;
            for t in rows.clone() {
                let pos = row_seq[t].1;
                let first = first_of(pos);
                spans.push(Span {
                    first,
                    pos,
                    at: total,
                });
                total += pos + 1 - first;
            }
            scores.clear();
            scores.resize(total, 0.0);
            let nr = spans.len();
            let (lo, hi) = (spans[0].first, spans[nr - 1].pos);
            let qv = |r: usize| {
                let t = rows.start + r;
                &q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd]
            };
            // Same scores in the same order as testing every row.
            let runs = visible_runs(spans, lo, hi);
            for &(p, a, b) in &runs {
                let kr = keys.head(p, kv_dim, kvh * hd, hd, scratch);
                for (r, sp) in spans.iter().enumerate().take(b).skip(a) {
                    scores[sp.at + p - sp.first] = kern.dot_f32(qv(r), kr) * scale;
                }
            }
            for sp in spans.iter() {
                let sc = &mut scores[sp.at..sp.at + sp.pos + 1 - sp.first];
                match w.sinks.get(h) {
                    Some(&sink) => softmax_with_sink(sc, sink),
                    None => softmax_inplace(sc),
                }
            }
            let mut out = vec![0f32; nr * hd];
            for &(p, a, b) in &runs {
                let vr = vals.head(p, kv_dim, kvh * hd, hd, scratch);
                for (sp, o) in spans[a..b].iter().zip(out[a * hd..b * hd].chunks_exact_mut(hd)) {
                    kern.axpy(o, scores[sp.at + p - sp.first], vr);
                }
            }
            out
        })
        .collect();
    let mut ctx = vec![0f32; n * q_dim];
    for ((_, h, rows), out) in blocks.iter().zip(&outs) {
        for (t, o) in rows.clone().zip(out.chunks_exact(hd)) {
            ctx[t * q_dim + h * hd..t * q_dim + (h + 1) * hd].copy_from_slice(o);
        }
    }
    let mut out = vec![0f32; n * hidden];
    w.o.matmul(&ctx, n, &mut out);
    add_bias(&mut out, &w.bias.o);
    out
}

/// For each key position `p` in `lo..=hi` that some row of the block sees,
/// `(p, a, b)`: the rows `a..b` that see it. The rows are consecutive
/// positions of one sequence, so `pos` rises and `first` never falls from
/// row to row, and the run moves forward with `p` (rows with `pos >= p`
/// intersected with rows with `first <= p`). The score pass and the value
/// pass walk the same runs.
fn visible_runs(spans: &[Span], lo: usize, hi: usize) -> Vec<(usize, usize, usize)> {
    let nr = spans.len();
    let (mut a, mut b) = (0, 0);
    let mut runs = Vec::with_capacity(hi + 1 - lo);
    for p in lo..=hi {
        while a < nr && spans[a].pos < p {
            a += 1;
        }
        while b < nr && spans[b].first <= p {
            b += 1;
        }
        if a < b {
            runs.push((p, a, b));
        }
    }
    runs
}

/// Softmax over `scores` plus one extra logit `sink` that takes its share
/// of the mass and is then dropped (transformers' gpt-oss: concatenate,
/// subtract the max, softmax, drop the last column).
fn softmax_with_sink(scores: &mut [f32], sink: f32) {
    let max = scores.iter().copied().fold(sink, f32::max);
    let mut sum = (sink - max).exp();
    for v in scores.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in scores.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv_cache::{KvType, KvTypes};

    #[test]
    fn a_sink_takes_mass_and_a_very_negative_one_takes_none() {
        let mut a = vec![1.0f32, 2.0, 0.5];
        let mut b = a.clone();
        softmax_with_sink(&mut a, -1e30);
        softmax_inplace(&mut b);
        assert_eq!(a, b);
        let mut c = vec![1.0f32, 2.0, 0.5];
        softmax_with_sink(&mut c, 2.0);
        let total: f32 = c.iter().sum();
        let expect = 1.0 - 2f32.exp() / (1f32.exp() + 2f32.exp() + 0.5f32.exp() + 2f32.exp());
        assert!((total - expect).abs() < 1e-6, "{total} vs {expect}");
    }

    /// A small attention block with deterministic pseudo-random weights:
    /// 4 query heads over 2 KV heads of 40 (a partial q8 block per row).
    fn block() -> (AttnSpec, AttnWeights, Rope) {
        let (hidden, heads, kv_heads, hd) = (24, 4, 2, 40);
        let mut seed = 0x2545_f491_u32;
        let mut mat = |rows: usize, cols: usize| {
            let w = (0..rows * cols)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    (seed as f32 / u32::MAX as f32 - 0.5) * 0.8
                })
                .collect();
            QMatrix::from_f32(rows, cols, w).unwrap()
        };
        let w = AttnWeights {
            q: mat(heads * hd, hidden),
            k: mat(kv_heads * hd, hidden),
            v: mat(kv_heads * hd, hidden),
            o: mat(hidden, heads * hd),
            q_norm: Vec::new(),
            k_norm: Vec::new(),
            bias: AttnBias::default(),
            sinks: Vec::new(),
        };
        let spec = AttnSpec {
            hidden,
            heads,
            kv_heads,
            head_dim: hd,
            eps: 1e-5,
            qk_norm: QkNorm::None,
            clip: None,
            window: None,
        };
        (spec, w, Rope::new(hd, 10000.0))
    }

    /// Attention outputs of a 70-token prefill (three row blocks) then two
    /// single-token steps, with a cache of `types`.
    fn run(types: KvTypes) -> Vec<f32> {
        let (spec, w, rope) = block();
        let mut kv = KvCache::with_types(1, spec.kv_heads * spec.head_dim, types);
        let xs: Vec<f32> = (0..72 * spec.hidden)
            .map(|i| (i * 37 % 101) as f32 / 50.0 - 1.0)
            .collect();
        let mut out = Vec::new();
        for (from, to) in [(0, 70), (70, 71), (71, 72)] {
            let xn = &xs[from * spec.hidden..to * spec.hidden];
            out.extend(attend(&spec, &w, &rope, 0, xn, &mut [(to - from, &mut kv)]));
            kv.commit(to - from);
        }
        out
    }

    #[test]
    fn compact_caches_stay_close_to_f32() {
        let exact = run(KvTypes::both(KvType::F32));
        let scale = exact.iter().fold(0f32, |m, x| m.max(x.abs()));
        // Stated tolerances, relative to the largest output: f16 rounds each
        // key and value by at most 2^-11 relative; q8 by half a step of
        // max|block| / 127.
        for (t, tol) in [
            (KvTypes::both(KvType::F16), 2e-3),
            (KvTypes::both(KvType::Q8), 3e-2),
            (
                KvTypes {
                    k: KvType::F32,
                    v: KvType::Q8,
                },
                3e-2,
            ),
        ] {
            let got = run(t);
            let diff = exact
                .iter()
                .zip(&got)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(diff <= tol * scale, "{t}: {diff} vs max {scale}");
            assert!(diff > 0.0, "{t} changed nothing");
        }
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
        for t in KvType::ALL {
            let types = KvTypes::both(t);
            let one = pool(1).install(|| run(types));
            let two = pool(2).install(|| run(types));
            assert_eq!(one, two, "{t}");
        }
    }

    /// With a sliding window and sinks, a 70-row prefill (blocks whose rows
    /// see different spans of the past) gives the same bits as the same
    /// rows one at a time: every row's arithmetic is that of a row alone.
    #[test]
    fn blocked_rows_equal_single_rows_with_a_window_and_sinks() {
        let (mut spec, mut w, rope) = block();
        spec.window = Some(7);
        w.sinks = vec![0.5, -1.0, 2.0, 0.0];
        let xs: Vec<f32> = (0..70 * spec.hidden)
            .map(|i| (i * 53 % 97) as f32 / 48.0 - 1.0)
            .collect();
        for t in KvType::ALL {
            let types = KvTypes::both(t);
            let d = spec.kv_heads * spec.head_dim;
            let mut kv = KvCache::with_types(1, d, types);
            let all = attend(&spec, &w, &rope, 0, &xs, &mut [(70, &mut kv)]);
            let mut kv = KvCache::with_types(1, d, types);
            let mut one = Vec::new();
            for x in xs.chunks_exact(spec.hidden) {
                one.extend(attend(&spec, &w, &rope, 0, x, &mut [(1, &mut kv)]));
                kv.commit(1);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&all), bits(&one), "{t}");
        }
    }

    #[test]
    fn bias_is_added_per_row() {
        let mut rows = vec![1.0f32, 2.0, 3.0, 4.0];
        add_bias(&mut rows, &[10.0, 20.0]);
        assert_eq!(rows, vec![11.0, 22.0, 13.0, 24.0]);
        add_bias(&mut rows, &[]);
        assert_eq!(rows, vec![11.0, 22.0, 13.0, 24.0]);
    }
}
