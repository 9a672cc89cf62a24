//! Model configurations read from a checkpoint's `config.json`.

pub mod glm;
pub mod glm4_moe;
pub mod gpt_oss;
pub mod moe_decoder;
pub mod olmoe;

pub use glm::GlmConfig;
pub use moe_decoder::{DecoderKind, MoeDecoderConfig, RouterChoice, Yarn};
pub use olmoe::OlmoeConfig;

use std::path::{Path, PathBuf};

/// A model's validated configuration, one variant per family. This is the
/// one place a `model_type` is mapped to a family: the engine, `coli
/// convert`, `coli bench` and the fuzzer match on the variant, so a new
/// family added here is a compile error everywhere it must be handled.
#[derive(Clone, Debug)]
pub enum ModelConfig {
    Olmoe(Box<OlmoeConfig>),
    /// Qwen3-MoE, Mixtral, GLM-4.x and gpt-oss.
    MoeDecoder(Box<MoeDecoderConfig>),
    /// GLM-5 and DeepSeek-V3.
    Glm(Box<GlmConfig>),
}

impl ModelConfig {
    /// Bytes one position of one sequence takes in the KV cache (f32):
    /// K and V per layer for plain attention; the compressed latent, rope
    /// key and indexer key per layer for MLA.
    pub fn kv_bytes_per_position(&self) -> u64 {
        match self {
            Self::Olmoe(c) => (c.num_hidden_layers * 2 * c.kv_heads() * c.head_dim() * 4) as u64,
            Self::MoeDecoder(c) => (c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 4) as u64,
            Self::Glm(c) => {
                (c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim + c.index_head_dim()) * 4) as u64
            }
        }
    }

    /// Positions the model supports.
    pub fn max_positions(&self) -> usize {
        match self {
            Self::Olmoe(c) => c.max_position_embeddings,
            Self::MoeDecoder(c) => c.max_position_embeddings,
            Self::Glm(c) => c.max_position_embeddings,
        }
    }

    /// Reads and validates `dir`'s config.json.
    pub fn load(dir: &Path) -> Result<Self, ConfigError> {
        let (path, value) = read_json(dir)?;
        Self::from_json(&path, value)
    }

    /// The family named by `model_type`, its config parsed and validated.
    pub fn from_json(path: &Path, value: serde_json::Value) -> Result<Self, ConfigError> {
        let model_type = value.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
        Ok(match model_type {
            "olmoe" => Self::Olmoe(Box::new(OlmoeConfig::from_json(path, value)?)),
            "qwen3_moe" | "mixtral" => Self::MoeDecoder(Box::new(MoeDecoderConfig::from_json(path, value)?)),
            "glm4_moe" => Self::MoeDecoder(Box::new(glm4_moe::from_json(path, value)?)),
            "gpt_oss" => Self::MoeDecoder(Box::new(gpt_oss::from_json(path, value)?)),
            "glm_moe_dsa" | "deepseek_v3" => Self::Glm(Box::new(GlmConfig::from_json(path, value)?)),
            other => {
                return Err(ConfigError::ModelType {
                    path: path.to_path_buf(),
                    found: other.to_string(),
                });
            }
        })
    }
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{path}: model_type {found:?} is not supported (supported: olmoe, qwen3_moe, mixtral, glm4_moe, gpt_oss, glm_moe_dsa, deepseek_v3)"
    )]
    ModelType { path: PathBuf, found: String },
    #[error("{path}: {field} {reason}")]
    Invalid {
        path: PathBuf,
        field: &'static str,
        reason: String,
    },
}

/// Largest count a config field may hold (layers, heads, sizes, ...): far
/// above any real model, small enough that products of two counts never
/// overflow and a hostile file cannot ask for absurd allocations.
pub(crate) const COUNT_LIMIT: usize = 1 << 24;

/// Largest element count of one weight matrix or table a config may imply.
pub(crate) const ELEMENT_LIMIT: u128 = 1 << 40;

/// Largest `rope_theta` accepted (real models use up to ~1e7).
pub(crate) const ROPE_THETA_LIMIT: f64 = 1e12;

/// Checks the float fields every family shares: finite, positive, and still
/// positive and finite once narrowed to f32 (the kernels compute in f32, so
/// an epsilon of 1e-300 would become 0 and a norm would divide by zero).
pub(crate) fn check_floats(path: &Path, rms_norm_eps: f64, rope_theta: f64) -> Result<(), ConfigError> {
    let bad = |field: &'static str, reason: String| {
        Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            reason,
        })
    };
    let eps32 = rms_norm_eps as f32;
    if !(rms_norm_eps.is_finite() && rms_norm_eps <= 1.0 && eps32 > 0.0) {
        return bad(
            "rms_norm_eps",
            format!("must be in (0, 1] and representable in f32, got {rms_norm_eps}"),
        );
    }
    if !(rope_theta.is_finite() && rope_theta > 0.0 && rope_theta <= ROPE_THETA_LIMIT) {
        return bad(
            "rope_theta",
            format!("must be in (0, {ROPE_THETA_LIMIT:e}], got {rope_theta}"),
        );
    }
    Ok(())
}

/// Checks that each named product of counts (a matrix's element count) stays
/// within [`ELEMENT_LIMIT`], so size arithmetic downstream cannot overflow.
pub(crate) fn check_products(path: &Path, products: &[(&'static str, &[usize])]) -> Result<(), ConfigError> {
    for (field, factors) in products {
        let n = factors
            .iter()
            .fold(1u128, |acc, &f| acc.saturating_mul(f as u128));
        if n > ELEMENT_LIMIT {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                field,
                reason: format!("implies a tensor of {n} elements (limit {ELEMENT_LIMIT})"),
            });
        }
    }
    Ok(())
}

/// Reads `config.json` of a model directory into JSON, for dispatching on
/// `model_type` before parsing the family's typed config.
pub fn read_json(dir: &Path) -> Result<(PathBuf, serde_json::Value), ConfigError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io {
        path: path.clone(),
        source,
    })?;
    let value = serde_json::from_str(&text).map_err(|source| ConfigError::Json {
        path: path.clone(),
        source,
    })?;
    Ok((path, value))
}

/// `rope_theta` at the top level (transformers 4) or inside
/// `rope_parameters` (transformers 5); 10000 when absent.
pub(crate) fn rope_theta(top: Option<f64>, params: Option<&serde_json::Value>) -> f64 {
    top.or_else(|| params?.get("rope_theta")?.as_f64())
        .unwrap_or(10000.0)
}

/// The RoPE type named in `rope_parameters` or `rope_scaling`, if any.
pub(crate) fn rope_kind(
    params: Option<&serde_json::Value>,
    scaling: Option<&serde_json::Value>,
) -> Option<String> {
    [params, scaling].into_iter().flatten().find_map(|v| {
        v.get("rope_type")
            .or_else(|| v.get("type"))
            .and_then(|t| t.as_str())
            .map(str::to_string)
    })
}

/// Token ids from a JSON number or list (`eos_token_id` in config.json and
/// generation_config.json); anything else gives none.
pub fn token_ids(value: Option<&serde_json::Value>) -> Vec<u32> {
    match value {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect(),
        _ => Vec::new(),
    }
}
