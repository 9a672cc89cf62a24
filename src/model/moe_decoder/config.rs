//! Qwen3-MoE (`model_type: "qwen3_moe"`) and Mixtral (`"mixtral"`)
//! hyper-parameters, read into one validated description of a Llama-style
//! MoE decoder (GQA, rotate-half RoPE, gated experts behind a router). The
//! description also carries the options GLM-4.x (`super::glm4_moe`) and
//! gpt-oss (`super::gpt_oss`) need, whose own files parse their configs
//! into it.

use std::path::Path;

use serde::Deserialize;

use crate::config::{COUNT_LIMIT, ConfigError, check_floats, check_products, read_json};

/// Which of the two families a [`MoeDecoderConfig`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderKind {
    /// Per-head q/k RMSNorm, optional dense MLP layers, `norm_topk_prob`,
    /// experts under `mlp.experts.E.{gate,up,down}_proj`.
    Qwen3Moe,
    /// No q/k norm, top-k always renormalised, optional sliding window,
    /// experts under `block_sparse_moe.experts.E.{w1,w3,w2}`.
    Mixtral,
    /// GLM-4.5 / 4.6 / 4.7 (`glm4_moe`): q/k/v biases, partial rotary,
    /// optional per-head q/k norm, sigmoid group-limited router with a
    /// correction bias and shared experts, dense leading layers.
    Glm4Moe,
    /// gpt-oss: biases everywhere, attention sinks, alternating sliding and
    /// full attention, YaRN RoPE, top-k-then-softmax router with a bias,
    /// clamped SwiGLU experts with biases.
    GptOss,
    /// MiniMax-M2: Mixtral's expert names, q/k RMSNorm over the whole
    /// projection, partial rotary, a sigmoid router with a correction bias
    /// and no groups or shared expert.
    MiniMaxM2,
}

/// How a layer's router turns logits into expert weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RouterChoice {
    /// Softmax over all experts, top-k, renormalised when `norm_topk_prob`.
    Softmax,
    /// Top-k logits, softmax over those (gpt-oss).
    TopKSoftmax,
    /// Sigmoid scores, `e_score_correction_bias`, `n_group` groups of
    /// which `topk_group` compete, times `routed_scaling_factor` (GLM-4.x).
    Sigmoid {
        n_group: usize,
        topk_group: usize,
        routed_scaling_factor: f64,
    },
}

/// YaRN RoPE scaling (`rope_scaling.rope_type: "yarn"`), as transformers
/// computes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub truncate: bool,
    /// Multiplies cos and sin (`attention_factor`, else from `factor` and
    /// `mscale` / `mscale_all_dim`).
    pub attention_factor: f64,
}

/// The RoPE scaling a config declares in `rope_scaling` (transformers 5's
/// `rope_parameters` is read into it by `crate::config::spelling`), with
/// the exact arithmetic of transformers' `ROPE_INIT_FUNCTIONS` for it
/// ([`crate::model::ops::Rope::scaled`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// `yarn` (`_compute_yarn_parameters`).
    Yarn(Yarn),
    /// `linear` (`_compute_linear_scaling_rope_parameters`): `inv_freq /
    /// factor`, i.e. every position divided by `factor`.
    Linear {
        factor: f64,
        /// The pre-scaling context, when the config names it
        /// (`original_max_position_embeddings`): transformers ignores it,
        /// it only says how far the scaling extends the model.
        original_max_position_embeddings: Option<usize>,
    },
}

impl RopeScaling {
    /// The YaRN parameters, for YaRN scaling.
    pub fn yarn(&self) -> Option<&Yarn> {
        match self {
            Self::Yarn(y) => Some(y),
            Self::Linear { .. } => None,
        }
    }

    /// Positions the scaling stretches the model to: `factor` times the
    /// pre-scaling context (YaRN's `original_max_position_embeddings`;
    /// linear's when the config names it, else no extension is claimed,
    /// since `max_position_embeddings` may already be the scaled length),
    /// never fewer than `max_pos`.
    pub fn extended_positions(&self, max_pos: usize) -> usize {
        let (factor, original) = match *self {
            Self::Yarn(y) => (y.factor, Some(y.original_max_position_embeddings)),
            Self::Linear {
                factor,
                original_max_position_embeddings,
            } => (factor, original_max_position_embeddings),
        };
        let scaled = original.map_or(0.0, |o| (o as f64 * factor).floor());
        // `as` saturates, and COUNT_LIMIT bounds what the caller accepts.
        max_pos.max((scaled as usize).min(COUNT_LIMIT))
    }
}

/// The fields of a Qwen3-MoE or Mixtral `config.json` the engine uses, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeDecoderConfig {
    pub model_type: String,
    pub kind: DecoderKind,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    /// Rows of a routed expert's gate/up projection.
    pub moe_intermediate_size: usize,
    /// Rows of a dense MLP layer's gate/up projection (Qwen3 `mlp_only_layers`).
    pub intermediate_size: usize,
    pub norm_topk_prob: bool,
    /// Qwen3: layer `l` is sparse unless listed here, and only when
    /// `(l + 1) % decoder_sparse_step == 0`.
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
    pub sliding_window: Option<usize>,
    pub tie_word_embeddings: bool,
    pub eos_token_id: Option<serde_json::Value>,
    /// q, k and v projections carry biases.
    pub qkv_bias: bool,
    /// The output projection carries a bias.
    pub o_bias: bool,
    /// q/k RMSNorm: per head, or over the whole projection for MiniMax-M2
    /// ([`MoeDecoderConfig::qk_norm_full_width`]).
    pub qk_norm: bool,
    /// Leading dimensions of each head RoPE rotates (`partial_rotary_factor`).
    pub rotary_dim: usize,
    /// `rope_scaling` (`None`: plain RoPE).
    pub rope_scaling: Option<RopeScaling>,
    pub router: RouterChoice,
    /// Rows of the always-on shared expert's gate/up (0: none).
    pub shared_intermediate: usize,
    /// Leading layers with a dense MLP (`first_k_dense_replace`).
    pub first_k_dense_replace: usize,
    /// Per layer, whether it uses `sliding_window` (gpt-oss `layer_types`);
    /// empty: every layer does when a window is set.
    pub sliding_layers: Vec<bool>,
    /// One learned sink logit per head joins every attention softmax.
    pub attention_sinks: bool,
    /// gpt-oss's clamped SwiGLU (`swiglu_limit`); `None`: plain SwiGLU.
    pub swiglu_limit: Option<f64>,
    /// Next-token (MTP) layers after the main ones (GLM-4.x), kept by
    /// `coli convert` but not run.
    pub num_nextn_predict_layers: usize,
}

/// `config.json` of a Qwen3-MoE checkpoint as written by transformers.
#[derive(Deserialize)]
struct Qwen3MoeJson {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    moe_intermediate_size: usize,
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
    rope_scaling: Option<serde_json::Value>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    num_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default)]
    norm_topk_prob: bool,
    #[serde(default = "one")]
    decoder_sparse_step: usize,
    #[serde(default)]
    mlp_only_layers: Option<Vec<usize>>,
    #[serde(default)]
    use_sliding_window: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
}

/// `config.json` of a Mixtral checkpoint as written by transformers.
#[derive(Deserialize)]
struct MixtralJson {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
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
    rope_scaling: Option<serde_json::Value>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    num_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
}

/// The integer fields of either family, checked to be non-negative
/// integers before parsing so an error names the field.
const COUNT_FIELDS: [&str; 14] = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "decoder_sparse_step",
    "sliding_window",
];

fn default_max_pos() -> usize {
    4096
}

fn default_eps() -> f64 {
    1e-6
}

fn one() -> usize {
    1
}

impl MoeDecoderConfig {
    pub fn load(dir: &Path) -> Result<Self, ConfigError> {
        let (path, value) = read_json(dir)?;
        Self::from_json(&path, value)
    }

    pub fn from_json(path: &Path, value: serde_json::Value) -> Result<Self, ConfigError> {
        let value = crate::config::spelling::canonical(path, value)?;
        let found = value
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let json = |source| crate::config::spelling::parse_error(path, source);
        let bad = |field: &'static str, reason: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            reason,
        };
        check_counts(path, &value, &COUNT_FIELDS)?;
        let cfg = match found.as_str() {
            "qwen3_moe" => {
                let j: Qwen3MoeJson = serde_json::from_value(value).map_err(json)?;
                if j.use_sliding_window {
                    return Err(bad(
                        "use_sliding_window",
                        "is true: sliding-window attention is not supported for qwen3_moe".into(),
                    ));
                }
                if j.attention_bias {
                    return Err(bad(
                        "attention_bias",
                        "is true: attention biases are not supported for qwen3_moe".into(),
                    ));
                }
                check_act(path, j.hidden_act.as_deref())?;
                let rope_scaling = parse_rope(path, j.rope_scaling.as_ref(), j.max_position_embeddings)?;
                let heads = j.num_attention_heads;
                let head_dim = j.head_dim.unwrap_or(j.hidden_size / heads.max(1));
                Self {
                    model_type: found,
                    kind: DecoderKind::Qwen3Moe,
                    vocab_size: j.vocab_size,
                    hidden_size: j.hidden_size,
                    num_hidden_layers: j.num_hidden_layers,
                    num_attention_heads: heads,
                    num_key_value_heads: j.num_key_value_heads.unwrap_or(heads),
                    head_dim,
                    max_position_embeddings: j.max_position_embeddings,
                    rope_theta: crate::config::rope_theta(j.rope_theta, 10000.0),
                    rms_norm_eps: j.rms_norm_eps,
                    num_experts: j.num_experts,
                    num_experts_per_tok: j.num_experts_per_tok,
                    moe_intermediate_size: j.moe_intermediate_size,
                    intermediate_size: j.intermediate_size,
                    norm_topk_prob: j.norm_topk_prob,
                    decoder_sparse_step: j.decoder_sparse_step,
                    mlp_only_layers: j.mlp_only_layers.unwrap_or_default(),
                    sliding_window: None,
                    tie_word_embeddings: j.tie_word_embeddings,
                    eos_token_id: j.eos_token_id,
                    qkv_bias: false,
                    o_bias: false,
                    qk_norm: true,
                    rotary_dim: head_dim,
                    rope_scaling,
                    router: RouterChoice::Softmax,
                    shared_intermediate: 0,
                    first_k_dense_replace: 0,
                    sliding_layers: Vec::new(),
                    attention_sinks: false,
                    swiglu_limit: None,
                    num_nextn_predict_layers: 0,
                }
            }
            "mixtral" => {
                let j: MixtralJson = serde_json::from_value(value).map_err(json)?;
                check_act(path, j.hidden_act.as_deref())?;
                let rope_scaling = parse_rope(path, j.rope_scaling.as_ref(), j.max_position_embeddings)?;
                let heads = j.num_attention_heads;
                let head_dim = j.head_dim.unwrap_or(j.hidden_size / heads.max(1));
                Self {
                    model_type: found,
                    kind: DecoderKind::Mixtral,
                    vocab_size: j.vocab_size,
                    hidden_size: j.hidden_size,
                    num_hidden_layers: j.num_hidden_layers,
                    num_attention_heads: heads,
                    num_key_value_heads: j.num_key_value_heads.unwrap_or(heads),
                    head_dim,
                    max_position_embeddings: j.max_position_embeddings,
                    // transformers' MixtralConfig default.
                    rope_theta: crate::config::rope_theta(j.rope_theta, 1e6),
                    rms_norm_eps: j.rms_norm_eps,
                    num_experts: j.num_experts,
                    num_experts_per_tok: j.num_experts_per_tok,
                    moe_intermediate_size: j.intermediate_size,
                    intermediate_size: j.intermediate_size,
                    norm_topk_prob: true,
                    decoder_sparse_step: 1,
                    mlp_only_layers: Vec::new(),
                    sliding_window: j.sliding_window,
                    tie_word_embeddings: j.tie_word_embeddings,
                    eos_token_id: j.eos_token_id,
                    qkv_bias: false,
                    o_bias: false,
                    qk_norm: false,
                    rotary_dim: head_dim,
                    rope_scaling,
                    router: RouterChoice::Softmax,
                    shared_intermediate: 0,
                    first_k_dense_replace: 0,
                    sliding_layers: Vec::new(),
                    attention_sinks: false,
                    swiglu_limit: None,
                    num_nextn_predict_layers: 0,
                }
            }
            _ => {
                return Err(ConfigError::ModelType {
                    path: path.to_path_buf(),
                    found,
                });
            }
        };
        cfg.validate(path)?;
        Ok(cfg)
    }

    pub(crate) fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: String| {
            Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                field,
                reason,
            })
        };
        let experts_field = match self.kind {
            DecoderKind::Qwen3Moe => "num_experts",
            DecoderKind::Mixtral | DecoderKind::GptOss | DecoderKind::MiniMaxM2 => "num_local_experts",
            DecoderKind::Glm4Moe => "n_routed_experts",
        };
        let moe_inter_field = match self.kind {
            DecoderKind::Qwen3Moe | DecoderKind::Glm4Moe => "moe_intermediate_size",
            DecoderKind::Mixtral | DecoderKind::GptOss | DecoderKind::MiniMaxM2 => "intermediate_size",
        };
        for (field, v) in [
            ("max_position_embeddings", self.max_position_embeddings),
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            (moe_inter_field, self.moe_intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            (experts_field, self.num_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("decoder_sparse_step", self.decoder_sparse_step),
        ] {
            if v == 0 || v > COUNT_LIMIT {
                return bad(field, format!("must be in 1..={COUNT_LIMIT}, got {v}"));
            }
        }
        let kv = self.num_key_value_heads;
        if !self.num_attention_heads.is_multiple_of(kv) {
            return bad(
                "num_key_value_heads",
                format!(
                    "{kv} must divide num_attention_heads {}",
                    self.num_attention_heads
                ),
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad("head_dim", format!("must be even, got {}", self.head_dim));
        }
        if self.rotary_dim == 0 || !self.rotary_dim.is_multiple_of(2) || self.rotary_dim > self.head_dim {
            return bad(
                "partial_rotary_factor",
                format!(
                    "gives {} rotary dimensions; they must be even and in 2..={}",
                    self.rotary_dim, self.head_dim
                ),
            );
        }
        if !self.sliding_layers.is_empty() && self.sliding_layers.len() != self.num_hidden_layers {
            return bad(
                "layer_types",
                format!(
                    "lists {} layers, the model has {}",
                    self.sliding_layers.len(),
                    self.num_hidden_layers
                ),
            );
        }
        if self.sliding_layers.contains(&true) && self.sliding_window.is_none() {
            return bad(
                "sliding_window",
                "is missing but layer_types has sliding layers".into(),
            );
        }
        if let RouterChoice::Sigmoid {
            n_group,
            topk_group,
            routed_scaling_factor,
        } = self.router
        {
            let ne = self.num_experts;
            if n_group == 0 || !ne.is_multiple_of(n_group) || ne / n_group < 2 {
                return bad(
                    "n_group",
                    format!("{n_group} must divide {experts_field} {ne} into groups of at least 2"),
                );
            }
            if topk_group == 0 || topk_group > n_group {
                return bad(
                    "topk_group",
                    format!("must be in 1..={n_group}, got {topk_group}"),
                );
            }
            if self.num_experts_per_tok > topk_group * (ne / n_group) {
                return bad(
                    "num_experts_per_tok",
                    "exceeds the experts of the topk_group selected groups".into(),
                );
            }
            if !(routed_scaling_factor.is_finite()
                && routed_scaling_factor > 0.0
                && routed_scaling_factor < 1e6)
            {
                return bad(
                    "routed_scaling_factor",
                    format!("must be positive and finite, got {routed_scaling_factor}"),
                );
            }
        }
        if self.shared_intermediate > COUNT_LIMIT {
            return bad(
                "n_shared_experts",
                format!("gives a shared expert of {} rows", self.shared_intermediate),
            );
        }
        if self.num_nextn_predict_layers > COUNT_LIMIT {
            return bad(
                "num_nextn_predict_layers",
                format!("must be at most {COUNT_LIMIT}"),
            );
        }
        if let Some(limit) = self.swiglu_limit
            && !(limit.is_finite() && limit > 0.0 && (limit as f32).is_finite())
        {
            return bad(
                "swiglu_limit",
                format!("must be positive and finite, got {limit}"),
            );
        }
        if let Some(scaling) = &self.rope_scaling {
            check_scaling(scaling, self.rope_theta).map_err(|reason| ConfigError::Invalid {
                path: path.to_path_buf(),
                field: "rope_scaling",
                reason,
            })?;
        }
        if self.num_experts_per_tok > self.num_experts {
            return bad(
                "num_experts_per_tok",
                format!(
                    "{} exceeds {experts_field} {}",
                    self.num_experts_per_tok, self.num_experts
                ),
            );
        }
        if let Some(&l) = self
            .mlp_only_layers
            .iter()
            .find(|&&l| l >= self.num_hidden_layers)
        {
            return bad(
                "mlp_only_layers",
                format!("names layer {l}, beyond the {} layers", self.num_hidden_layers),
            );
        }
        if !self.any_sparse() {
            let field = if self.first_k_dense_replace > 0 {
                "first_k_dense_replace"
            } else {
                "mlp_only_layers"
            };
            return bad(field, "leaves no layer with routed experts".into());
        }
        if let Some(w) = self.sliding_window
            && (w == 0 || w > COUNT_LIMIT)
        {
            return bad("sliding_window", format!("must be in 1..={COUNT_LIMIT}, got {w}"));
        }
        check_floats(path, self.rms_norm_eps, self.rope_theta)?;
        let (h, hd) = (self.hidden_size, self.head_dim);
        check_products(
            path,
            &[
                ("vocab_size", &[self.vocab_size, h]),
                ("intermediate_size", &[self.intermediate_size, h]),
                ("n_shared_experts", &[self.shared_intermediate, h]),
                ("num_attention_heads", &[self.num_attention_heads, hd, h]),
                ("num_key_value_heads", &[kv, hd, h]),
                (experts_field, &[self.num_experts, self.moe_intermediate_size, h]),
                (
                    "max_position_embeddings",
                    &[self.max_position_embeddings, self.num_hidden_layers, kv, hd],
                ),
            ],
        )?;
        Ok(())
    }

    /// Whether layer `l` has routed experts (else a dense MLP of
    /// `intermediate_size`), as transformers' Qwen3MoeDecoderLayer decides.
    pub fn is_sparse(&self, l: usize) -> bool {
        l >= self.first_k_dense_replace
            && !self.mlp_only_layers.contains(&l)
            && (l + 1).is_multiple_of(self.decoder_sparse_step.max(1))
    }

    /// MiniMax-M2 normalises q and k over all heads at once (one weight of
    /// `heads × head_dim`), the others per head.
    pub fn qk_norm_full_width(&self) -> bool {
        self.kind == DecoderKind::MiniMaxM2
    }

    /// The sliding window layer `l` attends through, if any.
    pub fn window(&self, l: usize) -> Option<usize> {
        match self.sliding_layers.get(l) {
            Some(false) => None,
            _ => self.sliding_window,
        }
    }

    /// [`Self::is_sparse`] of every layer.
    pub fn sparse_layers(&self) -> Vec<bool> {
        let dense: std::collections::HashSet<usize> = self.mlp_only_layers.iter().copied().collect();
        let step = self.decoder_sparse_step.max(1);
        (0..self.num_hidden_layers)
            .map(|l| l >= self.first_k_dense_replace && !dense.contains(&l) && (l + 1).is_multiple_of(step))
            .collect()
    }

    /// Whether some layer has routed experts, without walking every layer
    /// (a hostile config may declare millions).
    pub fn any_sparse(&self) -> bool {
        if self.first_k_dense_replace > 0 {
            // Only GLM-4.x sets it, and it has no other dense layers.
            return self.first_k_dense_replace < self.num_hidden_layers;
        }
        let step = self.decoder_sparse_step.max(1);
        let candidates = self.num_hidden_layers / step;
        if candidates > self.mlp_only_layers.len() {
            return true;
        }
        let dense: std::collections::HashSet<usize> = self.mlp_only_layers.iter().copied().collect();
        (1..=candidates).any(|k| !dense.contains(&(k * step - 1)))
    }

    /// Token ids that end generation, from `eos_token_id` (a number or a list).
    pub fn eos_ids(&self) -> Vec<u32> {
        crate::config::token_ids(self.eos_token_id.as_ref())
    }
}

/// Refuses a count field that is not a non-negative integer, naming it
/// (serde's own message for `-4` or `1.5` would not).
pub(crate) fn check_counts(
    path: &Path,
    value: &serde_json::Value,
    fields: &[&'static str],
) -> Result<(), ConfigError> {
    for &field in fields {
        if let Some(v) = value.get(field)
            && !(v.is_u64() || v.is_null())
        {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                field,
                reason: format!("must be a non-negative integer, got {v}"),
            });
        }
    }
    Ok(())
}

/// Only SiLU-gated experts are implemented.
pub(crate) fn check_act(path: &Path, act: Option<&str>) -> Result<(), ConfigError> {
    match act {
        None | Some("silu") => Ok(()),
        Some(other) => Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            field: "hidden_act",
            reason: format!("{other:?} is not supported (only \"silu\")"),
        }),
    }
}

/// What [`MoeDecoderConfig::validate`] requires of a scaling: finite
/// positive parameters, a factor of at least 1, and (YaRN) a theta above
/// 1 and an original context in range.
pub(crate) fn check_scaling(scaling: &RopeScaling, rope_theta: f64) -> Result<(), String> {
    let positive = |v: f64, what: &str| {
        if v.is_finite() && v > 0.0 && v < 1e9 {
            Ok(())
        } else {
            Err(format!("{what} must be positive and finite, got {v}"))
        }
    };
    let factor = match scaling {
        RopeScaling::Yarn(y) => {
            for (v, what) in [
                (y.factor, "yarn factor"),
                (y.beta_fast, "yarn beta_fast"),
                (y.beta_slow, "yarn beta_slow"),
                (y.attention_factor, "yarn attention_factor"),
            ] {
                positive(v, what)?;
            }
            if rope_theta <= 1.0 + 1e-6 {
                return Err(format!("yarn needs rope_theta above 1, got {rope_theta}"));
            }
            let orig = y.original_max_position_embeddings;
            if orig == 0 || orig > COUNT_LIMIT {
                return Err(format!(
                    "yarn original_max_position_embeddings must be in 1..={COUNT_LIMIT}, got {orig}"
                ));
            }
            y.factor
        }
        RopeScaling::Linear { factor, .. } => {
            positive(*factor, "linear factor")?;
            *factor
        }
    };
    if factor < 1.0 {
        return Err(format!("the factor must be at least 1, got {factor}"));
    }
    Ok(())
}

/// `rope_scaling` of a Qwen3-MoE, Mixtral, GLM-4.x or gpt-oss config:
/// absent, `null` or `default` is plain RoPE; `yarn` and `linear` are read
/// as transformers reads them (its defaults for what is left out);
/// anything else is refused by name. `dynamic` (NTK) is refused too:
/// transformers recomputes its frequencies from the longest position of
/// each forward call and keeps the largest seen, so its keys depend on how
/// a prompt was split into calls, which no KV cache here reproduces.
pub(crate) fn parse_rope(
    path: &Path,
    scaling: Option<&serde_json::Value>,
    max_pos: usize,
) -> Result<Option<RopeScaling>, ConfigError> {
    let bad = |reason: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field: "rope_scaling",
        reason,
    };
    let get = |k: &str| scaling.and_then(|s| s.get(k)).filter(|v| !v.is_null());
    let num = |k: &str| -> Result<Option<f64>, ConfigError> {
        match get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(format!("{k} must be a number, got {v}"))),
        }
    };
    // transformers: `get(..) or default`, so 0 also means the default.
    let original = || -> Result<Option<usize>, ConfigError> {
        match get("original_max_position_embeddings") {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(0) => Ok(None),
                Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
                None => Err(bad(format!(
                    "original_max_position_embeddings must be a non-negative integer, got {v}"
                ))),
            },
        }
    };
    let kind = crate::config::rope_kind(scaling);
    let needs_factor = |what: &str| bad(format!("{what} needs a factor"));
    match kind.as_deref() {
        None | Some("default") => Ok(None),
        Some("linear") => Ok(Some(RopeScaling::Linear {
            factor: num("factor")?.ok_or_else(|| needs_factor("linear"))?,
            original_max_position_embeddings: original()?,
        })),
        Some("yarn") => {
            let factor = num("factor")?.ok_or_else(|| needs_factor("yarn"))?;
            let mscale_of = |scale: f64, m: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let attention_factor = match (num("attention_factor")?, num("mscale")?, num("mscale_all_dim")?) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    mscale_of(factor, m) / mscale_of(factor, all)
                }
                _ => mscale_of(factor, 1.0),
            };
            let or = |v: Option<f64>, d: f64| v.filter(|&x| x != 0.0).unwrap_or(d);
            let truncate = match get("truncate") {
                None => true,
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| bad(format!("yarn truncate must be true or false, got {v}")))?,
            };
            Ok(Some(RopeScaling::Yarn(Yarn {
                factor,
                original_max_position_embeddings: original()?.unwrap_or(max_pos),
                beta_fast: or(num("beta_fast")?, 32.0),
                beta_slow: or(num("beta_slow")?, 1.0),
                truncate,
                attention_factor,
            })))
        }
        Some(other) => Err(bad(crate::config::unsupported_rope(
            other,
            "default, linear or yarn; dynamic NTK depends on how the prompt is split into forward calls",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen() -> serde_json::Value {
        serde_json::json!({
            "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 12, "num_experts": 8, "num_experts_per_tok": 2,
            "norm_topk_prob": true, "mlp_only_layers": [1], "rope_theta": 10000.0,
            "eos_token_id": 1, "sliding_window": null, "use_sliding_window": false
        })
    }

    fn mixtral() -> serde_json::Value {
        serde_json::json!({
            "model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8
        })
    }

    #[test]
    fn parses_both_families() {
        let c = MoeDecoderConfig::from_json(Path::new("c.json"), qwen()).unwrap();
        assert_eq!(
            (c.kind, c.head_dim, c.num_key_value_heads),
            (DecoderKind::Qwen3Moe, 12, 2)
        );
        assert_eq!(c.sparse_layers(), vec![true, false, true]);
        let c = MoeDecoderConfig::from_json(Path::new("c.json"), mixtral()).unwrap();
        assert_eq!(
            (c.kind, c.head_dim, c.sliding_window),
            (DecoderKind::Mixtral, 8, Some(8))
        );
        assert!(c.norm_topk_prob);
        assert_eq!(c.rope_theta, 1e6);
        let mut v = qwen();
        v["mlp_only_layers"] = serde_json::json!([]);
        v["decoder_sparse_step"] = 2.into();
        let c = MoeDecoderConfig::from_json(Path::new("c.json"), v).unwrap();
        assert_eq!(c.sparse_layers(), vec![false, true, false]);
    }

    #[test]
    fn refuses_what_is_not_implemented_by_name() {
        for (base, field, val) in [
            (qwen(), "use_sliding_window", serde_json::json!(true)),
            (qwen(), "attention_bias", serde_json::json!(true)),
            (
                qwen(),
                "rope_scaling",
                serde_json::json!({"rope_type": "dynamic", "factor": 4.0}),
            ),
            (
                mixtral(),
                "rope_scaling",
                serde_json::json!({"type": "longrope", "factor": 2.0}),
            ),
            (qwen(), "rope_scaling", serde_json::json!({"rope_type": "yarn"})),
            (
                mixtral(),
                "rope_scaling",
                serde_json::json!({"type": "linear", "factor": 0.5}),
            ),
            (
                qwen(),
                "rope_scaling",
                serde_json::json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": -1}),
            ),
            (mixtral(), "hidden_act", serde_json::json!("gelu")),
            (qwen(), "decoder_sparse_step", serde_json::json!(0)),
            (qwen(), "mlp_only_layers", serde_json::json!([0, 1, 2])),
            (qwen(), "mlp_only_layers", serde_json::json!([7])),
            (qwen(), "head_dim", serde_json::json!(7)),
            (qwen(), "num_key_value_heads", serde_json::json!(3)),
            (qwen(), "num_experts_per_tok", serde_json::json!(9)),
            (mixtral(), "num_local_experts", serde_json::json!(0)),
            (mixtral(), "sliding_window", serde_json::json!(0)),
            (qwen(), "rms_norm_eps", serde_json::json!(-1.0)),
            (qwen(), "vocab_size", serde_json::json!(1u64 << 30)),
            (mixtral(), "rope_theta", serde_json::json!(0.0)),
        ] {
            let mut v = base;
            v[field] = val.clone();
            let e = MoeDecoderConfig::from_json(Path::new("c.json"), v).unwrap_err();
            assert!(e.to_string().contains(field), "{field}={val}: {e}");
        }
        for field in ["vocab_size", "num_experts", "moe_intermediate_size"] {
            let mut v = qwen();
            v[field] = serde_json::json!(-3);
            assert!(MoeDecoderConfig::from_json(Path::new("c.json"), v).is_err());
            let mut v = qwen();
            v.as_object_mut().map(|o| o.remove(field));
            let e = MoeDecoderConfig::from_json(Path::new("c.json"), v).unwrap_err();
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn yarn_and_linear_are_read_for_qwen3_and_mixtral() {
        // Qwen3 at 128k, as its model card has it.
        let mut v = qwen();
        v["max_position_embeddings"] = 40960.into();
        v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768});
        let c = MoeDecoderConfig::from_json(Path::new("c.json"), v).unwrap();
        let y = *c.rope_scaling.as_ref().and_then(|r| r.yarn()).unwrap();
        assert_eq!((y.factor, y.original_max_position_embeddings), (4.0, 32768));
        assert_eq!((y.beta_fast, y.beta_slow, y.truncate), (32.0, 1.0, true));
        assert!((y.attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
        use crate::model::family::FamilyConfig;
        assert_eq!((c.max_positions(), c.position_limit()), (40960, 131072));
        // The older spelling `type`, and linear.
        let mut v = mixtral();
        v["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 2.0});
        let c = MoeDecoderConfig::from_json(Path::new("c.json"), v).unwrap();
        assert_eq!(
            c.rope_scaling,
            Some(RopeScaling::Linear {
                factor: 2.0,
                original_max_position_embeddings: None
            })
        );
        assert_eq!(c.position_limit(), c.max_positions());
        // `default` and null are plain RoPE.
        for plain in [
            serde_json::json!({"rope_type": "default"}),
            serde_json::Value::Null,
        ] {
            let mut v = qwen();
            v["rope_scaling"] = plain;
            let c = MoeDecoderConfig::from_json(Path::new("c.json"), v).unwrap();
            assert_eq!(c.rope_scaling, None);
        }
    }
}
