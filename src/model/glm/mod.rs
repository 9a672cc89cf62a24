//! GLM-5 (`glm_moe_dsa`) and DeepSeek-V3 (`deepseek_v3`): multi-head latent
//! attention (with the DSA lightning indexer on GLM-5), a sigmoid
//! group-limited router with shared experts, dense leading layers, and the
//! optional next-token (MTP) module used for speculative drafts. Its
//! config, convert rules and registration ([`GLM`]) are here too;
//! GLM-4.7-Flash and DeepSeek-V3.2 run on it from their own folders.

mod attention;
pub mod config;
mod convert;
mod family;
mod forward;
pub mod gguf;
mod load;
mod moe;
mod predictor;
mod state;
pub mod synth;
mod weights;

pub use attention::{ABSORB_MAX_TOKENS, Form, Selection, layer_norm};
pub use config::GlmConfig;
pub(crate) use family::GLM;
pub use forward::Glm;
pub use load::{expert_map, load_dense, mtp_available, mtp_format};
pub use moe::{Routing, route};
pub use predictor::GlmPredictor;
pub use state::{Dims, GlmState, LayerCache, MtpCache, Pending};
pub use weights::{
    DenseWeights, IndexerWeights, KvProj, LayerWeights, MlaWeights, Mlp, MoeWeights, MtpWeights,
};
