//! A loaded model plus what running it needs: the expert source, the
//! tokenizer, stop ids, and the generation loop over a conversation's state.

mod generate;
mod options;
pub mod speculative;

pub use generate::{GenStats, Session, StopReason};
pub use options::EngineOptions;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use colibri_actors::{BlockingSource, ExpertMap, ExpertSource, SourceStats};

use crate::config::{ConfigError, GlmConfig, OlmoeConfig, read_json};
use crate::model::ModelError;
use crate::model::expert::{ExpertCodec, ExpertWeights};
use crate::model::glm::{self, Glm, GlmPredictor};
use crate::model::lm::LanguageModel;
use crate::model::olmoe::{self, LoadOptions, Olmoe, OlmoePredictor};
use crate::quant::QFormat;
use crate::st::Checkpoint;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("invalid option: {0}")]
    Option(String),
    #[error(transparent)]
    Forward(#[from] crate::model::lm::ForwardError),
}

/// Builds the expert source a model streams its experts through, from the
/// model's expert map, its decoder and (for the pilot) its router math.
pub struct SourceFactory<'a> {
    pub opts: &'a EngineOptions,
}

/// A model's router math as the pilot prefetcher uses it.
pub type PredictFn = Arc<dyn Fn(usize, &[f32], usize) -> Vec<u32> + Send + Sync>;

impl SourceFactory<'_> {
    pub fn build(
        &self,
        map: ExpertMap,
        codec: ExpertCodec,
        _predict: Option<PredictFn>,
    ) -> Result<Arc<dyn ExpertSource<ExpertWeights>>, ModelError> {
        Ok(Arc::new(BlockingSource::open(map, Box::new(codec))?))
    }
}

/// Loads the model family named by config.json's model_type.
fn load_family(dir: &Path, opts: &EngineOptions) -> Result<(Box<dyn LanguageModel>, Vec<u32>), EngineError> {
    let (path, json) = read_json(dir).map_err(ModelError::from)?;
    let model_type = json
        .get("model_type")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    let load = LoadOptions {
        expert_format: QFormat::from_bits(opts.expert_bits)
            .map_err(|e| EngineError::Option(e.to_string()))?,
        dense_format: QFormat::from_bits(opts.dense_bits).map_err(|e| EngineError::Option(e.to_string()))?,
    };
    let factory = SourceFactory { opts };
    match model_type.as_str() {
        "olmoe" => {
            let cfg = OlmoeConfig::from_json(&path, json).map_err(ModelError::from)?;
            let ck = Checkpoint::open(dir).map_err(ModelError::from)?;
            let dense = Arc::new(olmoe::load_dense(&cfg, &ck, load)?);
            let (map, codec) = olmoe::expert_map(&cfg, &ck, load)?;
            drop(ck);
            let predictor = OlmoePredictor {
                cfg: cfg.clone(),
                weights: dense.clone(),
            };
            let predict: PredictFn =
                Arc::new(move |layer, residual, k| predictor.predict(layer, residual, k));
            let source = factory.build(map, codec, Some(predict))?;
            let stops = stop_ids(dir, cfg.eos_ids());
            Ok((Box::new(Olmoe::new(cfg, dense, source)), stops))
        }
        "glm_moe_dsa" | "deepseek_v3" => {
            let cfg = GlmConfig::from_json(&path, json).map_err(ModelError::from)?;
            let ck = Checkpoint::open(dir).map_err(ModelError::from)?;
            let mtp = glm::mtp_available(&cfg, &ck);
            let with_mtp = mtp.is_ok();
            let dense = Arc::new(glm::load_dense(&cfg, &ck, load, with_mtp)?);
            let (map, codec) = glm::expert_map(&cfg, &ck, load, with_mtp)?;
            drop(ck);
            let predictor = GlmPredictor {
                cfg: cfg.clone(),
                weights: dense.clone(),
            };
            let predict: PredictFn =
                Arc::new(move |layer, residual, k| predictor.predict(layer, residual, k));
            let source = factory.build(map, codec, Some(predict))?;
            let stops = stop_ids(dir, cfg.eos_ids());
            Ok((Box::new(Glm::new(cfg, dense, source, mtp.err())), stops))
        }
        other => Err(ModelError::from(ConfigError::ModelType {
            path,
            found: other.to_string(),
        })
        .into()),
    }
}

/// A model ready to generate.
pub struct Engine {
    pub dir: PathBuf,
    pub model: Box<dyn LanguageModel>,
    pub tokenizer: Option<Tokenizer>,
    pub stop_ids: Vec<u32>,
}

impl Engine {
    /// Loads `dir` with `opts`. A missing tokenizer is not an error here
    /// (validation runs on ids); text front ends ask for it explicitly.
    pub fn load(dir: &Path, opts: &EngineOptions) -> Result<Self, EngineError> {
        let (model, stop_ids) = load_family(dir, opts)?;
        let tokenizer = match Tokenizer::load(dir) {
            Ok(t) => Some(t),
            Err(TokenizerError::Missing(_)) => None,
            Err(e) => return Err(e.into()),
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            model,
            tokenizer,
            stop_ids,
        })
    }

    /// The tokenizer, or a clear error naming the missing file.
    pub fn tokenizer(&self) -> Result<&Tokenizer, TokenizerError> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| TokenizerError::Missing(self.dir.join("tokenizer.json")))
    }

    pub fn stats(&self) -> SourceStats {
        self.model.source().stats()
    }

    pub fn new_session(&self) -> Session {
        Session::new(self.model.new_state())
    }
}

/// Stop ids: generation_config.json's `eos_token_id` when present, else
/// config.json's.
pub fn stop_ids(dir: &Path, config_eos: Vec<u32>) -> Vec<u32> {
    let from_gen = std::fs::read_to_string(dir.join("generation_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("eos_token_id").cloned())
        .map(|v| match v {
            serde_json::Value::Number(n) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
            serde_json::Value::Array(a) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
            _ => Vec::new(),
        });
    match from_gen {
        Some(ids) if !ids.is_empty() => ids,
        _ => config_eos,
    }
}
