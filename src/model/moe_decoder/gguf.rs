//! Qwen3-MoE's GGUF mapping: llama.cpp architecture `qwen3moe`, its
//! metadata rebuilt into the config.json [`super::MoeDecoderConfig`] reads.
//!
//! llama.cpp's Qwen3-MoE graph always renormalises the top-k router
//! weights (whatever `norm_topk_prob` the checkpoint had; the converter
//! does not store it), so a file reads as renormalising. llama.cpp treats
//! every layer as sparse; a layer without a router but with a dense MLP
//! (`mlp_only_layers` in transformers) is read as dense here rather than
//! refused. Mixtral GGUFs are llama.cpp's `llama` architecture, whose q/k
//! rows the converter permutes; they are not read.

use serde_json::{Value, json};

use crate::gguf::hparams::ArchKeys;
use crate::gguf::{GgufError, GgufModel};

/// `general.architecture` of Qwen3-MoE files.
pub const QWEN3MOE: &str = "qwen3moe";

/// The config.json of the Qwen3-MoE model in `model`.
pub fn qwen3_config_json(model: &GgufModel) -> Result<Value, GgufError> {
    let k = ArchKeys::new(model, QWEN3MOE);
    let mut c = k.decoder_config("qwen3_moe")?;
    let moe = k.count("expert_feed_forward_length")?;
    c.insert("moe_intermediate_size".into(), json!(moe));
    c.insert(
        "intermediate_size".into(),
        json!(k.opt_count("feed_forward_length")?.unwrap_or(moe)),
    );
    c.insert("norm_topk_prob".into(), json!(true));
    if let Some(scale) = k.opt_float("expert_weights_scale")?
        && scale != 0.0
        && scale != 1.0
    {
        return Err(GgufError::Key {
            key: format!("{QWEN3MOE}.expert_weights_scale"),
            reason: format!("is {scale}; colibri's Qwen3-MoE router does not scale its weights"),
        });
    }
    let layers = k.count("block_count")?;
    // Every block has tensors of its own; a larger count would be walked
    // layer by layer below.
    if layers > model.len() {
        return Err(GgufError::Key {
            key: format!("{QWEN3MOE}.block_count"),
            reason: format!("is {layers}, more than the file's {} tensors", model.len()),
        });
    }
    let dense: Vec<usize> = (0..layers)
        .filter(|&l| !k.layer_has(l, "ffn_gate_inp.weight") && k.layer_has(l, "ffn_up.weight"))
        .collect();
    c.insert("mlp_only_layers".into(), json!(dense));
    c.insert("decoder_sparse_step".into(), json!(1));
    Ok(Value::Object(c))
}
