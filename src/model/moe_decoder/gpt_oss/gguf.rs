//! gpt-oss's GGUF mapping: llama.cpp architecture `gpt-oss`, its metadata
//! rebuilt into the config.json [`super::from_json`] reads, and its tensors
//! named as the loader reads them.
//!
//! llama.cpp's converter splits the checkpoint's fused experts: the
//! interleaved `gate_up_proj` becomes `ffn_gate_exps` (even rows) and
//! `ffn_up_exps` (odd rows), output-major like every other family's
//! experts, and the interleaved bias `ffn_{gate,up}_exps.bias`; so a GGUF's
//! experts are plain per-expert matrices with biases, not the fused layout
//! of the Hugging Face releases. MXFP4 experts keep their blocks.
//!
//! Several things llama.cpp's gpt-oss graph fixes rather than reads, and
//! the mapping fixes them the same way: the clamped SwiGLU's limit (7.0;
//! the converter does not store `swiglu_limit`), the softmax over the
//! top-k router logits, no renormalisation. The sliding-window layers
//! follow `attention.sliding_window_pattern` as llama.cpp reads it (an
//! array of per-layer flags, or a period whose last layer attends fully;
//! absent, every even layer slides). YaRN's correction range is rounded
//! outwards as ggml rounds it (transformers' `truncate: true`), whatever
//! the checkpoint said. What llama.cpp would honour and colibri cannot (a
//! separate RoPE base for the sliding layers, an extra RoPE attention
//! factor, scaled expert weights) is refused naming the key.

use serde_json::{Value, json};

use crate::gguf::hparams::ArchKeys;
use crate::gguf::names::GgufNaming;
use crate::gguf::{Array, GgufError, GgufModel, Value as Value_};
use crate::model::expert::ExpertNaming;

/// `general.architecture` of gpt-oss files.
pub const ARCH: &str = "gpt-oss";

/// llama.cpp's RoPE base when the file stores none.
const LLAMA_CPP_ROPE_BASE: f64 = 10000.0;

/// The SwiGLU limit llama.cpp's gpt-oss graph hard-codes.
const SWIGLU_LIMIT: f64 = 7.0;

/// gpt-oss's own per-layer tensors, llama.cpp suffix → Hugging Face suffix.
pub const NAMING: GgufNaming = GgufNaming {
    experts: ExpertNaming::MLP,
    layer: &[
        ("post_attention_norm.weight", "post_attention_layernorm.weight"),
        ("attn_sinks.weight", "self_attn.sinks"),
        ("ffn_gate_inp.weight", "mlp.router.weight"),
        ("ffn_gate_inp.bias", "mlp.router.bias"),
    ],
};

/// The config.json of the gpt-oss model in `model`.
pub fn config_json(model: &GgufModel) -> Result<Value, GgufError> {
    let k = ArchKeys::new(model, ARCH);
    let key = |name: &str| format!("{ARCH}.{name}");
    let mut c = k.decoder_config("gpt_oss")?;
    let layers = k.count("block_count")?;
    c.insert(
        "intermediate_size".into(),
        json!(k.count("expert_feed_forward_length")?),
    );
    let heads = k.count("attention.head_count")?;
    let head_dim = match k.opt_count("attention.key_length")? {
        Some(d) => d,
        None => k.count("embedding_length")? / heads.max(1),
    };
    c.insert("head_dim".into(), json!(head_dim));
    if let Some(rot) = k.opt_count("rope.dimension_count")?
        && rot != head_dim
    {
        return Err(GgufError::Key {
            key: key("rope.dimension_count"),
            reason: format!("is {rot}; gpt-oss rotates whole heads of {head_dim} dimensions"),
        });
    }
    // Absent keys mean llama.cpp's defaults, not transformers': RoPE base
    // 10000, and no scaling (transformers' default would be YaRN).
    c.entry("rope_theta").or_insert(json!(LLAMA_CPP_ROPE_BASE));
    c.entry("rope_scaling").or_insert(Value::Null);
    c.insert(
        "sliding_window".into(),
        json!(k.count("attention.sliding_window")?),
    );
    c.insert("layer_types".into(), json!(layer_types(&k, layers)?));
    c.insert("swiglu_limit".into(), json!(SWIGLU_LIMIT));
    refuse_unhonoured(&k)?;
    Ok(Value::Object(c))
}

/// `attention.sliding_window_pattern` as llama.cpp reads it: per-layer
/// flags, or a period `n` (layer `l` slides when `l % n < n - 1`; 0 means
/// every layer); absent, a period of 2.
fn layer_types(k: &ArchKeys, layers: usize) -> Result<Vec<&'static str>, GgufError> {
    let name = format!("{ARCH}.attention.sliding_window_pattern");
    let flags: Option<Vec<bool>> = match k.model.metadata().get(&name) {
        Some(Value_::Array(Array::Bool(v))) => Some(v.clone()),
        Some(Value_::Array(Array::I32(v))) => Some(v.iter().map(|&x| x != 0).collect()),
        Some(Value_::Array(Array::U32(v))) => Some(v.iter().map(|&x| x != 0).collect()),
        Some(Value_::Array(a)) => {
            return Err(GgufError::Key {
                key: name,
                reason: format!(
                    "is an array of {}; llama.cpp reads per-layer flags as bools or integers",
                    a.element_type().name()
                ),
            });
        }
        _ => None,
    };
    let sliding: Vec<bool> = match flags {
        Some(flags) if flags.len() != layers => {
            return Err(GgufError::Key {
                key: name,
                reason: format!("has {} entries for {layers} layers", flags.len()),
            });
        }
        Some(flags) => flags,
        None => {
            let n = k.opt_count("attention.sliding_window_pattern")?.unwrap_or(2);
            (0..layers).map(|l| n == 0 || l % n < n - 1).collect()
        }
    };
    Ok(sliding
        .into_iter()
        .map(|s| if s { "sliding_attention" } else { "full_attention" })
        .collect())
}

/// Keys llama.cpp would apply that colibri's gpt-oss has no place for.
fn refuse_unhonoured(k: &ArchKeys) -> Result<(), GgufError> {
    let key = |name: &str| format!("{ARCH}.{name}");
    if let Some(swa) = k.opt_float("rope.freq_base_swa")? {
        let base = k.opt_float("rope.freq_base")?.unwrap_or(LLAMA_CPP_ROPE_BASE);
        if swa != base {
            return Err(GgufError::Key {
                key: key("rope.freq_base_swa"),
                reason: format!(
                    "is {swa}, not the RoPE base {base}: colibri's gpt-oss has one base for every layer"
                ),
            });
        }
    }
    for (name, neutral) in [
        ("rope.scaling.attn_factor", 1.0),
        ("rope.scaling.yarn_log_multiplier", 0.0),
        ("expert_weights_scale", 1.0),
    ] {
        if let Some(v) = k.opt_float(name)?
            && v != neutral
            && !(name == "expert_weights_scale" && v == 0.0)
        {
            return Err(GgufError::Key {
                key: key(name),
                reason: format!("is {v}; colibri's gpt-oss does not apply it"),
            });
        }
    }
    Ok(())
}
