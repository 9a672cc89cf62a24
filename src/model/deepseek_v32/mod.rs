//! DeepSeek-V3.2 (`deepseek_v32`): DeepSeek-V3's MLA and router with DSA,
//! the lightning indexer that picks which positions each query attends to,
//! on every layer. It runs on the GLM engine (`model/glm/`), whose GLM-5
//! indexer it shares; the two differ in the indexer's RoPE (rotate-half
//! here, interleaved pairs there) and in GLM-5 letting layers share a
//! selection. This folder is its registration.

mod family;
pub mod synth;

pub(crate) use family::DEEPSEEK_V32;
