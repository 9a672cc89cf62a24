//! A GGUF model's config and chat template, through the family registry.
//!
//! `general.architecture` names the family in llama.cpp's words; the family
//! that lists that name ([`crate::model::family`]'s `gguf_architectures`)
//! rebuilds the config.json it would have read from the metadata, and that
//! value then goes through the same parsing and validation as a checkpoint
//! directory's config.json, so a GGUF cannot smuggle in a config the
//! engine would refuse.

use super::GgufError;
use super::metadata::optional;
use super::split::GgufModel;
use crate::config::ConfigError;
use crate::model::family::{ModelConfig, gguf_family_of, supported_gguf_architectures};

/// The key llama.cpp's converter stores the checkpoint's chat template in.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

#[derive(Debug, thiserror::Error)]
pub enum GgufConfigError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The validated config of the model in `model`.
pub fn model_config(model: &GgufModel) -> Result<ModelConfig, GgufConfigError> {
    Ok(ModelConfig::from_json(first_path(model), config_json(model)?)?)
}

/// The config.json equivalent of `model`'s metadata, before validation.
pub fn config_json(model: &GgufModel) -> Result<serde_json::Value, GgufError> {
    let path = first_path(model);
    let arch = model.architecture().map_err(|e| e.in_file(path))?;
    let family = gguf_family_of(arch).ok_or_else(|| {
        GgufError::Architecture {
            found: arch.to_string(),
            supported: supported_gguf_architectures(),
        }
        .in_file(path)
    })?;
    family.gguf_config(model).map_err(|e| e.in_file(path))
}

/// `tokenizer.chat_template`, when the file carries one.
pub fn chat_template(model: &GgufModel) -> Result<Option<&str>, GgufError> {
    optional(model.metadata().get_str(CHAT_TEMPLATE_KEY)).map_err(|e| e.in_file(first_path(model)))
}

fn first_path(model: &GgufModel) -> &std::path::Path {
    model.shards()[0].path()
}
