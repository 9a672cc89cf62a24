//! The GLM-4.x MoE shape of a synthetic model (`coli synth --preset
//! glm-4.5-air`, `glm4-tiny`): grouped-query attention with q/k/v biases
//! and partial rotary, leading dense layers, then a sigmoid router with a
//! correction bias and shared experts, written as transformers writes
//! `glm4_moe` (no MTP layer: the synthetic model has none).

use std::sync::Arc;

use crate::quant::QFormat;
use crate::synth::{DecoderShape, Registered, SpecError, SynthFamily, SynthSpec, SynthTensor, deepseek_mlp};

/// The sizes of a GLM-4.x MoE [`SynthSpec`] beyond the spec's own (whose
/// `intermediate` is the routed experts' `moe_intermediate_size`).
#[derive(Clone, Debug, PartialEq)]
pub struct Glm4Shape {
    pub attn: DecoderShape,
    /// The dense leading layers' MLP size (`intermediate_size`).
    pub dense_intermediate: usize,
    /// Leading dense layers (`first_k_dense_replace`).
    pub first_dense: usize,
    /// Shared experts, one SwiGLU of `intermediate × n_shared_experts` rows.
    pub n_shared_experts: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f64,
    /// Share of each head that is rotated.
    pub partial_rotary_factor: f64,
    /// Per-head q/k norms (`use_qk_norm`).
    pub qk_norm: bool,
}

impl Glm4Shape {
    /// GLM-4.5-Air's: 8 KV heads of 128, half of each rotated, one dense
    /// layer of 10944, one shared expert, no q/k norms.
    pub fn glm45_air() -> Self {
        Self {
            attn: DecoderShape {
                kv_heads: 8,
                head_dim: 128,
            },
            dense_intermediate: 10944,
            first_dense: 1,
            n_shared_experts: 1,
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: 1.0,
            partial_rotary_factor: 0.5,
            qk_norm: false,
        }
    }

    /// GLM-4.5-Air's at a few hundred KB: 2 KV heads of 24, one dense
    /// layer of 96.
    pub fn tiny() -> Self {
        Self {
            attn: DecoderShape {
                kv_heads: 2,
                head_dim: 24,
            },
            dense_intermediate: 96,
            ..Self::glm45_air()
        }
    }
}

impl SynthFamily for Glm4Shape {
    fn model_type(&self) -> &'static str {
        "glm4_moe"
    }

    fn name(&self) -> &'static str {
        "GLM-4"
    }

    /// GLM-4's `<|endoftext|>`.
    fn eos_id(&self) -> usize {
        151329
    }

    fn decoder(&self) -> Option<&DecoderShape> {
        Some(&self.attn)
    }

    fn sparse_layers(&self, spec: &SynthSpec) -> usize {
        spec.layers.saturating_sub(self.first_dense)
    }

    fn config_json(&self, s: &SynthSpec) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["Glm4MoeForCausalLM"],
            "model_type": "glm4_moe",
            "vocab_size": s.vocab,
            "hidden_size": s.hidden,
            "intermediate_size": self.dense_intermediate,
            "moe_intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": self.attn.kv_heads,
            "head_dim": self.attn.head_dim,
            "partial_rotary_factor": self.partial_rotary_factor,
            "attention_bias": true,
            "use_qk_norm": self.qk_norm,
            "n_routed_experts": s.experts,
            "n_shared_experts": self.n_shared_experts,
            "num_experts_per_tok": s.top_k,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "routed_scaling_factor": self.routed_scaling_factor,
            "norm_topk_prob": true,
            "first_k_dense_replace": self.first_dense,
            "num_nextn_predict_layers": 0,
            "max_position_embeddings": s.max_position_embeddings,
            "rope_theta": s.rope_theta,
            "rope_scaling": null,
            "rms_norm_eps": s.rms_norm_eps,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "bos_token_id": null,
            "eos_token_id": s.eos_id(),
            "colibri_synthetic": { "seed": s.seed },
        })
    }

    /// q/k/v biases, then a dense MLP for the leading layers, else the
    /// sigmoid router with its correction bias, the shared expert and the
    /// routed ones.
    fn layer_tensors(&self, s: &SynthSpec, l: usize) -> Vec<SynthTensor> {
        let (h, experts, inter) = (s.hidden, s.experts, s.intermediate);
        let mut out = self.attn.attention(l, h, s.heads, true, false);
        if self.qk_norm {
            out.extend(self.attn.qk_norms(l));
        }
        out.extend(deepseek_mlp(
            l,
            (h, experts, inter),
            (self.first_dense, self.dense_intermediate),
            inter * self.n_shared_experts,
        ));
        out
    }

    /// Formats, then GLM-4's own parser, whose messages name the fault
    /// (heads that do not group, no sparse layer after the dense ones).
    fn validate(&self, s: &SynthSpec) -> Result<(), SpecError> {
        s.check_parsed(super::from_json)
    }

    fn scaled(&self, round: &dyn Fn(usize, usize) -> usize) -> Result<Arc<dyn SynthFamily>, String> {
        Ok(Arc::new(Self {
            dense_intermediate: round(self.dense_intermediate, 8),
            ..self.clone()
        }))
    }
}

impl SynthSpec {
    /// GLM-4.5-Air's real shape (vocabulary 151552, hidden 4096, 46
    /// layers of which the first is dense, 96 query heads and 8 KV heads
    /// of 128 with half of each rotated, q/k/v biases, 128 routed experts
    /// top-8 of intermediate 1408 plus one shared, dense MLP 10944) with
    /// int8 experts, like the other Llama-style decoder presets: about
    /// 110 GB. Positions are capped at 4096 (the real model has 131072);
    /// the next-token (MTP) layer is left out, as for GLM-5.
    pub fn glm45_air() -> Self {
        Self {
            vocab: 151552,
            hidden: 4096,
            layers: 46,
            heads: 96,
            experts: 128,
            top_k: 8,
            intermediate: 1408,
            max_position_embeddings: 4096,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-5,
            expert_format: QFormat::Int8,
            dense_format: QFormat::Int8,
            seed: 0,
            family: Registered(Arc::new(Glm4Shape::glm45_air())),
        }
    }

    /// The GLM-4.5-Air layout at a few hundred KB (one dense layer then
    /// two sparse ones, grouped-query heads of 24 where hidden / heads is
    /// 16): for tests.
    pub fn glm4_tiny() -> Self {
        Self {
            vocab: 256,
            hidden: 64,
            layers: 3,
            heads: 4,
            experts: 8,
            top_k: 2,
            intermediate: 32,
            max_position_embeddings: 256,
            family: Registered(Arc::new(Glm4Shape::tiny())),
            ..Self::glm45_air()
        }
    }
}
