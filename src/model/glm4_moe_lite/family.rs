//! GLM-4.7-Flash's registration: `model_type` "glm4_moe_lite", read by
//! [`GlmConfig`], whose family behaviour (MLA KV size, loader with the MTP
//! module when present, convert rules, GLM chat format) it shares.

use std::path::Path;

use crate::config::ConfigError;
use crate::model::family::{Family, FamilyConfig};
use crate::model::glm::GlmConfig;
use crate::synth::SynthPreset;

/// The registry entry for GLM-4.7-Flash.
pub(crate) struct Glm4MoeLiteFamily;

/// Listed in [`crate::model::FAMILIES`].
pub(crate) static GLM4_MOE_LITE: Glm4MoeLiteFamily = Glm4MoeLiteFamily;

impl Family for Glm4MoeLiteFamily {
    fn model_types(&self) -> &'static [&'static str] {
        &["glm4_moe_lite"]
    }

    fn synth_presets(&self) -> &'static [SynthPreset] {
        &[
            SynthPreset {
                name: "glm-4.7-flash",
                build: super::synth::glm47_flash,
            },
            SynthPreset {
                name: "glm47-flash-tiny",
                build: super::synth::glm47_flash_tiny,
            },
        ]
    }

    fn parse(&self, path: &Path, value: serde_json::Value) -> Result<Box<dyn FamilyConfig>, ConfigError> {
        Ok(Box::new(GlmConfig::from_json(path, value)?))
    }

    /// GLM-4.7-Flash's own shape in miniature: a dense first layer by
    /// `mlp_layer_types`, one group, an MTP layer, RoPE as transformers 5
    /// writes it.
    fn fuzz_seeds(&self) -> Vec<serde_json::Value> {
        vec![serde_json::json!({
            "model_type": "glm4_moe_lite", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 8, "qk_rope_head_dim": 4,
            "qk_nope_head_dim": 8, "v_head_dim": 6, "n_routed_experts": 8, "n_shared_experts": 1,
            "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "norm_topk_prob": true,
            "routed_scaling_factor": 1.8, "mlp_layer_types": ["dense", "sparse", "sparse"],
            "num_nextn_predict_layers": 1, "eos_token_id": [1, 2],
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}
        })]
    }
}
