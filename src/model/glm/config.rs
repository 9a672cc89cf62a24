//! GLM-5 (`model_type: "glm_moe_dsa"`), DeepSeek-V3 (`"deepseek_v3"`),
//! DeepSeek-V3.2 (`"deepseek_v32"`, registered by `model/deepseek_v32/`) and
//! GLM-4.7-Flash (`"glm4_moe_lite"`, registered by `model/glm4_moe_lite/`)
//! hyper-parameters: MLA attention, the DSA lightning indexer (GLM-5 and
//! DeepSeek-V3.2),
//! a sigmoid group-limited router with shared experts, and an optional
//! next-token (MTP) module.

use std::path::Path;

use serde::Deserialize;

use crate::config::{COUNT_LIMIT, ConfigError, check_floats, check_products, read_json};
use crate::model::moe_decoder::{RopeScaling, Yarn};
use crate::model::moe_decoder::{check_scaling, parse_rope};
use crate::model::ops::Rope;

/// The `model_type`s this config describes.
pub const MODEL_TYPES: [&str; 4] = ["glm_moe_dsa", "deepseek_v3", "glm4_moe_lite", "deepseek_v32"];

/// Which attention a config describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaFamily {
    /// DSA, the lightning indexer choosing which positions attention
    /// reads: GLM-5 (each layer's indexer "full" or "shared") and
    /// DeepSeek-V3.2 (every layer its own, with rotate-half RoPE in it).
    GlmMoeDsa,
    /// Dense causal MLA attention, no indexer: DeepSeek-V3, and
    /// GLM-4.7-Flash, which transformers builds from the same attention,
    /// router and decoder layer.
    DeepseekV3,
}

/// Per-layer indexer mode of a DSA layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexerKind {
    /// Runs its own indexer.
    Full,
    /// Reuses the previous full layer's selection.
    Shared,
}

/// The fields of a glm_moe_dsa / deepseek_v3 `config.json` the engine uses.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct GlmConfig {
    #[serde(default)]
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_rope_head_dim: usize,
    pub qk_nope_head_dim: usize,
    pub v_head_dim: usize,
    #[serde(default, alias = "num_experts")]
    pub n_routed_experts: usize,
    #[serde(default)]
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    #[serde(default = "one")]
    pub n_group: usize,
    #[serde(default = "one")]
    pub topk_group: usize,
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    #[serde(default = "one_f")]
    pub routed_scaling_factor: f64,
    #[serde(default)]
    pub first_k_dense_replace: Option<usize>,
    #[serde(default)]
    pub mlp_layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub index_topk: Option<usize>,
    #[serde(default)]
    pub index_head_dim: Option<usize>,
    #[serde(default)]
    pub index_n_heads: Option<usize>,
    #[serde(default)]
    pub indexer_types: Option<Vec<String>>,
    #[serde(default)]
    pub index_topk_pattern: Option<serde_json::Value>,
    #[serde(default)]
    pub index_topk_freq: Option<usize>,
    #[serde(default)]
    pub index_skip_topk_offset: Option<usize>,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// DeepSeek-V3 only: interleaved (true, default) or rotate-half RoPE.
    #[serde(default)]
    pub rope_interleave: Option<bool>,
    /// GLM-4.7-Flash's rotary embedding reads it (a share of the rope head);
    /// only 1 (all of it) is supported.
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// DeepSeek-V3.2 names every layer's attention ("indexed_attention").
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub hidden_act: Option<String>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub num_nextn_predict_layers: usize,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    /// Epsilon of the latent norms (`q_a_layernorm`, `kv_a_layernorm`).
    /// Not a transformers field: its models build them with the RMSNorm
    /// default (1e-6); a GGUF's config sets it to the model's epsilon,
    /// which llama.cpp normalises the latents with.
    #[serde(default)]
    pub latent_norm_eps: Option<f64>,
}

fn one() -> usize {
    1
}
fn one_f() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn default_max_pos() -> usize {
    4096
}
fn default_eps() -> f64 {
    1e-6
}

impl GlmConfig {
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
        if !MODEL_TYPES.contains(&found.as_str()) {
            return Err(ConfigError::ModelType {
                path: path.to_path_buf(),
                found,
            });
        }
        let cfg: Self = serde_json::from_value(value)
            .map_err(|source| crate::config::spelling::parse_error(path, source))?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    pub fn family(&self) -> MlaFamily {
        if self.model_type == "glm_moe_dsa" || self.model_type == "deepseek_v32" {
            MlaFamily::GlmMoeDsa
        } else {
            MlaFamily::DeepseekV3
        }
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: String| {
            Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                field,
                reason,
            })
        };
        const LIMIT: usize = COUNT_LIMIT;
        for (field, v) in [
            ("n_shared_experts", self.n_shared_experts),
            ("first_k_dense_replace", self.first_k_dense_replace.unwrap_or(0)),
            ("index_topk_freq", self.index_topk_freq.unwrap_or(1)),
            ("index_skip_topk_offset", self.index_skip_topk_offset.unwrap_or(0)),
        ] {
            if v > LIMIT {
                return bad(field, format!("must be in 0..={LIMIT}, got {v}"));
            }
        }
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("v_head_dim", self.v_head_dim),
            ("n_routed_experts", self.n_routed_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("n_group", self.n_group),
            ("topk_group", self.topk_group),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 || v > LIMIT {
                return bad(field, format!("must be in 1..={LIMIT}, got {v}"));
            }
        }
        if let Some(q) = self.q_lora_rank
            && (q == 0 || q > LIMIT)
        {
            return bad("q_lora_rank", format!("must be in 1..={LIMIT}, got {q}"));
        }
        if !self.qk_rope_head_dim.is_multiple_of(2) {
            return bad(
                "qk_rope_head_dim",
                format!("must be even, got {}", self.qk_rope_head_dim),
            );
        }
        if self.num_experts_per_tok > self.n_routed_experts {
            return bad(
                "num_experts_per_tok",
                format!(
                    "{} exceeds n_routed_experts {}",
                    self.num_experts_per_tok, self.n_routed_experts
                ),
            );
        }
        if !self.n_routed_experts.is_multiple_of(self.n_group) {
            return bad(
                "n_group",
                format!(
                    "{} does not divide n_routed_experts {}",
                    self.n_group, self.n_routed_experts
                ),
            );
        }
        if self.topk_group > self.n_group {
            return bad(
                "topk_group",
                format!("{} exceeds n_group {}", self.topk_group, self.n_group),
            );
        }
        if self.n_routed_experts / self.n_group < 2 {
            return bad(
                "n_group",
                "each group needs at least 2 experts (group score = top-2 sum)".into(),
            );
        }
        if self.num_experts_per_tok > self.topk_group * (self.n_routed_experts / self.n_group) {
            return bad(
                "num_experts_per_tok",
                "exceeds the experts of the topk_group selected groups".into(),
            );
        }
        if self.attention_bias {
            return bad("attention_bias", "true is not supported".into());
        }
        if self.model_type == "glm4_moe_lite"
            && let Some(f) = self.partial_rotary_factor
            && f != 1.0
        {
            return bad(
                "partial_rotary_factor",
                format!("{f} is not supported (the whole qk_rope_head_dim is rotated: 1.0)"),
            );
        }
        if let Some(act) = &self.hidden_act
            && act != "silu"
        {
            return bad("hidden_act", format!("{act:?} is not supported (silu only)"));
        }
        match (self.family(), self.rope_kind().as_deref()) {
            (_, None | Some("default")) => {}
            // DeepSeek-V3's YaRN (its RoPE and its softmax scale).
            (MlaFamily::DeepseekV3, Some("yarn")) => {
                let y = self.yarn_from(path)?;
                if let Err(e) = check_scaling(&RopeScaling::Yarn(y), self.rope_theta()) {
                    return bad("rope_scaling", e);
                }
                match self.mscale_all_dim() {
                    Some(m) if !(m.is_finite() && m.abs() < 1e6) => {
                        return bad("rope_scaling", format!("mscale_all_dim must be finite, got {m}"));
                    }
                    _ => {}
                }
            }
            (MlaFamily::DeepseekV3, Some(kind)) => {
                return bad(
                    "rope_scaling",
                    crate::config::unsupported_rope(kind, "default and yarn"),
                );
            }
            (MlaFamily::GlmMoeDsa, Some(kind)) => {
                return bad(
                    "rope_scaling",
                    crate::config::unsupported_rope(kind, "default only"),
                );
            }
        }
        check_floats(path, self.rms_norm_eps, self.rope_theta())?;
        if let Some(e) = self.latent_norm_eps
            && !(e.is_finite() && e <= 1.0 && (e as f32) > 0.0)
        {
            return bad(
                "latent_norm_eps",
                format!("must be in (0, 1] and representable in f32, got {e}"),
            );
        }
        let rsf = self.routed_scaling_factor;
        if !(rsf.is_finite() && rsf > 0.0 && rsf <= 1e6) {
            return bad("routed_scaling_factor", format!("must be in (0, 1e6], got {rsf}"));
        }
        let h = self.hidden_size;
        let q_rank = self.q_lora_rank.unwrap_or(h);
        let index_dims = match self.family() {
            MlaFamily::GlmMoeDsa => self.index_n_heads().saturating_mul(self.index_head_dim()),
            MlaFamily::DeepseekV3 => 1,
        };
        check_products(
            path,
            &[
                ("vocab_size", &[self.vocab_size, h]),
                ("intermediate_size", &[self.intermediate_size, h]),
                (
                    "num_attention_heads",
                    &[self.num_attention_heads, self.q_head_dim(), q_rank],
                ),
                ("v_head_dim", &[self.num_attention_heads, self.v_head_dim, h]),
                (
                    "kv_lora_rank",
                    &[
                        self.kv_lora_rank,
                        self.num_attention_heads,
                        self.qk_nope_head_dim + self.v_head_dim,
                    ],
                ),
                (
                    "n_routed_experts",
                    &[self.n_routed_experts, self.moe_intermediate_size, h],
                ),
                (
                    "max_position_embeddings",
                    &[
                        self.max_position_embeddings,
                        self.num_hidden_layers,
                        self.kv_lora_rank + self.qk_rope_head_dim,
                    ],
                ),
                ("index_n_heads", &[index_dims, q_rank]),
            ],
        )?;
        if self.num_nextn_predict_layers > 1 {
            return bad(
                "num_nextn_predict_layers",
                format!(
                    "{} MTP layers; at most 1 is supported",
                    self.num_nextn_predict_layers
                ),
            );
        }
        let kinds = self.mlp_sparse();
        match &kinds {
            Err(e) => return bad("mlp_layer_types", e.clone()),
            Ok(k) if k.len() != self.num_hidden_layers => {
                return bad(
                    "mlp_layer_types",
                    format!("has {} entries for {} layers", k.len(), self.num_hidden_layers),
                );
            }
            Ok(_) => {}
        }
        if self.family() == MlaFamily::GlmMoeDsa {
            if self.q_lora_rank.is_none() {
                return bad(
                    "q_lora_rank",
                    format!("{} needs q_lora_rank (the indexer reads it)", self.model_type),
                );
            }
            for (field, v) in [
                ("index_topk", self.index_topk()),
                ("index_head_dim", self.index_head_dim()),
                ("index_n_heads", self.index_n_heads()),
            ] {
                if v == 0 || v > LIMIT {
                    return bad(field, format!("must be in 1..={LIMIT}, got {v}"));
                }
            }
            if self.index_head_dim() < self.qk_rope_head_dim {
                return bad(
                    "index_head_dim",
                    format!("{} is smaller than qk_rope_head_dim", self.index_head_dim()),
                );
            }
            // DeepSeek-V3.2 declares its layers in `layer_types`.
            let field = if self.model_type == "deepseek_v32" {
                "layer_types"
            } else {
                "indexer_types"
            };
            match self.indexer_kinds() {
                Err(e) => return bad(field, e),
                Ok(k) if k.len() != self.num_hidden_layers => {
                    return bad(
                        field,
                        format!("has {} entries for {} layers", k.len(), self.num_hidden_layers),
                    );
                }
                Ok(k) if k.first() == Some(&IndexerKind::Shared) => {
                    return bad(
                        "indexer_types",
                        "layer 0 is \"shared\" but no earlier layer is full".into(),
                    );
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// Epsilon of the latent norms: transformers' RMSNorm default unless
    /// the config names one.
    pub fn latent_norm_eps(&self) -> f32 {
        self.latent_norm_eps.unwrap_or(1e-6) as f32
    }

    pub fn q_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Attention softmax scale: `qk_head_dim^-0.5`, times YaRN's
    /// `mscale(factor, mscale_all_dim)` squared when the scaling names
    /// `mscale_all_dim` (transformers' DeepseekV3Attention).
    pub fn softmax_scale(&self) -> f32 {
        let base = (self.q_head_dim() as f64).powf(-0.5);
        let m = match (self.yarn(), self.mscale_all_dim()) {
            (Some(y), Some(all)) if all != 0.0 && y.factor > 1.0 => 0.1 * all * y.factor.ln() + 1.0,
            _ => 1.0,
        };
        (base * m * m) as f32
    }

    /// The YaRN parameters (`None` without YaRN scaling), as transformers
    /// reads them.
    pub fn yarn(&self) -> Option<Yarn> {
        self.yarn_from(Path::new("config.json")).ok()
    }

    fn yarn_from(&self, path: &Path) -> Result<Yarn, ConfigError> {
        match parse_rope(path, self.rope_scaling.as_ref(), self.max_position_embeddings)? {
            Some(RopeScaling::Yarn(y)) => Ok(y),
            _ => Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                field: "rope_scaling",
                reason: "is not YaRN scaling".into(),
            }),
        }
    }

    fn mscale_all_dim(&self) -> Option<f64> {
        self.rope_scaling.as_ref()?.get("mscale_all_dim")?.as_f64()
    }

    /// The rotary tables of the rope part of each head.
    pub fn rope(&self) -> Rope {
        match self.yarn() {
            Some(y) => Rope::yarn(self.qk_rope_head_dim, self.rope_theta(), &y),
            None => Rope::new(self.qk_rope_head_dim, self.rope_theta()),
        }
    }

    /// The longest context: YaRN's `factor` times its original context
    /// when that is more than `max_position_embeddings`.
    pub fn position_limit(&self) -> usize {
        match self.yarn() {
            Some(y) => RopeScaling::Yarn(y).extended_positions(self.max_position_embeddings),
            None => self.max_position_embeddings,
        }
    }

    pub fn index_topk(&self) -> usize {
        self.index_topk.unwrap_or(2048)
    }
    pub fn index_head_dim(&self) -> usize {
        self.index_head_dim.unwrap_or(128)
    }
    pub fn index_n_heads(&self) -> usize {
        self.index_n_heads.unwrap_or(32)
    }

    /// RoPE in the DSA indexer: interleaved pairs for GLM-5, rotate-half
    /// (the first half against the second) for DeepSeek-V3.2.
    pub fn indexer_rope_interleaved(&self) -> bool {
        self.model_type != "deepseek_v32"
    }

    /// Interleaved RoPE pairs (2i, 2i+1): always for GLM, by default for DeepSeek-V3.
    pub fn rope_interleaved(&self) -> bool {
        match self.family() {
            MlaFamily::GlmMoeDsa => true,
            MlaFamily::DeepseekV3 => self.rope_interleave.unwrap_or(true),
        }
    }

    /// Whether each layer's MLP is the sparse MoE (true) or a dense MLP.
    pub fn mlp_sparse(&self) -> Result<Vec<bool>, String> {
        match &self.mlp_layer_types {
            Some(v) => v
                .iter()
                .map(|s| match s.as_str() {
                    "sparse" => Ok(true),
                    "dense" => Ok(false),
                    other => Err(format!("unknown MLP type {other:?} (dense or sparse)")),
                })
                .collect(),
            None => {
                let k = self
                    .first_k_dense_replace
                    .unwrap_or(3)
                    .min(self.num_hidden_layers);
                Ok((0..self.num_hidden_layers).map(|l| l >= k).collect())
            }
        }
    }

    /// Per-layer indexer mode, as transformers derives it: explicit
    /// `indexer_types`, else `index_topk_pattern`, else the freq/offset schedule.
    pub fn indexer_kinds(&self) -> Result<Vec<IndexerKind>, String> {
        if self.model_type == "deepseek_v32" {
            // Every layer indexes for itself.
            return match &self.layer_types {
                Some(v) => v
                    .iter()
                    .map(|s| match s.as_str() {
                        "indexed_attention" => Ok(IndexerKind::Full),
                        other => Err(format!("unknown layer type {other:?} (indexed_attention)")),
                    })
                    .collect(),
                None => Ok(vec![IndexerKind::Full; self.num_hidden_layers]),
            };
        }
        let parse = |s: &str| match s {
            "full" | "F" => Ok(IndexerKind::Full),
            "shared" | "S" => Ok(IndexerKind::Shared),
            other => Err(format!("unknown indexer type {other:?} (full or shared)")),
        };
        if let Some(v) = &self.indexer_types {
            return v.iter().map(|s| parse(s)).collect();
        }
        match &self.index_topk_pattern {
            Some(serde_json::Value::String(s)) => s.chars().map(|c| parse(&c.to_string())).collect(),
            Some(serde_json::Value::Array(a)) => a.iter().map(|v| parse(v.as_str().unwrap_or("?"))).collect(),
            Some(_) => Err("index_topk_pattern must be a string or a list".into()),
            None => {
                let freq = self.index_topk_freq.unwrap_or(1).max(1);
                let offset = self.index_skip_topk_offset.unwrap_or(2) as i64;
                Ok((0..self.num_hidden_layers)
                    .map(|i| {
                        if ((i as i64 - offset + 1).max(0) as usize).is_multiple_of(freq) {
                            IndexerKind::Full
                        } else {
                            IndexerKind::Shared
                        }
                    })
                    .collect())
            }
        }
    }

    /// `rope_theta` (transformers 5's `rope_parameters.rope_theta` is
    /// lifted to it by [`crate::config::spelling`]).
    pub fn rope_theta(&self) -> f64 {
        crate::config::rope_theta(self.rope_theta, 10000.0)
    }

    fn rope_kind(&self) -> Option<String> {
        crate::config::rope_kind(self.rope_scaling.as_ref())
    }

    /// Token ids that end generation, from `eos_token_id` (a number or a list).
    pub fn eos_ids(&self) -> Vec<u32> {
        crate::config::token_ids(self.eos_token_id.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> serde_json::Value {
        serde_json::json!({
            "model_type": "glm_moe_dsa", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
            "q_lora_rank": 16, "kv_lora_rank": 8, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8,
            "v_head_dim": 6, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
            "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "index_topk": 4,
            "index_head_dim": 8, "index_n_heads": 2, "eos_token_id": [1, 2],
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}
        })
    }

    fn parse(v: serde_json::Value) -> Result<GlmConfig, ConfigError> {
        GlmConfig::from_json(Path::new("c.json"), v)
    }

    #[test]
    fn derives_layer_kinds_like_transformers() {
        let c = parse(base()).unwrap();
        assert_eq!(c.mlp_sparse().unwrap(), vec![false, true, true]);
        // freq 1 / offset 2: every layer full
        assert_eq!(c.indexer_kinds().unwrap(), vec![IndexerKind::Full; 3]);
        let mut v = base();
        v["index_topk_freq"] = 2.into();
        v["index_skip_topk_offset"] = 1.into();
        let c = parse(v).unwrap();
        use IndexerKind::*;
        assert_eq!(c.indexer_kinds().unwrap(), vec![Full, Shared, Full]);
        let mut v = base();
        v["index_topk_pattern"] = "FSS".into();
        assert_eq!(
            parse(v).unwrap().indexer_kinds().unwrap(),
            vec![Full, Shared, Shared]
        );
        assert!((c.softmax_scale() - 12f32.powf(-0.5)).abs() < 1e-7);
    }

    #[test]
    fn refuses_bad_fields_with_their_name() {
        for (field, val) in [
            ("n_group", serde_json::json!(3)),
            ("topk_group", serde_json::json!(3)),
            ("num_experts_per_tok", serde_json::json!(5)),
            ("indexer_types", serde_json::json!(["shared", "full", "full"])),
            ("mlp_layer_types", serde_json::json!(["dense", "sparse"])),
            (
                "rope_parameters",
                serde_json::json!({"rope_type": "yarn", "factor": 4.0}),
            ),
            ("num_nextn_predict_layers", serde_json::json!(2)),
        ] {
            let mut v = base();
            v[field] = val;
            let e = parse(v).unwrap_err();
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
        let mut v = base();
        v["model_type"] = "llama".into();
        assert!(matches!(parse(v), Err(ConfigError::ModelType { .. })));
    }

    #[test]
    fn deepseek_v3_reads_yarn_with_its_softmax_correction() {
        let mut v = base();
        v["model_type"] = "deepseek_v3".into();
        v["max_position_embeddings"] = 163840.into();
        v["rope_parameters"] = serde_json::json!({
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
            "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
            "mscale": 1.0, "mscale_all_dim": 1.0
        });
        let c = parse(v.clone()).unwrap();
        let m = 0.1 * 40f64.ln() + 1.0;
        let want = (12f64.powf(-0.5) * m * m) as f32;
        assert_eq!(c.softmax_scale(), want);
        // mscale == mscale_all_dim: the rotary tables are not scaled.
        assert_eq!(c.rope().attention_scale(), 1.0);
        assert_eq!(c.position_limit(), 163840);
        // Without mscale_all_dim the softmax keeps its plain scale.
        v["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .retain(|k, _| k != "mscale" && k != "mscale_all_dim");
        let c = parse(v.clone()).unwrap();
        assert_eq!(c.softmax_scale(), 12f32.powf(-0.5));
        v["rope_parameters"]["factor"] = (-1.0).into();
        assert!(parse(v).unwrap_err().to_string().contains("rope_scaling"));
    }

    #[test]
    fn every_number_is_range_checked() {
        for (field, val) in [
            ("routed_scaling_factor", serde_json::json!(-2.5)),
            ("routed_scaling_factor", serde_json::json!(0.0)),
            ("n_shared_experts", serde_json::json!(1u64 << 30)),
            ("first_k_dense_replace", serde_json::json!(1u64 << 30)),
            ("index_topk_freq", serde_json::json!(1u64 << 30)),
            ("rms_norm_eps", serde_json::json!(1e-300)),
            ("latent_norm_eps", serde_json::json!(0.0)),
            ("max_position_embeddings", serde_json::json!(0)),
            ("index_n_heads", serde_json::json!(0)),
        ] {
            let mut v = base();
            v[field] = val.clone();
            let e = parse(v).unwrap_err();
            assert!(e.to_string().contains(field), "{field}={val}: {e}");
        }
        let mut v = base();
        v["n_routed_experts"] = (1u64 << 24).into();
        v["moe_intermediate_size"] = (1u64 << 24).into();
        let e = parse(v).unwrap_err();
        assert!(e.to_string().contains("elements"), "{e}");
    }
}
