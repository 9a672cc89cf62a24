//! `coli convert`: a Hugging Face OLMoE checkpoint to a streaming container.
//!
//! The container is one `model.safetensors` (readable by any safetensors
//! reader) laid out for streaming: dense tensors first, then every routed
//! expert (layer-major, expert-minor) with its tensors adjacent and its first
//! byte 4096-aligned, so one read fetches a whole expert. Alignment gaps are
//! filled with `__pad__.N` U8 tensors, because safetensors forbids holes.
//! The file is written by a streaming writer (one tensor in memory at a time)
//! into a temporary directory renamed into place at the very end, so an
//! interrupted conversion never leaves something that loads.

use std::path::{Path, PathBuf};

use crate::config::ConfigError;
use crate::quant::{QFormat, QuantError};
use crate::st::StError;

/// Why a conversion failed.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Checkpoint(#[from] StError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unknown format {0:?} (use f32, int8, int4, int4-g64 or int2)")]
    Format(String),
    #[error("{0} already exists; refusing to overwrite it")]
    OutputExists(PathBuf),
    #[error("{path}: tensor {tensor:?}: {reason}")]
    Input {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("tensor {tensor:?}: {source}")]
    Quant {
        tensor: String,
        #[source]
        source: QuantError,
    },
}

/// What a conversion wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvertReport {
    pub output: PathBuf,
    /// Logical tensors written (a quantized tensor and its scales count once).
    pub tensors: usize,
    pub experts: usize,
    /// Size of the written `model.safetensors`.
    pub bytes: u64,
    pub experts_format: QFormat,
    pub dense_format: QFormat,
}

/// Parses a `--experts` / `--dense` value: f32, int8, int4, int4-gN
/// (N in 16..=256; int4-g64 is the documented one) or int2.
pub fn parse_format(s: &str) -> Result<QFormat, ConvertError> {
    let bad = || ConvertError::Format(s.to_string());
    match s {
        "f32" => Ok(QFormat::F32),
        "int8" => Ok(QFormat::Int8),
        "int4" => Ok(QFormat::Int4),
        "int2" => Ok(QFormat::Int2),
        _ => {
            let g: usize = s.strip_prefix("int4-g").ok_or_else(bad)?.parse().map_err(|_| bad())?;
            if (16..=256).contains(&g) {
                Ok(QFormat::Int4Grouped { group: g })
            } else {
                Err(bad())
            }
        }
    }
}

/// Converts the OLMoE checkpoint in `input` into a container at `output`
/// (a directory that must not exist yet, or be empty).
pub fn convert(
    input: &Path,
    output: &Path,
    experts: QFormat,
    dense: QFormat,
    progress: bool,
) -> Result<ConvertReport, ConvertError> {
    let _ = (input, output, experts, dense, progress);
    Err(ConvertError::Format("convert: not implemented yet".into()))
}
