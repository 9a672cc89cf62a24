//! Model families and what they share (ops, KV cache, the expert type), and
//! the registry that maps a `model_type` to its family.

pub mod attention;
pub mod expert;
pub mod family;
pub mod kv_cache;
pub mod lm;
pub mod ops;
pub mod routed;
pub mod sequence_state;
pub mod want;

// The families: each is a folder with its registration entry, listed once
// in `FAMILIES` (see docs/adding-a-family.md).
pub mod deepseek_v32;
pub mod glm;
pub mod glm4_moe_lite;
pub mod moe_decoder;
pub mod olmoe;
pub mod qwen3_next;

/// Every registered family, in the order the "supported" list names their
/// `model_type`s. The one table a new family is added to.
pub(crate) static FAMILIES: &[&dyn family::Family] = &[
    &olmoe::OLMOE,
    &moe_decoder::QWEN3_MIXTRAL,
    &moe_decoder::GLM4_MOE,
    &moe_decoder::GPT_OSS,
    &moe_decoder::MINIMAX_M2,
    &glm::GLM,
    &glm4_moe_lite::GLM4_MOE_LITE,
    &deepseek_v32::DEEPSEEK_V32,
    &qwen3_next::QWEN3_NEXT,
];

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
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
}
