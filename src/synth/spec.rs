//! The shape of a synthetic model and the tensors it is made of.

use std::path::Path;

use super::registered::Registered;
use super::{DecoderShape, Glm4Shape, GlmShape};
use crate::config::ConfigError;
use crate::convert::InputTensor;
use crate::model::expert::ExpertNaming;
use crate::model::family::ModelConfig;
use crate::model::glm::GlmConfig;
use crate::model::moe_decoder::MoeDecoderConfig;
use crate::quant::QFormat;
use crate::st::Dtype;

/// Which model family a synthetic model is, with the hyper-parameters only
/// that family has. The first six families' shapes are matched on here;
/// a family added since keeps its shape in its own folder and comes in as
/// [`Family::Registered`], so it adds no arm to these matches.
#[derive(Clone, Debug, PartialEq)]
pub enum Family {
    /// OLMoE (`olmoe`): multi-head attention of `hidden / heads`-sized
    /// heads with full-width q/k norms, every layer sparse.
    Olmoe,
    /// Qwen3-MoE (`qwen3_moe`): grouped-query attention with per-head q/k
    /// norms, every layer sparse, `norm_topk_prob` true; `dense_intermediate`
    /// is the config's `intermediate_size` (the spec's `intermediate` is
    /// `moe_intermediate_size`).
    Qwen3Moe {
        attn: DecoderShape,
        dense_intermediate: usize,
    },
    /// Mixtral (`mixtral`): grouped-query attention without q/k norms,
    /// experts under `block_sparse_moe.experts.E.{w1,w3,w2}`.
    Mixtral { attn: DecoderShape },
    /// GLM-5 (`glm_moe_dsa`), whose attention, indexer and router need
    /// more than OLMoE's fields; `intermediate` is then the routed experts'
    /// (`moe_intermediate_size`).
    Glm(GlmShape),
    /// GLM-4.x MoE (`glm4_moe`): grouped-query attention with q/k/v
    /// biases and partial rotary, leading dense layers, then a sigmoid
    /// router with a correction bias and shared experts; `intermediate` is
    /// the routed experts' (`moe_intermediate_size`).
    Glm4Moe(Glm4Shape),
    /// gpt-oss (`gpt_oss`): grouped-query attention with biases on every
    /// projection and one sink per head, layers alternating between a
    /// `sliding_window`-position window and full attention (sliding first),
    /// YaRN RoPE, a biased router, experts with biases and a clamped SwiGLU.
    GptOss {
        attn: DecoderShape,
        sliding_window: usize,
    },
    /// A family whose synthetic shape lives in its own folder
    /// (Qwen3.5/3.6, MiniMax-M2, DeepSeek-V3.2, GLM-4.7-Flash).
    Registered(Registered),
}

impl Family {
    /// config.json's `model_type`.
    pub fn model_type(&self) -> &'static str {
        match self {
            Family::Olmoe => "olmoe",
            Family::Qwen3Moe { .. } => "qwen3_moe",
            Family::Mixtral { .. } => "mixtral",
            Family::Glm(_) => "glm_moe_dsa",
            Family::Glm4Moe(_) => "glm4_moe",
            Family::GptOss { .. } => "gpt_oss",
            Family::Registered(r) => r.0.model_type(),
        }
    }

    /// The family's name in messages.
    pub fn name(&self) -> &'static str {
        match self {
            Family::Olmoe => "OLMoE",
            Family::Qwen3Moe { .. } => "Qwen3-MoE",
            Family::Mixtral { .. } => "Mixtral",
            Family::Glm(_) => "GLM",
            Family::Glm4Moe(_) => "GLM-4",
            Family::GptOss { .. } => "gpt-oss",
            Family::Registered(r) => r.0.name(),
        }
    }

    /// The grouped-query attention sizes of a Llama-style decoder family
    /// (Qwen3-MoE, Mixtral, GLM-4.x MoE, gpt-oss, MiniMax-M2).
    pub fn decoder(&self) -> Option<&DecoderShape> {
        match self {
            Family::Qwen3Moe { attn, .. } | Family::Mixtral { attn } | Family::GptOss { attn, .. } => {
                Some(attn)
            }
            Family::Glm4Moe(g) => Some(&g.attn),
            Family::Registered(r) => r.0.decoder(),
            Family::Olmoe | Family::Glm(_) => None,
        }
    }
}

/// Shape, formats and seed of a synthetic model of one of the engine's
/// families.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub experts: usize,
    pub top_k: usize,
    pub intermediate: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    /// Routed experts' stored format.
    pub expert_format: QFormat,
    /// Dense matrices' stored format (norms and router always stay f32).
    pub dense_format: QFormat,
    pub seed: u64,
    /// The family and its own hyper-parameters.
    pub family: Family,
}

/// Why a spec cannot be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("unknown preset {name:?} (use one of: {known})")]
    Preset { name: String, known: String },
    #[error("{0}")]
    Invalid(String),
}

impl SynthSpec {
    /// The real OLMoE-1B-7B shape (about 7 GB as an int8 container).
    pub fn olmoe_1b_7b() -> Self {
        Self {
            vocab: 50304,
            hidden: 2048,
            layers: 16,
            heads: 16,
            experts: 64,
            top_k: 8,
            intermediate: 1024,
            max_position_embeddings: 4096,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            expert_format: QFormat::Int8,
            dense_format: QFormat::Int8,
            seed: 0,
            family: Family::Olmoe,
        }
    }

    /// GLM-5's real shape (hidden 6144, 64 MLA heads, 256 routed experts
    /// top-8 of intermediate 2048 plus one shared, vocabulary 154880) with
    /// int4-g64 experts, so one expert read is the real model's (about
    /// 21 MB with its scales). The real model has 78 layers (about 400 GB);
    /// the default 4 (3 dense, 1 sparse: about 8.7 GB) is what a benchmark
    /// disk holds, and `--layers` picks more where the disk allows (each
    /// sparse layer adds about 5.6 GB).
    pub fn glm5() -> Self {
        Self {
            vocab: 154880,
            hidden: 6144,
            layers: 4,
            heads: 64,
            experts: 256,
            top_k: 8,
            intermediate: 2048,
            max_position_embeddings: 4096,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-5,
            expert_format: QFormat::Int4Grouped { group: 64 },
            dense_format: QFormat::Int8,
            seed: 0,
            family: Family::Glm(GlmShape::glm5()),
        }
    }

    /// The GLM-5 layout at a few hundred KB: for tests.
    pub fn glm_tiny() -> Self {
        Self {
            vocab: 256,
            hidden: 64,
            layers: 3,
            heads: 4,
            experts: 8,
            top_k: 2,
            intermediate: 64,
            max_position_embeddings: 256,
            family: Family::Glm(GlmShape::tiny()),
            ..Self::glm5()
        }
    }

    /// A few MB: small enough for benches that decode on a simulated slow disk.
    pub fn small() -> Self {
        Self {
            vocab: 1024,
            hidden: 256,
            layers: 4,
            heads: 4,
            experts: 16,
            top_k: 4,
            intermediate: 256,
            max_position_embeddings: 512,
            ..Self::olmoe_1b_7b()
        }
    }

    /// A few hundred KB: for tests.
    pub fn tiny() -> Self {
        Self {
            vocab: 256,
            hidden: 64,
            layers: 2,
            heads: 4,
            experts: 8,
            top_k: 2,
            intermediate: 32,
            max_position_embeddings: 256,
            ..Self::olmoe_1b_7b()
        }
    }

    /// Qwen3-30B-A3B's real shape (vocabulary 151936, hidden 2048, 48
    /// layers, 32 query heads and 4 KV heads of 128, 128 experts top-8 of
    /// intermediate 768) with int8 experts: about 31 GB. Positions are
    /// capped at 4096 (the real model has 40960), as the GLM-5 preset caps
    /// its own, so the KV cache the engine budgets for stays that of a
    /// 4096-token context.
    pub fn qwen3_30b_a3b() -> Self {
        Self {
            vocab: 151936,
            hidden: 2048,
            layers: 48,
            heads: 32,
            experts: 128,
            top_k: 8,
            intermediate: 768,
            max_position_embeddings: 4096,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-6,
            expert_format: QFormat::Int8,
            dense_format: QFormat::Int8,
            seed: 0,
            family: Family::Qwen3Moe {
                attn: DecoderShape {
                    kv_heads: 4,
                    head_dim: 128,
                },
                dense_intermediate: 6144,
            },
        }
    }

    /// The Qwen3-MoE layout at a few hundred KB (grouped-query attention,
    /// heads of 24 where hidden / heads is 16): for tests.
    pub fn qwen3_tiny() -> Self {
        Self {
            vocab: 256,
            hidden: 64,
            layers: 2,
            heads: 4,
            experts: 8,
            top_k: 2,
            intermediate: 32,
            max_position_embeddings: 256,
            family: Family::Qwen3Moe {
                attn: DecoderShape {
                    kv_heads: 2,
                    head_dim: 24,
                },
                dense_intermediate: 96,
            },
            ..Self::qwen3_30b_a3b()
        }
    }

    /// Mixtral-8x7B's real shape (vocabulary 32000, hidden 4096, 32
    /// layers, 32 query heads and 8 KV heads of 128, 8 experts top-2 of
    /// intermediate 14336) with int8 experts: about 47 GB. Positions are
    /// capped at 4096 (the real model has 32768) like the other presets.
    pub fn mixtral_8x7b() -> Self {
        Self {
            vocab: 32000,
            hidden: 4096,
            layers: 32,
            heads: 32,
            experts: 8,
            top_k: 2,
            intermediate: 14336,
            max_position_embeddings: 4096,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-5,
            expert_format: QFormat::Int8,
            dense_format: QFormat::Int8,
            seed: 0,
            family: Family::Mixtral {
                attn: DecoderShape {
                    kv_heads: 8,
                    head_dim: 128,
                },
            },
        }
    }

    /// The Mixtral layout at a few hundred KB (grouped-query attention,
    /// heads of 20 where hidden / heads is 16): for tests.
    pub fn mixtral_tiny() -> Self {
        Self {
            vocab: 256,
            hidden: 64,
            layers: 2,
            heads: 4,
            experts: 8,
            top_k: 2,
            intermediate: 48,
            max_position_embeddings: 256,
            family: Family::Mixtral {
                attn: DecoderShape {
                    kv_heads: 2,
                    head_dim: 20,
                },
            },
            ..Self::mixtral_8x7b()
        }
    }

    /// GLM-4.5-Air's real shape (vocabulary 151552, hidden 4096, 46
    /// layers of which the first is dense, 96 query heads and 8 KV heads
    /// of 128 with half of each rotated, q/k/v biases, 128 routed experts
    /// top-8 of intermediate 1408 plus one shared, dense MLP 10944) with
    /// int8 experts, like the other Llama-style decoder presets: about
    /// 110 GB. Positions are capped at 4096 (the real model has 131072);
    /// the next-token (MTP) layer is left out, as for GLM-5.
    pub fn glm45_air() -> Self {
        Self {
            vocab: 151552,
            hidden: 4096,
            layers: 46,
            heads: 96,
            experts: 128,
            top_k: 8,
            intermediate: 1408,
            max_position_embeddings: 4096,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-5,
            expert_format: QFormat::Int8,
            dense_format: QFormat::Int8,
            seed: 0,
            family: Family::Glm4Moe(Glm4Shape {
                attn: DecoderShape {
                    kv_heads: 8,
                    head_dim: 128,
                },
                dense_intermediate: 10944,
                first_dense: 1,
                n_shared_experts: 1,
                n_group: 1,
                topk_group: 1,
                routed_scaling_factor: 1.0,
                partial_rotary_factor: 0.5,
                qk_norm: false,
            }),
        }
    }

    /// The GLM-4.5-Air layout at a few hundred KB (one dense layer then
    /// two sparse ones, grouped-query heads of 24 where hidden / heads is
    /// 16): for tests.
    pub fn glm4_tiny() -> Self {
        Self {
            vocab: 256,
            hidden: 64,
            layers: 3,
            heads: 4,
            experts: 8,
            top_k: 2,
            intermediate: 32,
            max_position_embeddings: 256,
            family: Family::Glm4Moe(Glm4Shape {
                attn: DecoderShape {
                    kv_heads: 2,
                    head_dim: 24,
                },
                dense_intermediate: 96,
                first_dense: 1,
                n_shared_experts: 1,
                n_group: 1,
                topk_group: 1,
                routed_scaling_factor: 1.0,
                partial_rotary_factor: 0.5,
                qk_norm: false,
            }),
            ..Self::glm45_air()
        }
    }

    /// gpt-oss-20b's real shape (vocabulary 201088, hidden 2880, 24
    /// layers alternating a 128-position window and full attention, 64
    /// query heads and 8 KV heads of 64, 32 experts top-4 of intermediate
    /// 2880) with int8 experts, like the other Llama-style decoder
    /// presets: about 21 GB (the real MXFP4 release is about 13 GB).
    /// Positions are capped at 4096 (the real model has 131072; YaRN's
    /// original context is 4096 either way).
    pub fn gpt_oss_20b() -> Self {
        Self {
            vocab: 201088,
            hidden: 2880,
            layers: 24,
            heads: 64,
            experts: 32,
            top_k: 4,
            intermediate: 2880,
            max_position_embeddings: 4096,
            rope_theta: 150_000.0,
            rms_norm_eps: 1e-5,
            expert_format: QFormat::Int8,
            dense_format: QFormat::Int8,
            seed: 0,
            family: Family::GptOss {
                attn: DecoderShape {
                    kv_heads: 8,
                    head_dim: 64,
                },
                sliding_window: 128,
            },
        }
    }

    /// The gpt-oss layout at a few hundred KB (a sliding layer of a
    /// 4-position window, so a short test decode slides, then a full one;
    /// grouped-query heads of 24 where hidden / heads is 16): for tests.
    pub fn gpt_oss_tiny() -> Self {
        Self {
            vocab: 256,
            hidden: 64,
            layers: 2,
            heads: 4,
            experts: 8,
            top_k: 2,
            intermediate: 32,
            max_position_embeddings: 256,
            family: Family::GptOss {
                attn: DecoderShape {
                    kv_heads: 2,
                    head_dim: 24,
                },
                sliding_window: 4,
            },
            ..Self::gpt_oss_20b()
        }
    }

    pub fn preset(name: &str) -> Result<Self, SpecError> {
        match super::registered::presets().find(|p| p.name == name) {
            Some(p) => Ok((p.build)()),
            None => Err(SpecError::Preset {
                name: name.to_string(),
                known: super::registered::presets()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Multiplies vocab, hidden and intermediate sizes by `factor` (in
    /// (0, 1]). OLMoE's hidden stays a multiple of 2 × heads so its heads
    /// (hidden / heads) stay even; the Llama-style decoders' heads (Qwen3-MoE,
    /// Mixtral, GLM-4.x, gpt-oss) have their own size, kept, and hidden
    /// stays a multiple of 64 (a dense intermediate size is scaled too).
    pub fn scaled(mut self, factor: f64) -> Result<Self, SpecError> {
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(SpecError::Invalid(format!(
                "--scale must be in (0, 1], got {factor}"
            )));
        }
        let round = |v: usize, m: usize| (((v as f64 * factor) / m as f64).round() as usize).max(1) * m;
        let hidden_step = match &mut self.family {
            Family::Olmoe => 2 * self.heads,
            Family::Qwen3Moe {
                dense_intermediate, ..
            } => {
                *dense_intermediate = round(*dense_intermediate, 8);
                64
            }
            Family::Glm4Moe(g) => {
                g.dense_intermediate = round(g.dense_intermediate, 8);
                64
            }
            Family::Mixtral { .. } | Family::GptOss { .. } => 64,
            Family::Glm(_) => {
                return Err(SpecError::Invalid(
                    "--scale is not offered for GLM presets (glm-tiny is the small one)".into(),
                ));
            }
            Family::Registered(r) => {
                let step = r.0.hidden_multiple(self.heads);
                r.0 = r.0.scaled(&round).map_err(SpecError::Invalid)?;
                step
            }
        };
        self.hidden = round(self.hidden, hidden_step);
        self.intermediate = round(self.intermediate, 8);
        self.vocab = round(self.vocab, 64);
        Ok(self)
    }

    /// Size of one attention head: hidden / heads for OLMoE, the family's
    /// own for the Llama-style decoders.
    pub fn head_dim(&self) -> usize {
        match (&self.family, self.family.decoder()) {
            (Family::Registered(r), _) => r.0.head_dim(self),
            (_, Some(attn)) => attn.head_dim,
            (_, None) => self.hidden / self.heads,
        }
    }

    /// Layers with routed experts (GLM's dense leading layers have none).
    pub fn sparse_layers(&self) -> usize {
        match &self.family {
            Family::Glm(g) => self.layers.saturating_sub(g.first_dense),
            Family::Glm4Moe(g) => self.layers.saturating_sub(g.first_dense),
            Family::Olmoe | Family::Qwen3Moe { .. } | Family::Mixtral { .. } | Family::GptOss { .. } => {
                self.layers
            }
            Family::Registered(r) => r.0.sparse_layers(self),
        }
    }

    /// Checks what the engine will check later, so a bad flag fails first.
    pub fn validate(&self) -> Result<(), SpecError> {
        let bad = |s: String| Err(SpecError::Invalid(s));
        if [
            self.vocab,
            self.hidden,
            self.layers,
            self.heads,
            self.experts,
            self.top_k,
            self.intermediate,
        ]
        .contains(&0)
        {
            return bad(format!("every size must be non-zero: {self:?}"));
        }
        if self.top_k > self.experts {
            return bad(format!("top-k {} exceeds {} experts", self.top_k, self.experts));
        }
        match &self.family {
            Family::Olmoe => self.validate_olmoe(),
            Family::Glm(g) => self.validate_glm(g),
            Family::Qwen3Moe { .. } | Family::Mixtral { .. } | Family::Glm4Moe(_) | Family::GptOss { .. } => {
                self.validate_decoder()
            }
            Family::Registered(r) => r.0.validate(self),
        }
    }

    /// The registry's checks, the default family validation: formats the
    /// loaders read, a sparse layer, and the family's own config validation
    /// (through the registry, as the engine will read it) on the
    /// config.json this spec writes.
    pub fn check_registered(&self) -> Result<(), SpecError> {
        self.check_formats(self.family.name())?;
        if self.sparse_layers() == 0 {
            return Err(SpecError::Invalid(format!(
                "{} layers leave no sparse layer (use more --layers)",
                self.layers
            )));
        }
        let config = ModelConfig::from_json(Path::new("config.json"), self.config_json())
            .map_err(|e| SpecError::Invalid(e.to_string()))?;
        config.family().invariants().map_err(SpecError::Invalid)
    }

    /// OLMoE's checks: even heads, and the formats synth offers it.
    fn validate_olmoe(&self) -> Result<(), SpecError> {
        let bad = |s: String| Err(SpecError::Invalid(s));
        if !self.hidden.is_multiple_of(self.heads) || !self.head_dim().is_multiple_of(2) {
            return bad(format!(
                "hidden {} must split into {} even heads",
                self.hidden, self.heads
            ));
        }
        for (what, f) in [("experts", self.expert_format), ("dense", self.dense_format)] {
            if !matches!(f, QFormat::F32 | QFormat::Int8) {
                return bad(format!("--{what} {f} is not offered by synth (use int8 or f32)"));
            }
        }
        Ok(())
    }

    /// GLM's checks: the loader's own config validation (on the config.json
    /// this spec writes), formats the loader reads, and a sparse layer.
    fn validate_glm(&self, g: &GlmShape) -> Result<(), SpecError> {
        let bad = |s: String| Err(SpecError::Invalid(s));
        if self.layers <= g.first_dense {
            return bad(format!(
                "{} layers leave no sparse layer after the {} dense ones (use --layers {} or more)",
                self.layers,
                g.first_dense,
                g.first_dense + 1
            ));
        }
        self.check_formats(self.family.name())?;
        GlmConfig::from_json(Path::new("config.json"), self.config_json())
            .map(|_| ())
            .map_err(|e| SpecError::Invalid(e.to_string()))
    }

    /// The Llama-style decoders' checks: formats the loader reads, and the
    /// loader's own config validation (grouped-query heads, even head
    /// size, a sparse layer after GLM-4's dense ones) on the config.json
    /// this spec writes.
    fn validate_decoder(&self) -> Result<(), SpecError> {
        self.check_formats(self.family.name())?;
        self.decoder_config(Path::new("config.json"))
            .map(|_| ())
            .map_err(|e| SpecError::Invalid(e.to_string()))
    }

    /// The config.json this spec writes, parsed by the engine's own parser
    /// for the family (named `path` in errors). Only for the Llama-style
    /// decoders, which share [`MoeDecoderConfig`].
    pub(crate) fn decoder_config(&self, path: &Path) -> Result<MoeDecoderConfig, ConfigError> {
        let json = self.config_json();
        match self.family {
            Family::Glm4Moe(_) => crate::model::moe_decoder::glm4_moe::from_json(path, json),
            Family::GptOss { .. } => crate::model::moe_decoder::gpt_oss::from_json(path, json),
            _ => MoeDecoderConfig::from_json(path, json),
        }
    }

    /// Dense int8 or f32; experts int8, f32 or int4-gN with N dividing
    /// both sides of every expert matrix (every family but OLMoE).
    fn check_formats(&self, family: &str) -> Result<(), SpecError> {
        let bad = |s: String| Err(SpecError::Invalid(s));
        if !matches!(self.dense_format, QFormat::F32 | QFormat::Int8) {
            return bad(format!(
                "--dense {} is not offered by synth (use int8 or f32)",
                self.dense_format
            ));
        }
        match self.expert_format {
            QFormat::F32 | QFormat::Int8 => Ok(()),
            QFormat::Int4Grouped { group }
                if self.hidden.is_multiple_of(group) && self.intermediate.is_multiple_of(group) =>
            {
                Ok(())
            }
            f => bad(format!(
                "--expert-format {f} is not offered for {family} (use int4-gN with N dividing hidden {} and \
                 intermediate {}, int8 or f32)",
                self.hidden, self.intermediate
            )),
        }
    }

    /// The id generation stops at: the real model's when the vocabulary
    /// has it (OLMoE's for OLMoE and GLM, Qwen3's `<|im_end|>`, Mixtral's
    /// `</s>`, GLM-4's `<|endoftext|>`, gpt-oss's `<|return|>`), else the
    /// last id.
    pub fn eos_id(&self) -> usize {
        let real = match &self.family {
            Family::Olmoe | Family::Glm(_) => 50279,
            Family::Qwen3Moe { .. } => 151645,
            Family::Mixtral { .. } => 2,
            Family::Glm4Moe(_) => 151329,
            Family::GptOss { .. } => 200002,
            Family::Registered(r) => r.0.eos_id(),
        };
        if self.vocab > real { real } else { self.vocab - 1 }
    }

    /// config.json for the model, as transformers writes it for the family.
    pub fn config_json(&self) -> serde_json::Value {
        match &self.family {
            Family::Olmoe => self.olmoe_config_json(),
            Family::Glm(g) => self.glm_config_json(g),
            Family::Qwen3Moe {
                attn,
                dense_intermediate,
            } => self.qwen3_config_json(attn, *dense_intermediate),
            Family::Mixtral { attn } => self.mixtral_config_json(attn),
            Family::Glm4Moe(g) => self.glm4_config_json(g),
            Family::GptOss { attn, sliding_window } => self.gpt_oss_config_json(attn, *sliding_window),
            Family::Registered(r) => r.0.config_json(self),
        }
    }

    /// config.json as transformers writes it for `glm4_moe` (no MTP layer:
    /// the synthetic model has none).
    fn glm4_config_json(&self, g: &Glm4Shape) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["Glm4MoeForCausalLM"],
            "model_type": "glm4_moe",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": g.dense_intermediate,
            "moe_intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": g.attn.kv_heads,
            "head_dim": g.attn.head_dim,
            "partial_rotary_factor": g.partial_rotary_factor,
            "attention_bias": true,
            "use_qk_norm": g.qk_norm,
            "n_routed_experts": self.experts,
            "n_shared_experts": g.n_shared_experts,
            "num_experts_per_tok": self.top_k,
            "n_group": g.n_group,
            "topk_group": g.topk_group,
            "routed_scaling_factor": g.routed_scaling_factor,
            "norm_topk_prob": true,
            "first_k_dense_replace": g.first_dense,
            "num_nextn_predict_layers": 0,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_scaling": null,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "bos_token_id": null,
            "eos_token_id": self.eos_id(),
            "colibri_synthetic": { "seed": self.seed },
        })
    }

    /// config.json as transformers writes it for `gpt_oss` (layers
    /// alternate sliding and full attention, sliding first; gpt-oss's own
    /// YaRN and SwiGLU clamp).
    fn gpt_oss_config_json(&self, attn: &DecoderShape, sliding_window: usize) -> serde_json::Value {
        let layer_types: Vec<&str> = (0..self.layers)
            .map(|l| {
                if l % 2 == 0 {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        serde_json::json!({
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": attn.kv_heads,
            "head_dim": attn.head_dim,
            "num_local_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "sliding_window": sliding_window,
            "layer_types": layer_types,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": false,
                "original_max_position_embeddings": 4096,
            },
            "swiglu_limit": 7.0,
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": true,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "bos_token_id": null,
            "eos_token_id": self.eos_id(),
            "colibri_synthetic": { "seed": self.seed },
        })
    }

    fn olmoe_config_json(&self) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["OlmoeForCausalLM"],
            "model_type": "olmoe",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.heads,
            "num_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "norm_topk_prob": false,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": false,
            "clip_qkv": null,
            "bos_token_id": null,
            "eos_token_id": self.eos_id(),
            "pad_token_id": 1,
            "colibri_synthetic": { "seed": self.seed },
        })
    }

    /// config.json as transformers writes it for `qwen3_moe` (every layer
    /// sparse, no sliding window).
    fn qwen3_config_json(&self, attn: &DecoderShape, dense_intermediate: usize) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": dense_intermediate,
            "moe_intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": attn.kv_heads,
            "head_dim": attn.head_dim,
            "num_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "norm_topk_prob": true,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_scaling": null,
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": false,
            "hidden_act": "silu",
            "use_sliding_window": false,
            "sliding_window": null,
            "tie_word_embeddings": false,
            "bos_token_id": null,
            "eos_token_id": self.eos_id(),
            "colibri_synthetic": { "seed": self.seed },
        })
    }

    /// config.json as transformers writes it for `mixtral` (no sliding
    /// window; its one `intermediate_size` is the experts').
    fn mixtral_config_json(&self, attn: &DecoderShape) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": attn.kv_heads,
            "head_dim": attn.head_dim,
            "num_local_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": "silu",
            "sliding_window": null,
            "tie_word_embeddings": false,
            "bos_token_id": null,
            "eos_token_id": self.eos_id(),
            "colibri_synthetic": { "seed": self.seed },
        })
    }

    /// config.json as transformers writes it for `glm_moe_dsa` (no MTP
    /// layer: the synthetic model has none).
    fn glm_config_json(&self, g: &GlmShape) -> serde_json::Value {
        g.mla_config_with(
            self,
            vec![
                ("architectures", serde_json::json!(["GlmMoeDsaForCausalLM"])),
                ("model_type", serde_json::json!("glm_moe_dsa")),
                ("head_dim", serde_json::json!(g.qk_rope_head_dim)),
                ("first_k_dense_replace", serde_json::json!(g.first_dense)),
                ("index_topk", serde_json::json!(g.index_topk)),
                ("index_head_dim", serde_json::json!(g.index_head_dim)),
                ("index_n_heads", serde_json::json!(g.index_n_heads)),
                ("indexer_types", serde_json::json!(vec!["full"; self.layers])),
            ],
        )
    }

    /// Every tensor of the model as a Hugging Face checkpoint of its family
    /// names it, sorted by name (the order the planner expects).
    pub(crate) fn inputs(&self, origin: &Path) -> Vec<InputTensor> {
        let (h, inter) = (self.hidden, self.intermediate);
        let mut out = vec![
            ("model.embed_tokens.weight".to_string(), vec![self.vocab, h]),
            ("lm_head.weight".to_string(), vec![self.vocab, h]),
            ("model.norm.weight".to_string(), vec![h]),
        ];
        let dims = (h, self.heads, self.experts, inter);
        for l in 0..self.layers {
            out.extend(match &self.family {
                Family::Olmoe => self.olmoe_layer_tensors(l),
                Family::Glm(g) => g.layer_tensors(l, h, self.heads, self.experts, inter),
                Family::Qwen3Moe { attn, .. } => attn.layer_tensors(l, dims, true, ExpertNaming::MLP),
                Family::Mixtral { attn } => attn.layer_tensors(l, dims, false, ExpertNaming::BLOCK_SPARSE),
                Family::Glm4Moe(g) => g.layer_tensors(l, dims),
                Family::GptOss { attn, .. } => attn.gpt_oss_layer_tensors(l, dims),
                Family::Registered(r) => r.0.layer_tensors(self, l),
            });
        }
        out.sort();
        out.into_iter()
            .map(|(name, shape)| InputTensor {
                name,
                dtype: Dtype::F32,
                shape,
                path: origin.to_path_buf(),
            })
            .collect()
    }

    /// Per-layer tensors of OLMoE decoder layer `l` (unsorted).
    fn olmoe_layer_tensors(&self, l: usize) -> Vec<(String, Vec<usize>)> {
        let (h, inter) = (self.hidden, self.intermediate);
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let mut out = Vec::new();
        for p in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            out.push((n(&format!("self_attn.{p}.weight")), vec![h, h]));
        }
        for p in ["q_norm", "k_norm"] {
            out.push((n(&format!("self_attn.{p}.weight")), vec![h]));
        }
        out.push((n("input_layernorm.weight"), vec![h]));
        out.push((n("post_attention_layernorm.weight"), vec![h]));
        out.push((n("mlp.gate.weight"), vec![self.experts, h]));
        for e in 0..self.experts {
            out.push((n(&format!("mlp.experts.{e}.gate_proj.weight")), vec![inter, h]));
            out.push((n(&format!("mlp.experts.{e}.up_proj.weight")), vec![inter, h]));
            out.push((n(&format!("mlp.experts.{e}.down_proj.weight")), vec![h, inter]));
        }
        out
    }

    /// How a tensor's values are drawn: `(base, amplitude)`, values uniform
    /// in `base ± amplitude`. Matrices get variance 1 / fan_in (so every
    /// projection keeps activations at unit scale and nothing overflows over
    /// 16 layers); the router twice that, so routing is decided by the token
    /// and varies; norms scatter around 1, biases (attention, router and
    /// expert biases, GLM's router correction and indexer key norm) and
    /// gpt-oss's attention sinks around 0.
    pub(crate) fn distribution(&self, name: &str, shape: &[usize]) -> (f32, f32) {
        const SQRT3: f32 = 1.732_050_8;
        let unit = |fan_in: usize| SQRT3 / (fan_in as f32).sqrt();
        if let Family::Registered(r) = &self.family
            && let Some(d) = r.0.distribution(name, shape)
        {
            return d;
        }
        if shape.len() == 1 {
            return if name.ends_with("bias") || name.ends_with("sinks") {
                (0.0, 0.1)
            } else {
                (1.0, 0.1)
            };
        }
        let fan_in = shape[1];
        if name == "model.embed_tokens.weight" {
            (0.0, SQRT3)
        } else if name.ends_with("mlp.gate.weight")
            || name.ends_with("block_sparse_moe.gate.weight")
            || name.ends_with("mlp.router.weight")
        {
            (0.0, 2.0 * unit(fan_in))
        } else if name.ends_with("o_proj.weight")
            || name.ends_with("down_proj.weight")
            || name.ends_with(".w2.weight")
        {
            (0.0, 0.5 * unit(fan_in))
        } else {
            (0.0, unit(fan_in))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_inputs_sorted() {
        for p in ["olmoe-1b-7b", "small", "tiny"] {
            let s = SynthSpec::preset(p).unwrap();
            s.validate().unwrap();
            let inputs = s.inputs(Path::new("x"));
            assert!(inputs.windows(2).all(|w| w[0].name < w[1].name));
            assert_eq!(
                inputs.len(),
                3 + s.layers * (9 + 3 * s.experts),
                "{p}: every tensor once"
            );
        }
        assert!(SynthSpec::preset("nope").is_err());
    }

    #[test]
    fn glm_presets_are_valid_and_have_the_real_expert_shape() {
        for p in ["glm-5", "glm-tiny"] {
            let s = SynthSpec::preset(p).unwrap();
            s.validate().unwrap();
            let inputs = s.inputs(Path::new("x"));
            assert!(inputs.windows(2).all(|w| w[0].name < w[1].name), "{p}");
            let Family::Glm(g) = s.family.clone() else {
                panic!("{p} is GLM")
            };
            let dense = g.first_dense;
            let sparse = s.sparse_layers();
            assert_eq!(dense + sparse, s.layers);
            assert_eq!(
                inputs.len(),
                3 + dense * (14 + 3) + sparse * (14 + 2 + 3 + 3 * s.experts),
                "{p}: every tensor once"
            );
        }
        let s = SynthSpec::glm5();
        let up = s
            .inputs(Path::new("x"))
            .into_iter()
            .find(|t| t.name == "model.layers.3.mlp.experts.255.up_proj.weight")
            .unwrap();
        assert_eq!(up.shape, vec![2048, 6144]);
        assert_eq!(s.expert_format, QFormat::Int4Grouped { group: 64 });
        let mut s = SynthSpec::glm_tiny();
        s.layers = 1;
        assert!(s.validate().is_err(), "no sparse layer");
        let mut s = SynthSpec::glm_tiny();
        s.experts = 7;
        assert!(s.validate().is_err(), "groups must divide the experts");
        assert!(SynthSpec::glm_tiny().scaled(0.5).is_err());
    }

    /// The planner's jobs for the container `s` describes.
    fn planned_jobs(s: &SynthSpec) -> Vec<crate::convert::Job> {
        let cfg = ModelConfig::from_json(Path::new("c.json"), s.config_json()).unwrap();
        let model = cfg
            .family()
            .convert_spec(Path::new("c.json"), s.expert_format, s.dense_format)
            .unwrap();
        crate::convert::plan::plan(&s.inputs(Path::new("x")), Path::new("x"), &model).unwrap()
    }

    /// Bytes of the container `spec` would be, from the planner's entries
    /// (each expert's start rounded up to the 4096-byte alignment).
    fn planned_bytes(s: &SynthSpec) -> u64 {
        let jobs = planned_jobs(s);
        let align = crate::convert::ALIGN;
        jobs.iter().fold(0, |at, j| {
            let at = if j.align { at.div_ceil(align) * align } else { at };
            at + j.entries().iter().map(|e| e.len).sum::<u64>()
        })
    }

    #[test]
    fn decoder_presets_are_valid_and_have_the_real_expert_shape() {
        for p in ["qwen3-30b-a3b", "qwen3-tiny", "mixtral-8x7b", "mixtral-tiny"] {
            let s = SynthSpec::preset(p).unwrap();
            s.validate().unwrap();
            let inputs = s.inputs(Path::new("x"));
            assert!(inputs.windows(2).all(|w| w[0].name < w[1].name), "{p}");
            let qwen = matches!(s.family, Family::Qwen3Moe { .. });
            let attn = s.family.decoder().unwrap().clone();
            // 4 projections, 2 layer norms, the router (+ q/k norms), experts.
            let per_layer = 7 + if qwen { 2 } else { 0 } + 3 * s.experts;
            assert_eq!(inputs.len(), 3 + s.layers * per_layer, "{p}: every tensor once");
            assert!(s.heads > attn.kv_heads, "{p}: grouped-query attention");
            assert_eq!(s.head_dim(), attn.head_dim);

            // The engine reads back what was meant.
            let cfg = MoeDecoderConfig::from_json(Path::new("c.json"), s.config_json()).unwrap();
            assert_eq!(cfg.model_type, s.family.model_type());
            assert_eq!(
                (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers),
                (s.vocab, s.hidden, s.layers)
            );
            assert_eq!(
                (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim),
                (s.heads, attn.kv_heads, attn.head_dim)
            );
            assert_eq!(
                (
                    cfg.num_experts,
                    cfg.num_experts_per_tok,
                    cfg.moe_intermediate_size
                ),
                (s.experts, s.top_k, s.intermediate)
            );
            assert!(cfg.norm_topk_prob && !cfg.tie_word_embeddings, "{p}");
            assert_eq!(cfg.sparse_layers(), vec![true; s.layers], "{p}");
            assert_eq!(
                (cfg.rope_theta, cfg.max_position_embeddings),
                (1e6, s.max_position_embeddings)
            );
            assert!(cfg.eos_ids().iter().all(|&t| (t as usize) < s.vocab), "{p}");

            let find = |name: &str| {
                inputs
                    .iter()
                    .find(|t| t.name == name)
                    .unwrap_or_else(|| panic!("{p}: {name}"))
                    .shape
                    .clone()
            };
            let (q, kv) = (s.heads * attn.head_dim, attn.kv_heads * attn.head_dim);
            assert_eq!(find("model.layers.1.self_attn.q_proj.weight"), vec![q, s.hidden]);
            assert_eq!(find("model.layers.1.self_attn.k_proj.weight"), vec![kv, s.hidden]);
            assert_eq!(find("model.layers.1.self_attn.o_proj.weight"), vec![s.hidden, q]);
            let naming = if qwen {
                ExpertNaming::MLP
            } else {
                ExpertNaming::BLOCK_SPARSE
            };
            assert_eq!(find(&naming.router(1)), vec![s.experts, s.hidden]);
            let last = s.experts - 1;
            assert_eq!(find(&naming.tensor(1, last, 1)), vec![s.intermediate, s.hidden]);
            assert_eq!(find(&naming.tensor(1, last, 2)), vec![s.hidden, s.intermediate]);
            assert_eq!(
                inputs
                    .iter()
                    .any(|t| t.name == "model.layers.1.self_attn.q_norm.weight"),
                qwen,
                "{p}: only Qwen3 has q/k norms"
            );
            if qwen {
                assert_eq!(
                    find("model.layers.1.self_attn.k_norm.weight"),
                    vec![attn.head_dim]
                );
            }
            // Router and down projections are drawn like OLMoE's.
            let amp = |name: &str| s.distribution(name, &find(name)).1;
            let unit = |fan_in: usize| 1.732_050_8 / (fan_in as f32).sqrt();
            assert_eq!(amp(&naming.router(1)), 2.0 * unit(s.hidden));
            assert_eq!(amp(&naming.tensor(1, 0, 2)), 0.5 * unit(s.intermediate));
        }
        assert!(SynthSpec::qwen3_tiny().head_dim() != 64 / 4);
        assert!(SynthSpec::mixtral_tiny().head_dim() != 64 / 4);

        // The real shapes.
        let s = SynthSpec::qwen3_30b_a3b();
        assert_eq!((s.vocab, s.hidden, s.layers, s.heads), (151936, 2048, 48, 32));
        assert_eq!((s.experts, s.top_k, s.intermediate), (128, 8, 768));
        let Family::Qwen3Moe {
            attn,
            dense_intermediate,
        } = &s.family
        else {
            panic!("qwen3_moe")
        };
        assert_eq!(
            (attn.kv_heads, attn.head_dim, *dense_intermediate),
            (4, 128, 6144)
        );
        assert_eq!(s.config_json()["intermediate_size"], 6144);
        let gb = planned_bytes(&s) as f64 / 1e9;
        assert!((30.0..32.0).contains(&gb), "about 31 GB at int8: {gb}");
        let s = SynthSpec::mixtral_8x7b();
        assert_eq!((s.vocab, s.hidden, s.layers, s.heads), (32000, 4096, 32, 32));
        assert_eq!((s.experts, s.top_k, s.intermediate), (8, 2, 14336));
        assert_eq!(
            s.family.decoder().map(|a| (a.kv_heads, a.head_dim)),
            Some((8, 128))
        );
        assert_eq!(s.config_json()["num_local_experts"], 8);
        let gb = planned_bytes(&s) as f64 / 1e9;
        assert!((46.0..48.0).contains(&gb), "about 47 GB at int8: {gb}");
        // The tiny ones are a few hundred KB.
        for s in [SynthSpec::qwen3_tiny(), SynthSpec::mixtral_tiny()] {
            let kb = planned_bytes(&s) / 1000;
            assert!((100..1000).contains(&kb), "{kb} KB");
        }
    }

    #[test]
    fn glm4_and_gpt_oss_presets_are_valid_and_have_the_real_shapes() {
        for p in ["glm-4.5-air", "glm4-tiny", "gpt-oss-20b", "gpt-oss-tiny"] {
            let s = SynthSpec::preset(p).unwrap();
            s.validate().unwrap();
            let inputs = s.inputs(Path::new("x"));
            assert!(inputs.windows(2).all(|w| w[0].name < w[1].name), "{p}");
            let attn = s.family.decoder().unwrap().clone();
            assert!(s.heads > attn.kv_heads, "{p}: grouped-query attention");
            assert_eq!(s.head_dim(), attn.head_dim);
            let cfg = s.decoder_config(Path::new("c.json")).unwrap();
            assert_eq!(cfg.model_type, s.family.model_type());
            assert_eq!(
                (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers),
                (s.vocab, s.hidden, s.layers)
            );
            assert_eq!(
                (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim),
                (s.heads, attn.kv_heads, attn.head_dim)
            );
            assert_eq!(
                (
                    cfg.num_experts,
                    cfg.num_experts_per_tok,
                    cfg.moe_intermediate_size
                ),
                (s.experts, s.top_k, s.intermediate)
            );
            assert_eq!(
                (cfg.rope_theta, cfg.max_position_embeddings),
                (s.rope_theta, s.max_position_embeddings)
            );
            assert!(cfg.eos_ids().iter().all(|&t| (t as usize) < s.vocab), "{p}");
            assert!(cfg.qkv_bias && !cfg.tie_word_embeddings, "{p}");
            let find = |name: &str| {
                inputs
                    .iter()
                    .find(|t| t.name == name)
                    .unwrap_or_else(|| panic!("{p}: {name}"))
                    .shape
                    .clone()
            };
            let (h, i, ne) = (s.hidden, s.intermediate, s.experts);
            let (q, kv) = (s.heads * attn.head_dim, attn.kv_heads * attn.head_dim);
            let l = s.layers - 1;
            let n = |rest: &str| format!("model.layers.{l}.{rest}");
            assert_eq!(find(&n("self_attn.q_proj.weight")), vec![q, h]);
            assert_eq!(find(&n("self_attn.q_proj.bias")), vec![q]);
            assert_eq!(find(&n("self_attn.k_proj.bias")), vec![kv]);
            assert_eq!(find(&n("self_attn.v_proj.bias")), vec![kv]);
            let naming = ExpertNaming::MLP;
            assert_eq!(find(&naming.tensor(l, ne - 1, 1)), vec![i, h]);
            assert_eq!(find(&naming.tensor(l, ne - 1, 2)), vec![h, i]);
            let amp = |name: &str| s.distribution(name, &find(name));
            let unit = |fan_in: usize| 1.732_050_8 / (fan_in as f32).sqrt();
            assert_eq!(amp(&n("self_attn.q_proj.bias")), (0.0, 0.1));
            match &s.family {
                Family::Glm4Moe(g) => {
                    assert_eq!(
                        cfg.rotary_dim,
                        attn.head_dim / 2,
                        "{p}: half of each head rotates"
                    );
                    assert_eq!(cfg.first_k_dense_replace, g.first_dense);
                    assert_eq!(cfg.shared_intermediate, i * g.n_shared_experts);
                    assert_eq!(cfg.intermediate_size, g.dense_intermediate);
                    assert_eq!(s.sparse_layers(), s.layers - 1);
                    let mut sparse = vec![true; s.layers];
                    sparse[0] = false;
                    assert_eq!(cfg.sparse_layers(), sparse);
                    // 4 projections, 3 biases, 2 layer norms; a dense MLP,
                    // or the router, its correction bias, the shared
                    // expert and the routed ones.
                    assert_eq!(
                        inputs.len(),
                        3 + s.layers * 9 + 3 + s.sparse_layers() * (2 + 3 + 3 * ne),
                        "{p}: every tensor once"
                    );
                    assert_eq!(
                        find("model.layers.0.mlp.up_proj.weight"),
                        vec![g.dense_intermediate, h]
                    );
                    assert_eq!(find(&n("mlp.shared_experts.down_proj.weight")), vec![h, i]);
                    assert_eq!(find(&n("mlp.gate.e_score_correction_bias")), vec![ne]);
                    assert_eq!(amp(&n("mlp.gate.e_score_correction_bias")), (0.0, 0.1));
                    assert_eq!(amp(&naming.router(l)).1, 2.0 * unit(h));
                    assert!(!inputs.iter().any(|t| t.name.contains("q_norm")), "{p}");
                }
                Family::GptOss { sliding_window, .. } => {
                    assert!(cfg.o_bias && cfg.attention_sinks && s.sparse_layers() == s.layers);
                    assert_eq!(cfg.swiglu_limit, Some(7.0));
                    assert_eq!(cfg.sliding_window, Some(*sliding_window));
                    let alternating: Vec<bool> = (0..s.layers).map(|l| l % 2 == 0).collect();
                    assert_eq!(cfg.sliding_layers, alternating, "{p}: sliding first");
                    let yarn = *cfg.rope_scaling.as_ref().and_then(|r| r.yarn()).unwrap();
                    assert_eq!((yarn.factor, yarn.beta_fast, yarn.beta_slow), (32.0, 32.0, 1.0));
                    assert_eq!(yarn.original_max_position_embeddings, 4096);
                    assert!(!yarn.truncate);
                    // 4 projections and their biases, 2 layer norms, the
                    // sinks, the router and its bias; experts with biases.
                    assert_eq!(
                        inputs.len(),
                        3 + s.layers * (13 + 6 * ne),
                        "{p}: every tensor once"
                    );
                    assert_eq!(find(&n("self_attn.o_proj.bias")), vec![h]);
                    assert_eq!(find(&n("self_attn.sinks")), vec![s.heads]);
                    assert_eq!(find(&n("mlp.router.weight")), vec![ne, h]);
                    assert_eq!(find(&n("mlp.router.bias")), vec![ne]);
                    for (which, len) in [(0, i), (1, i), (2, h)] {
                        assert_eq!(find(&naming.bias(l, ne - 1, which)), vec![len]);
                        assert_eq!(amp(&naming.bias(l, 0, which)), (0.0, 0.1));
                    }
                    assert_eq!(amp(&n("self_attn.sinks")), (0.0, 0.1));
                    assert_eq!(amp(&n("mlp.router.weight")).1, 2.0 * unit(h));
                }
                f => panic!("{p}: {f:?}"),
            }
        }
        assert!(SynthSpec::glm4_tiny().head_dim() != 64 / 4);
        assert!(SynthSpec::gpt_oss_tiny().head_dim() != 64 / 4);

        // The real shapes and their planned containers.
        let s = SynthSpec::glm45_air();
        assert_eq!((s.vocab, s.hidden, s.layers, s.heads), (151552, 4096, 46, 96));
        assert_eq!((s.experts, s.top_k, s.intermediate), (128, 8, 1408));
        let Family::Glm4Moe(g) = &s.family else {
            panic!("glm4_moe")
        };
        assert_eq!((g.attn.kv_heads, g.attn.head_dim), (8, 128));
        assert_eq!(
            (g.dense_intermediate, g.first_dense, g.n_shared_experts),
            (10944, 1, 1)
        );
        assert_eq!((g.n_group, g.topk_group, g.routed_scaling_factor), (1, 1, 1.0));
        assert_eq!((g.partial_rotary_factor, g.qk_norm), (0.5, false));
        assert_eq!(s.expert_format, QFormat::Int8);
        let gb = planned_bytes(&s) as f64 / 1e9;
        assert!((105.0..112.0).contains(&gb), "about 108 GB at int8: {gb}");
        let s = SynthSpec::gpt_oss_20b();
        assert_eq!((s.vocab, s.hidden, s.layers, s.heads), (201088, 2880, 24, 64));
        assert_eq!((s.experts, s.top_k, s.intermediate), (32, 4, 2880));
        assert_eq!(
            s.family,
            Family::GptOss {
                attn: DecoderShape {
                    kv_heads: 8,
                    head_dim: 64
                },
                sliding_window: 128
            }
        );
        assert_eq!(s.rope_theta, 150_000.0);
        let gb = planned_bytes(&s) as f64 / 1e9;
        assert!((20.0..22.0).contains(&gb), "about 21 GB at int8: {gb}");
        for s in [SynthSpec::glm4_tiny(), SynthSpec::gpt_oss_tiny()] {
            let kb = planned_bytes(&s) / 1000;
            assert!((100..1000).contains(&kb), "{kb} KB");
        }

        // What the loader would refuse is refused first; the options the
        // presets leave off still give a valid model.
        let mut s = SynthSpec::glm4_tiny();
        s.layers = 1;
        assert!(s.validate().is_err(), "no sparse layer after the dense one");
        let mut s = SynthSpec::glm4_tiny();
        if let Family::Glm4Moe(g) = &mut s.family {
            g.qk_norm = true;
            g.n_group = 2;
        }
        s.validate().unwrap();
        assert!(
            s.inputs(Path::new("x"))
                .iter()
                .any(|t| t.name == "model.layers.2.self_attn.k_norm.weight" && t.shape == [24])
        );
        let mut s = SynthSpec::gpt_oss_tiny();
        s.layers = 3;
        s.validate().unwrap();
        assert_eq!(
            s.decoder_config(Path::new("c.json")).unwrap().sliding_layers,
            vec![true, false, true]
        );
        for s in [SynthSpec::glm45_air(), SynthSpec::gpt_oss_20b()] {
            let t = s.clone().scaled(0.1).unwrap();
            t.validate().unwrap();
            assert_eq!(t.family.decoder(), s.family.decoder());
            assert!(t.hidden < s.hidden && t.hidden.is_multiple_of(64));
            assert!(t.intermediate < s.intermediate && t.vocab < s.vocab);
        }
        let t = SynthSpec::glm45_air().scaled(0.5).unwrap();
        assert_eq!(t.config_json()["intermediate_size"], 5472);
        SynthSpec::glm4_tiny().scaled(0.01).unwrap().validate().unwrap();
        SynthSpec::gpt_oss_tiny()
            .scaled(0.01)
            .unwrap()
            .validate()
            .unwrap();
    }

    #[test]
    fn decoder_checks_and_scaling() {
        // What the loader would refuse is refused before a byte is written.
        let mut s = SynthSpec::qwen3_tiny();
        if let Family::Qwen3Moe { attn, .. } = &mut s.family {
            attn.kv_heads = 3;
        }
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("num_key_value_heads")
        );
        let mut s = SynthSpec::mixtral_tiny();
        if let Family::Mixtral { attn } = &mut s.family {
            attn.head_dim = 21;
        }
        assert!(s.validate().unwrap_err().to_string().contains("head_dim"));
        let mut s = SynthSpec::qwen3_tiny();
        s.top_k = 9;
        assert!(s.validate().is_err());
        // int4-gN where N divides both sides of an expert matrix.
        let mut s = SynthSpec::mixtral_tiny();
        s.expert_format = QFormat::Int4Grouped { group: 16 };
        s.validate().unwrap();
        s.expert_format = QFormat::Int4Grouped { group: 64 };
        assert!(s.validate().unwrap_err().to_string().contains("Mixtral"));
        s.expert_format = QFormat::Int8;
        s.dense_format = QFormat::Int4;
        assert!(s.validate().is_err());

        // --scale keeps the head size and the heads, shrinks the rest.
        for s in [SynthSpec::qwen3_30b_a3b(), SynthSpec::mixtral_8x7b()] {
            let t = s.clone().scaled(0.1).unwrap();
            t.validate().unwrap();
            assert_eq!(t.family.decoder(), s.family.decoder());
            assert_eq!((t.heads, t.head_dim()), (s.heads, s.head_dim()));
            assert!(t.hidden < s.hidden && t.hidden.is_multiple_of(64));
            assert!(t.intermediate < s.intermediate && t.vocab < s.vocab);
        }
        let t = SynthSpec::qwen3_30b_a3b().scaled(0.5).unwrap();
        assert_eq!((t.hidden, t.intermediate, t.vocab), (1024, 384, 75968));
        assert_eq!(t.config_json()["intermediate_size"], 3072);
        SynthSpec::qwen3_tiny().scaled(0.01).unwrap().validate().unwrap();
        SynthSpec::mixtral_tiny()
            .scaled(0.01)
            .unwrap()
            .validate()
            .unwrap();
    }

    #[test]
    fn scaling_keeps_heads_even() {
        let s = SynthSpec::olmoe_1b_7b().scaled(0.1).unwrap();
        s.validate().unwrap();
        assert!(s.hidden < 2048 && s.hidden.is_multiple_of(32));
        assert!(SynthSpec::tiny().scaled(0.0).is_err());
        assert!(SynthSpec::tiny().scaled(2.0).is_err());
        let mut s = SynthSpec::tiny();
        s.top_k = 9;
        assert!(s.validate().is_err());
    }

    /// The sizes the registered presets' doc comments and
    /// docs/benchmarks.md give, from the planner's own entries:
    /// (preset, GB of the default container, MB of one expert).
    #[test]
    fn registered_presets_have_the_sizes_their_docs_give() {
        for (p, gb, expert_mb) in [
            ("qwen3.6-35b-a3b", 34.9, 3.16),
            ("qwen3.5-397b-a17b", 17.1, 7.08),
            ("minimax-m2", 9.6, 7.96),
            ("deepseek-v3.2", 10.3, 24.8),
            ("glm-4.7-flash", 30.0, 9.46),
        ] {
            let s = SynthSpec::preset(p).unwrap();
            let total = planned_bytes(&s) as f64 / 1e9;
            let jobs = planned_jobs(&s);
            let routed: u64 = jobs
                .iter()
                .filter(|j| j.source.tensor.contains(".experts."))
                .flat_map(|j| j.entries())
                .map(|e| e.len)
                .sum();
            let expert = routed / (s.sparse_layers() * s.experts) as u64;
            eprintln!("{p}: {total:.2} GB, {:.3} MB an expert", expert as f64 / 1e6);
            assert!((total / gb - 1.0).abs() < 0.02, "{p}: {total:.2} GB");
            assert!(
                (expert as f64 / 1e6 / expert_mb - 1.0).abs() < 0.02,
                "{p}: {expert} B an expert"
            );
        }
    }
}
