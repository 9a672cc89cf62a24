//! DeepSeek-V2 / V3 / R1 (and what converts as they do: Kimi-K2,
//! GLM-4.7-Flash) as llama.cpp's architecture `deepseek2`: its metadata
//! rebuilt into the `deepseek_v3` config.json this family reads, and its
//! MLA tensors named as the Hugging Face checkpoint names them.
//!
//! The MLA projection from the latent to keys and values comes in two
//! layouts: older converters kept `attn_kv_b` (read as `kv_b_proj`), newer
//! ones split it into `attn_k_b` (each head's K rows transposed) and
//! `attn_v_b`, which the loader keeps per head and multiplies absorbed, as
//! llama.cpp does. `key_length` / `value_length` are the latent widths
//! there; the head sizes are the `_mla` keys (older files: the plain ones).
//!
//! Where llama.cpp decides otherwise than transformers' defaults, the
//! file's keys decide as llama.cpp reads them: `expert_weights_norm` absent
//! is no renormalisation, `expert_weights_scale` absent is no scaling, and
//! YaRN's softmax correction comes from `rope.scaling.yarn_log_multiplier`
//! (the converter stores `0.1 * mscale_all_dim`; llama.cpp then takes
//! `mscale` equal to it, so the rotary attention factor is 1). What this
//! engine cannot run as llama.cpp does is refused naming the key: the
//! softmax router of DeepSeek-V2 (and of files that store no gating
//! function, which llama.cpp routes with a softmax), YaRN without the log
//! multiplier (llama.cpp then scales the rotary part twice), attention
//! temperature tuning, the V3.2 sparse-attention indexer.

use serde_json::{Value, json};

use crate::gguf::hparams::ArchKeys;
use crate::gguf::names::GgufNaming;
use crate::gguf::{GgufError, GgufModel};
use crate::model::expert::ExpertNaming;

/// `general.architecture` of DeepSeek-V2 / V3 files.
pub const ARCH: &str = "deepseek2";

/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX` and `_SIGMOID`.
const GATING_SOFTMAX: usize = 1;
const GATING_SIGMOID: usize = 2;

/// The converter's factor on `mscale_all_dim` in `yarn_log_multiplier`.
const LOG_MUL_FACTOR: f64 = 0.1;

/// The MLA tensors, llama.cpp suffix → Hugging Face suffix (`k_b_proj` /
/// `v_b_proj` are colibri's names for llama.cpp's split projection).
pub const NAMING: GgufNaming = GgufNaming {
    experts: ExpertNaming::MLP,
    layer: &[
        ("attn_q_a.weight", "self_attn.q_a_proj.weight"),
        ("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"),
        ("attn_q_b.weight", "self_attn.q_b_proj.weight"),
        ("attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"),
        ("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"),
        ("attn_kv_b.weight", "self_attn.kv_b_proj.weight"),
        ("attn_k_b.weight", "self_attn.k_b_proj.weight"),
        ("attn_v_b.weight", "self_attn.v_b_proj.weight"),
        ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
        ("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"),
        ("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"),
        ("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"),
    ],
};

/// The config.json of the DeepSeek-V2/V3-shaped model in `model`.
pub fn config_json(model: &GgufModel) -> Result<Value, GgufError> {
    let k = ArchKeys::new(model, ARCH);
    let bad = |name: &str, reason: String| GgufError::Key {
        key: k.key(name),
        reason,
    };
    refuse_unsupported(&k)?;
    let mut c = k.base_config("deepseek_v3")?;

    let blocks = k.count("block_count")?;
    let nextn = k.opt_count("nextn_predict_layers")?.unwrap_or(0);
    if nextn >= blocks {
        return Err(bad(
            "nextn_predict_layers",
            format!("is {nextn}, for {blocks} blocks: the file holds no main layers"),
        ));
    }
    // The next-token layers at the end are not run (llama.cpp's main
    // graph does not run them either).
    c.insert("num_hidden_layers".into(), json!(blocks - nextn));
    c.insert("num_nextn_predict_layers".into(), json!(0));

    let kv_lora = k.count("attention.kv_lora_rank")?;
    c.insert("kv_lora_rank".into(), json!(kv_lora));
    c.insert(
        "q_lora_rank".into(),
        match k.opt_count("attention.q_lora_rank")? {
            Some(q) if q > 0 => json!(q),
            _ => Value::Null,
        },
    );
    let rope = k.count("rope.dimension_count")?;
    let key_len = match k.opt_count("attention.key_length_mla")? {
        Some(d) => d,
        None => k.count("attention.key_length")?,
    };
    let value_len = match k.opt_count("attention.value_length_mla")? {
        Some(d) => d,
        None => k.count("attention.value_length")?,
    };
    if rope == 0 || rope >= key_len {
        return Err(bad(
            "rope.dimension_count",
            format!("is {rope}, for query/key heads of {key_len} dimensions (the rest is the no-rope part)"),
        ));
    }
    c.insert("qk_rope_head_dim".into(), json!(rope));
    c.insert("qk_nope_head_dim".into(), json!(key_len - rope));
    c.insert("v_head_dim".into(), json!(value_len));
    c.insert("rope_interleave".into(), json!(true));

    c.insert("intermediate_size".into(), json!(k.count("feed_forward_length")?));
    c.insert(
        "moe_intermediate_size".into(),
        json!(k.count("expert_feed_forward_length")?),
    );
    c.insert(
        "n_shared_experts".into(),
        json!(k.opt_count("expert_shared_count")?.unwrap_or(0)),
    );
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
        Some(GATING_SIGMOID) => {}
        None if glm47_flash(&k, blocks)? => {}
        None => {
            return Err(bad(
                "expert_gating_func",
                format!(
                    "is absent, which llama.cpp reads as a softmax router (DeepSeek-V2); colibri's MLA \
                     family routes with a sigmoid ({GATING_SIGMOID})"
                ),
            ));
        }
        Some(other) => {
            let what = if other == GATING_SOFTMAX {
                " (softmax, DeepSeek-V2)"
            } else {
                ""
            };
            return Err(bad(
                "expert_gating_func",
                format!("is {other}{what}; colibri's MLA family routes with a sigmoid ({GATING_SIGMOID})"),
            ));
        }
    }
    // llama.cpp masks the dropped groups with minus infinity, as this
    // family's router does.
    c.insert(
        "n_group".into(),
        json!(k.opt_count("expert_group_count")?.unwrap_or(1).max(1)),
    );
    c.insert(
        "topk_group".into(),
        json!(k.opt_count("expert_group_used_count")?.unwrap_or(1).max(1)),
    );

    // llama.cpp normalises the latents with the model's epsilon.
    c.insert(
        "latent_norm_eps".into(),
        json!(k.float("attention.layer_norm_rms_epsilon")?),
    );
    if let Some(scaling) = c.get_mut("rope_scaling") {
        yarn_mscale(&k, scaling)?;
    }
    Ok(Value::Object(c))
}

/// GLM-4.7-Flash files converted before the gating function was stored:
/// llama.cpp recognises them by their shape and routes them with a sigmoid.
fn glm47_flash(k: &ArchKeys<'_>, blocks: usize) -> Result<bool, GgufError> {
    let vocab = match k.opt_count("vocab_size")? {
        Some(v) => v,
        None => k.model.metadata().get_str_array("tokenizer.ggml.tokens")?.len(),
    };
    Ok((blocks == 47 || blocks == 48) && vocab == 154_880)
}

/// Adds DeepSeek's `mscale` / `mscale_all_dim` to a YaRN `rope_scaling`
/// from `yarn_log_multiplier`, as llama.cpp reads it.
fn yarn_mscale(k: &ArchKeys<'_>, scaling: &mut Value) -> Result<(), GgufError> {
    if scaling.get("rope_type").and_then(Value::as_str) != Some("yarn") {
        return Ok(());
    }
    let Some(log_mul) = k
        .opt_float("rope.scaling.yarn_log_multiplier")?
        .filter(|&v| v != 0.0)
    else {
        return Err(GgufError::Key {
            key: k.key("rope.scaling.yarn_log_multiplier"),
            reason: "is absent or 0 with YaRN scaling: llama.cpp then scales the rotary part of the scores \
                     by the YaRN factor twice, which neither transformers nor colibri does"
                .into(),
        });
    };
    let all = log_mul / LOG_MUL_FACTOR;
    if !(all.is_finite() && all.abs() < 1e6) {
        return Err(GgufError::Key {
            key: k.key("rope.scaling.yarn_log_multiplier"),
            reason: format!("is {log_mul}, not a usable multiplier"),
        });
    }
    scaling["mscale"] = json!(all);
    scaling["mscale_all_dim"] = json!(all);
    Ok(())
}

/// Metadata and tensors colibri cannot honour, each refused by name.
fn refuse_unsupported(k: &ArchKeys<'_>) -> Result<(), GgufError> {
    for name in ["attention.temperature_scale", "rope.scaling.attn_factor"] {
        let neutral = if name == "rope.scaling.attn_factor" {
            1.0
        } else {
            0.0
        };
        if let Some(v) = k.opt_float(name)?
            && v != neutral
        {
            return Err(GgufError::Key {
                key: k.key(name),
                reason: format!("is {v}; colibri's MLA attention has no such scaling"),
            });
        }
    }
    for key in [
        "attention.indexer.head_count",
        "attention.indexer.key_length",
        "attention.indexer.top_k",
    ] {
        if k.model.metadata().contains(&k.key(key)) {
            return Err(GgufError::Key {
                key: k.key(key),
                reason: "is DeepSeek-V3.2's sparse-attention indexer, which deepseek2 files cannot run"
                    .into(),
            });
        }
    }
    if let Some(t) = k.model.tensors().find(|t| t.info.name.contains(".indexer.")) {
        return Err(GgufError::tensor(
            &t.info.name,
            "is a DeepSeek-V3.2 sparse-attention indexer tensor, which deepseek2 files cannot run",
        ));
    }
    Ok(())
}
