//! The Qwen3-MoE and Mixtral shapes of a synthetic model (`coli synth
//! --preset qwen3-30b-a3b`, `qwen3-tiny`, `mixtral-8x7b`, `mixtral-tiny`):
//! grouped-query attention with a head size of its own, every layer
//! sparse; per-head q/k norms and experts under `mlp.experts.E` for
//! Qwen3-MoE, neither norms nor biases and experts under
//! `block_sparse_moe.experts.E.{w1,w3,w2}` for Mixtral.

use std::sync::Arc;

use super::MoeDecoderConfig;
use crate::model::expert::ExpertNaming;
use crate::quant::QFormat;
use crate::synth::{DecoderShape, Registered, SpecError, SynthFamily, SynthSpec, SynthTensor};

/// The sizes of a Qwen3-MoE [`SynthSpec`] beyond the spec's own (whose
/// `intermediate` is `moe_intermediate_size`).
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3MoeShape {
    pub attn: DecoderShape,
    /// The config's `intermediate_size`, written as the release has it
    /// though no layer is dense here (so no tensor has this size).
    pub dense_intermediate: usize,
}

impl SynthFamily for Qwen3MoeShape {
    fn model_type(&self) -> &'static str {
        "qwen3_moe"
    }

    fn name(&self) -> &'static str {
        "Qwen3-MoE"
    }

    /// Qwen3's `<|im_end|>`.
    fn eos_id(&self) -> usize {
        151645
    }

    fn decoder(&self) -> Option<&DecoderShape> {
        Some(&self.attn)
    }

    /// As transformers writes `qwen3_moe` (every layer sparse, no sliding
    /// window).
    fn config_json(&self, s: &SynthSpec) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "vocab_size": s.vocab,
            "hidden_size": s.hidden,
            "intermediate_size": self.dense_intermediate,
            "moe_intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": self.attn.kv_heads,
            "head_dim": self.attn.head_dim,
            "num_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "norm_topk_prob": true,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "max_position_embeddings": s.max_position_embeddings,
            "rope_theta": s.rope_theta,
            "rope_scaling": null,
            "rms_norm_eps": s.rms_norm_eps,
            "attention_bias": false,
            "hidden_act": "silu",
            "use_sliding_window": false,
            "sliding_window": null,
            "tie_word_embeddings": false,
            "bos_token_id": null,
            "eos_token_id": s.eos_id(),
            "colibri_synthetic": { "seed": s.seed },
        })
    }

    fn layer_tensors(&self, s: &SynthSpec, l: usize) -> Vec<SynthTensor> {
        let dims = (s.hidden, s.heads, s.experts, s.intermediate);
        self.attn.layer_tensors(l, dims, true, ExpertNaming::MLP)
    }

    /// Formats, then the loader's own parser, whose messages name the
    /// config's fault (heads that do not group, an odd head size).
    fn validate(&self, s: &SynthSpec) -> Result<(), SpecError> {
        s.check_parsed(MoeDecoderConfig::from_json)
    }

    fn scaled(&self, round: &dyn Fn(usize, usize) -> usize) -> Result<Arc<dyn SynthFamily>, String> {
        Ok(Arc::new(Self {
            dense_intermediate: round(self.dense_intermediate, 8),
            ..self.clone()
        }))
    }
}

/// The attention of a Mixtral [`SynthSpec`] (whose `intermediate` is the
/// experts', the config's one `intermediate_size`).
#[derive(Clone, Debug, PartialEq)]
pub struct MixtralShape {
    pub attn: DecoderShape,
}

impl SynthFamily for MixtralShape {
    fn model_type(&self) -> &'static str {
        "mixtral"
    }

    fn name(&self) -> &'static str {
        "Mixtral"
    }

    /// Mixtral's `</s>`.
    fn eos_id(&self) -> usize {
        2
    }

    fn decoder(&self) -> Option<&DecoderShape> {
        Some(&self.attn)
    }

    /// As transformers writes `mixtral` (no sliding window).
    fn config_json(&self, s: &SynthSpec) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "vocab_size": s.vocab,
            "hidden_size": s.hidden,
            "intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": self.attn.kv_heads,
            "head_dim": self.attn.head_dim,
            "num_local_experts": s.experts,
            "num_experts_per_tok": s.top_k,
            "max_position_embeddings": s.max_position_embeddings,
            "rope_theta": s.rope_theta,
            "rms_norm_eps": s.rms_norm_eps,
            "hidden_act": "silu",
            "sliding_window": null,
            "tie_word_embeddings": false,
            "bos_token_id": null,
            "eos_token_id": s.eos_id(),
            "colibri_synthetic": { "seed": s.seed },
        })
    }

    fn layer_tensors(&self, s: &SynthSpec, l: usize) -> Vec<SynthTensor> {
        let dims = (s.hidden, s.heads, s.experts, s.intermediate);
        self.attn
            .layer_tensors(l, dims, false, ExpertNaming::BLOCK_SPARSE)
    }

    /// As Qwen3-MoE's: formats, then the loader's own parser.
    fn validate(&self, s: &SynthSpec) -> Result<(), SpecError> {
        s.check_parsed(MoeDecoderConfig::from_json)
    }

    fn scaled(&self, _round: &dyn Fn(usize, usize) -> usize) -> Result<Arc<dyn SynthFamily>, String> {
        Ok(Arc::new(self.clone()))
    }
}

impl SynthSpec {
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
            family: Registered(Arc::new(Qwen3MoeShape {
                attn: DecoderShape {
                    kv_heads: 4,
                    head_dim: 128,
                },
                dense_intermediate: 6144,
            })),
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
            family: Registered(Arc::new(Qwen3MoeShape {
                attn: DecoderShape {
                    kv_heads: 2,
                    head_dim: 24,
                },
                dense_intermediate: 96,
            })),
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
            family: Registered(Arc::new(MixtralShape {
                attn: DecoderShape {
                    kv_heads: 8,
                    head_dim: 128,
                },
            })),
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
            family: Registered(Arc::new(MixtralShape {
                attn: DecoderShape {
                    kv_heads: 2,
                    head_dim: 20,
                },
            })),
            ..Self::mixtral_8x7b()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::convert::InputTensor;
    use crate::model::moe_decoder::glm4_moe::{self, synth::Glm4Shape};
    use crate::model::moe_decoder::gpt_oss::{self, synth::GptOssShape};
    use crate::synth::planned_bytes;

    /// The config.json `s` writes, read back by its family's own parser.
    fn decoder_config(s: &SynthSpec) -> MoeDecoderConfig {
        let (path, json) = (Path::new("c.json"), s.config_json());
        match s.family.model_type() {
            "glm4_moe" => glm4_moe::from_json(path, json),
            "gpt_oss" => gpt_oss::from_json(path, json),
            _ => MoeDecoderConfig::from_json(path, json),
        }
        .unwrap()
    }

    /// A Llama-style decoder preset, its tensors, attention and config.json
    /// as its family's parser reads it back.
    struct ReadBack {
        s: SynthSpec,
        inputs: Vec<InputTensor>,
        attn: DecoderShape,
        cfg: MoeDecoderConfig,
    }

    /// Preset `p`, checked for what every Llama-style decoder preset
    /// shares: valid, tensors sorted, grouped-query heads of their own
    /// size, and the engine reading back the sizes that were meant.
    fn read_back(p: &str) -> ReadBack {
        let s = SynthSpec::preset(p).unwrap();
        s.validate().unwrap();
        let inputs = s.inputs(Path::new("x"));
        assert!(inputs.windows(2).all(|w| w[0].name < w[1].name), "{p}");
        let attn = s.family.decoder().unwrap().clone();
        assert!(s.heads > attn.kv_heads, "{p}: grouped-query attention");
        assert_eq!(s.head_dim(), attn.head_dim);
        let cfg = decoder_config(&s);
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
        ReadBack { s, inputs, attn, cfg }
    }

    /// The shape of tensor `name` among preset `p`'s `inputs`.
    fn shape_of(inputs: &[InputTensor], p: &str, name: &str) -> Vec<usize> {
        inputs
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{p}: {name}"))
            .shape
            .clone()
    }

    /// The tiny presets are a few hundred KB.
    fn few_hundred_kb(tiny: [SynthSpec; 2]) {
        for s in tiny {
            let kb = planned_bytes(&s) / 1000;
            assert!((100..1000).contains(&kb), "{kb} KB");
        }
    }

    /// --scale keeps the head size and the heads, shrinks the rest.
    fn scales_keeping_heads(real: [SynthSpec; 2]) {
        for s in real {
            let t = s.clone().scaled(0.1).unwrap();
            t.validate().unwrap();
            assert_eq!(t.family.decoder(), s.family.decoder());
            assert_eq!((t.heads, t.head_dim()), (s.heads, s.head_dim()));
            assert!(t.hidden < s.hidden && t.hidden.is_multiple_of(64));
            assert!(t.intermediate < s.intermediate && t.vocab < s.vocab);
        }
    }

    #[test]
    fn decoder_presets_are_valid_and_have_the_real_expert_shape() {
        for p in ["qwen3-30b-a3b", "qwen3-tiny", "mixtral-8x7b", "mixtral-tiny"] {
            // The engine reads back what was meant.
            let ReadBack { s, inputs, attn, cfg } = read_back(p);
            let qwen = s.family.model_type() == "qwen3_moe";
            // 4 projections, 2 layer norms, the router (+ q/k norms), experts.
            let per_layer = 7 + if qwen { 2 } else { 0 } + 3 * s.experts;
            assert_eq!(inputs.len(), 3 + s.layers * per_layer, "{p}: every tensor once");
            assert!(cfg.norm_topk_prob && !cfg.tie_word_embeddings, "{p}");
            assert_eq!(cfg.sparse_layers(), vec![true; s.layers], "{p}");
            assert_eq!(cfg.rope_theta, 1e6);

            let find = |name: &str| shape_of(&inputs, p, name);
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
        assert_eq!(
            s.family,
            Registered(Arc::new(Qwen3MoeShape {
                attn: DecoderShape {
                    kv_heads: 4,
                    head_dim: 128
                },
                dense_intermediate: 6144
            }))
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
        few_hundred_kb([SynthSpec::qwen3_tiny(), SynthSpec::mixtral_tiny()]);
    }

    #[test]
    fn glm4_and_gpt_oss_presets_are_valid_and_have_the_real_shapes() {
        for p in ["glm-4.5-air", "glm4-tiny", "gpt-oss-20b", "gpt-oss-tiny"] {
            let ReadBack { s, inputs, attn, cfg } = read_back(p);
            assert!(cfg.qkv_bias && !cfg.tie_word_embeddings, "{p}");
            let find = |name: &str| shape_of(&inputs, p, name);
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
            match s.family.model_type() {
                "glm4_moe" => {
                    let g = [Glm4Shape::glm45_air(), Glm4Shape::tiny()]
                        .into_iter()
                        .find(|g| s.family == Registered(Arc::new(g.clone())))
                        .unwrap();
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
                "gpt_oss" => {
                    let sliding_window = [GptOssShape::gpt_oss_20b(), GptOssShape::tiny()]
                        .into_iter()
                        .find(|g| s.family == Registered(Arc::new(g.clone())))
                        .map(|g| g.sliding_window)
                        .unwrap();
                    assert!(cfg.o_bias && cfg.attention_sinks && s.sparse_layers() == s.layers);
                    assert_eq!(cfg.swiglu_limit, Some(7.0));
                    assert_eq!(cfg.sliding_window, Some(sliding_window));
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
                f => panic!("{p}: {f}"),
            }
        }
        assert!(SynthSpec::glm4_tiny().head_dim() != 64 / 4);
        assert!(SynthSpec::gpt_oss_tiny().head_dim() != 64 / 4);

        // The real shapes and their planned containers.
        let s = SynthSpec::glm45_air();
        assert_eq!((s.vocab, s.hidden, s.layers, s.heads), (151552, 4096, 46, 96));
        assert_eq!((s.experts, s.top_k, s.intermediate), (128, 8, 1408));
        let g = Glm4Shape::glm45_air();
        assert_eq!(s.family, Registered(Arc::new(g.clone())));
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
            Registered(Arc::new(GptOssShape {
                attn: DecoderShape {
                    kv_heads: 8,
                    head_dim: 64
                },
                sliding_window: 128
            }))
        );
        assert_eq!(s.rope_theta, 150_000.0);
        let gb = planned_bytes(&s) as f64 / 1e9;
        assert!((20.0..22.0).contains(&gb), "about 21 GB at int8: {gb}");
        few_hundred_kb([SynthSpec::glm4_tiny(), SynthSpec::gpt_oss_tiny()]);

        // What the loader would refuse is refused first; the options the
        // presets leave off still give a valid model.
        let mut s = SynthSpec::glm4_tiny();
        s.layers = 1;
        assert!(s.validate().is_err(), "no sparse layer after the dense one");
        let mut s = SynthSpec::glm4_tiny();
        s.family = Registered(Arc::new(Glm4Shape {
            qk_norm: true,
            n_group: 2,
            ..Glm4Shape::tiny()
        }));
        s.validate().unwrap();
        assert!(
            s.inputs(Path::new("x"))
                .iter()
                .any(|t| t.name == "model.layers.2.self_attn.k_norm.weight" && t.shape == [24])
        );
        let mut s = SynthSpec::gpt_oss_tiny();
        s.layers = 3;
        s.validate().unwrap();
        assert_eq!(decoder_config(&s).sliding_layers, vec![true, false, true]);
        scales_keeping_heads([SynthSpec::glm45_air(), SynthSpec::gpt_oss_20b()]);
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
        s.family = Registered(Arc::new(Qwen3MoeShape {
            attn: DecoderShape {
                kv_heads: 3,
                head_dim: 24,
            },
            dense_intermediate: 96,
        }));
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("num_key_value_heads")
        );
        let mut s = SynthSpec::mixtral_tiny();
        s.family = Registered(Arc::new(MixtralShape {
            attn: DecoderShape {
                kv_heads: 2,
                head_dim: 21,
            },
        }));
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

        scales_keeping_heads([SynthSpec::qwen3_30b_a3b(), SynthSpec::mixtral_8x7b()]);
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
}
