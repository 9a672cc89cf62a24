//! The Llama-style MoE decoder: pre-norm layers with grouped-query
//! attention (per-head q/k RMSNorm for Qwen3, none for Mixtral; Mixtral may
//! use a sliding window), rotate-half RoPE, and a routed MoE of gated
//! experts (Qwen3 may interleave dense MLP layers). One implementation
//! serves `qwen3_moe`, `mixtral`, `glm4_moe`, `gpt_oss` and `minimax_m2`;
//! [`MoeDecoderConfig`] carries the differences, and each config parser
//! (`config.rs` for Qwen3 and Mixtral, `glm4_moe.rs`, `gpt_oss.rs`,
//! `minimax_m2/`) has its
//! registry entry and its `coli synth` shape (`synth.rs` for Qwen3 and
//! Mixtral, `glm4_moe/synth.rs`, `gpt_oss/synth.rs`, `minimax_m2/synth.rs`).
//! OLMoE runs its layers through the same pass ([`run_pass`]) and
//! predictor.

mod config;
mod family;
mod forward;
mod gguf;
pub mod glm4_moe;
pub mod gpt_oss;
mod gpt_oss_experts;
mod load;
pub mod minimax_m2;
mod predictor;
pub mod synth;
mod weights;

pub use config::{DecoderKind, MoeDecoderConfig, RopeScaling, RouterChoice, Yarn};
pub(crate) use config::{check_act, check_counts, check_scaling, parse_rope};
pub(crate) use family::{QWEN3_MIXTRAL, convert_spec};
pub use forward::MoeDecoder;
pub(crate) use forward::{Pass, run_pass};
pub(crate) use glm4_moe::GLM4_MOE;
pub(crate) use gpt_oss::GPT_OSS;
pub use load::{expert_map, load_dense, naming};
pub(crate) use minimax_m2::MINIMAX_M2;
pub use predictor::RouterPredictor;
pub use weights::{DenseWeights, Ffn, LayerWeights};
