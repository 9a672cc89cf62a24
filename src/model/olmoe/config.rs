//! OLMoE (`model_type: "olmoe"`) hyper-parameters.

use std::path::Path;

use serde::Deserialize;

use crate::config::{COUNT_LIMIT, ConfigError, check_floats, check_products, read_json};

/// The fields of an OLMoE `config.json` the engine uses, validated.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct OlmoeConfig {
    #[serde(default)]
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    #[serde(default)]
    pub norm_topk_prob: bool,
    #[serde(default)]
    pub clip_qkv: Option<f64>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub pad_token_id: Option<u32>,
}

fn default_max_pos() -> usize {
    4096
}

fn default_eps() -> f64 {
    1e-5
}

impl OlmoeConfig {
    pub fn load(dir: &Path) -> Result<Self, ConfigError> {
        let (path, value) = read_json(dir)?;
        Self::from_json(&path, value)
    }

    pub fn from_json(path: &Path, value: serde_json::Value) -> Result<Self, ConfigError> {
        let value = crate::config::spelling::canonical(path, value)?;
        let found = value
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        if found != "olmoe" {
            return Err(ConfigError::ModelType {
                path: path.to_path_buf(),
                found,
            });
        }
        let cfg: Self = serde_json::from_value(value)
            .map_err(|source| crate::config::spelling::parse_error(path, source))?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: String| {
            Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                field,
                reason,
            })
        };
        const LIMIT: usize = COUNT_LIMIT;
        for (field, v) in [
            ("max_position_embeddings", self.max_position_embeddings),
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
        ] {
            if v == 0 || v > LIMIT {
                return bad(field, format!("must be in 1..={LIMIT}, got {v}"));
            }
        }
        if let Some(h) = self.head_dim
            && h > LIMIT
        {
            return bad("head_dim", format!("must be in 1..={LIMIT}, got {h}"));
        }
        let kv = self.kv_heads();
        if kv == 0 || !self.num_attention_heads.is_multiple_of(kv) {
            return bad(
                "num_key_value_heads",
                format!(
                    "{kv} must divide num_attention_heads {}",
                    self.num_attention_heads
                ),
            );
        }
        if self.head_dim() == 0 || !self.head_dim().is_multiple_of(2) {
            return bad(
                "head_dim",
                format!("must be even and non-zero, got {}", self.head_dim()),
            );
        }
        if self.num_experts_per_tok > self.num_experts {
            return bad(
                "num_experts_per_tok",
                format!(
                    "{} exceeds num_experts {}",
                    self.num_experts_per_tok, self.num_experts
                ),
            );
        }
        if let Some(kind) = self.rope_kind()
            && kind != "default"
        {
            return bad(
                "rope_scaling",
                crate::config::unsupported_rope(&kind, "default only"),
            );
        }
        check_floats(path, self.rms_norm_eps, self.rope_theta())?;
        if let Some(c) = self.clip_qkv
            && !(c.is_finite() && c > 0.0 && (c as f32).is_finite())
        {
            // Attention clamps q, k, v to [-c, c]: a negative or NaN bound is
            // meaningless (and makes f32::clamp panic).
            return bad("clip_qkv", format!("must be a positive finite number, got {c}"));
        }
        let (h, hd) = (self.hidden_size, self.head_dim());
        check_products(
            path,
            &[
                ("vocab_size", &[self.vocab_size, h]),
                ("intermediate_size", &[self.intermediate_size, h]),
                ("num_attention_heads", &[self.num_attention_heads, hd, h]),
                ("num_experts", &[self.num_experts, self.intermediate_size, h]),
                (
                    "max_position_embeddings",
                    &[self.max_position_embeddings, self.num_hidden_layers, kv, hd],
                ),
            ],
        )?;
        Ok(())
    }

    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// `rope_theta` (transformers 5's `rope_parameters.rope_theta` is
    /// lifted to it by [`crate::config::spelling`]).
    pub fn rope_theta(&self) -> f64 {
        crate::config::rope_theta(self.rope_theta, 10000.0)
    }

    fn rope_kind(&self) -> Option<String> {
        crate::config::rope_kind(self.rope_scaling.as_ref())
    }

    /// Token ids that end generation, from `eos_token_id` (a number or a list).
    pub fn eos_ids(&self) -> Vec<u32> {
        crate::config::token_ids(self.eos_token_id.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> serde_json::Value {
        serde_json::json!({
            "model_type": "olmoe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
            "num_experts": 8, "num_experts_per_tok": 2, "rope_theta": 10000.0, "eos_token_id": [1, 2]
        })
    }

    #[test]
    fn parses_and_validates() {
        let c = OlmoeConfig::from_json(Path::new("c.json"), base()).unwrap();
        assert_eq!(c.head_dim(), 8);
        assert_eq!(c.eos_ids(), vec![1, 2]);
        let mut v = base();
        v["num_experts_per_tok"] = 9.into();
        let e = OlmoeConfig::from_json(Path::new("c.json"), v).unwrap_err();
        assert!(e.to_string().contains("num_experts_per_tok"), "{e}");
        let mut v = base();
        v["model_type"] = "llama".into();
        assert!(matches!(
            OlmoeConfig::from_json(Path::new("c.json"), v),
            Err(ConfigError::ModelType { .. })
        ));
    }

    #[test]
    fn every_number_is_range_checked() {
        for (field, val) in [
            ("clip_qkv", serde_json::json!(-1.0)),
            ("clip_qkv", serde_json::json!(0.0)),
            ("clip_qkv", serde_json::json!(1e300)),
            ("max_position_embeddings", serde_json::json!(0)),
            ("head_dim", serde_json::json!(1u64 << 40)),
            ("rms_norm_eps", serde_json::json!(1e-300)),
            ("rms_norm_eps", serde_json::json!(-1e-5)),
            ("rope_theta", serde_json::json!(1e300)),
            ("rope_theta", serde_json::json!(0.0)),
            ("vocab_size", serde_json::json!(1u64 << 30)),
        ] {
            let mut v = base();
            v[field] = val.clone();
            let e = OlmoeConfig::from_json(Path::new("c.json"), v).unwrap_err();
            assert!(e.to_string().contains(field), "{field}={val}: {e}");
        }
        // Products of individually valid counts are bounded too.
        let mut v = base();
        v["vocab_size"] = (1u64 << 24).into();
        v["hidden_size"] = (1u64 << 24).into();
        let e = OlmoeConfig::from_json(Path::new("c.json"), v).unwrap_err();
        assert!(e.to_string().contains("elements"), "{e}");
        let mut v = base();
        v["clip_qkv"] = 8.0.into();
        assert!(OlmoeConfig::from_json(Path::new("c.json"), v).is_ok());
    }
}
