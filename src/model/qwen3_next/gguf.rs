//! Qwen3-Next's and Qwen3.5/3.6-MoE's GGUF mappings: llama.cpp
//! architectures `qwen3next` and `qwen35moe`, their metadata rebuilt into
//! the config.json [`super::Qwen3NextConfig`] reads, and their tensors
//! named as the loader reads them.
//!
//! llama.cpp's converter rewrites some tensors rather than only renaming
//! them, so a file is not the Hugging Face checkpoint under other names.
//! The view records the architecture it was read as
//! ([`crate::gguf::checkpoint::ARCHITECTURE_KEY`], also kept by `coli
//! convert`), and the loader reads those tensors as the converter left
//! them ([`Stored::LlamaCpp`]):
//!
//! - every zero-centred RMSNorm weight (input, post-attention, final, q/k
//!   norms) is stored as `1 + w`; the gated norm of the linear layers is
//!   not centred and is stored as it is;
//! - `A_log` is stored as `-exp(A_log)` (`ssm_a`), read here as `A`;
//! - the depthwise convolution `[channels, 1, kernel]` is squeezed to
//!   `[channels, kernel]`;
//! - `in_proj_qkvz` (interleaved per key head) is split into `attn_qkv`
//!   (all q, all k, all v: the convolution's channel order) and
//!   `attn_gate` (z), the layout Qwen3.5's `in_proj_qkv` / `in_proj_z`
//!   have, so they are read under those names; `in_proj_ba` is kept
//!   interleaved (`ssm_ba`). Qwen3.5's separate `in_proj_b` / `in_proj_a`
//!   are `ssm_beta` / `ssm_alpha`.
//! - Qwen3.5 only: where there are more value heads than key heads, every
//!   per-value-head row (the v rows of `attn_qkv` and of the convolution,
//!   z, b, a, `A`, `dt_bias`) and the columns of `ssm_out` are reordered
//!   from grouped (value head `j` reads key head `j / r`) to tiled order
//!   (key head `j % key_heads`), so that ggml can broadcast q and k by
//!   repetition. The output projection's columns cannot be permuted back
//!   in ggml blocks, so the heads are kept in the file's order and the
//!   delta rule pairs them as tiled ([`Stored::tiled_value_heads`]).
//!
//! llama.cpp always renormalises the top-k router weights of this graph
//! and runs every layer as MoE; a `expert_weights_scale` other than 0 or 1
//! is refused since colibri's router does not scale. A next-token (MTP)
//! block appended by the converter (`nextn_predict_layers`) is not run,
//! as in llama.cpp's main graph.

use serde_json::{Value, json};

use crate::gguf::checkpoint::ARCHITECTURE_KEY;
use crate::gguf::hparams::ArchKeys;
use crate::gguf::names::GgufNaming;
use crate::gguf::{Array, GgufError, GgufModel, optional};
use crate::model::expert::ExpertNaming;
use crate::model::moe_decoder::glm4_moe::gguf::rotary_factor;
use crate::st::Checkpoint;

/// `general.architecture` of Qwen3-Next files.
pub const QWEN3NEXT: &str = "qwen3next";

/// `general.architecture` of Qwen3.5 / 3.6 MoE files.
pub const QWEN35MOE: &str = "qwen35moe";

/// Qwen3-Next's own per-layer tensors, llama.cpp suffix → Hugging Face
/// suffix (or, for what the converter rewrote, the name the loader reads
/// the rewritten tensor under).
pub const NAMING: GgufNaming = GgufNaming {
    experts: ExpertNaming::MLP,
    layer: &[
        ("post_attention_norm.weight", "post_attention_layernorm.weight"),
        ("attn_qkv.weight", "linear_attn.in_proj_qkv.weight"),
        ("attn_gate.weight", "linear_attn.in_proj_z.weight"),
        ("ssm_ba.weight", "linear_attn.in_proj_ba.weight"),
        ("ssm_beta.weight", "linear_attn.in_proj_b.weight"),
        ("ssm_alpha.weight", "linear_attn.in_proj_a.weight"),
        ("ssm_conv1d.weight", "linear_attn.conv1d.weight"),
        ("ssm_dt.bias", "linear_attn.dt_bias"),
        ("ssm_a", "linear_attn.A"),
        ("ssm_norm.weight", "linear_attn.norm.weight"),
        ("ssm_out.weight", "linear_attn.out_proj.weight"),
        ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
        ("ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"),
        ("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
        ("ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"),
    ],
};

/// How a checkpoint holds the tensors llama.cpp's converter rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// A Hugging Face checkpoint (or a container converted from one).
    HuggingFace,
    /// A `qwen3next` GGUF, or a container `coli convert` made from one.
    LlamaCpp,
    /// A `qwen35moe` GGUF (or its container): also value heads in tiled
    /// order.
    LlamaCppTiled,
}

impl Stored {
    /// Read from the architecture the checkpoint view records.
    pub fn of(ck: &Checkpoint) -> Self {
        match ck.metadata().get(ARCHITECTURE_KEY).map(String::as_str) {
            Some(QWEN3NEXT) => Stored::LlamaCpp,
            Some(QWEN35MOE) => Stored::LlamaCppTiled,
            _ => Stored::HuggingFace,
        }
    }

    /// Whether the converter rewrote the tensors (norms, `A`, convolution,
    /// split projections).
    pub fn by_llama_cpp(self) -> bool {
        self != Stored::HuggingFace
    }

    /// Whether value head `j` pairs with key head `j % key_heads` (tiled)
    /// rather than `j / (value_heads / key_heads)` (grouped).
    pub fn tiled_value_heads(self) -> bool {
        self == Stored::LlamaCppTiled
    }
}

/// The config.json of the Qwen3-Next model in `model`.
pub fn config_json(model: &GgufModel) -> Result<Value, GgufError> {
    config_for(model, QWEN3NEXT, "qwen3_next")
}

/// The config.json of the Qwen3.5 / 3.6 MoE model in `model`, read as its
/// language model.
pub fn qwen35_config_json(model: &GgufModel) -> Result<Value, GgufError> {
    config_for(model, QWEN35MOE, "qwen3_5_moe_text")
}

/// Both architectures store the same keys. Qwen3.5's interleaved M-RoPE
/// (`rope.dimension_sections`) rotates text by its one position in every
/// section, which is plain RoPE over the same dimensions, so the sections
/// are not read.
fn config_for(model: &GgufModel, arch: &'static str, model_type: &str) -> Result<Value, GgufError> {
    let k = ArchKeys::new(model, arch);
    let key = |name: &str| format!("{arch}.{name}");
    let mut c = k.decoder_config(model_type)?;
    let blocks = k.count("block_count")?;
    let nextn = k.opt_count("nextn_predict_layers")?.unwrap_or(0);
    if nextn >= blocks {
        return Err(GgufError::Key {
            key: key("nextn_predict_layers"),
            reason: format!("is {nextn}, but the file has {blocks} blocks in all"),
        });
    }
    if !k.layer_has(0, "attn_norm.weight") {
        return Err(GgufError::Key {
            key: key("nextn_predict_layers"),
            reason: "the file holds only the next-token (MTP) layers, not the model: \
                     point --model at the main GGUF"
                .into(),
        });
    }
    let layers = blocks - nextn;
    // Every block has tensors of its own: a count above the file's tensors
    // is a hostile one (and would be walked layer by layer below).
    if blocks > model.len() {
        return Err(GgufError::Key {
            key: key("block_count"),
            reason: format!("is {blocks}, more than the file's {} tensors", model.len()),
        });
    }
    c.insert("num_hidden_layers".into(), json!(layers));
    let moe = k.count("expert_feed_forward_length")?;
    c.insert("moe_intermediate_size".into(), json!(moe));
    let ff = k.opt_count("feed_forward_length")?;
    c.insert("intermediate_size".into(), json!(ff.unwrap_or(moe)));
    // llama.cpp falls back to the dense width when the key is absent or 0.
    let shared = match k.opt_count("expert_shared_feed_forward_length")? {
        Some(n) if n > 0 => n,
        _ => ff.ok_or_else(|| GgufError::Key {
            key: key("expert_shared_feed_forward_length"),
            reason: "is missing (and so is feed_forward_length): the shared expert has no size".into(),
        })?,
    };
    c.insert("shared_expert_intermediate_size".into(), json!(shared));
    c.insert("norm_topk_prob".into(), json!(true));
    c.insert("mlp_only_layers".into(), json!([]));
    c.insert("decoder_sparse_step".into(), json!(1));
    if let Some(scale) = k.opt_float("expert_weights_scale")?
        && scale != 0.0
        && scale != 1.0
    {
        return Err(GgufError::Key {
            key: key("expert_weights_scale"),
            reason: format!("is {scale}; colibri's {model_type} router does not scale its weights"),
        });
    }

    // The linear-attention shapes: llama.cpp's names for Mamba's sizes.
    let value_heads = k.count("ssm.time_step_rank")?;
    let inner = k.count("ssm.inner_size")?;
    if value_heads == 0 || !inner.is_multiple_of(value_heads) {
        return Err(GgufError::Key {
            key: key("ssm.inner_size"),
            reason: format!("is {inner}, not a whole number of heads of ssm.time_step_rank {value_heads}"),
        });
    }
    c.insert(
        "linear_conv_kernel_dim".into(),
        json!(k.count("ssm.conv_kernel")?),
    );
    c.insert("linear_key_head_dim".into(), json!(k.count("ssm.state_size")?));
    c.insert("linear_num_key_heads".into(), json!(k.count("ssm.group_count")?));
    c.insert("linear_num_value_heads".into(), json!(value_heads));
    c.insert("linear_value_head_dim".into(), json!(inner / value_heads));

    c.insert("layer_types".into(), json!(layer_types(&k, layers)?));

    let head_dim = match k.opt_count("attention.key_length")? {
        Some(d) => d,
        None => {
            let heads = k.count("attention.head_count")?.max(1);
            k.count("embedding_length")? / heads
        }
    };
    let rotary = k.opt_count("rope.dimension_count")?.unwrap_or(head_dim / 4);
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
    Ok(Value::Object(c))
}

/// Which of the first `layers` blocks are linear attention:
/// `attention.recurrent_layers` when stored (one bool per block, next-token
/// blocks included), else every `full_attention_interval`-th (default 4)
/// is full attention, as llama.cpp decides.
fn layer_types(k: &ArchKeys, layers: usize) -> Result<Vec<&'static str>, GgufError> {
    let kind = |recurrent: bool| {
        if recurrent {
            "linear_attention"
        } else {
            "full_attention"
        }
    };
    let rec_key = format!("{}.attention.recurrent_layers", k.arch);
    if let Some(arr) = optional(k.model.metadata().get_array(&rec_key))? {
        let Array::Bool(flags) = arr else {
            return Err(GgufError::Key {
                key: rec_key,
                reason: format!("is an array of {}, expected bool", arr.element_type().name()),
            });
        };
        if flags.len() < layers {
            return Err(GgufError::Key {
                key: rec_key,
                reason: format!("names {} blocks, the model has {layers}", flags.len()),
            });
        }
        return Ok(flags[..layers].iter().map(|&r| kind(r)).collect());
    }
    let every = k.opt_count("full_attention_interval")?.unwrap_or(4);
    if every == 0 {
        return Err(GgufError::Key {
            key: format!("{}.full_attention_interval", k.arch),
            reason: "is 0; it must be at least 1".into(),
        });
    }
    Ok((0..layers)
        .map(|l| kind(!(l + 1).is_multiple_of(every)))
        .collect())
}
