//! Causal multi-head attention with grouped KV heads over the KV cache.

use rayon::prelude::*;

use super::weights::LayerWeights;
use crate::config::OlmoeConfig;
use crate::model::kv_cache::KvCache;
use crate::model::ops::{Rope, dot, rms_norm_inplace, softmax_inplace};

/// Runs attention for `n` new tokens whose normalised inputs are `xn`
/// (`[n, hidden]`) at positions `kv.len()..kv.len()+n`, appends their K/V to
/// layer `layer` of the cache, and returns the o_proj output `[n, hidden]`.
pub fn attend(
    cfg: &OlmoeConfig,
    w: &LayerWeights,
    rope: &Rope,
    layer: usize,
    xn: &[f32],
    n: usize,
    kv: &mut KvCache,
) -> Vec<f32> {
    let hidden = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let kv_heads = cfg.kv_heads();
    let hd = cfg.head_dim();
    let q_dim = heads * hd;
    let kv_dim = kv_heads * hd;
    let eps = cfg.rms_norm_eps as f32;
    let start = kv.len();

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
    for t in 0..n {
        for h in 0..heads {
            rope.apply_half(&mut q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd], start + t);
        }
        for h in 0..kv_heads {
            rope.apply_half(&mut k[t * kv_dim + h * hd..t * kv_dim + (h + 1) * hd], start + t);
        }
    }
    kv.k[layer].extend_from_slice(&k);
    kv.v[layer].extend_from_slice(&v);
    let keys = &kv.k[layer];
    let vals = &kv.v[layer];

    let group = heads / kv_heads;
    let scale = (hd as f32).powf(-0.5);
    let mut ctx = vec![0f32; n * q_dim];
    ctx.par_chunks_mut(hd).enumerate().for_each(|(i, out)| {
        let (t, h) = (i / heads, i % heads);
        let kvh = h / group;
        let qv = &q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd];
        let visible = start + t + 1;
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
