//! `config.json` of Qwen3-Next (`qwen3_next`) and Qwen3.5/3.6-MoE
//! (`qwen3_5_moe`, its text-only `qwen3_5_moe_text`), validated.
//!
//! The attention and MoE half of these models is Qwen3-MoE's (grouped
//! query attention with per-head q/k norm, a softmax top-k router), so
//! that half is kept as a [`MoeDecoderConfig`] and validated by its own
//! rules; what is new is the layer pattern and the linear-attention
//! (Gated DeltaNet) shapes.

use std::path::Path;

use serde::Deserialize;

use crate::config::{ConfigError, check_products};
use crate::model::moe_decoder::{
    DecoderKind, MoeDecoderConfig, RouterChoice, check_act, check_counts, parse_rope,
};

/// What one decoder layer mixes its tokens with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet: a recurrent state of fixed size.
    Linear,
    /// Gated softmax attention over a KV cache.
    Full,
}

/// How the in-projections of a linear layer are laid out in the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjLayout {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, interleaved per key head.
    Interleaved,
    /// Qwen3.5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Split,
}

/// The sizes of the linear-attention layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearShape {
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub conv_kernel: usize,
}

impl LinearShape {
    /// Channels of the causal convolution: q, k and v side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// f32 values of one layer's recurrent state: the convolution's last
    /// `conv_kernel - 1` inputs and the delta rule's `[heads, dk, dv]`.
    pub fn state_values(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim() + self.value_heads * self.key_dim * self.value_dim
    }
}

/// A validated Qwen3-Next / Qwen3.5-MoE config.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3NextConfig {
    /// The attention, MoE and vocabulary half (Qwen3-MoE's fields).
    pub base: MoeDecoderConfig,
    pub layers: Vec<LayerKind>,
    pub linear: LinearShape,
    pub proj: ProjLayout,
    /// Rows of the shared expert's gate/up projection.
    pub shared_intermediate: usize,
}

#[derive(Deserialize)]
struct Json {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    #[serde(default)]
    intermediate_size: Option<usize>,
    moe_intermediate_size: usize,
    shared_expert_intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(default)]
    head_dim: Option<usize>,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    partial_rotary_factor: Option<f64>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    num_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default)]
    norm_topk_prob: Option<bool>,
    #[serde(default)]
    decoder_sparse_step: Option<usize>,
    #[serde(default)]
    mlp_only_layers: Option<Vec<usize>>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    full_attention_interval: Option<usize>,
    #[serde(default = "default_conv")]
    linear_conv_kernel_dim: usize,
    linear_key_head_dim: usize,
    linear_value_head_dim: usize,
    linear_num_key_heads: usize,
    linear_num_value_heads: usize,
}

fn default_max_pos() -> usize {
    32768
}

fn default_eps() -> f64 {
    1e-6
}

fn default_conv() -> usize {
    4
}

/// Count fields, checked to be non-negative integers so errors name them.
const COUNT_FIELDS: [&str; 19] = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "num_experts",
    "num_experts_per_tok",
    "decoder_sparse_step",
    "full_attention_interval",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
];

/// Upper bounds on the linear-attention shapes: far above any release
/// (Qwen3.5-397B: 64 value heads of 128), low enough that a hostile
/// config cannot ask for a state larger than memory.
const MAX_LINEAR_HEADS: usize = 1024;
const MAX_LINEAR_DIM: usize = 1024;
const MAX_CONV_KERNEL: usize = 64;

impl Qwen3NextConfig {
    /// The `model_type`s this config reads.
    pub const MODEL_TYPES: [&'static str; 3] = ["qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"];

    pub fn from_json(path: &Path, value: serde_json::Value) -> Result<Self, ConfigError> {
        let value = crate::config::spelling::canonical(path, value)?;
        check_counts(path, &value, &COUNT_FIELDS)?;
        let j: Json =
            serde_json::from_value(value).map_err(|e| crate::config::spelling::parse_error(path, e))?;
        let bad = |field: &'static str, reason: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            reason,
        };
        let next = match j.model_type.as_str() {
            "qwen3_next" => true,
            "qwen3_5_moe" | "qwen3_5_moe_text" => false,
            other => {
                return Err(ConfigError::ModelType {
                    path: path.to_path_buf(),
                    found: other.to_string(),
                });
            }
        };
        if j.attention_bias {
            return Err(bad(
                "attention_bias",
                format!("is true: attention biases are not supported for {}", j.model_type),
            ));
        }
        check_act(path, j.hidden_act.as_deref())?;
        let heads = j.num_attention_heads;
        let head_dim = j.head_dim.unwrap_or(j.hidden_size / heads.max(1));
        let factor = j.partial_rotary_factor.unwrap_or(0.25);
        if !(factor.is_finite() && factor > 0.0 && factor <= 1.0) {
            return Err(bad(
                "partial_rotary_factor",
                format!("must be in (0, 1], got {factor}"),
            ));
        }
        // transformers: int(head_dim * factor).
        let rotary_dim = (head_dim as f64 * factor) as usize;
        let rope_scaling = parse_rope(path, j.rope_scaling.as_ref(), j.max_position_embeddings)?;
        let n = j.num_hidden_layers;
        let layers = match &j.layer_types {
            Some(types) => {
                if types.len() != n {
                    return Err(bad(
                        "layer_types",
                        format!("names {} layers, num_hidden_layers is {n}", types.len()),
                    ));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        "linear_attention" => Ok(LayerKind::Linear),
                        "full_attention" => Ok(LayerKind::Full),
                        other => Err(bad(
                            "layer_types",
                            format!("{other:?} is not a layer type (linear_attention or full_attention)"),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
            None => {
                let every = j.full_attention_interval.unwrap_or(4);
                if every == 0 {
                    return Err(bad("full_attention_interval", "must be at least 1".into()));
                }
                if n > crate::config::COUNT_LIMIT {
                    return Err(bad("num_hidden_layers", format!("{n} is too many")));
                }
                (0..n)
                    .map(|l| {
                        if (l + 1).is_multiple_of(every) {
                            LayerKind::Full
                        } else {
                            LayerKind::Linear
                        }
                    })
                    .collect()
            }
        };
        let linear = LinearShape {
            key_heads: j.linear_num_key_heads,
            value_heads: j.linear_num_value_heads,
            key_dim: j.linear_key_head_dim,
            value_dim: j.linear_value_head_dim,
            conv_kernel: j.linear_conv_kernel_dim,
        };
        for (field, v, max) in [
            ("linear_num_key_heads", linear.key_heads, MAX_LINEAR_HEADS),
            ("linear_num_value_heads", linear.value_heads, MAX_LINEAR_HEADS),
            ("linear_key_head_dim", linear.key_dim, MAX_LINEAR_DIM),
            ("linear_value_head_dim", linear.value_dim, MAX_LINEAR_DIM),
            ("linear_conv_kernel_dim", linear.conv_kernel, MAX_CONV_KERNEL),
        ] {
            if v == 0 || v > max {
                return Err(bad(field, format!("must be in 1..={max}, got {v}")));
            }
        }
        if !linear.value_heads.is_multiple_of(linear.key_heads) {
            return Err(bad(
                "linear_num_value_heads",
                format!(
                    "{} is not a multiple of linear_num_key_heads {}",
                    linear.value_heads, linear.key_heads
                ),
            ));
        }
        if j.shared_expert_intermediate_size == 0 {
            return Err(bad(
                "shared_expert_intermediate_size",
                "must be at least 1".into(),
            ));
        }
        // Qwen3.5 has no dense layers and always renormalises the top-k.
        let (intermediate, sparse_step, mlp_only, renorm) = if next {
            (
                j.intermediate_size.unwrap_or(j.moe_intermediate_size),
                j.decoder_sparse_step.unwrap_or(1),
                j.mlp_only_layers.unwrap_or_default(),
                j.norm_topk_prob.unwrap_or(true),
            )
        } else {
            (j.moe_intermediate_size, 1, Vec::new(), true)
        };
        if next && !mlp_only.is_empty() && j.intermediate_size.is_none() {
            return Err(bad(
                "intermediate_size",
                "is missing but mlp_only_layers names dense layers".into(),
            ));
        }
        let base = MoeDecoderConfig {
            model_type: j.model_type.clone(),
            kind: DecoderKind::Qwen3Moe,
            vocab_size: j.vocab_size,
            hidden_size: j.hidden_size,
            num_hidden_layers: n,
            num_attention_heads: heads,
            num_key_value_heads: j.num_key_value_heads.unwrap_or(heads),
            head_dim,
            max_position_embeddings: j.max_position_embeddings,
            rope_theta: crate::config::rope_theta(j.rope_theta, 10000.0),
            rms_norm_eps: j.rms_norm_eps,
            num_experts: j.num_experts,
            num_experts_per_tok: j.num_experts_per_tok,
            moe_intermediate_size: j.moe_intermediate_size,
            intermediate_size: intermediate,
            norm_topk_prob: renorm,
            decoder_sparse_step: sparse_step,
            mlp_only_layers: mlp_only,
            sliding_window: None,
            tie_word_embeddings: j.tie_word_embeddings,
            eos_token_id: j.eos_token_id,
            qkv_bias: false,
            o_bias: false,
            qk_norm: true,
            rotary_dim,
            rope_scaling,
            router: RouterChoice::Softmax,
            shared_intermediate: j.shared_expert_intermediate_size,
            first_k_dense_replace: 0,
            sliding_layers: Vec::new(),
            attention_sinks: false,
            swiglu_limit: None,
            num_nextn_predict_layers: 0,
        };
        base.validate(path)?;
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return Err(bad(
                "partial_rotary_factor",
                format!(
                    "gives {rotary_dim} rotary dims of a {head_dim}-wide head; it must be even and non-zero"
                ),
            ));
        }
        let h = j.hidden_size;
        check_products(
            path,
            &[
                (
                    "linear_num_value_heads",
                    &[linear.value_heads, linear.key_dim, linear.value_dim],
                ),
                (
                    "hidden_size",
                    &[h, linear.conv_dim() + linear.value_heads * linear.value_dim],
                ),
                (
                    "shared_expert_intermediate_size",
                    &[j.shared_expert_intermediate_size, h, 3],
                ),
            ],
        )?;
        Ok(Self {
            base,
            layers,
            linear,
            proj: if next {
                ProjLayout::Interleaved
            } else {
                ProjLayout::Split
            },
            shared_intermediate: j.shared_expert_intermediate_size,
        })
    }

    /// Indices of the full-attention layers, in order: layer `l`'s slot in
    /// the KV cache is its position in this list.
    pub fn full_layers(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&l| self.layers[l] == LayerKind::Full)
            .collect()
    }

    /// Number of linear-attention layers.
    pub fn linear_layers(&self) -> usize {
        self.layers.iter().filter(|&&k| k == LayerKind::Linear).count()
    }
}
