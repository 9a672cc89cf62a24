//! The shape of a synthetic model and the tensors it is made of.

use std::path::Path;

use super::GlmShape;
use crate::config::GlmConfig;
use crate::convert::InputTensor;
use crate::quant::QFormat;
use crate::st::Dtype;

/// Shape, formats and seed of a synthetic OLMoE or GLM-5 model.
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
    /// `Some` for a GLM-5 (`glm_moe_dsa`) model, whose attention, indexer
    /// and router need more than OLMoE's fields; `intermediate` is then the
    /// routed experts' (`moe_intermediate_size`).
    pub glm: Option<GlmShape>,
}

/// Why a spec cannot be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("unknown preset {0:?} (use olmoe-1b-7b, small, tiny, glm-5 or glm-tiny)")]
    Preset(String),
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
            glm: None,
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
            glm: Some(GlmShape::glm5()),
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
            glm: Some(GlmShape::tiny()),
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

    pub fn preset(name: &str) -> Result<Self, SpecError> {
        match name {
            "olmoe-1b-7b" => Ok(Self::olmoe_1b_7b()),
            "small" => Ok(Self::small()),
            "tiny" => Ok(Self::tiny()),
            "glm-5" => Ok(Self::glm5()),
            "glm-tiny" => Ok(Self::glm_tiny()),
            _ => Err(SpecError::Preset(name.to_string())),
        }
    }

    /// Multiplies vocab, hidden and intermediate sizes by `factor` (in
    /// (0, 1]), keeping hidden a multiple of 2 × heads so heads stay even.
    pub fn scaled(mut self, factor: f64) -> Result<Self, SpecError> {
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(SpecError::Invalid(format!(
                "--scale must be in (0, 1], got {factor}"
            )));
        }
        if self.glm.is_some() {
            return Err(SpecError::Invalid(
                "--scale is not offered for GLM presets (glm-tiny is the small one)".into(),
            ));
        }
        let round = |v: usize, m: usize| (((v as f64 * factor) / m as f64).round() as usize).max(1) * m;
        self.hidden = round(self.hidden, 2 * self.heads);
        self.intermediate = round(self.intermediate, 8);
        self.vocab = round(self.vocab, 64);
        Ok(self)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Layers with routed experts (GLM's dense leading layers have none).
    pub fn sparse_layers(&self) -> usize {
        match &self.glm {
            Some(g) => self.layers.saturating_sub(g.first_dense),
            None => self.layers,
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
        if let Some(g) = &self.glm {
            return self.validate_glm(g);
        }
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
        if !matches!(self.dense_format, QFormat::F32 | QFormat::Int8) {
            return bad(format!(
                "--dense {} is not offered by synth (use int8 or f32)",
                self.dense_format
            ));
        }
        match self.expert_format {
            QFormat::F32 | QFormat::Int8 => {}
            QFormat::Int4Grouped { group }
                if self.hidden.is_multiple_of(group) && self.intermediate.is_multiple_of(group) => {}
            f => {
                return bad(format!(
                    "--expert-format {f} is not offered for GLM (use int4-gN with N dividing hidden {} and \
                     intermediate {}, int8 or f32)",
                    self.hidden, self.intermediate
                ));
            }
        }
        GlmConfig::from_json(Path::new("config.json"), self.config_json())
            .map(|_| ())
            .map_err(|e| SpecError::Invalid(e.to_string()))
    }

    /// The id generation stops at: OLMoE's when the vocabulary has it.
    pub fn eos_id(&self) -> usize {
        if self.vocab > 50279 { 50279 } else { self.vocab - 1 }
    }

    /// config.json for the model, as transformers writes it for OLMoE or
    /// GLM-5.
    pub fn config_json(&self) -> serde_json::Value {
        if let Some(g) = &self.glm {
            return self.glm_config_json(g);
        }
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

    /// config.json as transformers writes it for `glm_moe_dsa` (no MTP
    /// layer: the synthetic model has none).
    fn glm_config_json(&self, g: &GlmShape) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["GlmMoeDsaForCausalLM"],
            "model_type": "glm_moe_dsa",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": g.dense_intermediate,
            "moe_intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.heads,
            "q_lora_rank": g.q_lora_rank,
            "kv_lora_rank": g.kv_lora_rank,
            "qk_nope_head_dim": g.qk_nope_head_dim,
            "qk_rope_head_dim": g.qk_rope_head_dim,
            "qk_head_dim": g.qk_nope_head_dim + g.qk_rope_head_dim,
            "head_dim": g.qk_rope_head_dim,
            "v_head_dim": g.v_head_dim,
            "n_routed_experts": self.experts,
            "n_shared_experts": g.n_shared_experts,
            "num_experts_per_tok": self.top_k,
            "n_group": g.n_group,
            "topk_group": g.topk_group,
            "norm_topk_prob": true,
            "routed_scaling_factor": g.routed_scaling_factor,
            "first_k_dense_replace": g.first_dense,
            "index_topk": g.index_topk,
            "index_head_dim": g.index_head_dim,
            "index_n_heads": g.index_n_heads,
            "indexer_types": vec!["full"; self.layers],
            "max_position_embeddings": self.max_position_embeddings,
            "rope_parameters": { "rope_type": "default", "rope_theta": self.rope_theta },
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": false,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "num_nextn_predict_layers": 0,
            "bos_token_id": null,
            "eos_token_id": self.eos_id(),
            "colibri_synthetic": { "seed": self.seed },
        })
    }

    /// Every tensor of the model as a Hugging Face OLMoE (or GLM-5)
    /// checkpoint names it, sorted by name (the order the planner expects).
    pub(crate) fn inputs(&self, origin: &Path) -> Vec<InputTensor> {
        let (h, inter) = (self.hidden, self.intermediate);
        let mut out = vec![
            ("model.embed_tokens.weight".to_string(), vec![self.vocab, h]),
            ("lm_head.weight".to_string(), vec![self.vocab, h]),
            ("model.norm.weight".to_string(), vec![h]),
        ];
        for l in 0..self.layers {
            if let Some(g) = &self.glm {
                out.extend(g.layer_tensors(l, h, self.heads, self.experts, inter));
                continue;
            }
            let n = |rest: &str| format!("model.layers.{l}.{rest}");
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

    /// How a tensor's values are drawn: `(base, amplitude)`, values uniform
    /// in `base ± amplitude`. Matrices get variance 1 / fan_in (so every
    /// projection keeps activations at unit scale and nothing overflows over
    /// 16 layers); the router twice that, so routing is decided by the token
    /// and varies; norms scatter around 1, biases (GLM's router correction
    /// and indexer key norm) around 0.
    pub(crate) fn distribution(&self, name: &str, shape: &[usize]) -> (f32, f32) {
        const SQRT3: f32 = 1.732_050_8;
        let unit = |fan_in: usize| SQRT3 / (fan_in as f32).sqrt();
        if shape.len() == 1 {
            return if name.ends_with("bias") {
                (0.0, 0.1)
            } else {
                (1.0, 0.1)
            };
        }
        let fan_in = shape[1];
        if name == "model.embed_tokens.weight" {
            (0.0, SQRT3)
        } else if name.ends_with("mlp.gate.weight") {
            (0.0, 2.0 * unit(fan_in))
        } else if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
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
            let g = s.glm.clone().unwrap();
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
}
