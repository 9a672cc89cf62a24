//! The few numbers a benchmark needs from a model of either family.
//!
//! `coli bench` sizes its prompt, its all-resident pass and its disk probe
//! from the vocabulary, the expert count and the expert map; this reads them
//! from an OLMoE, Qwen3-MoE, Mixtral, GLM-4.x MoE, gpt-oss or GLM-5 /
//! DeepSeek-V3 config.json, so the same bench runs on every family
//! `coli synth` writes.

use std::path::Path;

use colibri_actors::ExpertMap;

use crate::config::{ConfigError, ModelConfig, read_json};
use crate::model::ModelError;
use crate::model::expert::ExpertCodec;
use crate::model::olmoe::LoadOptions;
use crate::st::Checkpoint;

/// Vocabulary, sizes and routing of a model, whatever its family (field
/// names as OLMoE's config, which the bench used before it read GLM).
#[derive(Clone, Debug)]
pub struct ModelShape {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    /// Routed experts per sparse layer.
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    family: ModelConfig,
}

impl ModelShape {
    /// Reads `dir`'s config.json, dispatching on `model_type` as
    /// `coli convert` does.
    pub fn load(dir: &Path) -> Result<Self, ConfigError> {
        let (path, json) = read_json(dir)?;
        let model_type = json
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let family = ModelConfig::from_json(&path, json)?;
        let (vocab_size, hidden_size, num_hidden_layers, num_experts, num_experts_per_tok) = match &family {
            ModelConfig::Olmoe(c) => (
                c.vocab_size,
                c.hidden_size,
                c.num_hidden_layers,
                c.num_experts,
                c.num_experts_per_tok,
            ),
            ModelConfig::MoeDecoder(c) => (
                c.vocab_size,
                c.hidden_size,
                c.num_hidden_layers,
                c.num_experts,
                c.num_experts_per_tok,
            ),
            ModelConfig::Glm(c) => (
                c.vocab_size,
                c.hidden_size,
                c.num_hidden_layers,
                c.n_routed_experts,
                c.num_experts_per_tok,
            ),
        };
        Ok(Self {
            model_type,
            vocab_size,
            hidden_size,
            num_hidden_layers,
            num_experts,
            num_experts_per_tok,
            family,
        })
    }

    /// The routed experts' byte ranges (main layers only: a bench decodes
    /// without MTP drafts), through the family's own loader.
    pub fn expert_map(
        &self,
        ck: &Checkpoint,
        opts: LoadOptions,
    ) -> Result<(ExpertMap, ExpertCodec), ModelError> {
        match &self.family {
            ModelConfig::Olmoe(c) => crate::model::olmoe::expert_map(c, ck, opts),
            ModelConfig::Glm(c) => crate::model::glm::expert_map(c, ck, opts, false),
            ModelConfig::MoeDecoder(c) => crate::model::moe_decoder::expert_map(c, ck, opts),
        }
    }

    /// Bytes one position of one sequence takes in the KV cache.
    pub fn kv_bytes_per_position(&self) -> u64 {
        self.family.kv_bytes_per_position()
    }

    /// Positions the model supports.
    pub fn max_positions(&self) -> usize {
        self.family.max_positions()
    }
}
