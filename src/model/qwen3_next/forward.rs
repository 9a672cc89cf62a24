//! The forward pass of Qwen3-Next / Qwen3.5-MoE over a batch of sequences:
//! linear-attention and gated full-attention layers in the configured
//! pattern, each followed by a routed MoE with a sigmoid-gated shared
//! expert (or a dense MLP), routed experts fetched through the source and
//! guessed one layer ahead for the pilot.

use std::sync::Arc;

use colibri_actors::{ExpertSource, Tag};

use super::config::{LayerKind, Qwen3NextConfig};
use super::delta_net;
use super::state::HybridState;
use super::weights::{Mixer, Weights};
use crate::model::attention::{AttnSpec, QkNorm, attend};
use crate::model::expert::ExpertWeights;
use crate::model::kv_cache::{KvCache, KvTypes};
use crate::model::lm::{
    BatchItem, BatchedForward, ForwardError, LanguageModel, Logits, SequenceState, TypedItem, check_tokens,
    fingerprint, output_logits,
};
use crate::model::moe_decoder::Ffn;
use crate::model::ops::{Rope, rms_norm, sigmoid};
use crate::model::routed::{Router, Routing, routed_sum};

/// A Qwen3-Next / Qwen3.5-MoE model ready to run.
pub struct Qwen3Next {
    pub cfg: Qwen3NextConfig,
    pub weights: Arc<Weights>,
    pub source: Arc<dyn ExpertSource<ExpertWeights>>,
    rope: Rope,
    attn: AttnSpec,
    router: Router,
    /// Layer `l`'s slot among its kind (KV cache layer or linear state).
    slot: Vec<usize>,
    kv_types: KvTypes,
}

impl Qwen3Next {
    pub fn new(
        cfg: Qwen3NextConfig,
        weights: Arc<Weights>,
        source: Arc<dyn ExpertSource<ExpertWeights>>,
    ) -> Self {
        let c = &cfg.base;
        let rope = Rope::scaled(c.rotary_dim, c.rope_theta, c.rope_scaling.as_ref());
        let attn = AttnSpec {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            eps: c.rms_norm_eps as f32,
            qk_norm: QkNorm::PerHead,
            clip: None,
            window: None,
        };
        let router = Router::Softmax {
            renorm: c.norm_topk_prob,
        };
        let (mut full, mut linear) = (0, 0);
        let slot = cfg
            .layers
            .iter()
            .map(|k| {
                let counter = match k {
                    LayerKind::Full => &mut full,
                    LayerKind::Linear => &mut linear,
                };
                *counter += 1;
                *counter - 1
            })
            .collect();
        Self {
            cfg,
            weights,
            source,
            rope,
            attn,
            router,
            slot,
            kv_types: KvTypes::default(),
        }
    }

    pub fn new_hybrid_state(&self) -> HybridState {
        let c = &self.cfg.base;
        let kv = KvCache::with_types(
            self.cfg.full_layers().len(),
            c.num_key_value_heads * c.head_dim,
            self.kv_types,
        );
        HybridState::new(kv, self.cfg.linear_layers(), &self.cfg.linear)
    }

    /// One pass over the new tokens of several sequences (rows back to
    /// back); a sequence's numbers are the same alone or in a batch.
    pub fn forward_seqs(
        &mut self,
        seqs: &mut [(&[u32], &mut HybridState, Logits)],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let c = &self.cfg.base;
        let (hidden, eps) = (c.hidden_size, c.rms_norm_eps as f32);
        for (tokens, st, _) in seqs.iter() {
            check_tokens(tokens, st.len(), c.vocab_size, c.max_position_embeddings)?;
        }
        let n: usize = seqs.iter().map(|(t, _, _)| t.len()).sum();
        if n == 0 {
            return Ok(vec![Vec::new(); seqs.len()]);
        }
        let w = &self.weights;
        let source = self.source.as_ref();
        let mut x = vec![0f32; n * hidden];
        for (t, &id) in seqs.iter().flat_map(|(t, _, _)| t.iter()).enumerate() {
            w.embed
                .dequantize_row(id as usize, &mut x[t * hidden..(t + 1) * hidden]);
        }
        for (tokens, st, _) in seqs.iter_mut() {
            st.begin(tokens.len());
        }
        let mut parts: Vec<(usize, &mut HybridState)> =
            seqs.iter_mut().map(|(t, st, _)| (t.len(), &mut **st)).collect();
        source.advance(tag.at_layer(0));
        let layers = w.layers.len();
        let mut xn = vec![0f32; n * hidden];
        let norm_rows = |x: &[f32], weight: &[f32], out: &mut [f32]| {
            for (xr, or) in x.chunks_exact(hidden).zip(out.chunks_exact_mut(hidden)) {
                rms_norm(xr, weight, eps, or);
            }
        };
        for (l, lw) in w.layers.iter().enumerate() {
            let _span = tracing::trace_span!("layer", l).entered();
            norm_rows(&x, &lw.input_norm, &mut xn);
            let mixed = match &lw.mixer {
                Mixer::Linear(lin) => {
                    let _s = tracing::trace_span!("linear_attention", layer = l).entered();
                    delta_net::forward(&self.cfg.linear, lin, eps, hidden, self.slot[l], &xn, &mut parts)
                }
                Mixer::Full(aw) => {
                    let _s = tracing::trace_span!("attention", layer = l).entered();
                    let mut kvs: Vec<(usize, &mut KvCache)> =
                        parts.iter_mut().map(|(m, st)| (*m, &mut st.kv)).collect();
                    attend(&self.attn, aw, &self.rope, self.slot[l], &xn, &mut kvs)
                }
            };
            for (a, b) in x.iter_mut().zip(&mixed) {
                *a += b;
            }
            if l + 1 < layers {
                source.pilot(tag.at_layer(l as u32 + 1), &x[(n - 1) * hidden..n * hidden]);
            }
            norm_rows(&x, &lw.post_norm, &mut xn);
            let out = match &lw.ffn {
                Ffn::Dense(mlp) => {
                    let mut y = vec![0f32; n * hidden];
                    mlp.forward(&xn, n, &mut y);
                    y
                }
                Ffn::Moe { router, shared, .. } => {
                    let ne = c.num_experts;
                    let mut logits = vec![0f32; n * ne];
                    router.matmul(&xn, n, &mut logits);
                    let routes: Vec<Routing> = logits
                        .chunks_exact(ne)
                        .map(|r| self.router.route(r, &[], c.num_experts_per_tok))
                        .collect();
                    let mut acc = routed_sum(source, tag.at_layer(l as u32), &routes, ne, &xn, hidden)?;
                    if let Some(shared) = shared {
                        let mut y = vec![0f32; n * hidden];
                        shared.forward(&xn, n, &mut y);
                        for ((a, yr), xr) in acc
                            .chunks_exact_mut(hidden)
                            .zip(y.chunks_exact(hidden))
                            .zip(xn.chunks_exact(hidden))
                        {
                            let gate = sigmoid(crate::model::ops::dot(xr, &lw.shared_gate));
                            for (a, b) in a.iter_mut().zip(yr) {
                                *a += gate * b;
                            }
                        }
                    }
                    acc
                }
            };
            for (a, b) in x.iter_mut().zip(&out) {
                *a += b;
            }
            if l + 1 < layers {
                source.pilot(tag.at_layer(l as u32 + 1), &x[(n - 1) * hidden..n * hidden]);
            }
        }
        for (m, st) in parts.iter_mut() {
            st.commit(*m);
        }
        let _s = tracing::trace_span!("lm_head").entered();
        let wants: Vec<(usize, Logits)> = seqs.iter().map(|(t, _, want)| (t.len(), *want)).collect();
        Ok(output_logits(&x, hidden, &wants, &w.final_norm, eps, &w.lm_head))
    }
}

impl BatchedForward for Qwen3Next {
    type State = HybridState;
    fn run_batch(
        &mut self,
        seqs: &mut [TypedItem<'_, HybridState>],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        self.forward_seqs(seqs, tag)
    }
}

impl LanguageModel for Qwen3Next {
    fn vocab_size(&self) -> usize {
        self.cfg.base.vocab_size
    }
    fn max_positions(&self) -> usize {
        self.cfg.base.max_position_embeddings
    }
    fn fingerprint(&self) -> u64 {
        let c = &self.cfg.base;
        let s = &self.cfg.linear;
        let mut parts = vec![
            0x5177_334e_6578, // "Qw3Nex"
            c.vocab_size as u64,
            c.hidden_size as u64,
            c.num_hidden_layers as u64,
            c.num_attention_heads as u64,
            c.num_key_value_heads as u64,
            c.head_dim as u64,
            c.num_experts as u64,
            c.moe_intermediate_size as u64,
            c.rotary_dim as u64,
            s.key_heads as u64,
            s.value_heads as u64,
            s.key_dim as u64,
            s.value_dim as u64,
            s.conv_kernel as u64,
        ];
        parts.extend(self.cfg.layers.iter().map(|k| *k as u64));
        fingerprint(&parts)
    }
    fn set_kv_types(&mut self, kv: KvTypes) -> bool {
        self.kv_types = kv;
        true
    }
    fn new_state(&self) -> Box<dyn SequenceState> {
        Box::new(self.new_hybrid_state())
    }
    fn forward(
        &mut self,
        tokens: &[u32],
        state: &mut dyn SequenceState,
        tag: Tag,
        logits: Logits,
    ) -> Result<Vec<f32>, ForwardError> {
        self.forward_one(tokens, state, tag, logits)
    }
    fn forward_batch(
        &mut self,
        items: &mut [BatchItem<'_>],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        self.forward_many(items, tag)
    }
    fn source(&self) -> &Arc<dyn ExpertSource<ExpertWeights>> {
        &self.source
    }
    fn dense_bytes(&self) -> usize {
        self.weights.resident_bytes()
    }
    fn step_dense_bytes(&self) -> usize {
        self.weights.step_bytes()
    }
}
