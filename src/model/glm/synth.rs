//! The GLM-5 shape of a synthetic model (`coli synth --preset glm-5`,
//! `glm-tiny`): MLA attention with the DSA indexer on every layer, dense
//! leading layers, then routed experts plus one shared expert behind the
//! sigmoid router, written as transformers writes `glm_moe_dsa`.

use std::sync::Arc;

use super::GlmConfig;
use crate::quant::QFormat;
use crate::synth::{GlmShape, Registered, SpecError, SynthFamily, SynthSpec, SynthTensor};

/// A GLM-5 [`SynthSpec`]'s MLA, indexer and router sizes (the spec's
/// `intermediate` is the routed experts' `moe_intermediate_size`).
#[derive(Clone, Debug, PartialEq)]
pub struct Glm5Shape(pub GlmShape);

impl SynthFamily for Glm5Shape {
    fn model_type(&self) -> &'static str {
        "glm_moe_dsa"
    }

    fn name(&self) -> &'static str {
        "GLM"
    }

    /// OLMoE's `<|endoftext|>`, which the GLM-5 presets have written since
    /// they were added (another id would change their config.json).
    fn eos_id(&self) -> usize {
        50279
    }

    fn sparse_layers(&self, spec: &SynthSpec) -> usize {
        spec.layers.saturating_sub(self.0.first_dense)
    }

    fn config_json(&self, s: &SynthSpec) -> serde_json::Value {
        let g = &self.0;
        g.mla_config_with(
            s,
            vec![
                ("architectures", serde_json::json!(["GlmMoeDsaForCausalLM"])),
                ("model_type", serde_json::json!("glm_moe_dsa")),
                ("head_dim", serde_json::json!(g.qk_rope_head_dim)),
                ("first_k_dense_replace", serde_json::json!(g.first_dense)),
                ("index_topk", serde_json::json!(g.index_topk)),
                ("index_head_dim", serde_json::json!(g.index_head_dim)),
                ("index_n_heads", serde_json::json!(g.index_n_heads)),
                ("indexer_types", serde_json::json!(vec!["full"; s.layers])),
            ],
        )
    }

    fn layer_tensors(&self, s: &SynthSpec, l: usize) -> Vec<SynthTensor> {
        self.0
            .mla_layer_tensors(l, (s.hidden, s.heads, s.experts, s.intermediate), true)
    }

    /// A sparse layer after the dense ones (saying how many layers that
    /// takes), the formats the loader reads, then GLM's own config
    /// validation on the config.json this spec writes.
    fn validate(&self, s: &SynthSpec) -> Result<(), SpecError> {
        let first_dense = self.0.first_dense;
        if s.layers <= first_dense {
            return Err(SpecError::Invalid(format!(
                "{} layers leave no sparse layer after the {} dense ones (use --layers {} or more)",
                s.layers,
                first_dense,
                first_dense + 1
            )));
        }
        s.check_parsed(GlmConfig::from_json)
    }

    fn scaled(&self, _round: &dyn Fn(usize, usize) -> usize) -> Result<Arc<dyn SynthFamily>, String> {
        Err("--scale is not offered for GLM presets (glm-tiny is the small one)".into())
    }
}

impl SynthSpec {
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
            family: Registered(Arc::new(Glm5Shape(GlmShape {
                dense_intermediate: 12288,
                first_dense: 3,
                q_lora_rank: 2048,
                kv_lora_rank: 512,
                qk_nope_head_dim: 192,
                qk_rope_head_dim: 64,
                v_head_dim: 256,
                index_n_heads: 32,
                index_head_dim: 128,
                index_topk: 2048,
                n_group: 1,
                topk_group: 1,
                n_shared_experts: 1,
                routed_scaling_factor: 2.5,
            }))),
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
            family: Registered(Arc::new(Glm5Shape(GlmShape::tiny()))),
            ..Self::glm5()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn glm_presets_are_valid_and_have_the_real_expert_shape() {
        for p in ["glm-5", "glm-tiny"] {
            let s = SynthSpec::preset(p).unwrap();
            s.validate().unwrap();
            let inputs = s.inputs(Path::new("x"));
            assert!(inputs.windows(2).all(|w| w[0].name < w[1].name), "{p}");
            assert_eq!(s.family.model_type(), "glm_moe_dsa", "{p} is GLM");
            let dense = s.config_json()["first_k_dense_replace"].as_u64().unwrap() as usize;
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
}
