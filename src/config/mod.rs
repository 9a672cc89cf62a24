//! Model configurations read from a checkpoint's `config.json`.

pub mod glm;
pub mod olmoe;

pub use glm::GlmConfig;
pub use olmoe::OlmoeConfig;

use std::path::{Path, PathBuf};

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
    #[error("{path}: model_type {found:?} is not supported (supported: olmoe, glm_moe_dsa, deepseek_v3)")]
    ModelType { path: PathBuf, found: String },
    #[error("{path}: {field} {reason}")]
    Invalid {
        path: PathBuf,
        field: &'static str,
        reason: String,
    },
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
