//! Qwen3-MoE and Mixtral: Llama-style pre-norm decoders with grouped-query
//! attention (per-head q/k RMSNorm for Qwen3, none for Mixtral; Mixtral may
//! use a sliding window), rotate-half RoPE, and a softmax top-k MoE of SwiGLU
//! experts (Qwen3 may interleave dense MLP layers). One implementation
//! serves both `model_type`s; [`crate::config::MoeDecoderConfig`] carries
//! the differences. OLMoE runs its layers through the same pass
//! ([`run_pass`]) and predictor.

mod forward;
mod load;
mod predictor;
mod weights;

pub use forward::MoeDecoder;
pub(crate) use forward::{Pass, run_pass};
pub use load::{expert_map, load_dense, naming};
pub use predictor::RouterPredictor;
pub use weights::{DenseWeights, Ffn, LayerWeights};
