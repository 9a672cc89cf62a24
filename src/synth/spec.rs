//! The shape of a synthetic model and the tensors it is made of.

use std::path::Path;

use crate::convert::InputTensor;
use crate::quant::QFormat;
use crate::st::Dtype;

/// Shape, formats and seed of a synthetic OLMoE model.
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
}

/// Why a spec cannot be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("unknown preset {0:?} (use olmoe-1b-7b, small or tiny)")]
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
        let round = |v: usize, m: usize| (((v as f64 * factor) / m as f64).round() as usize).max(1) * m;
        self.hidden = round(self.hidden, 2 * self.heads);
        self.intermediate = round(self.intermediate, 8);
        self.vocab = round(self.vocab, 64);
        Ok(self)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
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

    /// The id generation stops at: OLMoE's when the vocabulary has it.
    pub fn eos_id(&self) -> usize {
        if self.vocab > 50279 { 50279 } else { self.vocab - 1 }
    }

    /// config.json for the model, as transformers writes it for OLMoE.
    pub fn config_json(&self) -> serde_json::Value {
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

    /// Every tensor of the model as a Hugging Face OLMoE checkpoint names
    /// it, sorted by name (the order the planner expects).
    pub(crate) fn inputs(&self, origin: &Path) -> Vec<InputTensor> {
        let (h, inter) = (self.hidden, self.intermediate);
        let mut out = vec![
            ("model.embed_tokens.weight".to_string(), vec![self.vocab, h]),
            ("lm_head.weight".to_string(), vec![self.vocab, h]),
            ("model.norm.weight".to_string(), vec![h]),
        ];
        for l in 0..self.layers {
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
    /// and varies; norms scatter around 1.
    pub(crate) fn distribution(&self, name: &str, shape: &[usize]) -> (f32, f32) {
        const SQRT3: f32 = 1.732_050_8;
        let unit = |fan_in: usize| SQRT3 / (fan_in as f32).sqrt();
        if shape.len() == 1 {
            return (1.0, 0.1);
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
