//! The OLMoE model: prefill of many tokens in one batched pass, or one
//! decode step, through the shared Llama-style MoE pass with OLMoE's
//! attention options (full-width q/k norm, `clip_qkv`).

use std::sync::Arc;

use colibri_actors::{ExpertSource, Tag};

use super::OlmoeConfig;
use crate::model::attention::{AttnSpec, QkNorm};
use crate::model::expert::ExpertWeights;
use crate::model::kv_cache::{KvCache, KvTypes};
use crate::model::lm::{
    BatchItem, BatchedForward, ForwardError, LanguageModel, Logits, SequenceState, TypedItem, fingerprint,
};
use crate::model::moe_decoder::{DenseWeights, Pass, run_pass};
use crate::model::ops::Rope;
use crate::model::routed::{Router, Routing};

/// An OLMoE model ready to run: resident weights plus a source of experts.
pub struct Olmoe {
    pub cfg: OlmoeConfig,
    pub weights: Arc<DenseWeights>,
    pub source: Arc<dyn ExpertSource<ExpertWeights>>,
    rope: Rope,
    /// One per layer (all equal).
    attn: Vec<AttnSpec>,
    /// Routing decisions of the last forward (per layer, per token), kept
    /// for statistics and tests.
    pub last_routing: Vec<Vec<Routing>>,
    /// How new caches store keys and values (f32 unless the engine says
    /// otherwise, see [`LanguageModel::set_kv_types`]).
    kv_types: KvTypes,
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
        let attn = vec![attn; weights.layers.len()];
        Self {
            cfg,
            weights,
            source,
            rope,
            attn,
            last_routing: Vec::new(),
            kv_types: KvTypes::default(),
        }
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::with_types(
            self.cfg.num_hidden_layers,
            self.cfg.kv_heads() * self.cfg.head_dim(),
            self.kv_types,
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
        let pass = Pass {
            vocab: cfg.vocab_size,
            max_positions: cfg.max_position_embeddings,
            hidden: cfg.hidden_size,
            eps: cfg.rms_norm_eps as f32,
            num_experts: cfg.num_experts,
            top_k: cfg.num_experts_per_tok,
            router: Router::Softmax {
                renorm: cfg.norm_topk_prob,
            },
            attn: &self.attn,
            rope: &self.rope,
        };
        let (logits, routing) = run_pass(&pass, &self.weights, self.source.as_ref(), seqs, tag)?;
        self.last_routing = routing;
        Ok(logits)
    }
}

impl SequenceState for KvCache {
    fn len(&self) -> usize {
        KvCache::len(self)
    }
    fn truncate(&mut self, n: usize) -> usize {
        KvCache::truncate(self, n);
        self.len()
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
    fn payload_kind(&self) -> u32 {
        self.types().header_code()
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl BatchedForward for Olmoe {
    type State = KvCache;
    fn run_batch(
        &mut self,
        seqs: &mut [TypedItem<'_, KvCache>],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        self.forward_seqs(seqs, tag)
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
    fn set_kv_types(&mut self, kv: KvTypes) -> bool {
        self.kv_types = kv;
        true
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
