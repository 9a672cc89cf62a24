//! GLM-5 and DeepSeek-V3's registration: `model_type` "glm_moe_dsa" and
//! "deepseek_v3", their MLA KV size, loader (with the MTP module when the
//! checkpoint has it), convert rules, chat format and fuzz invariants.

use crate::synth::{SynthPreset, SynthSpec};
use std::path::Path;
use std::sync::Arc;

use colibri_actors::{ExpertMap, Predictor};

use super::config::{GlmConfig, MlaFamily};
use super::{Glm, GlmPredictor, expert_map, load_dense, mtp_available};
use crate::chat_template::ChatFormat;
use crate::config::ConfigError;
use crate::convert::{ConvertError, ModelSpec};
use crate::model::ModelError;
use crate::model::expert::ExpertCodec;
use crate::model::family::{Family, FamilyConfig, FamilyLoad, ShapeFacts, start_dense_load};
use crate::model::kv_cache::KvTypes;
use crate::model::olmoe::LoadOptions;
use crate::quant::QFormat;
use crate::st::Checkpoint;

/// The registry entry for GLM-5 and DeepSeek-V3.
pub(crate) struct GlmFamily;

/// Listed in [`crate::model::FAMILIES`].
pub(crate) static GLM: GlmFamily = GlmFamily;

impl Family for GlmFamily {
    fn model_types(&self) -> &'static [&'static str] {
        &["glm_moe_dsa", "deepseek_v3"]
    }

    fn synth_presets(&self) -> &'static [SynthPreset] {
        &[
            SynthPreset {
                name: "glm-5",
                build: SynthSpec::glm5,
            },
            SynthPreset {
                name: "glm-tiny",
                build: SynthSpec::glm_tiny,
            },
        ]
    }

    fn parse(&self, path: &Path, value: serde_json::Value) -> Result<Box<dyn FamilyConfig>, ConfigError> {
        Ok(Box::new(GlmConfig::from_json(path, value)?))
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &[super::gguf::ARCH]
    }

    fn gguf_config(
        &self,
        model: &crate::gguf::GgufModel,
    ) -> Result<serde_json::Value, crate::gguf::GgufError> {
        super::gguf::config_json(model)
    }

    fn gguf_checkpoint(&self, model: &crate::gguf::GgufModel) -> Result<Checkpoint, crate::gguf::GgufError> {
        crate::gguf::checkpoint::checkpoint(model, super::gguf::NAMING)
    }

    fn fuzz_seeds(&self) -> Vec<serde_json::Value> {
        let glm = serde_json::json!({
            "model_type": "glm_moe_dsa", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
            "q_lora_rank": 16, "kv_lora_rank": 8, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8,
            "v_head_dim": 6, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
            "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "index_topk": 4,
            "index_head_dim": 8, "index_n_heads": 2, "eos_token_id": [1, 2],
            "index_topk_pattern": "FSF", "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}
        });
        let mut dsv3 = glm.clone();
        dsv3["model_type"] = "deepseek_v3".into();
        dsv3["mlp_layer_types"] = serde_json::json!(["dense", "sparse", "sparse"]);
        dsv3["rope_interleave"] = false.into();
        vec![glm, dsv3]
    }
}

impl FamilyConfig for GlmConfig {
    /// The compressed latent, rope key and indexer key per layer, in the
    /// key type (the latent is MLA's keys and values at once). Counting the
    /// indexer key on every layer over-counts models where only some layers
    /// index, which a memory budget may do.
    fn kv_bytes_per_position(&self, kv: KvTypes) -> u64 {
        let t = kv.k;
        (self.num_hidden_layers
            * (t.row_bytes(self.kv_lora_rank)
                + t.row_bytes(self.qk_rope_head_dim)
                + t.row_bytes(self.index_head_dim()))) as u64
    }

    fn max_positions(&self) -> usize {
        self.max_position_embeddings
    }

    fn position_limit(&self) -> usize {
        GlmConfig::position_limit(self)
    }

    fn shape(&self) -> ShapeFacts {
        ShapeFacts {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            num_experts: self.n_routed_experts,
            num_experts_per_tok: self.num_experts_per_tok,
        }
    }

    fn chat_format(&self) -> ChatFormat {
        if self.model_type.starts_with("deepseek") {
            ChatFormat::DEEPSEEK
        } else {
            ChatFormat::GLM
        }
    }

    fn main_expert_map(
        &self,
        ck: &Checkpoint,
        opts: LoadOptions,
    ) -> Result<(ExpertMap, ExpertCodec), ModelError> {
        expert_map(self, ck, opts, false)
    }

    fn load(self: Box<Self>, ck: Checkpoint, opts: LoadOptions) -> Result<FamilyLoad, ModelError> {
        let cfg = *self;
        let mtp = mtp_available(&cfg, &ck);
        let with_mtp = mtp.is_ok();
        let (map, codec) = expert_map(&cfg, &ck, opts, with_mtp)?;
        start_dense_load(&ck, &map);
        let dense = Arc::new(load_dense(&cfg, &ck, opts, with_mtp)?);
        drop(ck);
        let predictor: Arc<dyn Predictor> = Arc::new(GlmPredictor {
            cfg: cfg.clone(),
            weights: dense.clone(),
        });
        Ok(FamilyLoad {
            dense_bytes: dense.resident_bytes() as u64,
            map,
            codec,
            predictor: Some(predictor),
            top_k: cfg.num_experts_per_tok,
            eos_ids: cfg.eos_ids(),
            finish: Box::new(move |source| Box::new(Glm::new(cfg, dense, source, mtp.err()))),
        })
    }

    fn convert_spec(
        &self,
        config: &Path,
        experts: QFormat,
        dense: QFormat,
    ) -> Result<ModelSpec, ConvertError> {
        super::convert::spec(self, config, experts, dense)
    }

    fn invariants(&self) -> Result<(), String> {
        let Ok(kinds) = self.mlp_sparse() else {
            return Err("mlp_sparse refused a validated config".into());
        };
        if kinds.len() != self.num_hidden_layers {
            return Err("layer kinds do not cover the layers".into());
        }
        if self.family() == MlaFamily::GlmMoeDsa {
            match self.indexer_kinds() {
                Ok(k) if k.len() == self.num_hidden_layers => {}
                _ => return Err("indexer kinds do not cover the layers".into()),
            }
        }
        let s = self.softmax_scale();
        if !(s.is_finite() && s > 0.0 && (self.rms_norm_eps as f32) > 0.0) {
            return Err(format!("softmax scale {s} or eps unusable"));
        }
        if !self.n_routed_experts.is_multiple_of(self.n_group) || self.topk_group > self.n_group {
            return Err("group layout".into());
        }
        let _ = self.eos_ids();
        Ok(())
    }
}
