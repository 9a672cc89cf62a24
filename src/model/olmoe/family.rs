//! OLMoE's registration: `model_type` "olmoe", its KV size, loader,
//! convert rules, chat format and fuzz invariants.

use crate::synth::{SynthPreset, SynthSpec};
use std::path::Path;
use std::sync::Arc;

use colibri_actors::{ExpertMap, Predictor};

use super::{LoadOptions, Olmoe, OlmoeConfig, expert_map, load_dense};
use crate::chat_template::ChatFormat;
use crate::config::ConfigError;
use crate::convert::plan::{FusedLayout, keeps_f32};
use crate::convert::{ConvertError, ModelSpec};
use crate::model::ModelError;
use crate::model::expert::{ExpertCodec, ExpertNaming};
use crate::model::family::{Family, FamilyConfig, FamilyLoad, ShapeFacts, start_dense_load};
use crate::model::kv_cache::KvTypes;
use crate::model::moe_decoder::RouterPredictor;
use crate::model::routed::Router;
use crate::quant::QFormat;
use crate::st::Checkpoint;

/// The registry entry for OLMoE.
pub(crate) struct OlmoeFamily;

/// Listed in [`crate::model::FAMILIES`].
pub(crate) static OLMOE: OlmoeFamily = OlmoeFamily;

impl Family for OlmoeFamily {
    fn model_types(&self) -> &'static [&'static str] {
        &["olmoe"]
    }

    fn synth_presets(&self) -> &'static [SynthPreset] {
        &[
            SynthPreset {
                name: "olmoe-1b-7b",
                build: SynthSpec::olmoe_1b_7b,
            },
            SynthPreset {
                name: "small",
                build: SynthSpec::small,
            },
            SynthPreset {
                name: "tiny",
                build: SynthSpec::tiny,
            },
        ]
    }

    fn parse(&self, path: &Path, value: serde_json::Value) -> Result<Box<dyn FamilyConfig>, ConfigError> {
        Ok(Box::new(OlmoeConfig::from_json(path, value)?))
    }

    fn fuzz_seeds(&self) -> Vec<serde_json::Value> {
        vec![serde_json::json!({
            "model_type": "olmoe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
            "num_experts": 8, "num_experts_per_tok": 2, "rope_theta": 10000.0, "eos_token_id": [1, 2],
            "clip_qkv": 8.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 128, "head_dim": 8,
            "rope_scaling": null, "tie_word_embeddings": false
        })]
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

    fn gguf_checkpoint(
        &self,
        model: &crate::gguf::GgufModel,
    ) -> Result<crate::st::Checkpoint, crate::gguf::GgufError> {
        crate::gguf::checkpoint::checkpoint(
            model,
            crate::gguf::names::GgufNaming::plain(crate::model::expert::ExpertNaming::MLP),
        )
    }
}

impl FamilyConfig for OlmoeConfig {
    fn kv_bytes_per_position(&self, kv: KvTypes) -> u64 {
        kv.bytes_per_position(self.num_hidden_layers, self.kv_heads() * self.head_dim())
    }

    fn max_positions(&self) -> usize {
        self.max_position_embeddings
    }

    fn shape(&self) -> ShapeFacts {
        ShapeFacts {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            num_experts: self.num_experts,
            num_experts_per_tok: self.num_experts_per_tok,
        }
    }

    fn chat_format(&self) -> ChatFormat {
        ChatFormat::OLMOE
    }

    fn main_expert_map(
        &self,
        ck: &Checkpoint,
        opts: LoadOptions,
    ) -> Result<(ExpertMap, ExpertCodec), ModelError> {
        expert_map(self, ck, opts)
    }

    fn load(self: Box<Self>, ck: Checkpoint, opts: LoadOptions) -> Result<FamilyLoad, ModelError> {
        let cfg = *self;
        let (map, codec) = expert_map(&cfg, &ck, opts)?;
        start_dense_load(&ck, &map);
        let dense = Arc::new(load_dense(&cfg, &ck, opts)?);
        drop(ck);
        let predictor: Arc<dyn Predictor> = Arc::new(RouterPredictor {
            hidden: cfg.hidden_size,
            rms_norm_eps: cfg.rms_norm_eps as f32,
            num_experts: cfg.num_experts,
            router: Router::Softmax {
                renorm: cfg.norm_topk_prob,
            },
            weights: dense.clone(),
        });
        Ok(FamilyLoad {
            dense_bytes: dense.resident_bytes() as u64,
            map,
            codec,
            predictor: Some(predictor),
            top_k: cfg.num_experts_per_tok,
            eos_ids: cfg.eos_ids(),
            finish: Box::new(move |source| Box::new(Olmoe::new(cfg, dense, source))),
        })
    }

    fn convert_spec(
        &self,
        _config: &Path,
        experts: QFormat,
        dense: QFormat,
    ) -> Result<ModelSpec, ConvertError> {
        Ok(convert_spec(self, experts, dense))
    }

    fn invariants(&self) -> Result<(), String> {
        if let Some(clip) = self.clip_qkv {
            // What attention does with it; panics when the bound is not a range.
            let b = clip as f32;
            let _ = 1.0f32.clamp(-b, b);
        }
        let hd = self.head_dim();
        if hd == 0 || !hd.is_multiple_of(2) || !self.num_attention_heads.is_multiple_of(self.kv_heads()) {
            return Err(format!(
                "head layout {hd} / {} / {}",
                self.num_attention_heads,
                self.kv_heads()
            ));
        }
        if !((self.rms_norm_eps as f32) > 0.0 && self.rope_theta().is_finite()) {
            return Err("rms_norm_eps or rope_theta unusable in f32".into());
        }
        if self.num_experts_per_tok > self.num_experts {
            return Err("top-k above the expert count".into());
        }
        let _ = self.eos_ids();
        Ok(())
    }
}

/// OLMoE's convert rules: every layer has experts, one format for all of
/// them.
fn convert_spec(cfg: &OlmoeConfig, experts: QFormat, dense: QFormat) -> ModelSpec {
    ModelSpec {
        expert_layers: vec![true; cfg.num_hidden_layers],
        optional_layers_from: usize::MAX,
        n_experts: cfg.num_experts,
        hidden: cfg.hidden_size,
        inter: cfg.intermediate_size,
        expert_format: vec![experts; cfg.num_hidden_layers],
        dense_format: Box::new(move |name, shape| {
            if keeps_f32(name, shape) {
                QFormat::F32
            } else {
                dense
            }
        }),
        metadata: Vec::new(),
        naming: ExpertNaming::MLP,
        fused: FusedLayout::Stacked,
        expert_bias: false,
    }
}
