//! The gpt-oss shape of a synthetic model (`coli synth --preset
//! gpt-oss-20b`, `gpt-oss-tiny`): grouped-query attention with biases on
//! every projection and one sink per head, layers alternating between a
//! `sliding_window`-position window and full attention (sliding first),
//! YaRN RoPE, a biased router, experts with biases and a clamped SwiGLU.

use std::sync::Arc;

use crate::model::expert::ExpertNaming;
use crate::quant::QFormat;
use crate::synth::{DecoderShape, Registered, SpecError, SynthFamily, SynthSpec, SynthTensor};

/// The sizes of a gpt-oss [`SynthSpec`] beyond the spec's own (whose
/// `intermediate` is the experts').
#[derive(Clone, Debug, PartialEq)]
pub struct GptOssShape {
    pub attn: DecoderShape,
    /// Positions a sliding layer sees.
    pub sliding_window: usize,
}

impl GptOssShape {
    /// gpt-oss-20b's: 8 KV heads of 64, a 128-position window.
    pub fn gpt_oss_20b() -> Self {
        Self {
            attn: DecoderShape {
                kv_heads: 8,
                head_dim: 64,
            },
            sliding_window: 128,
        }
    }

    /// A few hundred KB's: 2 KV heads of 24, a 4-position window, so a
    /// short test decode slides.
    pub fn tiny() -> Self {
        Self {
            attn: DecoderShape {
                kv_heads: 2,
                head_dim: 24,
            },
            sliding_window: 4,
        }
    }
}

impl SynthFamily for GptOssShape {
    fn model_type(&self) -> &'static str {
        "gpt_oss"
    }

    fn name(&self) -> &'static str {
        "gpt-oss"
    }

    /// gpt-oss's `<|return|>`.
    fn eos_id(&self) -> usize {
        200002
    }

    fn decoder(&self) -> Option<&DecoderShape> {
        Some(&self.attn)
    }

    /// As transformers writes `gpt_oss` (layers alternate sliding and full
    /// attention, sliding first; gpt-oss's own YaRN and SwiGLU clamp).
    fn config_json(&self, s: &SynthSpec) -> serde_json::Value {
        let layer_types: Vec<&str> = (0..s.layers)
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
            "vocab_size": s.vocab,
            "hidden_size": s.hidden,
            "intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": self.attn.kv_heads,
            "head_dim": self.attn.head_dim,
            "num_local_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "sliding_window": self.sliding_window,
            "layer_types": layer_types,
            "max_position_embeddings": s.max_position_embeddings,
            "rope_theta": s.rope_theta,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": false,
                "original_max_position_embeddings": 4096,
            },
            "swiglu_limit": 7.0,
            "rms_norm_eps": s.rms_norm_eps,
            "attention_bias": true,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "bos_token_id": null,
            "eos_token_id": s.eos_id(),
            "colibri_synthetic": { "seed": s.seed },
        })
    }

    /// As a per-expert checkpoint (a container) names them: biases on
    /// every attention projection, one sink per head, a biased router
    /// `mlp.router`, and each expert's gate/up/down matrices with their
    /// biases `mlp.experts.E.{gate,up,down}_proj.bias`.
    fn layer_tensors(&self, s: &SynthSpec, l: usize) -> Vec<SynthTensor> {
        let (h, heads, experts, inter) = (s.hidden, s.heads, s.experts, s.intermediate);
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let naming = ExpertNaming::MLP;
        let mut out = self.attn.attention(l, h, heads, true, true);
        out.push((n("self_attn.sinks"), vec![heads]));
        out.push((n("mlp.router.weight"), vec![experts, h]));
        out.push((n("mlp.router.bias"), vec![experts]));
        for e in 0..experts {
            for (which, (shape, bias)) in [
                (vec![inter, h], inter),
                (vec![inter, h], inter),
                (vec![h, inter], h),
            ]
            .into_iter()
            .enumerate()
            {
                out.push((naming.tensor(l, e, which), shape));
                out.push((naming.bias(l, e, which), vec![bias]));
            }
        }
        out
    }

    /// Formats, then gpt-oss's own parser, whose messages name the fault
    /// (heads that do not group, an odd head size).
    fn validate(&self, s: &SynthSpec) -> Result<(), SpecError> {
        s.check_parsed(super::from_json)
    }

    fn scaled(&self, _round: &dyn Fn(usize, usize) -> usize) -> Result<Arc<dyn SynthFamily>, String> {
        Ok(Arc::new(self.clone()))
    }
}

impl SynthSpec {
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
            family: Registered(Arc::new(GptOssShape::gpt_oss_20b())),
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
            family: Registered(Arc::new(GptOssShape::tiny())),
            ..Self::gpt_oss_20b()
        }
    }
}
