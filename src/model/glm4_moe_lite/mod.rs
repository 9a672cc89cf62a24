//! GLM-4.7-Flash (`glm4_moe_lite`): multi-head latent attention with
//! DeepSeek-V3's layout (low-rank queries, a compressed key/value latent,
//! interleaved RoPE on a separate rope head), GLM-4.5's sigmoid router with
//! its correction bias and shared expert, and `mlp_layer_types` choosing
//! which layers are dense. transformers builds it from those same pieces,
//! so it runs on the GLM engine's DeepSeek-V3 arm (`model/glm/`); this
//! folder is its registration.

mod family;
pub mod synth;

pub(crate) use family::GLM4_MOE_LITE;
