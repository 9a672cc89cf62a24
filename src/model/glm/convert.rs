//! GLM-5 (`glm_moe_dsa`) and DeepSeek-V3 (`deepseek_v3`) conversion rules.
//!
//! The planning and writing are shared ([`crate::convert::plan`]); what is
//! particular here is which layers have routed experts (dense leading
//! layers; the MTP layers after the main ones always do), which tensors stay
//! F32, and the MTP layers' precision floor.

use std::path::Path;

use super::config::GlmConfig;
use super::mtp_format;
use crate::config::ConfigError;
use crate::convert::ConvertError;
use crate::convert::plan::{FusedLayout, ModelSpec, layer_of};
use crate::model::expert::ExpertNaming;
use crate::quant::QFormat;

/// Dense tensors kept F32 whatever `--dense` says: vectors (norms, biases,
/// `e_score_correction_bias`), the router, and the indexer's per-head
/// weighting `weights_proj` (a router-like projection the loader reads as F32).
fn keeps_f32(name: &str, shape: &[usize]) -> bool {
    shape.len() != 2
        || name.contains("norm")
        || name.ends_with(".bias")
        || name.ends_with("mlp.gate.weight")
        || name.ends_with("indexer.weights_proj.weight")
}

/// The plan inputs for a GLM / DeepSeek-V3 checkpoint. Layers
/// `num_hidden_layers..num_hidden_layers + num_nextn_predict_layers` are the
/// MTP layers: their routed experts and dense matrices use
/// [`mtp_format`] of the requested formats (never below int8).
/// `config` is config.json's path, for errors.
pub(crate) fn spec(
    cfg: &GlmConfig,
    config: &Path,
    experts: QFormat,
    dense: QFormat,
) -> Result<ModelSpec, ConvertError> {
    let main = cfg.num_hidden_layers;
    let mut expert_layers = cfg.mlp_sparse().map_err(|reason| ConfigError::Invalid {
        path: config.to_path_buf(),
        field: "mlp_layer_types",
        reason,
    })?;
    expert_layers.resize(main + cfg.num_nextn_predict_layers, true);
    let expert_format = (0..expert_layers.len())
        .map(|l| if l < main { experts } else { mtp_format(experts) })
        .collect();
    let mut metadata = vec![("model_type", cfg.model_type.clone())];
    if cfg.num_nextn_predict_layers > 0 {
        metadata.push(("mtp_experts", mtp_format(experts).to_string()));
        metadata.push(("mtp_dense", mtp_format(dense).to_string()));
    }
    Ok(ModelSpec {
        fused: FusedLayout::Stacked,
        expert_bias: false,
        expert_layers,
        optional_layers_from: main,
        n_experts: cfg.n_routed_experts,
        hidden: cfg.hidden_size,
        inter: cfg.moe_intermediate_size,
        expert_format,
        dense_format: Box::new(move |name, shape| {
            if keeps_f32(name, shape) {
                QFormat::F32
            } else if layer_of(name).is_some_and(|l| l >= main) {
                mtp_format(dense)
            } else {
                dense
            }
        }),
        metadata,
        naming: ExpertNaming::MLP,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routers_norms_biases_and_indexer_weighting_stay_f32() {
        assert!(keeps_f32("model.layers.1.mlp.gate.weight", &[8, 64]));
        assert!(keeps_f32("model.layers.1.mlp.gate.e_score_correction_bias", &[8]));
        assert!(keeps_f32("model.layers.0.self_attn.kv_a_layernorm.weight", &[24]));
        assert!(keeps_f32(
            "model.layers.0.self_attn.indexer.weights_proj.weight",
            &[8, 64]
        ));
        assert!(!keeps_f32(
            "model.layers.0.self_attn.indexer.wq_b.weight",
            &[128, 32]
        ));
        assert!(!keeps_f32("model.layers.2.eh_proj.weight", &[64, 128]));
        assert!(!keeps_f32(
            "model.layers.1.mlp.shared_experts.up_proj.weight",
            &[16, 64]
        ));
    }
}
