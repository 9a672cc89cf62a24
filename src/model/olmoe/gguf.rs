//! OLMoE's GGUF mapping: llama.cpp architecture `olmoe`, its metadata keys
//! rebuilt into the config.json [`super::OlmoeConfig`] reads.
//!
//! llama.cpp's OLMoE graph never renormalises the top-k router weights and
//! its converter does not store `norm_topk_prob`, so it reads as false
//! unless a file says otherwise (`olmoe.expert_weights_norm`). A tied head
//! is the absence of `output.weight`, as llama.cpp loads it.

use serde_json::{Map, Value, json};

use crate::gguf::{GgufError, GgufModel, optional};

/// `general.architecture` of OLMoE files.
pub const ARCH: &str = "olmoe";

/// The config.json of the OLMoE model in `model` (validated afterwards by
/// [`super::OlmoeConfig::from_json`]).
pub fn config_json(model: &GgufModel) -> Result<Value, GgufError> {
    let m = model.metadata();
    let k = |name: &str| format!("{ARCH}.{name}");
    let count = |name: &str| m.get_count(&k(name));
    let opt_count = |name: &str| optional(m.get_count(&k(name)));
    let vocab = match opt_count("vocab_size")? {
        Some(v) => v,
        None => m.get_str_array("tokenizer.ggml.tokens")?.len(),
    };
    let heads = count("attention.head_count")?;
    let intermediate = match opt_count("expert_feed_forward_length")? {
        Some(v) => v,
        None => count("feed_forward_length")?,
    };
    let mut c = Map::new();
    c.insert("model_type".into(), json!("olmoe"));
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("hidden_size".into(), json!(count("embedding_length")?));
    c.insert("intermediate_size".into(), json!(intermediate));
    c.insert("num_hidden_layers".into(), json!(count("block_count")?));
    c.insert("num_attention_heads".into(), json!(heads));
    c.insert(
        "num_key_value_heads".into(),
        json!(opt_count("attention.head_count_kv")?.unwrap_or(heads)),
    );
    if let Some(d) = opt_count("attention.key_length")? {
        c.insert("head_dim".into(), json!(d));
    }
    c.insert("max_position_embeddings".into(), json!(count("context_length")?));
    if let Some(theta) = optional(m.get_float(&k("rope.freq_base")))? {
        c.insert("rope_theta".into(), json!(theta));
    }
    c.insert(
        "rms_norm_eps".into(),
        json!(m.get_float(&k("attention.layer_norm_rms_epsilon"))?),
    );
    c.insert("num_experts".into(), json!(count("expert_count")?));
    c.insert("num_experts_per_tok".into(), json!(count("expert_used_count")?));
    c.insert(
        "norm_topk_prob".into(),
        json!(optional(m.get_bool(&k("expert_weights_norm")))?.unwrap_or(false)),
    );
    if let Some(clip) = optional(m.get_float(&k("attention.clamp_kqv")))? {
        c.insert("clip_qkv".into(), json!(clip));
    }
    c.insert("tie_word_embeddings".into(), json!(!model.has("output.weight")));
    for (key, field) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
    ] {
        if let Some(id) = optional(m.get_count(key))? {
            c.insert(field.into(), json!(id));
        }
    }
    Ok(Value::Object(c))
}
