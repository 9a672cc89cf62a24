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
