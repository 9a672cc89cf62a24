//! The Llama-style decoder's registration: Qwen3-MoE and Mixtral parse with
//! [`MoeDecoderConfig::from_json`] ([`QWEN3_MIXTRAL`]); GLM-4.x and gpt-oss
//! have their own parsers and entries (`super::glm4_moe`, `super::gpt_oss`).
//! All four share the config type, so its [`FamilyConfig`] impl (KV size,
//! loader, convert rules, chat format by [`DecoderKind`], invariants) is
//! here once.

use crate::synth::{SynthPreset, SynthSpec};
use std::path::Path;
use std::sync::Arc;

use colibri_actors::{ExpertMap, Predictor};

use super::config::{DecoderKind, MoeDecoderConfig, RouterChoice};
use super::{MoeDecoder, RouterPredictor, expert_map, load_dense, naming};
use crate::chat_template::ChatFormat;
use crate::config::ConfigError;
use crate::convert::plan::{FusedLayout, keeps_f32};
use crate::convert::{ConvertError, ModelSpec};
use crate::gguf::names::GgufNaming;
use crate::gguf::{GgufError, GgufModel};
use crate::model::ModelError;
use crate::model::expert::ExpertCodec;
use crate::model::expert::ExpertNaming;
use crate::model::family::{Family, FamilyConfig, FamilyLoad, ShapeFacts, start_dense_load};
use crate::model::kv_cache::KvTypes;
use crate::model::olmoe::LoadOptions;
use crate::quant::QFormat;
use crate::st::Checkpoint;

/// The registry entry for `qwen3_moe` and `mixtral`.
pub(crate) struct Qwen3Mixtral;

/// Listed in [`crate::model::FAMILIES`].
pub(crate) static QWEN3_MIXTRAL: Qwen3Mixtral = Qwen3Mixtral;

impl Family for Qwen3Mixtral {
    fn model_types(&self) -> &'static [&'static str] {
        &["qwen3_moe", "mixtral"]
    }

    fn synth_presets(&self) -> &'static [SynthPreset] {
        &[
            SynthPreset {
                name: "qwen3-30b-a3b",
                build: SynthSpec::qwen3_30b_a3b,
            },
            SynthPreset {
                name: "qwen3-tiny",
                build: SynthSpec::qwen3_tiny,
            },
            SynthPreset {
                name: "mixtral-8x7b",
                build: SynthSpec::mixtral_8x7b,
            },
            SynthPreset {
                name: "mixtral-tiny",
                build: SynthSpec::mixtral_tiny,
            },
        ]
    }

    fn parse(&self, path: &Path, value: serde_json::Value) -> Result<Box<dyn FamilyConfig>, ConfigError> {
        Ok(Box::new(MoeDecoderConfig::from_json(path, value)?))
    }

    fn fuzz_seeds(&self) -> Vec<serde_json::Value> {
        let qwen = serde_json::json!({
            "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 12, "num_experts": 8, "num_experts_per_tok": 2,
            "norm_topk_prob": true, "mlp_only_layers": [1], "decoder_sparse_step": 1,
            "rope_theta": 1e6, "eos_token_id": 2, "use_sliding_window": false, "sliding_window": null,
            "tie_word_embeddings": false, "hidden_act": "silu"
        });
        let mixtral = serde_json::json!({
            "model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 10,
            "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8, "rope_theta": 1e6,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": true
        });
        // Qwen3-MoE as transformers 5 writes it.
        let qwen_v5 = serde_json::json!({
            "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 12, "num_local_experts": 8, "num_experts_per_tok": 2,
            "norm_topk_prob": true, "mlp_only_layers": [1], "dtype": "bfloat16",
            "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}, "eos_token_id": 2
        });
        vec![qwen, mixtral, qwen_v5]
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &[super::gguf::QWEN3MOE]
    }

    fn gguf_config(&self, model: &GgufModel) -> Result<serde_json::Value, GgufError> {
        super::gguf::qwen3_config_json(model)
    }

    fn gguf_checkpoint(&self, model: &GgufModel) -> Result<Checkpoint, GgufError> {
        crate::gguf::checkpoint::checkpoint(model, GgufNaming::plain(ExpertNaming::MLP))
    }
}

impl FamilyConfig for MoeDecoderConfig {
    fn kv_bytes_per_position(&self, kv: KvTypes) -> u64 {
        kv.bytes_per_position(self.num_hidden_layers, self.num_key_value_heads * self.head_dim)
    }

    fn max_positions(&self) -> usize {
        self.max_position_embeddings
    }

    fn position_limit(&self) -> usize {
        self.rope_scaling.map_or(self.max_position_embeddings, |s| {
            s.extended_positions(self.max_position_embeddings)
        })
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
        match self.kind {
            DecoderKind::Qwen3Moe => ChatFormat::CHATML,
            DecoderKind::Mixtral => ChatFormat::MISTRAL,
            DecoderKind::Glm4Moe => ChatFormat::GLM4,
            DecoderKind::GptOss => ChatFormat::HARMONY,
            // Its release ships its own template; this is the fallback.
            DecoderKind::MiniMaxM2 => ChatFormat::CHATML,
        }
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
        let predictor: Arc<dyn Predictor> = Arc::new(RouterPredictor::for_decoder(&cfg, dense.clone()));
        Ok(FamilyLoad {
            dense_bytes: dense.resident_bytes() as u64,
            map,
            codec,
            predictor: Some(predictor),
            top_k: cfg.num_experts_per_tok,
            eos_ids: cfg.eos_ids(),
            finish: Box::new(move |source| Box::new(MoeDecoder::new(cfg, dense, source))),
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
        let hd = self.head_dim;
        if hd == 0
            || !hd.is_multiple_of(2)
            || !self.num_attention_heads.is_multiple_of(self.num_key_value_heads)
        {
            return Err(format!(
                "head layout {hd} / {} / {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !((self.rms_norm_eps as f32) > 0.0 && self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err("rms_norm_eps or rope_theta unusable in f32".into());
        }
        if self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.num_experts {
            return Err("top-k outside 1..=experts".into());
        }
        if !self.any_sparse() {
            return Err("no layer has routed experts".into());
        }
        if self.sliding_window == Some(0) {
            return Err("an empty sliding window".into());
        }
        if self.rotary_dim == 0 || self.rotary_dim > hd || !self.rotary_dim.is_multiple_of(2) {
            return Err(format!("rotary dims {} of head {hd}", self.rotary_dim));
        }
        if !self.sliding_layers.is_empty() && self.sliding_layers.len() != self.num_hidden_layers {
            return Err("layer_types do not cover the layers".into());
        }
        if let RouterChoice::Sigmoid {
            n_group, topk_group, ..
        } = self.router
            && (n_group == 0 || !self.num_experts.is_multiple_of(n_group) || topk_group > n_group)
        {
            return Err("group layout".into());
        }
        if let Some(scaling) = &self.rope_scaling {
            // What RoPE builds from it must be finite.
            let rope =
                crate::model::ops::Rope::scaled(self.rotary_dim.min(64), self.rope_theta, Some(scaling));
            let mut v = vec![1.0f32; self.rotary_dim.min(64)];
            rope.apply_half(&mut v, 3);
            if v.iter().any(|x| !x.is_finite()) {
                return Err("scaled RoPE gives non-finite values".into());
            }
        }
        let _ = self.eos_ids();
        Ok(())
    }
}

/// Qwen3-MoE / Mixtral / GLM-4.x / gpt-oss convert rules: routed experts in
/// the sparse layers (dense MLP layers are ordinary dense tensors), one
/// format for all, under the family's own expert names. GLM-4.x's
/// next-token layers after the main ones are kept (with experts).
pub(crate) fn convert_spec(cfg: &MoeDecoderConfig, experts: QFormat, dense: QFormat) -> ModelSpec {
    let mut expert_layers = cfg.sparse_layers();
    expert_layers.resize(cfg.num_hidden_layers + cfg.num_nextn_predict_layers, true);
    let gpt_oss = cfg.kind == DecoderKind::GptOss;
    ModelSpec {
        expert_format: vec![experts; expert_layers.len()],
        expert_layers,
        optional_layers_from: cfg.num_hidden_layers,
        n_experts: cfg.num_experts,
        hidden: cfg.hidden_size,
        inter: cfg.moe_intermediate_size,
        dense_format: Box::new(move |name, shape| {
            if keeps_f32(name, shape) {
                QFormat::F32
            } else {
                dense
            }
        }),
        metadata: vec![("model_type", cfg.model_type.clone())],
        naming: naming(cfg),
        fused: if gpt_oss {
            FusedLayout::GptOss
        } else {
            FusedLayout::Stacked
        },
        expert_bias: gpt_oss,
    }
}
