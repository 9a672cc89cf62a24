//! The OLMoE forward pass: prefill of many tokens in one batched pass, or one
//! decode step, with routed experts fetched through an [`ExpertSource`].

use std::sync::Arc;

use colibri_actors::{ExpertSource, Tag};

use super::moe::{Routing, moe_block};
use super::weights::DenseWeights;
use crate::config::OlmoeConfig;
use crate::model::attention::{AttnSpec, QkNorm, attend};
use crate::model::expert::ExpertWeights;
use crate::model::kv_cache::KvCache;
use crate::model::lm::{
    BatchItem, ForwardError, LanguageModel, Logits, SequenceState, check_tokens, downcast_batch, fingerprint,
    output_logits,
};
use crate::model::ops::{Rope, rms_norm};

/// An OLMoE model ready to run: resident weights plus a source of experts.
pub struct Olmoe {
    pub cfg: OlmoeConfig,
    pub weights: Arc<DenseWeights>,
    pub source: Arc<dyn ExpertSource<ExpertWeights>>,
    rope: Rope,
    attn: AttnSpec,
    /// Routing decisions of the last forward (per layer, per token), kept
    /// for statistics and tests.
    pub last_routing: Vec<Vec<Routing>>,
}

impl Olmoe {
    pub fn new(
        cfg: OlmoeConfig,
        weights: Arc<DenseWeights>,
        source: Arc<dyn ExpertSource<ExpertWeights>>,
    ) -> Self {
        let rope = Rope::new(cfg.head_dim(), cfg.rope_theta());
        let attn = AttnSpec {
            hidden: cfg.hidden_size,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.kv_heads(),
            head_dim: cfg.head_dim(),
            eps: cfg.rms_norm_eps as f32,
            qk_norm: QkNorm::Full,
            clip: cfg.clip_qkv.map(|c| c as f32),
            window: None,
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
            self.cfg.kv_heads() * self.cfg.head_dim(),
        )
    }

    /// Runs `tokens` through the model after the positions already in `kv`,
    /// appending their K/V. `tag` names the token step (its layer is ignored).
    pub fn forward(
        &mut self,
        tokens: &[u32],
        kv: &mut KvCache,
        tag: Tag,
        logits: Logits,
    ) -> Result<Vec<f32>, ForwardError> {
        let mut out = self.forward_seqs(&mut [(tokens, kv, logits)], tag)?;
        Ok(out.pop().unwrap_or_default())
    }

    /// One pass over the new tokens of several sequences (rows back to back):
    /// norms, projections, router and experts run over all rows at once,
    /// attention per sequence. Every row's numbers are independent of the
    /// others, so a sequence gets the same logits alone or in a batch.
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
        let mut routing = Vec::with_capacity(cfg.num_hidden_layers);
        let mut xn = vec![0f32; n * hidden];
        for (l, lw) in w.layers.iter().enumerate() {
            let _span = tracing::trace_span!("layer", l).entered();
            for t in 0..n {
                rms_norm(
                    &x[t * hidden..(t + 1) * hidden],
                    &lw.input_norm,
                    eps,
                    &mut xn[t * hidden..(t + 1) * hidden],
                );
            }
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
            for t in 0..n {
                rms_norm(
                    &x[t * hidden..(t + 1) * hidden],
                    &lw.post_norm,
                    eps,
                    &mut xn[t * hidden..(t + 1) * hidden],
                );
            }
            let routes = moe_block(
                cfg,
                lw,
                self.source.as_ref(),
                tag.at_layer(l as u32),
                &xn,
                n,
                &mut x,
            )?;
            routing.push(routes);
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

impl SequenceState for KvCache {
    fn len(&self) -> usize {
        KvCache::len(self)
    }
    fn truncate(&mut self, n: usize) {
        KvCache::truncate(self, n)
    }
    fn record_bytes(&self) -> usize {
        KvCache::record_bytes(self)
    }
    fn position_bytes(&self, pos: usize) -> Vec<u8> {
        KvCache::position_bytes(self, pos)
    }
    fn push_position_bytes(&mut self, bytes: &[u8]) -> bool {
        KvCache::push_position_bytes(self, bytes)
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl LanguageModel for Olmoe {
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }
    fn max_positions(&self) -> usize {
        self.cfg.max_position_embeddings
    }
    fn fingerprint(&self) -> u64 {
        let c = &self.cfg;
        fingerprint(&[
            0x4f_4c4d_6f45, // "OLMoE"
            c.vocab_size as u64,
            c.hidden_size as u64,
            c.num_hidden_layers as u64,
            c.num_attention_heads as u64,
            c.kv_heads() as u64,
            c.head_dim() as u64,
            c.num_experts as u64,
            c.intermediate_size as u64,
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
        Olmoe::forward(self, tokens, kv, tag, logits)
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
