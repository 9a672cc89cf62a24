//! The few numbers a benchmark needs from a model of either family.
//!
//! `coli bench` sizes its prompt, its all-resident pass and its disk probe
//! from the vocabulary, the expert count and the expert map; this reads them
//! through the registered family's config ([`crate::model::family`]), so
//! the same bench runs on every family `coli synth` writes.

use std::path::Path;

use colibri_actors::ExpertMap;

use crate::config::read_json;
use crate::model::ModelError;
use crate::model::expert::ExpertCodec;
use crate::model::family::ModelConfig;
use crate::model::olmoe::LoadOptions;
use crate::st::Checkpoint;

/// Vocabulary, sizes and routing of a model, whatever its family (field
/// names as OLMoE's config, which the bench used before it read GLM).
#[derive(Debug)]
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
    /// A GGUF's config is the one its metadata describes.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let (path, json) = match crate::engine::ModelFiles::resolve(dir) {
            Ok(crate::engine::ModelFiles::Gguf(p)) => {
                let model = crate::gguf::GgufModel::open(&p)?;
                let json = crate::gguf::config::config_json(&model)?;
                (p, json)
            }
            _ => read_json(dir)?,
        };
        let model_type = json
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let family = ModelConfig::from_json(&path, json)?;
        let f = family.shape();
        Ok(Self {
            model_type,
            vocab_size: f.vocab_size,
            hidden_size: f.hidden_size,
            num_hidden_layers: f.num_hidden_layers,
            num_experts: f.num_experts,
            num_experts_per_tok: f.num_experts_per_tok,
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
        self.family.family().main_expert_map(ck, opts)
    }

    /// Bytes one position of one sequence takes in a KV cache of `kv`.
    pub fn kv_bytes_per_position(&self, kv: crate::model::kv_cache::KvTypes) -> u64 {
        self.family.kv_bytes_per_position(kv)
    }

    /// Bytes of `slots` sequences' state at `ctx` positions each: the KV
    /// cache and, for a model with recurrent layers, their fixed-size
    /// state (what the memory plan reserves per conversation).
    pub fn state_bytes(&self, kv: crate::model::kv_cache::KvTypes, ctx: usize, slots: usize) -> u64 {
        (self.kv_bytes_per_position(kv) * ctx as u64 + self.family.sequence_state_bytes())
            * slots.max(1) as u64
    }

    /// Positions the model supports.
    pub fn max_positions(&self) -> usize {
        self.family.max_positions()
    }

    /// The longest context an explicit `--ctx` may ask for (a declared
    /// RoPE scaling may extend it past [`Self::max_positions`]).
    pub fn position_limit(&self) -> usize {
        self.family.position_limit()
    }
}
