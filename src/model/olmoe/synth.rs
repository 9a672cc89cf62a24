//! The OLMoE shape of a synthetic model (`coli synth --preset olmoe-1b-7b`,
//! `small`, `tiny`): multi-head attention of `hidden / heads`-sized heads
//! with full-width q/k norms, every layer sparse, experts under
//! `mlp.experts.E`.

use std::sync::Arc;

use crate::quant::QFormat;
use crate::synth::{Registered, SpecError, SynthFamily, SynthSpec, SynthTensor};

/// OLMoE has no hyper-parameters beyond the spec's shared ones.
#[derive(Clone, Debug, PartialEq)]
pub struct OlmoeShape;

impl SynthFamily for OlmoeShape {
    fn model_type(&self) -> &'static str {
        "olmoe"
    }

    fn name(&self) -> &'static str {
        "OLMoE"
    }

    /// OLMoE's `<|endoftext|>`.
    fn eos_id(&self) -> usize {
        50279
    }

    fn config_json(&self, s: &SynthSpec) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["OlmoeForCausalLM"],
            "model_type": "olmoe",
            "vocab_size": s.vocab,
            "hidden_size": s.hidden,
            "intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.heads,
            "num_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "norm_topk_prob": false,
            "max_position_embeddings": s.max_position_embeddings,
            "rope_theta": s.rope_theta,
            "rms_norm_eps": s.rms_norm_eps,
            "tie_word_embeddings": false,
            "clip_qkv": null,
            "bos_token_id": null,
            "eos_token_id": s.eos_id(),
            "pad_token_id": 1,
            "colibri_synthetic": { "seed": s.seed },
        })
    }

    fn layer_tensors(&self, s: &SynthSpec, l: usize) -> Vec<SynthTensor> {
        let (h, inter) = (s.hidden, s.intermediate);
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
        out.push((n("mlp.gate.weight"), vec![s.experts, h]));
        for e in 0..s.experts {
            out.push((n(&format!("mlp.experts.{e}.gate_proj.weight")), vec![inter, h]));
            out.push((n(&format!("mlp.experts.{e}.up_proj.weight")), vec![inter, h]));
            out.push((n(&format!("mlp.experts.{e}.down_proj.weight")), vec![h, inter]));
        }
        out
    }

    /// Heads even (rotate-half RoPE splits each head in two), and int8 or
    /// f32 on both sides: the formats synth offers OLMoE, which the shared
    /// format check (int4-gN experts) would widen.
    fn validate(&self, s: &SynthSpec) -> Result<(), SpecError> {
        let bad = |s: String| Err(SpecError::Invalid(s));
        if !s.hidden.is_multiple_of(s.heads) || !s.head_dim().is_multiple_of(2) {
            return bad(format!(
                "hidden {} must split into {} even heads",
                s.hidden, s.heads
            ));
        }
        for (what, f) in [("experts", s.expert_format), ("dense", s.dense_format)] {
            if !matches!(f, QFormat::F32 | QFormat::Int8) {
                return bad(format!("--{what} {f} is not offered by synth (use int8 or f32)"));
            }
        }
        Ok(())
    }

    fn scaled(&self, _round: &dyn Fn(usize, usize) -> usize) -> Result<Arc<dyn SynthFamily>, String> {
        Ok(Arc::new(Self))
    }

    /// Heads are hidden / heads: a multiple of 2 × heads keeps them even.
    fn hidden_multiple(&self, heads: usize) -> usize {
        2 * heads
    }
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
            family: Registered(Arc::new(OlmoeShape)),
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
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::synth::SynthSpec;

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
