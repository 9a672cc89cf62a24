//! The DeepSeek-V3.2 shape of a synthetic model (`coli synth --preset
//! deepseek-v3.2`, `deepseek-v32-tiny`): DeepSeek-V3's MLA with the DSA
//! indexer on every layer, dense leading layers, then 256 routed experts
//! in 8 groups behind the sigmoid router, written as transformers 5 writes
//! `deepseek_v32` (`layer_types`, `mlp_layer_types`, `rope_parameters`).

use std::sync::Arc;

use crate::quant::QFormat;
use crate::synth::{GlmShape, Registered, SynthFamily, SynthSpec, SynthTensor};

/// A DeepSeek-V3.2 [`SynthSpec`]'s MLA, indexer and router sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct DeepseekV32Shape(pub GlmShape);

impl SynthFamily for DeepseekV32Shape {
    fn model_type(&self) -> &'static str {
        "deepseek_v32"
    }

    fn name(&self) -> &'static str {
        "DeepSeek-V3.2"
    }

    /// `<｜end▁of▁sentence｜>`.
    fn eos_id(&self) -> usize {
        1
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
                ("architectures", serde_json::json!(["DeepseekV32ForCausalLM"])),
                ("model_type", serde_json::json!("deepseek_v32")),
                ("first_k_dense_replace", serde_json::json!(g.first_dense)),
                ("mlp_layer_types", serde_json::json!(g.mlp_layer_types(s.layers))),
                (
                    "layer_types",
                    serde_json::json!(vec!["indexed_attention"; s.layers]),
                ),
                ("index_topk", serde_json::json!(g.index_topk)),
                ("index_head_dim", serde_json::json!(g.index_head_dim)),
                ("index_n_heads", serde_json::json!(g.index_n_heads)),
            ],
        )
    }

    fn layer_tensors(&self, s: &SynthSpec, l: usize) -> Vec<SynthTensor> {
        self.0
            .mla_layer_tensors(l, (s.hidden, s.heads, s.experts, s.intermediate), true)
    }
}

/// DeepSeek-V3.2's real shape: vocabulary 129280, hidden 7168, 61 layers
/// (3 dense of intermediate 18432, then 58 with 256 routed experts in 8
/// groups, 4 groups and 8 experts per token, intermediate 2048, plus one
/// shared), 128 heads of MLA (q rank 1536, KV rank 512, 128 + 64 key and
/// 128 value dimensions) with a 64-head indexer of 128 choosing 2048
/// positions; int4-g64 experts (24.8 MB each), int8 dense. All 61 layers
/// are about 385 GB: the default 4 (3 dense, 1 sparse, 10.3 GB) is what a
/// benchmark disk holds, and `--layers` picks more (about 6.5 GB a sparse
/// layer). Positions are capped at 4096 (the release stretches 4096 to
/// 163840 by YaRN); the MTP layer is left out.
pub fn deepseek_v32() -> SynthSpec {
    SynthSpec {
        vocab: 129_280,
        hidden: 7168,
        layers: 4,
        heads: 128,
        experts: 256,
        top_k: 8,
        intermediate: 2048,
        max_position_embeddings: 4096,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-6,
        expert_format: QFormat::Int4Grouped { group: 64 },
        dense_format: QFormat::Int8,
        seed: 0,
        family: Registered(Arc::new(DeepseekV32Shape(GlmShape {
            dense_intermediate: 18432,
            first_dense: 3,
            q_lora_rank: 1536,
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
            index_n_heads: 64,
            index_head_dim: 128,
            index_topk: 2048,
            n_group: 8,
            topk_group: 4,
            n_shared_experts: 1,
            routed_scaling_factor: 2.5,
        }))),
    }
}

/// The DeepSeek-V3.2 layout at a few hundred KB (grouped routing and an
/// indexer that selects fewer positions than a prompt has): for tests.
pub fn deepseek_v32_tiny() -> SynthSpec {
    SynthSpec {
        vocab: 256,
        hidden: 64,
        layers: 3,
        heads: 4,
        experts: 8,
        top_k: 2,
        intermediate: 32,
        max_position_embeddings: 256,
        expert_format: QFormat::Int8,
        family: Registered(Arc::new(DeepseekV32Shape(GlmShape {
            n_group: 2,
            topk_group: 1,
            ..GlmShape::tiny()
        }))),
        ..deepseek_v32()
    }
}
