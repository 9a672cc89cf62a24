//! GLM-4.5 / 4.6 / 4.7 (`model_type: "glm4_moe"`): a Llama-style decoder
//! with GQA, q/k/v biases, partial rotary embedding and optional per-head
//! q/k norm, whose sparse layers use the DeepSeek-style sigmoid router
//! (correction bias, groups, `routed_scaling_factor`) plus shared experts,
//! after `first_k_dense_replace` dense layers. Parsed into the shared
//! [`MoeDecoderConfig`].

use crate::synth::{SynthPreset, SynthSpec};
use std::path::Path;

use serde::Deserialize;

use super::config::{DecoderKind, MoeDecoderConfig, RouterChoice, check_act, check_counts, parse_rope};
use crate::config::ConfigError;
use crate::model::family::{Family, FamilyConfig};

pub mod gguf;
pub mod synth;

/// `config.json` of a GLM-4.x MoE checkpoint as written by transformers
/// (defaults are `Glm4MoeConfig`'s).
#[derive(Deserialize)]
struct Glm4MoeJson {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    moe_intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(default)]
    head_dim: Option<usize>,
    #[serde(default = "half")]
    partial_rotary_factor: f64,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    num_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default = "one")]
    n_shared_experts: usize,
    #[serde(default = "one_f")]
    routed_scaling_factor: f64,
    #[serde(default = "one")]
    n_group: usize,
    #[serde(default = "one")]
    topk_group: usize,
    #[serde(default = "one")]
    first_k_dense_replace: usize,
    #[serde(default = "yes")]
    norm_topk_prob: bool,
    #[serde(default)]
    use_qk_norm: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    num_nextn_predict_layers: usize,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
}

const COUNT_FIELDS: [&str; 16] = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "num_experts",
    "num_experts_per_tok",
    "n_shared_experts",
    "n_group",
    "topk_group",
    "first_k_dense_replace",
    "num_nextn_predict_layers",
];

fn half() -> f64 {
    0.5
}
fn one() -> usize {
    1
}
fn one_f() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn default_max_pos() -> usize {
    131072
}
fn default_eps() -> f64 {
    1e-5
}

/// Parses and validates a `glm4_moe` config.
pub fn from_json(path: &Path, value: serde_json::Value) -> Result<MoeDecoderConfig, ConfigError> {
    let value = crate::config::spelling::canonical(path, value)?;
    let bad = |field: &'static str, reason: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        reason,
    };
    check_counts(path, &value, &COUNT_FIELDS)?;
    let j: Glm4MoeJson =
        serde_json::from_value(value).map_err(|source| crate::config::spelling::parse_error(path, source))?;
    check_act(path, j.hidden_act.as_deref())?;
    let rope_scaling = parse_rope(path, j.rope_scaling.as_ref(), j.max_position_embeddings)?;
    let heads = j.num_attention_heads;
    let head_dim = j.head_dim.unwrap_or(j.hidden_size / heads.max(1));
    let f = j.partial_rotary_factor;
    if !(f.is_finite() && f > 0.0 && f <= 1.0) {
        return Err(bad(
            "partial_rotary_factor",
            format!("must be in (0, 1], got {f}"),
        ));
    }
    let cfg = MoeDecoderConfig {
        model_type: "glm4_moe".into(),
        kind: DecoderKind::Glm4Moe,
        vocab_size: j.vocab_size,
        hidden_size: j.hidden_size,
        num_hidden_layers: j.num_hidden_layers,
        num_attention_heads: heads,
        num_key_value_heads: j.num_key_value_heads.unwrap_or(heads),
        head_dim,
        max_position_embeddings: j.max_position_embeddings,
        rope_theta: crate::config::rope_theta(j.rope_theta, 10000.0),
        rms_norm_eps: j.rms_norm_eps,
        num_experts: j.num_experts,
        num_experts_per_tok: j.num_experts_per_tok,
        moe_intermediate_size: j.moe_intermediate_size,
        intermediate_size: j.intermediate_size,
        norm_topk_prob: j.norm_topk_prob,
        decoder_sparse_step: 1,
        mlp_only_layers: Vec::new(),
        sliding_window: None,
        tie_word_embeddings: j.tie_word_embeddings,
        eos_token_id: j.eos_token_id,
        qkv_bias: j.attention_bias,
        o_bias: false,
        qk_norm: j.use_qk_norm,
        // transformers: int(head_dim * partial_rotary_factor).
        rotary_dim: (head_dim as f64 * f) as usize,
        rope_scaling,
        router: RouterChoice::Sigmoid {
            n_group: j.n_group,
            topk_group: j.topk_group,
            routed_scaling_factor: j.routed_scaling_factor,
        },
        shared_intermediate: j.moe_intermediate_size.saturating_mul(j.n_shared_experts),
        first_k_dense_replace: j.first_k_dense_replace,
        sliding_layers: Vec::new(),
        attention_sinks: false,
        swiglu_limit: None,
        num_nextn_predict_layers: j.num_nextn_predict_layers,
    };
    cfg.validate(path)?;
    Ok(cfg)
}

/// The registry entry for `glm4_moe`: parsed here, run as a
/// [`MoeDecoderConfig`].
pub(crate) struct Glm4Moe;

/// Listed in [`crate::model::FAMILIES`].
pub(crate) static GLM4_MOE: Glm4Moe = Glm4Moe;

impl Family for Glm4Moe {
    fn model_types(&self) -> &'static [&'static str] {
        &["glm4_moe"]
    }

    fn synth_presets(&self) -> &'static [SynthPreset] {
        &[
            SynthPreset {
                name: "glm-4.5-air",
                build: SynthSpec::glm45_air,
            },
            SynthPreset {
                name: "glm4-tiny",
                build: SynthSpec::glm4_tiny,
            },
        ]
    }

    fn parse(&self, path: &Path, value: serde_json::Value) -> Result<Box<dyn FamilyConfig>, ConfigError> {
        Ok(Box::new(from_json(path, value)?))
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &[gguf::ARCH]
    }

    fn gguf_config(
        &self,
        model: &crate::gguf::GgufModel,
    ) -> Result<serde_json::Value, crate::gguf::GgufError> {
        gguf::config_json(model)
    }

    fn gguf_checkpoint(
        &self,
        model: &crate::gguf::GgufModel,
    ) -> Result<crate::st::Checkpoint, crate::gguf::GgufError> {
        crate::gguf::checkpoint::checkpoint(model, gguf::NAMING)
    }

    fn fuzz_seeds(&self) -> Vec<serde_json::Value> {
        vec![
            serde_json::json!({
                "model_type": "glm4_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
                "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 12, "partial_rotary_factor": 0.5,
                "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 2,
                "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
                "attention_bias": true, "use_qk_norm": true, "num_nextn_predict_layers": 1, "eos_token_id": [1, 2]
            }),
            // As transformers 5 writes it.
            serde_json::json!({
                "model_type": "glm4_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
                "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2,
                "n_shared_experts": 1, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
                "routed_scaling_factor": 2.5, "dtype": "bfloat16", "num_nextn_predict_layers": 1,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn glm4() -> serde_json::Value {
        serde_json::json!({
            "model_type": "glm4_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 12, "partial_rotary_factor": 0.5,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
            "attention_bias": true, "use_qk_norm": true, "num_nextn_predict_layers": 1,
            "rope_theta": 10000.0, "eos_token_id": [1, 2]
        })
    }

    #[test]
    fn parses_the_glm4_options() {
        let c = from_json(Path::new("c.json"), glm4()).unwrap();
        assert_eq!(c.kind, DecoderKind::Glm4Moe);
        assert_eq!((c.rotary_dim, c.shared_intermediate), (6, 16));
        assert!(c.qkv_bias && !c.o_bias && c.qk_norm);
        assert_eq!(c.sparse_layers(), vec![false, true, true]);
        assert_eq!(c.eos_ids(), vec![1, 2]);
        assert!(matches!(
            c.router,
            RouterChoice::Sigmoid {
                n_group: 2,
                topk_group: 1,
                ..
            }
        ));
    }

    #[test]
    fn transformers_5_keeps_the_rotary_share_inside_rope_parameters() {
        let mut v = glm4();
        let o = v.as_object_mut().unwrap();
        o.remove("partial_rotary_factor");
        o.remove("rope_theta");
        o.insert("head_dim".into(), serde_json::json!(16));
        o.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.25}),
        );
        let c = from_json(Path::new("c.json"), v).unwrap();
        assert_eq!((c.rotary_dim, c.rope_theta), (4, 5e5));
    }

    #[test]
    fn refuses_bad_values_by_name() {
        for (field, val) in [
            ("partial_rotary_factor", serde_json::json!(0.0)),
            ("partial_rotary_factor", serde_json::json!(0.1)),
            ("n_group", serde_json::json!(3)),
            ("n_group", serde_json::json!(8)),
            ("topk_group", serde_json::json!(3)),
            ("num_experts_per_tok", serde_json::json!(5)),
            ("first_k_dense_replace", serde_json::json!(3)),
            ("routed_scaling_factor", serde_json::json!(-1.0)),
            ("n_shared_experts", serde_json::json!(-1)),
            ("n_routed_experts", serde_json::json!(0)),
            ("hidden_act", serde_json::json!("gelu")),
            (
                "rope_scaling",
                serde_json::json!({"rope_type": "dynamic", "factor": 4.0}),
            ),
            ("head_dim", serde_json::json!(7)),
        ] {
            let mut v = glm4();
            v[field] = val.clone();
            let e = from_json(Path::new("c.json"), v).unwrap_err();
            assert!(e.to_string().contains(field), "{field}={val}: {e}");
        }
    }
}
