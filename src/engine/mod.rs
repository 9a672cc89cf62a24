//! A loaded model plus what running it needs: the expert source, the
//! tokenizer, stop ids, and the generation loop over a conversation's state.

mod generate;
mod options;

pub use generate::{GenStats, Session, StopReason};
pub use options::EngineOptions;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use colibri_actors::{BlockingSource, ExpertSource, SourceStats};

use crate::config::OlmoeConfig;
use crate::model::ModelError;
use crate::model::expert::ExpertWeights;
use crate::model::olmoe::{self, LoadOptions, Olmoe};
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
    Forward(#[from] crate::model::olmoe::ForwardError),
}

/// A model ready to generate.
pub struct Engine {
    pub dir: PathBuf,
    pub model: Olmoe,
    pub tokenizer: Option<Tokenizer>,
    pub stop_ids: Vec<u32>,
    pub dense_bytes: usize,
}

impl Engine {
    /// Loads `dir` with `opts`. A missing tokenizer is not an error here
    /// (validation runs on ids); text front ends ask for it explicitly.
    pub fn load(dir: &Path, opts: &EngineOptions) -> Result<Self, EngineError> {
        let cfg = OlmoeConfig::load(dir).map_err(ModelError::from)?;
        let ck = Checkpoint::open(dir).map_err(ModelError::from)?;
        let load = LoadOptions {
            expert_format: QFormat::from_bits(opts.expert_bits)
                .map_err(|e| EngineError::Option(e.to_string()))?,
            dense_format: QFormat::from_bits(opts.dense_bits)
                .map_err(|e| EngineError::Option(e.to_string()))?,
        };
        let dense = Arc::new(olmoe::load_dense(&cfg, &ck, load)?);
        let (map, codec) = olmoe::expert_map(&cfg, &ck, load)?;
        drop(ck);
        let source: Arc<dyn ExpertSource<ExpertWeights>> =
            Arc::new(BlockingSource::open(map, Box::new(codec)).map_err(ModelError::from)?);
        let tokenizer = match Tokenizer::load(dir) {
            Ok(t) => Some(t),
            Err(TokenizerError::Missing(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let stop_ids = stop_ids(dir, &cfg);
        let dense_bytes = dense.resident_bytes();
        Ok(Self {
            dir: dir.to_path_buf(),
            model: Olmoe::new(cfg, dense, source),
            tokenizer,
            stop_ids,
            dense_bytes,
        })
    }

    /// The tokenizer, or a clear error naming the missing file.
    pub fn tokenizer(&self) -> Result<&Tokenizer, TokenizerError> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| TokenizerError::Missing(self.dir.join("tokenizer.json")))
    }

    pub fn stats(&self) -> SourceStats {
        self.model.source.stats()
    }

    pub fn new_session(&self) -> Session {
        Session::new(self.model.new_cache())
    }
}

/// Stop ids: generation_config.json's `eos_token_id` when present, else
/// config.json's.
fn stop_ids(dir: &Path, cfg: &OlmoeConfig) -> Vec<u32> {
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
        _ => cfg.eos_ids(),
    }
}
