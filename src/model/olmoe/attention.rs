//! Causal multi-head attention with grouped KV heads over the KV cache.
//!
//! One call serves a batch of sequences: the projections run once over every
//! new row of every sequence (each weight row is read once per step), while
//! rope positions, the cache and the causal mask stay per sequence.

use rayon::prelude::*;

use super::weights::LayerWeights;
use crate::config::OlmoeConfig;
use crate::model::kv_cache::KvCache;
use crate::model::ops::{Rope, dot, rms_norm_inplace, softmax_inplace};

/// Runs attention for the new rows of several sequences. `xn` holds the
/// normalised inputs of every sequence's new tokens back to back
/// (`[Σ n_i, hidden]`); `seqs[i] = (n_i, cache_i)` says how many rows are
/// sequence `i`'s and where its past is. Their K/V are appended to layer
/// `layer` of each cache (committed by the caller after the last layer).
/// Returns the o_proj output `[Σ n_i, hidden]`.
pub fn attend(
    cfg: &OlmoeConfig,
    w: &LayerWeights,
    rope: &Rope,
    layer: usize,
    xn: &[f32],
    seqs: &mut [(usize, &mut KvCache)],
) -> Vec<f32> {
    let hidden = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let kv_heads = cfg.kv_heads();
    let hd = cfg.head_dim();
    let q_dim = heads * hd;
    let kv_dim = kv_heads * hd;
    let eps = cfg.rms_norm_eps as f32;
    let n: usize = seqs.iter().map(|(m, _)| *m).sum();

    let mut q = vec![0f32; n * q_dim];
    let mut k = vec![0f32; n * kv_dim];
    let mut v = vec![0f32; n * kv_dim];
    w.q.matmul(xn, n, &mut q);
    w.k.matmul(xn, n, &mut k);
    w.v.matmul(xn, n, &mut v);
    for t in 0..n {
        rms_norm_inplace(&mut q[t * q_dim..(t + 1) * q_dim], &w.q_norm, eps);
        rms_norm_inplace(&mut k[t * kv_dim..(t + 1) * kv_dim], &w.k_norm, eps);
    }
    if let Some(clip) = cfg.clip_qkv {
        let c = clip as f32;
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
        kv.k[layer].extend_from_slice(&k[row0 * kv_dim..(row0 + m) * kv_dim]);
        kv.v[layer].extend_from_slice(&v[row0 * kv_dim..(row0 + m) * kv_dim]);
        row0 += m;
    }
    let caches: Vec<(&[f32], &[f32])> = seqs
        .iter()
        .map(|(_, kv)| (kv.k[layer].as_slice(), kv.v[layer].as_slice()))
        .collect();

    let group = heads / kv_heads;
    let scale = (hd as f32).powf(-0.5);
    let mut ctx = vec![0f32; n * q_dim];
    ctx.par_chunks_mut(hd).enumerate().for_each(|(i, out)| {
        let (t, h) = (i / heads, i % heads);
        let (s, pos) = row_seq[t];
        let (keys, vals) = caches[s];
        let kvh = h / group;
        let qv = &q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd];
        let visible = pos + 1;
        let mut scores: Vec<f32> = (0..visible)
            .map(|p| {
                let kr = &keys[p * kv_dim + kvh * hd..p * kv_dim + (kvh + 1) * hd];
                dot(qv, kr) * scale
            })
            .collect();
        softmax_inplace(&mut scores);
        out.fill(0.0);
        for (p, &s) in scores.iter().enumerate() {
            let vr = &vals[p * kv_dim + kvh * hd..p * kv_dim + (kvh + 1) * hd];
            for (o, &x) in out.iter_mut().zip(vr) {
                *o += s * x;
            }
        }
    });
    let mut out = vec![0f32; n * hidden];
    w.o.matmul(&ctx, n, &mut out);
    out
}
