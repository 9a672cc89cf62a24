//! Model configurations read from a checkpoint's `config.json`.
//!
//! The family-specific configs live in their family's folder
//! (`src/model/<family>/config.rs`); [`crate::model::family::ModelConfig`]
//! dispatches on `model_type` through the registry. This module holds what
//! they share: the error type, the limits and the common checks.

use std::path::{Path, PathBuf};

pub mod spelling;

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
    /// No registered family reads this `model_type`; the list comes from
    /// the registry ([`crate::model::FAMILIES`]).
    #[error(
        "{path}: model_type {found:?} is not supported (supported: {})",
        crate::model::family::supported_model_types()
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

/// Reads `config.json` of a model directory into JSON as written, for
/// dispatching on `model_type` before parsing the family's typed config
/// (which rewrites it into one spelling first, [`spelling::canonical`]).
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

/// `rope_theta` of a canonical config ([`spelling::canonical`] lifts
/// transformers 5's `rope_parameters.rope_theta`); `default` when absent.
pub(crate) fn rope_theta(top: Option<f64>, default: f64) -> f64 {
    top.unwrap_or(default)
}

/// The RoPE type named in a canonical config's `rope_scaling`, if any.
pub(crate) fn rope_kind(scaling: Option<&serde_json::Value>) -> Option<String> {
    let v = scaling?;
    v.get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(|t| t.as_str())
        .map(str::to_string)
}

/// Why a RoPE type is refused, naming both places a config may have
/// spelled it.
pub(crate) fn unsupported_rope(kind: &str, supported: &str) -> String {
    format!("(or rope_parameters) gives rope type {kind:?}, which is not supported ({supported})")
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
