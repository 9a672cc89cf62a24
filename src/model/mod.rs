//! Model families and what they share (ops, KV cache, the expert type).

pub mod attention;
pub mod expert;
pub mod glm;
pub mod kv_cache;
pub mod lm;
pub mod moe_decoder;
pub mod olmoe;
pub mod ops;
pub mod routed;
pub mod want;

use crate::config::ConfigError;
use crate::st::StError;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Checkpoint(#[from] StError),
    #[error("weights: {0}")]
    Weights(String),
    #[error(transparent)]
    Source(#[from] colibri_actors::SourceError),
}
