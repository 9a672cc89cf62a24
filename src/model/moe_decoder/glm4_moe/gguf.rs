//! GLM-4.5 / 4.6 / 4.7's GGUF mapping: llama.cpp architecture `glm4moe`,
//! its metadata rebuilt into the config.json [`super::from_json`] reads,
//! and the tensors only GLM has (shared experts, the router's correction
//! bias, the post-attention norm, the next-token layer) named as the
//! Hugging Face checkpoint names them.
//!
//! What llama.cpp decides differently from transformers' defaults, the
//! file's own keys decide here too: `expert_weights_norm` absent means no
//! renormalisation, `expert_weights_scale` absent means no scaling, and
//! expert groups exist only when `expert_group_count` says so (GLM-4.5's
//! converter stores none: its checkpoints have one group). q/k norms and
//! q/k/v biases are there when their tensors are.

use serde_json::{Value, json};

use crate::gguf::hparams::ArchKeys;
use crate::gguf::names::GgufNaming;
use crate::gguf::{GgufError, GgufModel};
use crate::model::expert::ExpertNaming;

/// `general.architecture` of GLM-4.x MoE files.
pub const ARCH: &str = "glm4moe";

/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`.
const GATING_SIGMOID: usize = 2;

/// GLM's own per-layer tensors, llama.cpp suffix → Hugging Face suffix.
pub const NAMING: GgufNaming = GgufNaming {
    experts: ExpertNaming::MLP,
    layer: &[
        ("post_attention_norm.weight", "post_attention_layernorm.weight"),
        ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
        ("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"),
        ("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"),
        ("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"),
        ("nextn.eh_proj.weight", "eh_proj.weight"),
        ("nextn.enorm.weight", "enorm.weight"),
        ("nextn.hnorm.weight", "hnorm.weight"),
        ("nextn.shared_head_norm.weight", "shared_head.norm.weight"),
        ("nextn.shared_head_head.weight", "shared_head.head.weight"),
        ("nextn.embed_tokens.weight", "embed_tokens.weight"),
    ],
};

/// The config.json of the GLM-4.x MoE model in `model`.
pub fn config_json(model: &GgufModel) -> Result<Value, GgufError> {
    let k = ArchKeys::new(model, ARCH);
    let key = |name: &str| format!("{ARCH}.{name}");
    let mut c = k.decoder_config("glm4_moe")?;
    let blocks = k.count("block_count")?;
    let declared_nextn = k.opt_count("nextn_predict_layers")?.unwrap_or(0);
    if declared_nextn > blocks {
        return Err(GgufError::Key {
            key: key("nextn_predict_layers"),
            reason: format!("is {declared_nextn}, more than the {blocks} blocks"),
        });
    }
    let layers = blocks - declared_nextn;
    if !k.layer_has(0, "attn_norm.weight") {
        return Err(GgufError::Key {
            key: key("nextn_predict_layers"),
            reason: "the file holds only the next-token (MTP) layers, not the model: \
                     point --model at the main GGUF"
                .into(),
        });
    }
    // A file converted without its next-token layer may still declare it.
    let nextn = if (layers..blocks).all(|l| k.layer_has(l, "nextn.eh_proj.weight")) {
        declared_nextn
    } else {
        0
    };
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("num_nextn_predict_layers".into(), json!(nextn));
    c.insert(
        "moe_intermediate_size".into(),
        json!(k.count("expert_feed_forward_length")?),
    );
    c.insert("intermediate_size".into(), json!(k.count("feed_forward_length")?));
    c.insert("n_shared_experts".into(), json!(k.count("expert_shared_count")?));
    c.insert(
        "first_k_dense_replace".into(),
        json!(k.opt_count("leading_dense_block_count")?.unwrap_or(0)),
    );
    let scale = k.opt_float("expert_weights_scale")?.unwrap_or(0.0);
    c.insert(
        "routed_scaling_factor".into(),
        json!(if scale == 0.0 { 1.0 } else { scale }),
    );
    c.insert(
        "norm_topk_prob".into(),
        json!(k.opt_bool("expert_weights_norm")?.unwrap_or(false)),
    );
    match k.opt_count("expert_gating_func")? {
        None | Some(0) | Some(GATING_SIGMOID) => {}
        Some(other) => {
            return Err(GgufError::Key {
                key: key("expert_gating_func"),
                reason: format!("is {other}; GLM-4.x routes with a sigmoid ({GATING_SIGMOID})"),
            });
        }
    }
    c.insert(
        "n_group".into(),
        json!(k.opt_count("expert_group_count")?.unwrap_or(1).max(1)),
    );
    c.insert(
        "topk_group".into(),
        json!(k.opt_count("expert_group_used_count")?.unwrap_or(1).max(1)),
    );
    let head_dim = match k.opt_count("attention.key_length")? {
        Some(d) => d,
        None => {
            let heads = k.count("attention.head_count")?.max(1);
            k.count("embedding_length")? / heads
        }
    };
    let rotary = k.opt_count("rope.dimension_count")?.unwrap_or(head_dim / 2);
    if head_dim == 0 || rotary == 0 || rotary > head_dim {
        return Err(GgufError::Key {
            key: key("rope.dimension_count"),
            reason: format!("is {rotary}, for heads of {head_dim} dimensions"),
        });
    }
    c.insert("head_dim".into(), json!(head_dim));
    c.insert(
        "partial_rotary_factor".into(),
        json!(rotary_factor(rotary, head_dim)),
    );
    c.insert("use_qk_norm".into(), json!(k.layer_has(0, "attn_q_norm.weight")));
    c.insert("attention_bias".into(), json!(k.layer_has(0, "attn_q.bias")));
    Ok(Value::Object(c))
}

/// The `partial_rotary_factor` transformers turns back into `rotary` of
/// `head_dim` dimensions (`int(head_dim * factor)`): the quotient, one
/// step up where its rounding would truncate to one dimension less.
pub(crate) fn rotary_factor(rotary: usize, head_dim: usize) -> f64 {
    let f = rotary as f64 / head_dim as f64;
    if (head_dim as f64 * f) as usize == rotary {
        f
    } else {
        f64::from_bits(f.to_bits() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rotary_factor_gives_back_the_rotary_dimensions() {
        for head_dim in 1..=512usize {
            for rotary in 1..=head_dim {
                let f = rotary_factor(rotary, head_dim);
                assert_eq!((head_dim as f64 * f) as usize, rotary, "{rotary}/{head_dim}");
                assert!(f <= 1.0);
            }
        }
    }
}
