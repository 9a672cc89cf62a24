//! What a model family registers, and the one lookup from `model_type` to it.
//!
//! Every place that used to match on the family (the engine's loader, `coli
//! convert`, `coli bench`'s model shape, the built-in chat template, the
//! config fuzzer) asks the family's [`FamilyConfig`] instead, so a new family
//! is its own folder under `src/model/` (implementing [`Family`] and
//! [`FamilyConfig`]) plus one `mod` line and one entry in
//! [`super::FAMILIES`].

use std::path::Path;
use std::sync::Arc;

use colibri_actors::{ExpertMap, ExpertSource, Predictor};

use super::ModelError;
use super::expert::{ExpertCodec, ExpertWeights};
use super::kv_cache::KvTypes;
use super::lm::LanguageModel;
use super::olmoe::LoadOptions;
use crate::chat_template::ChatFormat;
use crate::config::{ConfigError, read_json};
use crate::convert::{ConvertError, ModelSpec};
use crate::gguf::{GgufError, GgufModel};
use crate::quant::QFormat;
use crate::st::Checkpoint;
use crate::synth::SynthPreset;

/// One registration entry: the `model_type` strings a family reads and how
/// it parses them. Implemented by a unit struct in the family's folder,
/// whose `static` is listed in [`super::FAMILIES`].
pub(crate) trait Family: Sync {
    /// The `model_type` values this entry parses, in the order the
    /// "supported" list of [`ConfigError::ModelType`] names them.
    fn model_types(&self) -> &'static [&'static str];

    /// Parses and validates a config.json whose `model_type` is one of
    /// [`Family::model_types`]; `path` is named in errors.
    fn parse(&self, path: &Path, value: serde_json::Value) -> Result<Box<dyn FamilyConfig>, ConfigError>;

    /// Small valid config.json values the config fuzzer mutates (one per
    /// `model_type` at least, each accepted by [`Family::parse`]).
    fn fuzz_seeds(&self) -> Vec<serde_json::Value>;

    /// The `coli synth --preset`s of this family's shapes (the real
    /// releases' and a tiny one for tests), so synth lists every preset
    /// through this registry.
    fn synth_presets(&self) -> &'static [SynthPreset] {
        &[]
    }

    /// The llama.cpp architecture names (a GGUF's `general.architecture`)
    /// this family reads; none until the family adds its GGUF mapping in
    /// its own folder.
    fn gguf_architectures(&self) -> &'static [&'static str] {
        &[]
    }

    /// The config.json [`Family::parse`] would read, rebuilt from a GGUF's
    /// metadata and tensor list, so a GGUF config is validated exactly as a
    /// checkpoint's is. Called only for an architecture the family lists
    /// in [`Family::gguf_architectures`].
    fn gguf_config(&self, model: &GgufModel) -> Result<serde_json::Value, GgufError> {
        Err(GgufError::Architecture {
            found: model.architecture().unwrap_or_default().to_string(),
            supported: supported_gguf_architectures(),
        })
    }

    /// The GGUF's tensors under the names [`FamilyConfig::load`] reads
    /// ([`crate::gguf::checkpoint`]), experts in place in the file. Called
    /// only for an architecture the family lists.
    fn gguf_checkpoint(&self, model: &GgufModel) -> Result<Checkpoint, GgufError> {
        Err(GgufError::Architecture {
            found: model.architecture().unwrap_or_default().to_string(),
            supported: supported_gguf_architectures(),
        })
    }
}

/// A family's validated configuration: everything the engine, `coli
/// convert`, `coli bench`, the chat front ends and the fuzzer ask of a
/// family, so none of them matches on the family.
pub(crate) trait FamilyConfig: Send + Sync + std::fmt::Debug {
    /// Bytes one position of one sequence takes in the KV cache when it
    /// stores keys and values as `kv` says (families whose state is not a
    /// plain KV cache may ignore it).
    fn kv_bytes_per_position(&self, kv: KvTypes) -> u64;

    /// Bytes one sequence's state takes whatever its length: a recurrent
    /// layer's fixed-size state, with the copies of it a sequence keeps to
    /// go back to (0 for a state that is one record per position).
    fn sequence_state_bytes(&self) -> u64 {
        0
    }

    /// Positions the model was configured for (`max_position_embeddings`):
    /// the default context.
    fn max_positions(&self) -> usize;

    /// The longest context an explicit `--ctx` may ask for: more than
    /// [`Self::max_positions`] only when the config declares a RoPE
    /// scaling that stretches the model beyond it.
    fn position_limit(&self) -> usize {
        self.max_positions()
    }

    /// The counts `coli bench` sizes its prompt and passes from.
    fn shape(&self) -> ShapeFacts;

    /// The built-in chat format used when the checkout ships no template.
    fn chat_format(&self) -> ChatFormat;

    /// The routed experts' byte ranges of the main layers (no next-token
    /// layers: a bench decodes without drafts), through the family's loader.
    fn main_expert_map(
        &self,
        ck: &Checkpoint,
        opts: LoadOptions,
    ) -> Result<(ExpertMap, ExpertCodec), ModelError>;

    /// Loads the resident weights and expert map of the model in `ck`; the
    /// engine builds the expert source from the result and then finishes
    /// the model. Calls [`start_dense_load`] before the first dense tensor.
    fn load(self: Box<Self>, ck: Checkpoint, opts: LoadOptions) -> Result<FamilyLoad, ModelError>;

    /// `coli convert`'s plan inputs: which layers hold routed experts, their
    /// shapes and names, and every tensor's output format. `config` is
    /// config.json's path, for errors.
    fn convert_spec(
        &self,
        config: &Path,
        experts: QFormat,
        dense: QFormat,
    ) -> Result<ModelSpec, ConvertError>;

    /// What the model code assumes of a validated config, checked by the
    /// config fuzzer on every accepted mutant: `Err` names the broken
    /// assumption.
    fn invariants(&self) -> Result<(), String>;
}

/// What a load reports as its phase ([`crate::progress::Progress::start`]).
pub const DENSE_LOAD_PHASE: &str = "loading dense weights";

/// Starts `ck`'s load progress, once the loader knows its expert map: the
/// loader copies every tensor but the routed experts, which stay in the
/// files (tensors a family does not read make the total an overestimate).
pub(crate) fn start_dense_load(ck: &Checkpoint, map: &ExpertMap) {
    ck.start_progress(
        DENSE_LOAD_PHASE,
        colibri_actors::MappedSource::<()>::expert_bytes(map),
    );
}

/// The expert source a model reads its routed experts through.
pub(crate) type Experts = Arc<dyn ExpertSource<ExpertWeights>>;

/// What a family's loader hands the engine: the pieces its expert source is
/// built from, and the step that turns that source into the model.
pub(crate) struct FamilyLoad {
    /// Resident (dense) weights, for the memory budget.
    pub dense_bytes: u64,
    pub map: ExpertMap,
    pub codec: ExpertCodec,
    /// The pilot's router math, if the family has one.
    pub predictor: Option<Arc<dyn Predictor>>,
    /// Experts routed per token (the pilot's default guess count).
    pub top_k: usize,
    /// config.json's end-of-sequence ids (generation_config.json wins).
    pub eos_ids: Vec<u32>,
    /// Builds the model around the expert source.
    pub finish: Box<dyn FnOnce(Experts) -> Box<dyn LanguageModel>>,
}

/// The few counts a benchmark needs, whatever the family (names as OLMoE's
/// config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeFacts {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    /// Routed experts per sparse layer.
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
}

/// The registered entry that parses `model_type`, if any.
pub(crate) fn family_of(model_type: &str) -> Option<&'static dyn Family> {
    super::FAMILIES
        .iter()
        .copied()
        .find(|f| f.model_types().contains(&model_type))
}

/// The registered entry that reads GGUF files of llama.cpp architecture
/// `arch`, if any.
pub(crate) fn gguf_family_of(arch: &str) -> Option<&'static dyn Family> {
    super::FAMILIES
        .iter()
        .copied()
        .find(|f| f.gguf_architectures().contains(&arch))
}

/// Every GGUF architecture a family reads, comma-separated in registry
/// order.
pub fn supported_gguf_architectures() -> String {
    super::FAMILIES
        .iter()
        .flat_map(|f| f.gguf_architectures().iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every supported `model_type`, comma-separated in registry order (the
/// list [`ConfigError::ModelType`] prints).
pub fn supported_model_types() -> String {
    super::FAMILIES
        .iter()
        .flat_map(|f| f.model_types().iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A model's validated configuration, parsed by the family its `model_type`
/// names. The family itself stays behind [`FamilyConfig`].
#[derive(Debug)]
pub struct ModelConfig {
    config: Box<dyn FamilyConfig>,
}

impl ModelConfig {
    /// Reads and validates `dir`'s config.json.
    pub fn load(dir: &Path) -> Result<Self, ConfigError> {
        let (path, value) = read_json(dir)?;
        Self::from_json(&path, value)
    }

    /// The family named by `model_type`, its config parsed and validated.
    pub fn from_json(path: &Path, value: serde_json::Value) -> Result<Self, ConfigError> {
        let value = crate::config::spelling::canonical(path, value)?;
        let model_type = value.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
        match family_of(model_type) {
            Some(family) => Ok(Self {
                config: family.parse(path, value)?,
            }),
            None => Err(ConfigError::ModelType {
                path: path.to_path_buf(),
                found: model_type.to_string(),
            }),
        }
    }

    /// Bytes one position of one sequence takes in the KV cache: K and V
    /// per layer for plain attention, in the types `kv` names; the
    /// compressed latent, rope key and indexer key per layer for MLA
    /// (in the key type).
    pub fn kv_bytes_per_position(&self, kv: KvTypes) -> u64 {
        self.config.kv_bytes_per_position(kv)
    }

    /// Bytes of one sequence's state besides its positions
    /// ([`FamilyConfig::sequence_state_bytes`]).
    pub fn sequence_state_bytes(&self) -> u64 {
        self.config.sequence_state_bytes()
    }

    /// Positions the model was configured for (`max_position_embeddings`).
    pub fn max_positions(&self) -> usize {
        self.config.max_positions()
    }

    /// The longest context the model may be asked to run: its
    /// `max_position_embeddings`, or what a declared RoPE scaling extends
    /// it to (factor times the pre-scaling context) when that is more.
    pub fn position_limit(&self) -> usize {
        self.config.position_limit()
    }

    /// The counts a benchmark needs.
    pub fn shape(&self) -> ShapeFacts {
        self.config.shape()
    }

    /// The built-in chat format of the family.
    pub fn chat_format(&self) -> ChatFormat {
        self.config.chat_format()
    }

    /// The family's own view of the config.
    pub(crate) fn family(&self) -> &dyn FamilyConfig {
        self.config.as_ref()
    }

    /// The family's config, to load the model from.
    pub(crate) fn into_family(self) -> Box<dyn FamilyConfig> {
        self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_type_maps_to_exactly_one_family() {
        let all: Vec<&str> = super::super::FAMILIES
            .iter()
            .flat_map(|f| f.model_types().iter().copied())
            .collect();
        assert!(!all.is_empty());
        for t in &all {
            assert!(!t.is_empty());
            let owners = super::super::FAMILIES
                .iter()
                .filter(|f| f.model_types().contains(t))
                .count();
            assert_eq!(owners, 1, "{t} is registered {owners} times");
        }
    }

    #[test]
    fn every_family_has_a_seed_per_model_type_that_it_accepts() {
        for f in super::super::FAMILIES {
            let seeds = f.fuzz_seeds();
            for t in f.model_types() {
                assert!(
                    seeds.iter().any(|s| s["model_type"] == *t),
                    "{t} has no fuzz seed"
                );
            }
            for s in seeds {
                let t = s["model_type"].as_str().unwrap_or("").to_string();
                assert!(f.model_types().contains(&t.as_str()), "a seed of {t}");
                let c = ModelConfig::from_json(Path::new("seed.json"), s)
                    .unwrap_or_else(|e| panic!("seed of {t} refused: {e}"));
                assert_eq!(c.family().invariants(), Ok(()), "{t}");
                assert!(
                    c.max_positions() > 0 && c.kv_bytes_per_position(KvTypes::default()) > 0,
                    "{t}"
                );
            }
        }
    }

    #[test]
    fn every_gguf_architecture_maps_to_exactly_one_family() {
        for f in super::super::FAMILIES {
            for a in f.gguf_architectures() {
                let owners = super::super::FAMILIES
                    .iter()
                    .filter(|g| g.gguf_architectures().contains(a))
                    .count();
                assert_eq!(owners, 1, "{a} is registered {owners} times");
            }
        }
        let list = supported_gguf_architectures();
        for a in ["olmoe", "qwen3moe", "glm4moe", "gpt-oss", "minimax-m2"] {
            assert!(list.split(", ").any(|x| x == a), "{a} missing from {list}");
        }
    }

    #[test]
    fn the_supported_list_is_the_table() {
        assert_eq!(
            supported_model_types(),
            "olmoe, qwen3_moe, mixtral, glm4_moe, gpt_oss, minimax_m2, glm_moe_dsa, deepseek_v3, glm4_moe_lite, deepseek_v32, qwen3_next, qwen3_5_moe, qwen3_5_moe_text"
        );
        let e = ModelConfig::from_json(Path::new("c.json"), serde_json::json!({"model_type": "llama"}))
            .unwrap_err();
        assert!(matches!(e, ConfigError::ModelType { .. }));
        assert_eq!(
            e.to_string(),
            format!(
                "c.json: model_type \"llama\" is not supported (supported: {})",
                supported_model_types()
            )
        );
    }
}
