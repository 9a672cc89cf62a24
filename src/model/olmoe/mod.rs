//! OLMoE (allenai/OLMoE-1B-7B family): pre-norm decoder layers with q/k
//! RMSNorm, rotate-half RoPE, and a softmax-routed top-k MoE of SwiGLU experts.

mod forward;
mod load;
mod moe;
mod predictor;
mod weights;

pub use crate::model::lm::{ForwardError, Logits};
pub use forward::Olmoe;
pub use load::{LoadOptions, expert_map, load_dense};
pub use predictor::OlmoePredictor;
pub use weights::{DenseWeights, LayerWeights};
