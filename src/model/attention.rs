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
use crate::model::ops::{Rope, rms_norm_inplace};
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
    /// An output gate `[heads * head_dim, hidden]` (Qwen3-Next): the heads'
    /// output is multiplied by `sigmoid(gate · x)` before `o`, so a head
    /// can switch itself off for a token.
    pub gate: Option<QMatrix>,
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
            + self.gate.as_ref().map_or(0, QMatrix::resident_bytes)
            + (self.q_norm.len() + self.k_norm.len() + self.sinks.len()) * 4
            + self.bias.bytes()
    }
}

/// Rows of one sequence that share one pass over its keys and values.
const ROW_BLOCK: usize = 32;

/// Keys per tile of the online softmax. Tiles are aligned to absolute key
/// positions (tile `i` holds positions `i * KEY_TILE ..`), so the tiles a row
/// walks, and therefore its arithmetic, depend only on that row's position
/// and window, never on which other rows share its block.
const KEY_TILE: usize = 64;

/// Buffers a worker reuses from one work item to the next (rayon's
/// `map_init`); every value is overwritten before it is read, so reuse
/// cannot change a result.
#[derive(Default)]
struct BlockBuffers {
    /// A compact cache's key and value head slices of one tile, as f32.
    keys: Vec<f32>,
    vals: Vec<f32>,
    /// Every row's scores within one tile (`rows × tile` wide).
    scores: Vec<f32>,
    /// Every row's visible keys within one tile, from the tile's start.
    rel: Vec<(usize, usize)>,
    /// Per row: running maximum and running sum of the online softmax.
    max: Vec<f32>,
    sum: Vec<f32>,
}

/// The head slices `off..off + hd` of cache rows `t0..t1`: borrowed in place
/// from an f32 cache (stride `kv_dim`), else converted once into `buf`
/// (stride `hd`) for every row of the block to share.
struct Tile<'a> {
    data: &'a [f32],
    stride: usize,
}

impl<'a> Tile<'a> {
    #[allow(clippy::too_many_arguments)]
    fn load(
        rows: &'a KvRows,
        t0: usize,
        t1: usize,
        kv_dim: usize,
        off: usize,
        hd: usize,
        buf: &'a mut Vec<f32>,
    ) -> Self {
        match rows {
            KvRows::F32(v) => Tile {
                data: &v[t0 * kv_dim + off..],
                stride: kv_dim,
            },
            _ => {
                buf.resize((t1 - t0) * hd, 0.0);
                for (p, out) in (t0..t1).zip(buf.chunks_exact_mut(hd)) {
                    rows.read_into(p, kv_dim, off, out);
                }
                Tile {
                    data: buf,
                    stride: hd,
                }
            }
        }
    }
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
    // head, run as a single pass over the keys and values with an online
    // softmax (flash-attention style): tile by tile, each row's scores are
    // computed, its running maximum raised, what it has summed so far
    // rescaled by `exp(old max - new max)`, and the tile's values added with
    // weights `exp(score - max)`; the sum divides at the end. The rows of a
    // block share each tile's key and value rows (read, and for a compact
    // cache converted to f32, once per block rather than once per row), and
    // no buffer grows with the context beyond one tile of scores. A row's
    // arithmetic follows only from its own visible keys and the absolute
    // tile boundaries, so the results depend on neither the blocking, the
    // chunking of a prompt, nor the thread count. The q·k dot products and
    // the weighted sums run on the SIMD kernels (`Kernels::dot_f32`,
    // `Kernels::axpy`), bit-identical to `ops::dot` and `o += w * v`, so the
    // kernel set does not change a token either.
    //
    // A work item takes `per` query heads of one KV group together (rows
    // ordered row by row, each row's heads side by side), so the heads that
    // share a KV head share each tile's keys and values: read, and for a
    // compact cache converted, once for all of them. All `group` heads at
    // once when that leaves the threads enough items, fewer when the step
    // is small (a decode step has one row block per sequence). The heads
    // of an item do not change any head's arithmetic.
    let row_blocks: usize = seqs.iter().map(|(m, _)| m.div_ceil(ROW_BLOCK)).sum();
    let want_items = 2 * rayon::current_num_threads();
    let split = (1..=group)
        .filter(|k| group % k == 0)
        .find(|k| row_blocks * kv_heads * k >= want_items)
        .unwrap_or(group);
    let per = group / split;
    let mut blocks = Vec::new();
    let mut row0 = 0;
    for (s, (m, _)) in seqs.iter().enumerate() {
        for b0 in (0..*m).step_by(ROW_BLOCK) {
            let rows = row0 + b0..row0 + (*m).min(b0 + ROW_BLOCK);
            for h0 in (0..heads).step_by(per) {
                blocks.push((s, h0..h0 + per, rows.clone()));
            }
        }
        row0 += m;
    }
    let kern = dispatch();
    let outs: Vec<Vec<f32>> = blocks
        .par_iter()
        .map_init(
            || (BlockBuffers::default(), Vec::new(), Vec::new(), Vec::new()),
            |(buf, spans, qs, sinks), (s, hs, rows)| {
                let (keys, vals) = caches[*s];
                // Reused per worker like `buf`: cleared and refilled per item.
                spans.clear();
                qs.clear();
                sinks.clear();
                for t in rows.clone() {
                    let pos = row_seq[t].1;
                    for h in hs.clone() {
                        spans.push((first_of(pos), pos));
                        qs.push(&q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd]);
                        if let Some(&sk) = w.sinks.get(h) {
                            sinks.push(sk);
                        }
                    }
                }
                let head = HeadView {
                    kv_dim,
                    off: (hs.start / group) * hd,
                    hd,
                };
                attend_block(&kern, qs, spans, (keys, vals), head, scale, sinks, buf)
            },
        )
        .collect();
    let mut ctx = vec![0f32; n * q_dim];
    for ((_, hs, rows), out) in blocks.iter().zip(&outs) {
        let mut o = out.chunks_exact(hd);
        for t in rows.clone() {
            for (h, o) in hs.clone().zip(o.by_ref()) {
                ctx[t * q_dim + h * hd..t * q_dim + (h + 1) * hd].copy_from_slice(o);
            }
        }
    }
    if let Some(gate) = &w.gate {
        let mut g = vec![0f32; n * q_dim];
        gate.matmul(xn, n, &mut g);
        for (c, g) in ctx.iter_mut().zip(&g) {
            *c *= crate::model::ops::sigmoid(*g);
        }
    }
    let mut out = vec![0f32; n * hidden];
    w.o.matmul(&ctx, n, &mut out);
    add_bias(&mut out, &w.bias.o);
    out
}

/// Where one KV head's slice sits in a cache row.
#[derive(Clone, Copy, Debug)]
struct HeadView {
    kv_dim: usize,
    off: usize,
    hd: usize,
}

/// Attention output for a block of rows of one sequence against one KV
/// head: row `r` (one query head at one position) has query `qs[r]` and
/// sees keys `spans[r].0 ..= spans[r].1`. One pass over the keys and values
/// in tiles with an online softmax (see `attend`); `sinks[r]`, when
/// `sinks` is not empty, joins row `r`'s softmax as one extra logit that
/// takes no value.
#[allow(clippy::too_many_arguments)]
fn attend_block(
    kern: &crate::kernels::Kernels,
    qs: &[&[f32]],
    spans: &[(usize, usize)],
    (keys, vals): (&KvRows, &KvRows),
    head: HeadView,
    scale: f32,
    sinks: &[f32],
    buf: &mut BlockBuffers,
) -> Vec<f32> {
    let HeadView { kv_dim, off, hd } = head;
    let BlockBuffers {
        keys: kbuf,
        vals: vbuf,
        scores,
        rel,
        max,
        sum,
    } = buf;
    let nr = spans.len();
    max.clear();
    max.resize(nr, f32::NEG_INFINITY);
    sum.clear();
    sum.resize(nr, 0.0);
    let mut out = vec![0f32; nr * hd];
    let lo = spans.iter().map(|s| s.0).min().unwrap_or(0);
    let hi = spans.iter().map(|s| s.1).max().unwrap_or(0);
    for tile in lo / KEY_TILE..=hi / KEY_TILE {
        let t0 = (tile * KEY_TILE).max(lo);
        let t1 = ((tile + 1) * KEY_TILE).min(hi + 1);
        let nk = t1 - t0;
        // Each row's visible keys within the tile, from the tile's start.
        rel.clear();
        rel.extend(spans.iter().map(|&(first, pos)| {
            let (a, b) = (t0.max(first), t1.min(pos + 1));
            if a < b { (a - t0, b - t0) } else { (0, 0) }
        }));
        // Every row against every key of the tile (a row's keys outside its
        // span are scored and then ignored), then per row the online
        // softmax over its own span, then the weighted sums: per row the
        // same dot products, rescaling and adds in the same order as one
        // row at a time.
        scores.resize(nr * nk, 0.0);
        let kt = Tile::load(keys, t0, t1, kv_dim, off, hd, kbuf);
        kern.dot_f32_grid(qs, kt.data, kt.stride, nk, scale, scores, nk);
        for (r, o) in out.chunks_exact_mut(hd).enumerate() {
            let (a, b) = rel[r];
            if a >= b {
                continue;
            }
            let row = &mut scores[r * nk + a..r * nk + b];
            let m = row.iter().copied().fold(max[r], f32::max);
            if m > max[r] && max[r] > f32::NEG_INFINITY {
                let alpha = (max[r] - m).exp();
                sum[r] *= alpha;
                o.iter_mut().for_each(|x| *x *= alpha);
            }
            max[r] = m;
            for e in row.iter_mut() {
                *e = (*e - m).exp();
                sum[r] += *e;
            }
        }
        let vt = Tile::load(vals, t0, t1, kv_dim, off, hd, vbuf);
        kern.axpy_grid(&mut out, hd, scores, nk, nk, rel, vt.data, vt.stride);
    }
    for (r, o) in out.chunks_exact_mut(hd).enumerate() {
        let inv = match sinks.get(r).copied() {
            // The sink joins the maximum and the sum, then takes no value
            // (transformers' gpt-oss: concatenate, softmax, drop it).
            Some(sink) => {
                let m = max[r].max(sink);
                let alpha = (max[r] - m).exp();
                alpha / (sum[r] * alpha + (sink - m).exp())
            }
            None => 1.0 / sum[r],
        };
        o.iter_mut().for_each(|x| *x *= inv);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv_cache::{KvType, KvTypes};
    use crate::model::ops::softmax_inplace;

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
            gate: None,
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
            // Eight threads split every KV group's heads into items of one
            // head; one thread keeps a group's heads in one item.
            let eight = pool(8).install(|| run(types));
            assert_eq!(one, eight, "{t}");
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

    /// The online softmax against the textbook definition in f64 (all
    /// scores, one maximum, one sum), over contexts of several tiles, with
    /// and without a window and a sink: within 2e-6 of the largest output
    /// (f32 rounding of the rescaled partial sums).
    #[test]
    fn the_online_softmax_matches_the_two_pass_definition() {
        let (hd, kv_dim, off) = (24, 48, 24);
        let mut seed = 0x9e37_79b9_u32;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as f32 / u32::MAX as f32 * 4.0 - 2.0
        };
        let len = 3 * KEY_TILE + 17;
        let kv: Vec<f32> = (0..len * kv_dim).map(|_| rnd()).collect();
        let vv: Vec<f32> = (0..len * kv_dim).map(|_| rnd()).collect();
        let (keys, vals) = (KvRows::F32(kv.clone()), KvRows::F32(vv.clone()));
        let rows = 40;
        let qv: Vec<f32> = (0..rows * hd).map(|_| rnd()).collect();
        let qs: Vec<&[f32]> = qv.chunks_exact(hd).collect();
        let scale = 0.3;
        for (window, sink) in [
            (None, None),
            (Some(70), None),
            (None, Some(1.5)),
            (Some(5), Some(-0.5)),
        ] {
            let spans: Vec<(usize, usize)> = (0..rows)
                .map(|r| {
                    let pos = len - rows + r;
                    (window.map_or(0, |w: usize| (pos + 1).saturating_sub(w)), pos)
                })
                .collect();
            let head = HeadView { kv_dim, off, hd };
            let got = attend_block(
                &dispatch(),
                &qs,
                &spans,
                (&keys, &vals),
                head,
                scale,
                &sink.map_or(Vec::new(), |sk| vec![sk; rows]),
                &mut BlockBuffers::default(),
            );
            let mut worst = 0f64;
            for (r, &(first, pos)) in spans.iter().enumerate() {
                let sc: Vec<f64> = (first..=pos)
                    .map(|p| {
                        let k = &kv[p * kv_dim + off..p * kv_dim + off + hd];
                        qs[r]
                            .iter()
                            .zip(k)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let m = sc
                    .iter()
                    .copied()
                    .fold(sink.map_or(f64::NEG_INFINITY, |s| s as f64), f64::max);
                let total: f64 = sc.iter().map(|x| (x - m).exp()).sum::<f64>()
                    + sink.map_or(0.0, |s| (s as f64 - m).exp());
                for d in 0..hd {
                    let want: f64 = (first..=pos)
                        .zip(&sc)
                        .map(|(p, x)| (x - m).exp() / total * vv[p * kv_dim + off + d] as f64)
                        .sum();
                    worst = worst.max((want - got[r * hd + d] as f64).abs());
                }
            }
            assert!(worst < 2e-6, "window {window:?} sink {sink:?}: {worst}");
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
