//! DeepSeek-V3.2's registration: `model_type` "deepseek_v32", read by
//! [`GlmConfig`], whose family behaviour (MLA KV size with the indexer key,
//! loader, convert rules, DeepSeek chat format) it shares.

use std::path::Path;

use crate::config::ConfigError;
use crate::model::family::{Family, FamilyConfig};
use crate::model::glm::GlmConfig;
use crate::synth::SynthPreset;

/// The registry entry for DeepSeek-V3.2.
pub(crate) struct DeepseekV32Family;

/// Listed in [`crate::model::FAMILIES`].
pub(crate) static DEEPSEEK_V32: DeepseekV32Family = DeepseekV32Family;

impl Family for DeepseekV32Family {
    fn model_types(&self) -> &'static [&'static str] {
        &["deepseek_v32"]
    }

    fn synth_presets(&self) -> &'static [SynthPreset] {
        &[
            SynthPreset {
                name: "deepseek-v3.2",
                build: super::synth::deepseek_v32,
            },
            SynthPreset {
                name: "deepseek-v32-tiny",
                build: super::synth::deepseek_v32_tiny,
            },
        ]
    }

    fn parse(&self, path: &Path, value: serde_json::Value) -> Result<Box<dyn FamilyConfig>, ConfigError> {
        Ok(Box::new(GlmConfig::from_json(path, value)?))
    }

    /// DeepSeek-V3.2's shape in miniature, as transformers 5 writes it
    /// (`layer_types`, `mlp_layer_types`, `rope_parameters`).
    fn fuzz_seeds(&self) -> Vec<serde_json::Value> {
        vec![serde_json::json!({
            "model_type": "deepseek_v32", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
            "q_lora_rank": 16, "kv_lora_rank": 8, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8,
            "v_head_dim": 6, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
            "n_group": 2, "topk_group": 1, "index_topk": 4, "index_head_dim": 8, "index_n_heads": 2,
            "mlp_layer_types": ["dense", "sparse", "sparse"],
            "layer_types": ["indexed_attention", "indexed_attention", "indexed_attention"],
            "routed_scaling_factor": 2.5, "eos_token_id": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}
        })]
    }
}
