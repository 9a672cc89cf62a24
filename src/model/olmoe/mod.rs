//! OLMoE (allenai/OLMoE-1B-7B family): pre-norm decoder layers with q/k
//! RMSNorm over the whole projection, optional `clip_qkv`, rotate-half RoPE,
//! and a softmax-routed top-k MoE of SwiGLU experts. The layers and the pass
//! are the Llama-style MoE decoder's ([`crate::model::moe_decoder`]); this
//! family holds OLMoE's config, weight names, state fingerprint and its
//! registration ([`OLMOE`]).

mod config;
mod family;
mod forward;
pub mod gguf;
mod load;
pub mod synth;

pub use crate::model::lm::{ForwardError, Logits};
pub use crate::model::moe_decoder::{DenseWeights, LayerWeights, RouterPredictor};
pub use config::OlmoeConfig;
pub(crate) use family::OLMOE;
pub use forward::Olmoe;
pub use load::{LoadOptions, expert_map, load_dense};
