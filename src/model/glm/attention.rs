//! Multi-head latent attention (MLA) with the DSA lightning indexer.
//!
//! Only the normalised KV latent and the rotated shared rope key are cached.
//! Two mathematically equal forms compute attention from them:
//! - expanded: `kv_b_proj` turns every cached latent into per-head K/V (what
//!   transformers does; cheap per query when many queries share the keys);
//! - absorbed: the query's no-rope part is folded through `kv_b_proj`'s K rows
//!   into latent space and the output comes back through its V rows, so the
//!   keys are never expanded (decode and draft verification).
//!
//! The form depends only on the number of new tokens (at most
//! [`ABSORB_MAX_TOKENS`] -> absorbed), so a token's numbers are the same
//! whether it is decoded alone or verified in a small batch with drafts.

use rayon::prelude::*;

use super::config::GlmConfig;
use super::state::LayerCache;
use super::weights::{IndexerWeights, KvProj, MlaWeights};
use crate::kernels::dispatch;
use crate::model::ops::{Rope, rms_norm_inplace, softmax_inplace, top_k};

/// Largest forward (in new tokens) computed in the absorbed form.
pub const ABSORB_MAX_TOKENS: usize = 16;

/// Epsilon of the indexer's key LayerNorm.
const INDEX_NORM_EPS: f32 = 1e-6;

/// Which attention form a forward uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// Absorbed for at most [`ABSORB_MAX_TOKENS`] new tokens, else expanded.
    Auto,
    Expanded,
    Absorbed,
}

/// Per new token, the cache indices it attends to (ascending), or `None`
/// for every causally visible key.
pub type Selection = Vec<Option<Vec<usize>>>;

/// Where a layer's keys are: the cache holds positions `base..`, the new
/// tokens sit at positions `start..start + n`.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub base: usize,
    pub start: usize,
    pub n: usize,
}

/// What attention needs besides the weights.
pub struct AttnCtx<'a> {
    pub cfg: &'a GlmConfig,
    pub rope: &'a Rope,
    pub form: Form,
}

impl AttnCtx<'_> {
    fn rotate(&self, v: &mut [f32], pos: usize) {
        self.rotate_as(self.cfg.rope_interleaved(), v, pos);
    }

    fn rotate_as(&self, interleaved: bool, v: &mut [f32], pos: usize) {
        if interleaved {
            self.rope.apply_interleaved(v, pos);
        } else {
            self.rope.apply_half(v, pos);
        }
    }

    /// Runs attention for `span.n` tokens whose normalised inputs are `xn`,
    /// appending their latents (and indexer keys) to `cache`. Returns the
    /// o_proj output `[n, hidden]` and, on a layer with an indexer, its
    /// selection (which following "shared" layers reuse). `shared` is the
    /// selection a layer without an indexer applies (`None`: dense causal).
    pub fn attend(
        &self,
        w: &MlaWeights,
        xn: &[f32],
        span: Span,
        cache: &mut LayerCache,
        shared: Option<&Selection>,
    ) -> (Vec<f32>, Option<Selection>) {
        let cfg = self.cfg;
        let n = span.n;
        let heads = cfg.num_attention_heads;
        let (nope, rd, vd, kvl) = (
            cfg.qk_nope_head_dim,
            cfg.qk_rope_head_dim,
            cfg.v_head_dim,
            cfg.kv_lora_rank,
        );
        let qhd = nope + rd;
        let latent_eps = cfg.latent_norm_eps();

        // Queries (through the low-rank path when there is one).
        let q_resid = w.q_a.as_ref().map(|qa| {
            let qr = qa.rows();
            let mut r = vec![0f32; n * qr];
            qa.matmul(xn, n, &mut r);
            for row in r.chunks_mut(qr) {
                rms_norm_inplace(row, &w.q_a_norm, latent_eps);
            }
            r
        });
        let mut q = vec![0f32; n * heads * qhd];
        w.q_b.matmul(q_resid.as_deref().unwrap_or(xn), n, &mut q);
        for t in 0..n {
            for h in 0..heads {
                let o = (t * heads + h) * qhd + nope;
                self.rotate(&mut q[o..o + rd], span.start + t);
            }
        }

        // The new positions' latent and rope key.
        let mut ckv = vec![0f32; n * (kvl + rd)];
        w.kv_a.matmul(xn, n, &mut ckv);
        for (t, row) in ckv.chunks_mut(kvl + rd).enumerate() {
            let (lat, kr) = row.split_at_mut(kvl);
            rms_norm_inplace(lat, &w.kv_a_norm, latent_eps);
            self.rotate(kr, span.start + t);
            cache.latent.push_rows(lat, kvl);
            cache.k_rope.push_rows(kr, rd);
        }

        let own = w
            .indexer
            .as_ref()
            .map(|ix| self.select(ix, xn, q_resid.as_deref().unwrap_or(&[]), span, cache));
        let sel = own.as_ref().or(shared);

        let total = cache.latent.rows(kvl);
        // The whole cache as f32 once per call (borrowed when it is f32),
        // rather than converting each row once per head.
        let latent = cache.latent.rows_f32(total, kvl);
        let k_rope = cache.k_rope.rows_f32(total, rd);
        let visible = |t: usize| span.start + t + 1 - span.base;
        let keys_of = |t: usize| -> Vec<usize> {
            match sel.and_then(|s| s[t].as_ref()) {
                Some(v) => v.clone(),
                None => (0..visible(t)).collect(),
            }
        };
        let scale = cfg.softmax_scale();
        // The SIMD dot products and weighted adds, bit-identical to
        // `ops::dot` and `o += a * x` (see `Kernels::dot_f32`), so the
        // kernel set changes no number here either.
        let kern = dispatch();
        let kvb = match &w.kv_b {
            KvProj::Joint(m) => Some(m),
            KvProj::PerHead { .. } => None,
        };
        let absorbed = kvb.is_none()
            || match self.form {
                Form::Auto => n <= ABSORB_MAX_TOKENS,
                Form::Expanded => false,
                Form::Absorbed => true,
            };
        let kvb_rows = nope + vd;
        let mut ctx = vec![0f32; n * heads * vd];
        if absorbed {
            // kv_b_proj is used in place: its K rows through a dequantized
            // row at a time, its V rows through the row kernel. Expanding it
            // to f32 here would cost `rows × kv_lora_rank × 4` bytes per
            // layer and token (59 MB at GLM-5's shape). The split form's
            // per-head matrices are products of their own, the query and
            // the latent context quantized as their types ask (llama.cpp's
            // absorbed MLA).
            ctx.par_chunks_mut(vd).enumerate().for_each(|(i, out)| {
                let (t, h) = (i / heads, i % heads);
                let qh = &q[(t * heads + h) * qhd..(t * heads + h + 1) * qhd];
                // q_abs = W_uk^T q_nope
                let mut q_abs = vec![0f32; kvl];
                match &w.kv_b {
                    KvProj::PerHead { k, .. } => k[h].matvec(&qh[..nope], &mut q_abs),
                    KvProj::Joint(kvb) => {
                        let mut wrow = vec![0f32; kvl];
                        for (j, &qj) in qh[..nope].iter().enumerate() {
                            let r = h * kvb_rows + j;
                            let wk: &[f32] = match kvb.f32_data() {
                                Some(d) => &d[r * kvl..(r + 1) * kvl],
                                None => {
                                    kvb.dequantize_row(r, &mut wrow);
                                    &wrow
                                }
                            };
                            kern.axpy(&mut q_abs, qj, wk);
                        }
                    }
                }
                let keys = keys_of(t);
                let mut s: Vec<f32> = keys
                    .iter()
                    .map(|&p| {
                        (kern.dot_f32(&q_abs, &latent[p * kvl..(p + 1) * kvl])
                            + kern.dot_f32(&qh[nope..], &k_rope[p * rd..(p + 1) * rd]))
                            * scale
                    })
                    .collect();
                softmax_inplace(&mut s);
                let mut ctx_lat = vec![0f32; kvl];
                for (&p, &a) in keys.iter().zip(&s) {
                    kern.axpy(&mut ctx_lat, a, &latent[p * kvl..(p + 1) * kvl]);
                }
                match &w.kv_b {
                    KvProj::PerHead { v, .. } => v[h].matvec(&ctx_lat, out),
                    KvProj::Joint(kvb) => {
                        for (d, o) in out.iter_mut().enumerate() {
                            let r = h * kvb_rows + nope + d;
                            *o = match kvb.f32_data() {
                                Some(wv) => kern.dot_f32(&wv[r * kvl..(r + 1) * kvl], &ctx_lat),
                                None => kvb.row_dot(r, &ctx_lat),
                            };
                        }
                    }
                }
            });
        } else if let Some(kvb) = kvb {
            let mut kv = vec![0f32; total * heads * kvb_rows];
            kvb.matmul(&latent, total, &mut kv);
            ctx.par_chunks_mut(vd).enumerate().for_each(|(i, out)| {
                let (t, h) = (i / heads, i % heads);
                let qh = &q[(t * heads + h) * qhd..(t * heads + h + 1) * qhd];
                let row = |p: usize| &kv[(p * heads + h) * kvb_rows..(p * heads + h + 1) * kvb_rows];
                let keys = keys_of(t);
                let mut s: Vec<f32> = keys
                    .iter()
                    .map(|&p| {
                        (kern.dot_f32(&qh[..nope], &row(p)[..nope])
                            + kern.dot_f32(&qh[nope..], &k_rope[p * rd..(p + 1) * rd]))
                            * scale
                    })
                    .collect();
                softmax_inplace(&mut s);
                out.fill(0.0);
                for (&p, &a) in keys.iter().zip(&s) {
                    kern.axpy(out, a, &row(p)[nope..]);
                }
            });
        }
        let mut out = vec![0f32; n * cfg.hidden_size];
        w.o.matmul(&ctx, n, &mut out);
        (out, own)
    }

    /// The lightning indexer: appends the new indexer keys to the cache and
    /// picks, per new token with more than `index_topk` visible keys, the
    /// `index_topk` keys of highest `sum_h w_h * relu(q_h . k * d^-0.5)`
    /// (transformers' GlmMoeDsaIndexer; ties go to the lower position).
    fn select(
        &self,
        ix: &IndexerWeights,
        xn: &[f32],
        q_resid: &[f32],
        span: Span,
        cache: &mut LayerCache,
    ) -> Selection {
        let cfg = self.cfg;
        let n = span.n;
        let (ih, ihd, rd) = (cfg.index_n_heads(), cfg.index_head_dim(), cfg.qk_rope_head_dim);
        let mut iq = vec![0f32; n * ih * ihd];
        ix.wq_b.matmul(q_resid, n, &mut iq);
        let mut ik = vec![0f32; n * ihd];
        ix.wk.matmul(xn, n, &mut ik);
        let mut wts = vec![0f32; n * ih];
        ix.weights_proj.matmul(xn, n, &mut wts);
        let head_scale = (ih as f32).powf(-0.5);
        for v in &mut wts {
            *v *= head_scale;
        }
        let il = cfg.indexer_rope_interleaved();
        for t in 0..n {
            for h in 0..ih {
                let o = (t * ih + h) * ihd;
                self.rotate_as(il, &mut iq[o..o + rd], span.start + t);
            }
            let k = &mut ik[t * ihd..(t + 1) * ihd];
            layer_norm(k, &ix.k_norm_w, &ix.k_norm_b, INDEX_NORM_EPS);
            self.rotate_as(il, &mut k[..rd], span.start + t);
            cache.index_k.push_rows(k, ihd);
        }
        let keys = cache.index_k.rows_f32(cache.index_k.rows(ihd), ihd);
        let topk = cfg.index_topk();
        let scale = (ihd as f32).powf(-0.5);
        let kern = dispatch();
        (0..n)
            .into_par_iter()
            .map(|t| {
                let visible = span.start + t + 1 - span.base;
                if visible <= topk {
                    return None;
                }
                let scores: Vec<f32> = (0..visible)
                    .map(|p| {
                        let k = &keys[p * ihd..(p + 1) * ihd];
                        (0..ih)
                            .map(|h| {
                                let qh = &iq[(t * ih + h) * ihd..(t * ih + h + 1) * ihd];
                                wts[t * ih + h] * (kern.dot_f32(qh, k) * scale).max(0.0)
                            })
                            .sum()
                    })
                    .collect();
                let mut chosen = top_k(&scores, topk);
                chosen.sort_unstable();
                Some(chosen)
            })
            .collect()
    }
}

/// LayerNorm with weight and bias: `(x - mean) / sqrt(var + eps) * w + b`.
pub fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, &wv), &bv) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * inv * wv + bv;
    }
}
