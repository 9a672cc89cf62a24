//! The forward pass of a Llama-style MoE decoder (Qwen3-MoE, Mixtral,
//! GLM-4.x, gpt-oss) over a batch of sequences, with routed experts
//! fetched through an [`ExpertSource`].

use std::sync::Arc;

use colibri_actors::{ExpertSource, Tag};

use super::config::{DecoderKind, MoeDecoderConfig, RouterChoice};
use super::weights::{DenseWeights, Ffn};
use crate::model::attention::{AttnSpec, QkNorm, add_bias, attend};
use crate::model::expert::ExpertWeights;
use crate::model::kv_cache::{KvCache, KvTypes};
use crate::model::lm::{
    BatchItem, BatchedForward, ForwardError, LanguageModel, Logits, SequenceState, TypedItem, check_tokens,
    fingerprint, output_logits,
};
use crate::model::ops::{Rope, rms_norm};
use crate::model::routed::{GroupLimited, Router, Routing, routed_sum};

/// A Llama-style MoE decoder ready to run: resident weights plus a source
/// of experts.
pub struct MoeDecoder {
    pub cfg: MoeDecoderConfig,
    pub weights: Arc<DenseWeights>,
    pub source: Arc<dyn ExpertSource<ExpertWeights>>,
    rope: Rope,
    /// Per layer (the sliding window may differ between layers).
    attn: Vec<AttnSpec>,
    router: Router,
    /// Routing decisions of the last forward (per sparse layer, per token).
    pub last_routing: Vec<Vec<Routing>>,
    /// How new caches store keys and values (f32 unless the engine says
    /// otherwise, see [`LanguageModel::set_kv_types`]).
    kv_types: KvTypes,
}

impl MoeDecoder {
    pub fn new(
        cfg: MoeDecoderConfig,
        weights: Arc<DenseWeights>,
        source: Arc<dyn ExpertSource<ExpertWeights>>,
    ) -> Self {
        let rope = Rope::scaled(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling.as_ref());
        let attn = (0..weights.layers.len())
            .map(|l| AttnSpec {
                hidden: cfg.hidden_size,
                heads: cfg.num_attention_heads,
                kv_heads: cfg.num_key_value_heads,
                head_dim: cfg.head_dim,
                eps: cfg.rms_norm_eps as f32,
                qk_norm: match (cfg.qk_norm, cfg.qk_norm_full_width()) {
                    (false, _) => QkNorm::None,
                    (true, false) => QkNorm::PerHead,
                    (true, true) => QkNorm::Full,
                },
                clip: None,
                window: cfg.window(l),
            })
            .collect();
        let router = router_of(&cfg);
        Self {
            cfg,
            weights,
            source,
            rope,
            attn,
            router,
            last_routing: Vec::new(),
            kv_types: KvTypes::default(),
        }
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::with_types(
            self.cfg.num_hidden_layers,
            self.cfg.num_key_value_heads * self.cfg.head_dim,
            self.kv_types,
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
        let pass = Pass {
            vocab: cfg.vocab_size,
            max_positions: cfg.max_position_embeddings,
            hidden: cfg.hidden_size,
            eps: cfg.rms_norm_eps as f32,
            num_experts: cfg.num_experts,
            top_k: cfg.num_experts_per_tok,
            router: self.router,
            attn: &self.attn,
            rope: &self.rope,
        };
        let (logits, routing) = run_pass(&pass, &self.weights, self.source.as_ref(), seqs, tag)?;
        self.last_routing = routing;
        Ok(logits)
    }
}

/// The router a decoder config describes.
pub(crate) fn router_of(cfg: &MoeDecoderConfig) -> Router {
    match cfg.router {
        RouterChoice::Softmax => Router::Softmax {
            renorm: cfg.norm_topk_prob,
        },
        RouterChoice::TopKSoftmax => Router::TopKSoftmax,
        RouterChoice::Sigmoid {
            n_group,
            topk_group,
            routed_scaling_factor,
        } => Router::Sigmoid(GroupLimited {
            n_group,
            topk_group,
            renorm: cfg.norm_topk_prob,
            scale: routed_scaling_factor as f32,
            // transformers' Glm4MoeTopkRouter fills dropped groups with 0.
            dropped: 0.0,
        }),
    }
}

/// What a pass of a Llama-style MoE decoder needs besides its weights
/// (shared with OLMoE, whose layers are this decoder's with full-width q/k
/// norms and `clip_qkv`).
pub(crate) struct Pass<'a> {
    pub vocab: usize,
    pub max_positions: usize,
    pub hidden: usize,
    pub eps: f32,
    pub num_experts: usize,
    pub top_k: usize,
    pub router: Router,
    /// One spec per layer.
    pub attn: &'a [AttnSpec],
    pub rope: &'a Rope,
}

/// Each sequence's wanted logits, and the routing of every sparse layer
/// (per token).
pub(crate) type PassOutput = (Vec<Vec<f32>>, Vec<Vec<Routing>>);

/// One pass over the new tokens of several sequences: returns each
/// sequence's wanted logits and the routing of every sparse layer.
pub(crate) fn run_pass(
    p: &Pass<'_>,
    w: &DenseWeights,
    source: &dyn ExpertSource<ExpertWeights>,
    seqs: &mut [(&[u32], &mut KvCache, Logits)],
    tag: Tag,
) -> Result<PassOutput, ForwardError> {
    let hidden = p.hidden;
    let eps = p.eps;
    let layers = w.layers.len();
    for (tokens, kv, _) in seqs.iter() {
        check_tokens(tokens, kv.len(), p.vocab, p.max_positions)?;
    }
    let n: usize = seqs.iter().map(|(t, _, _)| t.len()).sum();
    if n == 0 {
        return Ok((vec![Vec::new(); seqs.len()], Vec::new()));
    }
    let mut x = vec![0f32; n * hidden];
    for (t, &id) in seqs.iter().flat_map(|(t, _, _)| t.iter()).enumerate() {
        w.embed
            .dequantize_row(id as usize, &mut x[t * hidden..(t + 1) * hidden]);
    }
    let mut parts: Vec<(usize, &mut KvCache)> =
        seqs.iter_mut().map(|(t, kv, _)| (t.len(), &mut **kv)).collect();
    source.advance(tag.at_layer(0));
    // Dense leading layers: guess the first sparse layer's experts from the
    // embedding already, so its reads run while the dense layers compute
    // (the disk is otherwise idle from the last sparse layer of one token
    // to the first of the next). The usual two guesses follow.
    if let Some(first) = w.layers.iter().position(|lw| matches!(lw.ffn, Ffn::Moe { .. }))
        && first > 0
    {
        source.pilot(tag.at_layer(first as u32), &x[(n - 1) * hidden..n * hidden]);
    }
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
            attend(&p.attn[l], &lw.attn, p.rope, l, &xn, &mut parts)
        };
        for (a, b) in x.iter_mut().zip(&attn) {
            *a += b;
        }
        // Offer the residual of the last token to the pilot of layer l+1.
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
            Ffn::Moe {
                router,
                router_bias,
                correction,
                shared,
            } => {
                let ne = p.num_experts;
                let mut logits = vec![0f32; n * ne];
                router.matmul(&xn, n, &mut logits);
                add_bias(&mut logits, router_bias);
                let routes: Vec<Routing> = logits
                    .chunks_exact(ne)
                    .map(|r| p.router.route(r, correction, p.top_k))
                    .collect();
                let mut acc = routed_sum(source, tag.at_layer(l as u32), &routes, ne, &xn, hidden)?;
                if let Some(shared) = shared {
                    let mut y = vec![0f32; n * hidden];
                    shared.forward(&xn, n, &mut y);
                    for (a, b) in acc.iter_mut().zip(&y) {
                        *a += b;
                    }
                }
                routing.push(routes);
                acc
            }
        };
        for (a, b) in x.iter_mut().zip(&out) {
            *a += b;
        }
        // And once more with the layer's output, the next layer's input: a
        // later guess, closer to its routing (it misses only the next
        // attention); the pilot adds the experts the first one missed.
        if l + 1 < layers {
            source.pilot(tag.at_layer(l as u32 + 1), &x[(n - 1) * hidden..n * hidden]);
        }
    }
    for (m, kv) in parts.iter_mut() {
        kv.commit(*m);
    }
    let _s = tracing::trace_span!("lm_head").entered();
    let wants: Vec<(usize, Logits)> = seqs.iter().map(|(t, _, want)| (t.len(), *want)).collect();
    Ok((
        output_logits(&x, hidden, &wants, &w.final_norm, eps, &w.lm_head),
        routing,
    ))
}

impl BatchedForward for MoeDecoder {
    type State = KvCache;
    fn run_batch(
        &mut self,
        seqs: &mut [TypedItem<'_, KvCache>],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        self.forward_seqs(seqs, tag)
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
                DecoderKind::Qwen3Moe => 0x5177_656e_334d,  // "Qwen3M"
                DecoderKind::Mixtral => 0x4d69_7874_7261,   // "Mixtra"
                DecoderKind::Glm4Moe => 0x476c_6d34_4d6f,   // "Glm4Mo"
                DecoderKind::GptOss => 0x4770_744f_7373,    // "GptOss"
                DecoderKind::MiniMaxM2 => 0x4d69_6e69_4d32, // "MiniM2"
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
            c.rotary_dim as u64,
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
