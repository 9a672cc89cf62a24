//! OLMoE's GGUF mapping: llama.cpp architecture `olmoe`, its metadata keys
//! rebuilt into the config.json [`super::OlmoeConfig`] reads.
//!
//! llama.cpp's OLMoE graph never renormalises the top-k router weights and
//! its converter does not store `norm_topk_prob`, so it reads as false
//! unless a file says otherwise (`olmoe.expert_weights_norm`).

use serde_json::{Value, json};

use crate::gguf::hparams::ArchKeys;
use crate::gguf::{GgufError, GgufModel};

/// `general.architecture` of OLMoE files.
pub const ARCH: &str = "olmoe";

/// The config.json of the OLMoE model in `model` (validated afterwards by
/// [`super::OlmoeConfig::from_json`]).
pub fn config_json(model: &GgufModel) -> Result<Value, GgufError> {
    let k = ArchKeys::new(model, ARCH);
    let mut c = k.decoder_config("olmoe")?;
    let intermediate = match k.opt_count("expert_feed_forward_length")? {
        Some(v) => v,
        None => k.count("feed_forward_length")?,
    };
    c.insert("intermediate_size".into(), json!(intermediate));
    c.insert(
        "norm_topk_prob".into(),
        json!(k.opt_bool("expert_weights_norm")?.unwrap_or(false)),
    );
    if let Some(clip) = k.opt_float("attention.clamp_kqv")? {
        c.insert("clip_qkv".into(), json!(clip));
    }
    Ok(Value::Object(c))
}
