//! MiniMax-M2's GGUF mapping: llama.cpp architecture `minimax-m2`, its
//! metadata rebuilt into the config.json [`super::from_json`] reads, and the
//! router's correction bias named as the checkpoint names it.
//!
//! llama.cpp's converter stacks the per-expert `w1` / `w3` / `w2` into
//! `ffn_{gate,up,down}_exps` without transposing them and stores q/k/v/o
//! as they are (no RoPE permutation), so every tensor reads back as the
//! checkpoint's. llama.cpp's MiniMax-M2 graph always renormalises the
//! top-k weights and never scales them; the router runs whatever
//! `expert_gating_func` says, and without the key llama.cpp cannot run the
//! file at all, so only the sigmoid (2) is read and anything else,
//! absence included, is refused naming the key. `rope.dimension_count` is
//! the rotated share (the release's `rotary_dim`); the q/k norms span all
//! heads at once, as the release's do.

use serde_json::{Value, json};

use crate::gguf::hparams::ArchKeys;
use crate::gguf::names::GgufNaming;
use crate::gguf::{GgufError, GgufModel};
use crate::model::expert::ExpertNaming;

/// `general.architecture` of MiniMax-M2 files.
pub const ARCH: &str = "minimax-m2";

/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`.
const GATING_SIGMOID: usize = 2;

/// llama.cpp's RoPE base when the file stores none.
const LLAMA_CPP_ROPE_BASE: f64 = 10000.0;

/// MiniMax-M2's own per-layer tensors, llama.cpp suffix → Hugging Face suffix.
pub const NAMING: GgufNaming = GgufNaming {
    experts: ExpertNaming::BLOCK_SPARSE,
    layer: &[("exp_probs_b.bias", "block_sparse_moe.e_score_correction_bias")],
};

/// The config.json of the MiniMax-M2 model in `model`.
pub fn config_json(model: &GgufModel) -> Result<Value, GgufError> {
    let k = ArchKeys::new(model, ARCH);
    let key = |name: &str| format!("{ARCH}.{name}");
    let mut c = k.decoder_config("minimax_m2")?;
    c.insert(
        "intermediate_size".into(),
        json!(k.count("expert_feed_forward_length")?),
    );
    c.entry("rope_theta").or_insert(json!(LLAMA_CPP_ROPE_BASE));
    let heads = k.count("attention.head_count")?;
    let head_dim = match k.opt_count("attention.key_length")? {
        Some(d) => d,
        None => k.count("embedding_length")? / heads.max(1),
    };
    c.insert("head_dim".into(), json!(head_dim));
    let rotary = k.opt_count("rope.dimension_count")?.unwrap_or(head_dim);
    if rotary == 0 || rotary > head_dim {
        return Err(GgufError::Key {
            key: key("rope.dimension_count"),
            reason: format!("is {rotary}, for heads of {head_dim} dimensions"),
        });
    }
    c.insert("rotary_dim".into(), json!(rotary));
    match k.opt_count("expert_gating_func")? {
        Some(GATING_SIGMOID) => {
            c.insert("scoring_func".into(), json!("sigmoid"));
        }
        other => {
            return Err(GgufError::Key {
                key: key("expert_gating_func"),
                reason: format!(
                    "is {}; MiniMax-M2 routes with a sigmoid ({GATING_SIGMOID})",
                    other.map_or_else(|| "missing".to_string(), |g| g.to_string())
                ),
            });
        }
    }
    if let Some(scale) = k.opt_float("expert_weights_scale")?
        && scale != 0.0
        && scale != 1.0
    {
        return Err(GgufError::Key {
            key: key("expert_weights_scale"),
            reason: format!("is {scale}; colibri's MiniMax-M2 router does not scale its weights"),
        });
    }
    if let Some(groups) = k.opt_count("expert_group_count")?
        && groups > 1
    {
        return Err(GgufError::Key {
            key: key("expert_group_count"),
            reason: format!("is {groups}; colibri's MiniMax-M2 router has one expert group"),
        });
    }
    if let Some(v) = k.opt_float("rope.scaling.attn_factor")?
        && v != 1.0
    {
        return Err(GgufError::Key {
            key: key("rope.scaling.attn_factor"),
            reason: format!("is {v}; colibri's MiniMax-M2 does not apply it"),
        });
    }
    Ok(Value::Object(c))
}
