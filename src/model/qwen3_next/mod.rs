//! Qwen3-Next (`qwen3_next`) and Qwen3.5/3.6-MoE (`qwen3_5_moe`, its
//! text-only `qwen3_5_moe_text`): a hybrid stack where most layers are
//! Gated DeltaNet linear attention (a causal convolution and the gated
//! delta rule over a fixed-size recurrent state) and every few a gated
//! full-attention layer (output gate, partial rotary, q/k norm), each
//! followed by a routed MoE with a sigmoid-gated shared expert. The two
//! releases differ only in how the linear layers' in-projections are laid
//! out ([`config::ProjLayout`]) and in Qwen3.5 having no dense layers; its
//! multimodal release is read as its language model (the checkpoint's
//! `model.language_model.` names and `text_config`).

pub mod config;
mod delta_net;
pub mod delta_rule;
mod family;
pub mod forward;
pub mod gguf;
mod predictor;
pub mod state;
pub mod synth;
mod weights;

pub use config::Qwen3NextConfig;
pub(crate) use family::QWEN3_NEXT;
pub use forward::Qwen3Next;
pub use state::HybridState;
