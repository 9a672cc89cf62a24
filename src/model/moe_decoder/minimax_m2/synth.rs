//! The MiniMax-M2 shape of a synthetic model (`coli synth --preset
//! minimax-m2`, `minimax-tiny`): grouped-query attention with full-width
//! q/k norms and partial rotary, every layer routed through a sigmoid
//! router with a correction bias, experts under `block_sparse_moe`, the
//! config in the release's own spelling.

use std::sync::Arc;

use crate::model::expert::ExpertNaming;
use crate::quant::QFormat;
use crate::synth::{DecoderShape, Registered, SynthFamily, SynthSpec, SynthTensor};

/// The sizes of a MiniMax-M2 [`SynthSpec`] beyond the spec's own (whose
/// `intermediate` is the experts' `intermediate_size`).
#[derive(Clone, Debug, PartialEq)]
pub struct MiniMaxShape {
    pub attn: DecoderShape,
    /// Rotated dimensions of each head (`rotary_dim`).
    pub rotary_dim: usize,
}

impl SynthFamily for MiniMaxShape {
    fn model_type(&self) -> &'static str {
        "minimax_m2"
    }

    fn name(&self) -> &'static str {
        "MiniMax-M2"
    }

    /// The release's `eos_token_id`.
    fn eos_id(&self) -> usize {
        200_020
    }

    fn decoder(&self) -> Option<&DecoderShape> {
        Some(&self.attn)
    }

    fn config_json(&self, s: &SynthSpec) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["MiniMaxM2ForCausalLM"],
            "model_type": "minimax_m2",
            "vocab_size": s.vocab,
            "hidden_size": s.hidden,
            "intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": self.attn.kv_heads,
            "head_dim": self.attn.head_dim,
            "rotary_dim": self.rotary_dim,
            "num_local_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "scoring_func": "sigmoid",
            "use_routing_bias": true,
            "use_qk_norm": true,
            "qk_norm_type": "per_layer",
            "max_position_embeddings": s.max_position_embeddings,
            "rope_theta": s.rope_theta,
            "rms_norm_eps": s.rms_norm_eps,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "eos_token_id": s.eos_id(),
            "colibri_synthetic": { "seed": s.seed },
        })
    }

    fn layer_tensors(&self, s: &SynthSpec, l: usize) -> Vec<SynthTensor> {
        let (h, inter) = (s.hidden, s.intermediate);
        let naming = ExpertNaming::BLOCK_SPARSE;
        let mut out = self.attn.attention(l, h, s.heads, false, false);
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        out.push((n("self_attn.q_norm.weight"), vec![s.heads * self.attn.head_dim]));
        out.push((
            n("self_attn.k_norm.weight"),
            vec![self.attn.kv_heads * self.attn.head_dim],
        ));
        out.push((naming.router(l), vec![s.experts, h]));
        out.push((n("block_sparse_moe.e_score_correction_bias"), vec![s.experts]));
        for e in 0..s.experts {
            out.push((naming.tensor(l, e, 0), vec![inter, h]));
            out.push((naming.tensor(l, e, 1), vec![inter, h]));
            out.push((naming.tensor(l, e, 2), vec![h, inter]));
        }
        out
    }

    fn scaled(&self, _round: &dyn Fn(usize, usize) -> usize) -> Result<Arc<dyn SynthFamily>, String> {
        Ok(Arc::new(self.clone()))
    }
}

/// MiniMax-M2's real shape: vocabulary 200064, hidden 3072, 62 layers,
/// 48 query and 8 KV heads of 128 with 64 dimensions rotated, 256 experts
/// top-8 of intermediate 1536; int4-g64 experts (8.0 MB each). All 62
/// layers are about 128 GB: the default 4 (9.6 GB) is what a benchmark disk holds,
/// and `--layers` picks more (about 2.0 GB a layer). Positions are capped
/// at 4096 (the release has 196608).
pub fn minimax_m2() -> SynthSpec {
    SynthSpec {
        vocab: 200_064,
        hidden: 3072,
        layers: 4,
        heads: 48,
        experts: 256,
        top_k: 8,
        intermediate: 1536,
        max_position_embeddings: 4096,
        rope_theta: 5_000_000.0,
        rms_norm_eps: 1e-6,
        expert_format: QFormat::Int4Grouped { group: 64 },
        dense_format: QFormat::Int8,
        seed: 0,
        family: Registered(Arc::new(MiniMaxShape {
            attn: DecoderShape {
                kv_heads: 8,
                head_dim: 128,
            },
            rotary_dim: 64,
        })),
    }
}

/// The MiniMax-M2 layout at a few hundred KB (heads of 16 where hidden /
/// heads is 16, half of each rotated, GQA 2): for tests.
pub fn minimax_tiny() -> SynthSpec {
    SynthSpec {
        vocab: 256,
        hidden: 64,
        layers: 3,
        heads: 4,
        experts: 8,
        top_k: 2,
        intermediate: 32,
        max_position_embeddings: 256,
        expert_format: QFormat::Int8,
        family: Registered(Arc::new(MiniMaxShape {
            attn: DecoderShape {
                kv_heads: 2,
                head_dim: 16,
            },
            rotary_dim: 8,
        })),
        ..minimax_m2()
    }
}
