//! The Qwen3.5/3.6-MoE shape of a synthetic model (`coli synth --preset
//! qwen3.6-35b-a3b`, `qwen3.5-397b-a17b`, `qwen35-tiny`): the hybrid stack
//! of Gated DeltaNet layers and one gated full-attention layer in every
//! `full_interval`, each followed by routed experts plus a gated shared
//! expert, written as the text-only `qwen3_5_moe_text` checkpoint (the
//! release's multimodal wrapper only renames the same tensors).

use std::sync::Arc;

use super::config::LinearShape;
use crate::quant::QFormat;
use crate::synth::{Registered, SynthFamily, SynthSpec, SynthTensor};

/// The sizes of a Qwen3.5-MoE [`SynthSpec`] beyond the spec's own (whose
/// `intermediate` is the routed experts' `moe_intermediate_size`).
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen35Shape {
    /// Key/value heads of the full-attention layers.
    pub kv_heads: usize,
    /// Size of one full-attention head.
    pub head_dim: usize,
    /// The Gated DeltaNet layers' heads and sizes.
    pub linear: LinearShape,
    /// Rows of the shared expert's gate/up projection.
    pub shared_intermediate: usize,
    /// Every `full_interval`-th layer is full attention, the rest linear.
    pub full_interval: usize,
    /// Share of a full-attention head that is rotated.
    pub partial_rotary_factor: f64,
}

impl Qwen35Shape {
    fn is_full(&self, l: usize) -> bool {
        (l + 1).is_multiple_of(self.full_interval)
    }

    /// The multimodal RoPE split of the rotated half (temporal, height,
    /// width), as the release writes it; text positions use all three alike.
    fn mrope_section(&self) -> [usize; 3] {
        let half = (self.head_dim as f64 * self.partial_rotary_factor) as usize / 2;
        let a = half.div_ceil(3);
        [a, a, half.saturating_sub(2 * a)]
    }
}

impl SynthFamily for Qwen35Shape {
    fn model_type(&self) -> &'static str {
        "qwen3_5_moe_text"
    }

    fn name(&self) -> &'static str {
        "Qwen3.5-MoE"
    }

    /// `<|im_end|>` of the Qwen3.5 vocabulary.
    fn eos_id(&self) -> usize {
        248_046
    }

    fn head_dim(&self, _spec: &SynthSpec) -> usize {
        self.head_dim
    }

    fn config_json(&self, s: &SynthSpec) -> serde_json::Value {
        let kinds: Vec<&str> = (0..s.layers)
            .map(|l| {
                if self.is_full(l) {
                    "full_attention"
                } else {
                    "linear_attention"
                }
            })
            .collect();
        serde_json::json!({
            "architectures": ["Qwen3_5MoeForCausalLM"],
            "model_type": "qwen3_5_moe_text",
            "vocab_size": s.vocab,
            "hidden_size": s.hidden,
            "moe_intermediate_size": s.intermediate,
            "shared_expert_intermediate_size": self.shared_intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "num_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "layer_types": kinds,
            "full_attention_interval": self.full_interval,
            "linear_conv_kernel_dim": self.linear.conv_kernel,
            "linear_key_head_dim": self.linear.key_dim,
            "linear_value_head_dim": self.linear.value_dim,
            "linear_num_key_heads": self.linear.key_heads,
            "linear_num_value_heads": self.linear.value_heads,
            "max_position_embeddings": s.max_position_embeddings,
            "rms_norm_eps": s.rms_norm_eps,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": s.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": self.mrope_section(),
                "mrope_interleaved": true,
            },
            "hidden_act": "silu",
            "attention_bias": false,
            "tie_word_embeddings": false,
            "bos_token_id": null,
            "eos_token_id": s.eos_id(),
            "colibri_synthetic": { "seed": s.seed },
        })
    }

    fn layer_tensors(&self, s: &SynthSpec, l: usize) -> Vec<SynthTensor> {
        let h = s.hidden;
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let mut out = vec![
            (n("input_layernorm.weight"), vec![h]),
            (n("post_attention_layernorm.weight"), vec![h]),
        ];
        if self.is_full(l) {
            let (q, kv) = (s.heads * self.head_dim, self.kv_heads * self.head_dim);
            out.extend([
                // Per head: its query rows, then its output-gate rows.
                (n("self_attn.q_proj.weight"), vec![2 * q, h]),
                (n("self_attn.k_proj.weight"), vec![kv, h]),
                (n("self_attn.v_proj.weight"), vec![kv, h]),
                (n("self_attn.o_proj.weight"), vec![h, q]),
                (n("self_attn.q_norm.weight"), vec![self.head_dim]),
                (n("self_attn.k_norm.weight"), vec![self.head_dim]),
            ]);
        } else {
            let ls = &self.linear;
            let (conv, v) = (ls.conv_dim(), ls.value_heads * ls.value_dim);
            out.extend([
                (n("linear_attn.in_proj_qkv.weight"), vec![conv, h]),
                (n("linear_attn.in_proj_z.weight"), vec![v, h]),
                (n("linear_attn.in_proj_b.weight"), vec![ls.value_heads, h]),
                (n("linear_attn.in_proj_a.weight"), vec![ls.value_heads, h]),
                (n("linear_attn.conv1d.weight"), vec![conv, 1, ls.conv_kernel]),
                (n("linear_attn.A_log"), vec![ls.value_heads]),
                (n("linear_attn.dt_bias"), vec![ls.value_heads]),
                (n("linear_attn.norm.weight"), vec![ls.value_dim]),
                (n("linear_attn.out_proj.weight"), vec![h, v]),
            ]);
        }
        let mlp = |prefix: &str, i: usize| {
            [
                (n(&format!("{prefix}.gate_proj.weight")), vec![i, h]),
                (n(&format!("{prefix}.up_proj.weight")), vec![i, h]),
                (n(&format!("{prefix}.down_proj.weight")), vec![h, i]),
            ]
        };
        out.push((n("mlp.gate.weight"), vec![s.experts, h]));
        out.push((n("mlp.shared_expert_gate.weight"), vec![1, h]));
        out.extend(mlp("mlp.shared_expert", self.shared_intermediate));
        for e in 0..s.experts {
            out.extend(mlp(&format!("mlp.experts.{e}"), s.intermediate));
        }
        out
    }

    /// The checkpoint's RMSNorm weights are zero-centred (the model
    /// multiplies by `1 + w`), so they scatter around 0; the convolution's
    /// fan-in is its kernel; `A_log` keeps decays in the release's range
    /// (`exp(A_log)` between 1 and 16 there); the mixers' out-projections
    /// are drawn at half scale like `o_proj`.
    fn distribution(&self, name: &str, shape: &[usize]) -> Option<(f32, f32)> {
        const SQRT3: f32 = 1.732_050_8;
        let centred = ["layernorm.weight", "q_norm.weight", "k_norm.weight"];
        if name == "model.norm.weight" || centred.iter().any(|c| name.ends_with(c)) {
            return Some((0.0, 0.1));
        }
        if name.ends_with("conv1d.weight") {
            return Some((0.0, SQRT3 / (self.linear.conv_kernel as f32).sqrt()));
        }
        if name.ends_with("A_log") {
            return Some((1.0, 0.5));
        }
        if name.ends_with("out_proj.weight") && shape.len() == 2 {
            return Some((0.0, 0.5 * SQRT3 / (shape[1] as f32).sqrt()));
        }
        None
    }

    fn scaled(&self, round: &dyn Fn(usize, usize) -> usize) -> Result<Arc<dyn SynthFamily>, String> {
        Ok(Arc::new(Self {
            shared_intermediate: round(self.shared_intermediate, 8),
            ..self.clone()
        }))
    }
}

fn spec(
    (vocab, hidden, layers, heads): (usize, usize, usize, usize),
    (experts, top_k, intermediate): (usize, usize, usize),
    shape: Qwen35Shape,
) -> SynthSpec {
    SynthSpec {
        vocab,
        hidden,
        layers,
        heads,
        experts,
        top_k,
        intermediate,
        max_position_embeddings: 4096,
        rope_theta: 10_000_000.0,
        rms_norm_eps: 1e-6,
        expert_format: QFormat::Int8,
        dense_format: QFormat::Int8,
        seed: 0,
        family: Registered(Arc::new(shape)),
    }
}

/// Qwen3.6-35B-A3B's (and Qwen3.5-35B-A3B's) real shape: vocabulary
/// 248320, hidden 2048, 40 layers in ten groups of three Gated DeltaNet
/// layers (16 key heads and 32 value heads of 128) and one gated attention
/// layer (16 query and 2 KV heads of 256, a quarter rotated), 256 experts
/// top-8 of intermediate 512 plus a shared one of 512; int8 experts (3.2
/// MB each), about 35 GB. Positions are capped at 4096 (the real model has 262144) like
/// the other presets.
pub fn qwen36_35b_a3b() -> SynthSpec {
    spec(
        (248_320, 2048, 40, 16),
        (256, 8, 512),
        Qwen35Shape {
            kv_heads: 2,
            head_dim: 256,
            linear: LinearShape {
                key_heads: 16,
                value_heads: 32,
                key_dim: 128,
                value_dim: 128,
                conv_kernel: 4,
            },
            shared_intermediate: 512,
            full_interval: 4,
            partial_rotary_factor: 0.25,
        },
    )
}

/// Qwen3.5-397B-A17B's real shape: hidden 4096, 60 layers in fifteen
/// groups of three Gated DeltaNet layers (16 key heads and 64 value heads
/// of 128) and one gated attention layer (32 query and 2 KV heads of 256),
/// 512 experts top-10 of intermediate 1024 plus a shared one; int4-g64
/// experts (7.1 MB each). All 60 layers are about 220 GB: the default 4
/// (one group, 17 GB) is what a benchmark disk holds, and `--layers` picks
/// more (about 3.7 GB a layer).
pub fn qwen35_397b_a17b() -> SynthSpec {
    SynthSpec {
        expert_format: QFormat::Int4Grouped { group: 64 },
        ..spec(
            (248_320, 4096, 4, 32),
            (512, 10, 1024),
            Qwen35Shape {
                kv_heads: 2,
                head_dim: 256,
                linear: LinearShape {
                    key_heads: 16,
                    value_heads: 64,
                    key_dim: 128,
                    value_dim: 128,
                    conv_kernel: 4,
                },
                shared_intermediate: 1024,
                full_interval: 4,
                partial_rotary_factor: 0.25,
            },
        )
    }
}

/// The Qwen3.5 layout at a few hundred KB: three linear layers before a
/// full one and a second group begun, GQA 2, value heads twice the key
/// heads, heads of 16 where hidden / heads is 8; for tests.
pub fn qwen35_tiny() -> SynthSpec {
    SynthSpec {
        max_position_embeddings: 256,
        ..spec(
            (256, 64, 5, 8),
            (8, 2, 32),
            Qwen35Shape {
                kv_heads: 4,
                head_dim: 16,
                linear: LinearShape {
                    key_heads: 2,
                    value_heads: 4,
                    key_dim: 8,
                    value_dim: 12,
                    conv_kernel: 4,
                },
                shared_intermediate: 48,
                full_interval: 4,
                partial_rotary_factor: 0.5,
            },
        )
    }
}
