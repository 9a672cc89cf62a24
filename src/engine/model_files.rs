//! Where a model's files are and what each kind of model keeps where: a
//! Hugging Face checkpoint directory (or a `coli convert` container) keeps
//! its config, tokenizer, chat template and stop ids in JSON files beside
//! the weights; a GGUF keeps all of them in its metadata. Everything that
//! reads a model's files outside its weights asks [`ModelFiles`], so the
//! front ends work the same on both.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::chat_template::{ChatFormat, ChatTemplate, TemplateError};
use crate::gguf::config::{GgufConfigError, chat_template, model_config};
use crate::gguf::split::split_name;
use crate::gguf::{GgufError, GgufModel, MAGIC, tokenizer_from_gguf};
use crate::model::ModelError;
use crate::model::family::{ModelConfig, gguf_family_of, supported_gguf_architectures};
use crate::st::Checkpoint;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// A model on disk, as `--model` named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelFiles {
    /// A checkpoint directory (config.json, safetensors, tokenizer files).
    Checkpoint(PathBuf),
    /// A GGUF file (the first shard of a split model, or any file holding
    /// one, such as an ollama blob without an extension).
    Gguf(PathBuf),
}

/// Why `--model` names no model colibri can open.
#[derive(Debug, thiserror::Error)]
pub enum ModelFilesError {
    #[error("{dir} holds several GGUF models ({found}) and no config.json: pass one of the files as --model")]
    SeveralGguf { dir: PathBuf, found: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ModelFiles {
    /// What `path` holds: a file starting with the GGUF magic is a GGUF
    /// whatever its name; a directory with a config.json is a checkpoint;
    /// a directory without one but with the files of exactly one GGUF
    /// model (one file, or the shards of one split model) is that model.
    /// Anything else is taken as a checkpoint directory, whose loader then
    /// names what is missing.
    pub fn resolve(path: &Path) -> Result<Self, ModelFilesError> {
        if path.is_file() {
            return Ok(if starts_with_magic(path)? {
                Self::Gguf(path.to_path_buf())
            } else {
                Self::Checkpoint(path.to_path_buf())
            });
        }
        if !path.is_dir() || path.join("config.json").is_file() {
            return Ok(Self::Checkpoint(path.to_path_buf()));
        }
        let io = |source| ModelFilesError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut models: Vec<PathBuf> = Vec::new();
        for entry in std::fs::read_dir(path).map_err(io)? {
            let p = entry.map_err(io)?.path();
            if !p.is_file() || p.extension().is_none_or(|e| e != "gguf") {
                continue;
            }
            // A split model counts once, by its first shard.
            match split_name(&p) {
                Some((_, 1, _)) | None => models.push(p),
                Some(_) => {}
            }
        }
        models.sort();
        match models.as_slice() {
            [] => Ok(Self::Checkpoint(path.to_path_buf())),
            [one] => Ok(Self::Gguf(one.clone())),
            several => Err(ModelFilesError::SeveralGguf {
                dir: path.to_path_buf(),
                found: several
                    .iter()
                    .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The path as resolved (the directory, or the GGUF file).
    pub fn path(&self) -> &Path {
        match self {
            Self::Checkpoint(p) | Self::Gguf(p) => p,
        }
    }

    pub fn is_gguf(&self) -> bool {
        matches!(self, Self::Gguf(_))
    }

    /// The GGUF model, opened and validated (every shard).
    fn gguf(&self) -> Option<Result<GgufModel, GgufError>> {
        match self {
            Self::Gguf(p) => Some(GgufModel::open(p)),
            Self::Checkpoint(_) => None,
        }
    }

    /// The validated model config: config.json, or the one a GGUF's
    /// metadata describes (validated the same way).
    pub fn config(&self) -> Result<ModelConfig, ModelError> {
        match self.gguf() {
            None => Ok(ModelConfig::load(self.path())?),
            Some(model) => {
                let model = model.map_err(gguf_err)?;
                model_config(&model).map_err(|e| match e {
                    GgufConfigError::Config(c) => ModelError::Config(c),
                    GgufConfigError::Gguf(g) => gguf_err(g),
                })
            }
        }
    }

    /// The config as text, for the state fingerprint: the bytes of
    /// config.json, or the config rebuilt from a GGUF's metadata.
    pub fn config_text(&self) -> Result<Vec<u8>, ModelError> {
        match self.gguf() {
            None => {
                let path = self.path().join("config.json");
                std::fs::read(&path)
                    .map_err(|e| ModelError::Weights(format!("reading {}: {e}", path.display())))
            }
            Some(model) => {
                let model = model.map_err(gguf_err)?;
                let json = crate::gguf::config::config_json(&model).map_err(gguf_err)?;
                Ok(json.to_string().into_bytes())
            }
        }
    }

    /// The weights, as the family's loader reads them.
    pub fn weights(&self) -> Result<Checkpoint, ModelError> {
        let Some(model) = self.gguf() else {
            return Ok(Checkpoint::open(self.path())?);
        };
        let model = model.map_err(gguf_err)?;
        let arch = model.architecture().map_err(gguf_err)?;
        let family = gguf_family_of(arch).ok_or_else(|| {
            gguf_err(GgufError::Architecture {
                found: arch.to_string(),
                supported: supported_gguf_architectures(),
            })
        })?;
        family.gguf_checkpoint(&model).map_err(gguf_err)
    }

    /// The files whose names, sizes and samples identify the weights.
    pub fn weight_files(&self) -> Result<Vec<PathBuf>, ModelError> {
        match self.gguf() {
            None => Ok(Vec::new()),
            Some(model) => Ok(model
                .map_err(gguf_err)?
                .shards()
                .iter()
                .map(|s| s.path().to_path_buf())
                .collect()),
        }
    }

    /// The tokenizer: tokenizer.json, or the one rebuilt from a GGUF's
    /// `tokenizer.ggml.*` keys. `None` when a checkpoint ships none.
    pub fn tokenizer(&self) -> Result<Option<Tokenizer>, TokenizerError> {
        let Some(model) = self.gguf() else {
            return match Tokenizer::load(self.path()) {
                Ok(t) => Ok(Some(t)),
                Err(TokenizerError::Missing(_)) => Ok(None),
                Err(e) => Err(e),
            };
        };
        let load = |reason: String| TokenizerError::Load {
            path: self.path().to_path_buf(),
            reason,
        };
        let model = model.map_err(|e| load(e.to_string()))?;
        let tok = tokenizer_from_gguf(model.metadata()).map_err(|e| load(e.to_string()))?;
        Ok(Some(tok.into_tokenizer()))
    }

    /// Stop ids: generation_config.json's `eos_token_id`, else the
    /// config's; for a GGUF its EOS, end-of-turn and end-of-message ids,
    /// else the config's.
    pub fn stop_ids(&self, config_eos: Vec<u32>) -> Vec<u32> {
        let Some(model) = self.gguf() else {
            return super::stop_ids(self.path(), config_eos);
        };
        let stops = model
            .ok()
            .and_then(|m| tokenizer_from_gguf(m.metadata()).ok())
            .map(|t| t.stop_ids())
            .unwrap_or_default();
        if stops.is_empty() { config_eos } else { stops }
    }

    /// The built-in chat format of the model's family (OLMoE's when the
    /// config cannot be read).
    pub fn family_format(&self) -> ChatFormat {
        self.config().map_or(ChatFormat::OLMOE, |c| c.chat_format())
    }

    /// The template the model ships, or `None` when it ships none:
    /// tokenizer_config.json's (or chat_template.jinja), or a GGUF's
    /// `tokenizer.chat_template` with its BOS and EOS tokens.
    pub fn shipped_template(&self) -> Result<Option<ChatTemplate>, TemplateError> {
        let fallback = self.family_format();
        let Some(model) = self.gguf() else {
            return ChatTemplate::of_model(self.path(), fallback);
        };
        let Ok(model) = model else {
            return Ok(None);
        };
        let Ok(Some(source)) = chat_template(&model) else {
            return Ok(None);
        };
        let (dbos, deos) = fallback.default_tokens();
        let (mut bos, mut eos) = (dbos.to_string(), deos.to_string());
        if let Ok(tok) = tokenizer_from_gguf(model.metadata()) {
            let name = |id: Option<u32>| id.and_then(|i| tok.hf().id_to_token(i));
            bos = name(tok.special.bos).unwrap_or(bos);
            eos = name(tok.special.eos).unwrap_or(eos);
        }
        let origin = format!("{} (tokenizer.chat_template)", self.path().display());
        ChatTemplate::new(source, &bos, &eos, &origin).map(|t| Some(t.or_dialect(fallback.dialect)))
    }

    /// The template chat front ends use: the shipped one, else the
    /// family's built-in one (`note` is told which).
    pub fn chat_template(&self, note: &mut dyn FnMut(String)) -> Result<ChatTemplate, TemplateError> {
        if let Self::Checkpoint(dir) = self {
            let cfg = dir.join("tokenizer_config.json");
            let family = self.family_format();
            if cfg.is_file() {
                return ChatTemplate::from_tokenizer_config(&cfg, family);
            }
            note(format!(
                "{} not found; using the built-in {family} chat template",
                cfg.display()
            ));
            return Ok(ChatTemplate::builtin(family));
        }
        match self.shipped_template()? {
            Some(t) => Ok(t),
            None => {
                let family = self.family_format();
                note(format!(
                    "{} has no tokenizer.chat_template; using the built-in {family} chat template",
                    self.path().display()
                ));
                Ok(ChatTemplate::builtin(family))
            }
        }
    }
}

fn gguf_err(e: GgufError) -> ModelError {
    ModelError::Gguf(e)
}

/// Whether the file at `path` begins with the GGUF magic.
fn starts_with_magic(path: &Path) -> Result<bool, ModelFilesError> {
    let mut head = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(|source| ModelFilesError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let n = f.read(&mut head).map_err(|source| ModelFilesError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(n == 4 && head == *MAGIC)
}
