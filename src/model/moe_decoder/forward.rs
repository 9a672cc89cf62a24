//! The Qwen3-MoE / Mixtral forward pass over a batch of sequences, with
//! routed experts fetched through an [`ExpertSource`].

use std::sync::Arc;

use colibri_actors::{ExpertSource, Tag};

use super::weights::{DenseWeights, Ffn};
use crate::config::{DecoderKind, MoeDecoderConfig};
use crate::model::attention::{AttnSpec, QkNorm, attend};
use crate::model::expert::ExpertWeights;
use crate::model::kv_cache::KvCache;
use crate::model::lm::{
    BatchItem, ForwardError, LanguageModel, Logits, SequenceState, check_tokens, downcast_batch, fingerprint,
    output_logits,
};
use crate::model::ops::{Rope, rms_norm};
use crate::model::routed::{Routing, routed_sum};

/// A Qwen3-MoE or Mixtral model ready to run: resident weights plus a
/// source of experts.
pub struct MoeDecoder {
    pub cfg: MoeDecoderConfig,
    pub weights: Arc<DenseWeights>,
    pub source: Arc<dyn ExpertSource<ExpertWeights>>,
    rope: Rope,
    attn: AttnSpec,
    /// Routing decisions of the last forward (per sparse layer, per token).
    pub last_routing: Vec<Vec<Routing>>,
}

impl MoeDecoder {
    pub fn new(
        cfg: MoeDecoderConfig,
        weights: Arc<DenseWeights>,
        source: Arc<dyn ExpertSource<ExpertWeights>>,
    ) -> Self {
        let rope = Rope::new(cfg.head_dim, cfg.rope_theta);
        let attn = AttnSpec {
            hidden: cfg.hidden_size,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            eps: cfg.rms_norm_eps as f32,
            qk_norm: match cfg.kind {
                DecoderKind::Qwen3Moe => QkNorm::PerHead,
                DecoderKind::Mixtral => QkNorm::None,
            },
            clip: None,
            window: cfg.sliding_window,
        };
        Self {
            cfg,
            weights,
            source,
            rope,
            attn,
            last_routing: Vec::new(),
        }
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::new(
            self.cfg.num_hidden_layers,
            self.cfg.num_key_value_heads * self.cfg.head_dim,
        )
    }

    /// One pass over the new tokens of several sequences (rows back to back):
    /// norms, projections, router and experts run over all rows at once,
    /// attention per sequence, so a sequence gets the same logits alone or
    /// in a batch.
    pub fn forward_seqs(
        &mut self,
        seqs: &mut [(&[u32], &mut KvCache, Logits)],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let cfg = &self.cfg;
        let w = &self.weights;
        let hidden = cfg.hidden_size;
        let eps = cfg.rms_norm_eps as f32;
        for (tokens, kv, _) in seqs.iter() {
            check_tokens(tokens, kv.len(), cfg.vocab_size, cfg.max_position_embeddings)?;
        }
        let n: usize = seqs.iter().map(|(t, _, _)| t.len()).sum();
        if n == 0 {
            return Ok(vec![Vec::new(); seqs.len()]);
        }
        let mut x = vec![0f32; n * hidden];
        for (t, &id) in seqs.iter().flat_map(|(t, _, _)| t.iter()).enumerate() {
            w.embed
                .dequantize_row(id as usize, &mut x[t * hidden..(t + 1) * hidden]);
        }
        let mut parts: Vec<(usize, &mut KvCache)> =
            seqs.iter_mut().map(|(t, kv, _)| (t.len(), &mut **kv)).collect();
        self.source.advance(tag.at_layer(0));
        let mut routing = Vec::new();
        let mut xn = vec![0f32; n * hidden];
        let norm_rows = |x: &[f32], weight: &[f32], out: &mut [f32]| {
            for (xr, or) in x.chunks_exact(hidden).zip(out.chunks_exact_mut(hidden)) {
                rms_norm(xr, weight, eps, or);
            }
        };
        for (l, lw) in w.layers.iter().enumerate() {
            let _span = tracing::trace_span!("layer", l).entered();
            norm_rows(&x, &lw.input_norm, &mut xn);
            let attn = {
                let _s = tracing::trace_span!("attention", layer = l).entered();
                attend(&self.attn, &lw.attn, &self.rope, l, &xn, &mut parts)
            };
            for (a, b) in x.iter_mut().zip(&attn) {
                *a += b;
            }
            // Offer the residual of the last token to the pilot of layer l+1.
            if l + 1 < cfg.num_hidden_layers {
                self.source
                    .pilot(tag.at_layer(l as u32 + 1), &x[(n - 1) * hidden..n * hidden]);
            }
            norm_rows(&x, &lw.post_norm, &mut xn);
            let out = match &lw.ffn {
                Ffn::Dense(mlp) => {
                    let mut y = vec![0f32; n * hidden];
                    mlp.forward(&xn, n, &mut y);
                    y
                }
                Ffn::Moe { router } => {
                    let ne = cfg.num_experts;
                    let mut logits = vec![0f32; n * ne];
                    router.matmul(&xn, n, &mut logits);
                    let routes: Vec<Routing> = logits
                        .chunks_exact(ne)
                        .map(|r| Routing::softmax_top_k(r, cfg.num_experts_per_tok, cfg.norm_topk_prob))
                        .collect();
                    let acc = routed_sum(
                        self.source.as_ref(),
                        tag.at_layer(l as u32),
                        &routes,
                        ne,
                        &xn,
                        hidden,
                    )?;
                    routing.push(routes);
                    acc
                }
            };
            for (a, b) in x.iter_mut().zip(&out) {
                *a += b;
            }
        }
        for (m, kv) in parts.iter_mut() {
            kv.commit(*m);
        }
        self.last_routing = routing;
        let _s = tracing::trace_span!("lm_head").entered();
        let wants: Vec<(usize, Logits)> = seqs.iter().map(|(t, _, want)| (t.len(), *want)).collect();
        Ok(output_logits(&x, hidden, &wants, &w.final_norm, eps, &w.lm_head))
    }
}

impl LanguageModel for MoeDecoder {
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }
    fn max_positions(&self) -> usize {
        self.cfg.max_position_embeddings
    }
    fn fingerprint(&self) -> u64 {
        let c = &self.cfg;
        fingerprint(&[
            match c.kind {
                DecoderKind::Qwen3Moe => 0x5177_656e_334d, // "Qwen3M"
                DecoderKind::Mixtral => 0x4d69_7874_7261,  // "Mixtra"
            },
            c.vocab_size as u64,
            c.hidden_size as u64,
            c.num_hidden_layers as u64,
            c.num_attention_heads as u64,
            c.num_key_value_heads as u64,
            c.head_dim as u64,
            c.num_experts as u64,
            c.moe_intermediate_size as u64,
            c.sliding_window.unwrap_or(0) as u64,
        ])
    }
    fn new_state(&self) -> Box<dyn SequenceState> {
        Box::new(self.new_cache())
    }
    fn forward(
        &mut self,
        tokens: &[u32],
        state: &mut dyn SequenceState,
        tag: Tag,
        logits: Logits,
    ) -> Result<Vec<f32>, ForwardError> {
        let kv = state
            .as_any_mut()
            .downcast_mut::<KvCache>()
            .ok_or(ForwardError::State)?;
        let mut out = self.forward_seqs(&mut [(tokens, kv, logits)], tag)?;
        Ok(out.pop().unwrap_or_default())
    }
    fn forward_batch(
        &mut self,
        items: &mut [BatchItem<'_>],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let mut seqs = downcast_batch::<KvCache>(items)?;
        self.forward_seqs(&mut seqs, tag)
    }
    fn source(&self) -> &Arc<dyn ExpertSource<ExpertWeights>> {
        &self.source
    }
    fn dense_bytes(&self) -> usize {
        self.weights.resident_bytes()
    }
    fn step_dense_bytes(&self) -> usize {
        self.weights
            .resident_bytes()
            .saturating_sub(self.weights.embed.resident_bytes())
    }
}
