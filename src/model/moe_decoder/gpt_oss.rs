//! gpt-oss (`model_type: "gpt_oss"`): a Llama-style decoder with biases on
//! every attention projection, one learned attention sink per head,
//! alternating sliding-window and full attention (`layer_types`), YaRN
//! RoPE, a biased router whose top-k logits are softmaxed, and experts with
//! biases and a clamped SwiGLU. Parsed into the shared [`MoeDecoderConfig`].

use crate::synth::{SynthPreset, SynthSpec};
use std::path::Path;

use serde::Deserialize;

use super::config::{DecoderKind, MoeDecoderConfig, RouterChoice, check_act, check_counts, parse_rope};
use crate::config::ConfigError;
use crate::model::family::{Family, FamilyConfig};

pub mod gguf;
pub mod synth;

/// `config.json` of a gpt-oss checkpoint (defaults are `GptOssConfig`'s).
#[derive(Deserialize)]
struct GptOssJson {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(default = "default_head_dim")]
    head_dim: usize,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    #[serde(default)]
    rope_theta: Option<f64>,
    /// Absent: transformers' default YaRN; `null`: plain RoPE.
    #[serde(default = "default_yarn")]
    rope_scaling: Option<serde_json::Value>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    num_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default = "default_window")]
    sliding_window: Option<usize>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default = "default_limit")]
    swiglu_limit: f64,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
}

const COUNT_FIELDS: [&str; 11] = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "num_experts",
    "num_experts_per_tok",
    "sliding_window",
];

fn default_head_dim() -> usize {
    64
}
fn default_max_pos() -> usize {
    131072
}
fn default_eps() -> f64 {
    1e-5
}
fn default_window() -> Option<usize> {
    Some(128)
}
fn default_limit() -> f64 {
    7.0
}
fn default_yarn() -> Option<serde_json::Value> {
    Some(serde_json::json!({
        "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": false, "original_max_position_embeddings": 4096
    }))
}

/// Parses and validates a `gpt_oss` config.
pub fn from_json(path: &Path, value: serde_json::Value) -> Result<MoeDecoderConfig, ConfigError> {
    let value = crate::config::spelling::canonical(path, value)?;
    let bad = |field: &'static str, reason: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        reason,
    };
    check_counts(path, &value, &COUNT_FIELDS)?;
    let j: GptOssJson =
        serde_json::from_value(value).map_err(|source| crate::config::spelling::parse_error(path, source))?;
    check_act(path, j.hidden_act.as_deref())?;
    let rope_scaling = parse_rope(path, j.rope_scaling.as_ref(), j.max_position_embeddings)?;
    let sliding_layers = match &j.layer_types {
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(bad(
                    "layer_types",
                    format!("{other:?} is not a layer type (sliding_attention or full_attention)"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        // transformers: even layers slide, odd ones attend fully.
        None => (0..j.num_hidden_layers.min(crate::config::COUNT_LIMIT))
            .map(|l| l % 2 == 0)
            .collect(),
    };
    let heads = j.num_attention_heads;
    let theta = crate::config::rope_theta(j.rope_theta, 150000.0);
    let cfg = MoeDecoderConfig {
        model_type: "gpt_oss".into(),
        kind: DecoderKind::GptOss,
        vocab_size: j.vocab_size,
        hidden_size: j.hidden_size,
        num_hidden_layers: j.num_hidden_layers,
        num_attention_heads: heads,
        num_key_value_heads: j.num_key_value_heads.unwrap_or(heads),
        head_dim: j.head_dim,
        max_position_embeddings: j.max_position_embeddings,
        rope_theta: theta,
        rms_norm_eps: j.rms_norm_eps,
        num_experts: j.num_experts,
        num_experts_per_tok: j.num_experts_per_tok,
        moe_intermediate_size: j.intermediate_size,
        intermediate_size: j.intermediate_size,
        norm_topk_prob: false,
        decoder_sparse_step: 1,
        mlp_only_layers: Vec::new(),
        sliding_window: j.sliding_window,
        tie_word_embeddings: j.tie_word_embeddings,
        eos_token_id: j.eos_token_id,
        qkv_bias: true,
        o_bias: true,
        qk_norm: false,
        rotary_dim: j.head_dim,
        rope_scaling,
        router: RouterChoice::TopKSoftmax,
        shared_intermediate: 0,
        first_k_dense_replace: 0,
        sliding_layers,
        attention_sinks: true,
        swiglu_limit: Some(j.swiglu_limit),
        num_nextn_predict_layers: 0,
    };
    cfg.validate(path)?;
    Ok(cfg)
}

/// The registry entry for `gpt_oss`: parsed here, run as a
/// [`MoeDecoderConfig`].
pub(crate) struct GptOss;

/// Listed in [`crate::model::FAMILIES`].
pub(crate) static GPT_OSS: GptOss = GptOss;

impl Family for GptOss {
    fn model_types(&self) -> &'static [&'static str] {
        &["gpt_oss"]
    }

    fn synth_presets(&self) -> &'static [SynthPreset] {
        &[
            SynthPreset {
                name: "gpt-oss-20b",
                build: SynthSpec::gpt_oss_20b,
            },
            SynthPreset {
                name: "gpt-oss-tiny",
                build: SynthSpec::gpt_oss_tiny,
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
        vec![serde_json::json!({
            "model_type": "gpt_oss", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12,
            "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 5, "swiglu_limit": 7.0,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": false, "original_max_position_embeddings": 4096}
        })]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn gpt_oss() -> serde_json::Value {
        serde_json::json!({
            "model_type": "gpt_oss", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12,
            "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 5,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": false, "original_max_position_embeddings": 32},
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]
        })
    }

    #[test]
    fn parses_the_gpt_oss_options() {
        let c = from_json(Path::new("c.json"), gpt_oss()).unwrap();
        assert_eq!(c.kind, DecoderKind::GptOss);
        assert_eq!(c.sliding_layers, vec![true, false, true]);
        assert_eq!((c.window(0), c.window(1)), (Some(5), None));
        let y = *c.rope_scaling.and_then(|r| r.yarn().copied()).as_ref().unwrap();
        assert_eq!(y.original_max_position_embeddings, 32);
        assert!((y.attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
        assert!(!y.truncate);
        assert_eq!(c.swiglu_limit, Some(7.0));
        assert_eq!(c.rope_theta, 150000.0);
        // No layer_types: transformers alternates, sliding first.
        let mut v = gpt_oss();
        v.as_object_mut().map(|o| o.remove("layer_types"));
        let c = from_json(Path::new("c.json"), v).unwrap();
        assert_eq!(c.sliding_layers, vec![true, false, true]);
        // rope_scaling absent: the default YaRN; null: plain RoPE.
        let mut v = gpt_oss();
        v.as_object_mut().map(|o| o.remove("rope_scaling"));
        let c = from_json(Path::new("c.json"), v).unwrap();
        assert_eq!(
            c.rope_scaling.and_then(|r| r.yarn().map(|y| y.factor)),
            Some(32.0)
        );
        let mut v = gpt_oss();
        v["rope_scaling"] = serde_json::Value::Null;
        assert_eq!(from_json(Path::new("c.json"), v).unwrap().rope_scaling, None);
    }

    #[test]
    fn refuses_bad_values_by_name() {
        for (field, val) in [
            ("layer_types", serde_json::json!(["sliding_attention"])),
            (
                "layer_types",
                serde_json::json!(["sliding_attention", "chunked", "full_attention"]),
            ),
            (
                "rope_scaling",
                serde_json::json!({"rope_type": "longrope", "factor": 4.0}),
            ),
            ("rope_scaling", serde_json::json!({"rope_type": "yarn"})),
            (
                "rope_scaling",
                serde_json::json!({"rope_type": "yarn", "factor": -2.0}),
            ),
            (
                "rope_scaling",
                serde_json::json!({"rope_type": "yarn", "factor": 2.0, "truncate": 3}),
            ),
            ("swiglu_limit", serde_json::json!(-1.0)),
            ("sliding_window", serde_json::json!(0)),
            ("sliding_window", serde_json::json!(-5)),
            ("num_local_experts", serde_json::json!(0)),
            ("head_dim", serde_json::json!(0)),
            ("hidden_act", serde_json::json!("relu")),
        ] {
            let mut v = gpt_oss();
            v[field] = val.clone();
            let e = from_json(Path::new("c.json"), v).unwrap_err();
            assert!(e.to_string().contains(field), "{field}={val}: {e}");
        }
        let mut v = gpt_oss();
        v["sliding_window"] = serde_json::Value::Null;
        let e = from_json(Path::new("c.json"), v).unwrap_err();
        assert!(e.to_string().contains("sliding_window"), "{e}");
    }
}
