//! Qwen3-Next and Qwen3.5/3.6-MoE's registration: the `model_type`s, KV
//! size (full-attention layers only), loader, convert rules, chat format
//! and fuzz invariants.

use super::state::{CHECKPOINTS, KEPT};
use std::path::Path;
use std::sync::Arc;

use colibri_actors::{ExpertMap, Predictor};

use super::config::Qwen3NextConfig;
use super::forward::Qwen3Next;
use super::predictor::Qwen3NextPredictor;
use super::weights::load_weights;
use crate::chat_template::ChatFormat;
use crate::config::ConfigError;
use crate::convert::{ConvertError, ModelSpec};
use crate::gguf::{GgufError, GgufModel};
use crate::model::ModelError;
use crate::model::expert::ExpertCodec;
use crate::model::family::{Family, FamilyConfig, FamilyLoad, ShapeFacts, start_dense_load};
use crate::model::kv_cache::KvTypes;
use crate::model::moe_decoder::{convert_spec, expert_map};
use crate::model::olmoe::LoadOptions;
use crate::quant::QFormat;
use crate::st::Checkpoint;
use crate::synth::SynthPreset;

/// The registry entry for `qwen3_next`, `qwen3_5_moe` and `qwen3_5_moe_text`.
pub(crate) struct Qwen3NextFamily;

/// Listed in [`crate::model::FAMILIES`].
pub(crate) static QWEN3_NEXT: Qwen3NextFamily = Qwen3NextFamily;

impl Family for Qwen3NextFamily {
    fn model_types(&self) -> &'static [&'static str] {
        &Qwen3NextConfig::MODEL_TYPES
    }

    fn synth_presets(&self) -> &'static [SynthPreset] {
        &[
            SynthPreset {
                name: "qwen3.6-35b-a3b",
                build: super::synth::qwen36_35b_a3b,
            },
            SynthPreset {
                name: "qwen3.5-397b-a17b",
                build: super::synth::qwen35_397b_a17b,
            },
            SynthPreset {
                name: "qwen35-tiny",
                build: super::synth::qwen35_tiny,
            },
        ]
    }

    fn parse(&self, path: &Path, value: serde_json::Value) -> Result<Box<dyn FamilyConfig>, ConfigError> {
        Ok(Box::new(Qwen3NextConfig::from_json(path, value)?))
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &[super::gguf::QWEN3NEXT, super::gguf::QWEN35MOE]
    }

    fn gguf_config(&self, model: &GgufModel) -> Result<serde_json::Value, GgufError> {
        match model.architecture()? {
            super::gguf::QWEN35MOE => super::gguf::qwen35_config_json(model),
            _ => super::gguf::config_json(model),
        }
    }

    fn gguf_checkpoint(&self, model: &GgufModel) -> Result<Checkpoint, GgufError> {
        crate::gguf::checkpoint::checkpoint(model, super::gguf::NAMING)
    }

    fn fuzz_seeds(&self) -> Vec<serde_json::Value> {
        let next = serde_json::json!({
            "model_type": "qwen3_next", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 40,
            "moe_intermediate_size": 12, "shared_expert_intermediate_size": 16, "num_hidden_layers": 5,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "full_attention_interval": 4, "mlp_only_layers": [1], "num_experts": 8,
            "num_experts_per_tok": 2, "norm_topk_prob": true, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 8, "linear_value_head_dim": 6, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
            "eos_token_id": 2
        });
        let qwen35 = serde_json::json!({
            "model_type": "qwen3_5_moe",
            "text_config": {
                "model_type": "qwen3_5_moe_text", "vocab_size": 64, "hidden_size": 32,
                "moe_intermediate_size": 12, "shared_expert_intermediate_size": 16,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 8, "num_experts": 8, "num_experts_per_tok": 2,
                "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2,
                "linear_num_value_heads": 2,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                    "mrope_section": [1, 0, 0], "mrope_interleaved": true},
                "eos_token_id": 2
            },
            "vision_config": {"depth": 1, "hidden_size": 8},
            "tie_word_embeddings": false
        });
        let text = qwen35["text_config"].clone();
        vec![next, qwen35, text]
    }
}

impl FamilyConfig for Qwen3NextConfig {
    /// Keys and values of the full-attention layers; the linear layers'
    /// recurrent state has a fixed size per sequence, not per position.
    fn kv_bytes_per_position(&self, kv: KvTypes) -> u64 {
        kv.bytes_per_position(
            self.full_layers().len(),
            self.base.num_key_value_heads * self.base.head_dim,
        )
    }

    /// Each linear layer's state (f32), held once and in up to
    /// [`CHECKPOINTS`] + [`KEPT`] copies to go back to.
    fn sequence_state_bytes(&self) -> u64 {
        let copies = 1 + CHECKPOINTS + KEPT;
        4 * (self.linear_layers() * self.linear.state_values() * copies) as u64
    }

    fn max_positions(&self) -> usize {
        self.base.max_position_embeddings
    }

    fn position_limit(&self) -> usize {
        self.base.position_limit()
    }

    fn shape(&self) -> ShapeFacts {
        self.base.shape()
    }

    fn chat_format(&self) -> ChatFormat {
        ChatFormat::CHATML
    }

    fn main_expert_map(
        &self,
        ck: &Checkpoint,
        opts: LoadOptions,
    ) -> Result<(ExpertMap, ExpertCodec), ModelError> {
        expert_map(&self.base, ck, opts)
    }

    fn load(self: Box<Self>, ck: Checkpoint, opts: LoadOptions) -> Result<FamilyLoad, ModelError> {
        let cfg = *self;
        let (map, codec) = expert_map(&cfg.base, &ck, opts)?;
        start_dense_load(&ck, &map);
        let weights = Arc::new(load_weights(&cfg, &ck, opts)?);
        drop(ck);
        let predictor: Arc<dyn Predictor> = Arc::new(Qwen3NextPredictor::new(&cfg, weights.clone()));
        Ok(FamilyLoad {
            dense_bytes: weights.resident_bytes() as u64,
            map,
            codec,
            predictor: Some(predictor),
            top_k: cfg.base.num_experts_per_tok,
            eos_ids: cfg.base.eos_ids(),
            finish: Box::new(move |source| Box::new(Qwen3Next::new(cfg, weights, source))),
        })
    }

    fn convert_spec(
        &self,
        _config: &Path,
        experts: QFormat,
        dense: QFormat,
    ) -> Result<ModelSpec, ConvertError> {
        Ok(convert_spec(&self.base, experts, dense))
    }

    fn invariants(&self) -> Result<(), String> {
        self.base.invariants()?;
        let s = &self.linear;
        if s.key_heads == 0 || !s.value_heads.is_multiple_of(s.key_heads) || s.conv_kernel == 0 {
            return Err(format!("linear heads {} / {}", s.key_heads, s.value_heads));
        }
        if self.layers.len() != self.base.num_hidden_layers {
            return Err("layer kinds do not cover the layers".into());
        }
        if self.base.shared_intermediate == 0 {
            return Err("no shared expert".into());
        }
        Ok(())
    }
}
