//! The GLM-4.7-Flash shape of a synthetic model (`coli synth --preset
//! glm-4.7-flash`, `glm47-flash-tiny`): DeepSeek-V3's MLA without an
//! indexer, one dense leading layer by `mlp_layer_types`, then routed
//! experts plus a shared one behind GLM's sigmoid router.

use std::sync::Arc;

use crate::quant::QFormat;
use crate::synth::{GlmShape, Registered, SynthFamily, SynthSpec, SynthTensor};

/// A GLM-4.7-Flash [`SynthSpec`]'s MLA and router sizes (the indexer's
/// fields of [`GlmShape`] are unused).
#[derive(Clone, Debug, PartialEq)]
pub struct Glm47FlashShape(pub GlmShape);

impl SynthFamily for Glm47FlashShape {
    fn model_type(&self) -> &'static str {
        "glm4_moe_lite"
    }

    fn name(&self) -> &'static str {
        "GLM-4.7-Flash"
    }

    /// `<|endoftext|>` of the GLM-4.7 vocabulary.
    fn eos_id(&self) -> usize {
        154_820
    }

    fn head_dim(&self, _spec: &SynthSpec) -> usize {
        self.0.qk_nope_head_dim + self.0.qk_rope_head_dim
    }

    fn sparse_layers(&self, spec: &SynthSpec) -> usize {
        spec.layers.saturating_sub(self.0.first_dense)
    }

    fn config_json(&self, s: &SynthSpec) -> serde_json::Value {
        let g = &self.0;
        g.mla_config_with(
            s,
            vec![
                ("architectures", serde_json::json!(["Glm4MoeLiteForCausalLM"])),
                ("model_type", serde_json::json!("glm4_moe_lite")),
                ("mlp_layer_types", serde_json::json!(g.mlp_layer_types(s.layers))),
                ("rope_interleave", serde_json::json!(true)),
            ],
        )
    }

    fn layer_tensors(&self, s: &SynthSpec, l: usize) -> Vec<SynthTensor> {
        self.0
            .mla_layer_tensors(l, (s.hidden, s.heads, s.experts, s.intermediate), false)
    }
}

/// GLM-4.7-Flash's real shape: vocabulary 154880, hidden 2048, 47 layers
/// (the first dense of intermediate 10240, then 46 with 64 routed experts
/// top-4 of intermediate 1536 plus one shared), 20 heads of MLA (q rank
/// 768, KV rank 512, 192 + 64 key and 256 value dimensions); int8 experts
/// (9.5 MB each) and dense, about 30 GB. Positions are capped at 4096 (the release has
/// 202752); the MTP layer is left out.
pub fn glm47_flash() -> SynthSpec {
    SynthSpec {
        vocab: 154_880,
        hidden: 2048,
        layers: 47,
        heads: 20,
        experts: 64,
        top_k: 4,
        intermediate: 1536,
        max_position_embeddings: 4096,
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-5,
        expert_format: QFormat::Int8,
        dense_format: QFormat::Int8,
        seed: 0,
        family: Registered(Arc::new(Glm47FlashShape(GlmShape {
            dense_intermediate: 10240,
            first_dense: 1,
            q_lora_rank: 768,
            kv_lora_rank: 512,
            qk_nope_head_dim: 192,
            qk_rope_head_dim: 64,
            v_head_dim: 256,
            index_n_heads: 0,
            index_head_dim: 0,
            index_topk: 0,
            n_group: 1,
            topk_group: 1,
            n_shared_experts: 1,
            routed_scaling_factor: 1.8,
        }))),
    }
}

/// The GLM-4.7-Flash layout at a few hundred KB: for tests.
pub fn glm47_flash_tiny() -> SynthSpec {
    SynthSpec {
        vocab: 256,
        hidden: 64,
        layers: 3,
        heads: 4,
        experts: 8,
        top_k: 2,
        intermediate: 32,
        max_position_embeddings: 256,
        family: Registered(Arc::new(Glm47FlashShape(GlmShape {
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: 1.8,
            index_n_heads: 0,
            index_head_dim: 0,
            index_topk: 0,
            ..GlmShape::tiny()
        }))),
        ..glm47_flash()
    }
}
