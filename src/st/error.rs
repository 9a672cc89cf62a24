//! Why a checkpoint or one of its tensors could not be used.

use std::path::PathBuf;

use crate::quant::QuantError;

/// Every error names the file and, where there is one, the tensor.
/// Tensors decoded from raw buffers (experts delivered by the I/O workers)
/// carry the path `(buffer)`.
#[derive(Debug, thiserror::Error)]
pub enum StError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: no safetensors files found (expected model.safetensors, model.safetensors.index.json or *.safetensors)"
    )]
    NoFiles { path: PathBuf },
    #[error("{path}: bad header: {reason}")]
    Header { path: PathBuf, reason: String },
    #[error("{path}: tensor {tensor:?}: {reason}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("{path}: bad shard index: {reason}")]
    Index { path: PathBuf, reason: String },
    #[error("tensor {tensor:?} appears in both {first} and {second}")]
    Duplicate {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("{path}: tensor {tensor:?} not found")]
    NotFound { path: PathBuf, tensor: String },
    #[error("{path}: tensor {tensor:?}: expected shape {expected:?}, found {found:?}")]
    Shape {
        path: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: tensor {tensor:?}: {source}")]
    Quant {
        path: PathBuf,
        tensor: String,
        #[source]
        source: QuantError,
    },
}

impl StError {
    pub(crate) fn tensor(path: impl Into<PathBuf>, tensor: &str, reason: impl Into<String>) -> Self {
        Self::Tensor {
            path: path.into(),
            tensor: tensor.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn header(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Header {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// Replaces the placeholder path of an error raised on raw bytes by the
    /// file the bytes came from.
    pub(crate) fn in_file(self, file: &std::path::Path) -> Self {
        match self {
            Self::Tensor { tensor, reason, .. } => Self::Tensor {
                path: file.to_path_buf(),
                tensor,
                reason,
            },
            Self::Shape {
                tensor,
                expected,
                found,
                ..
            } => Self::Shape {
                path: file.to_path_buf(),
                tensor,
                expected,
                found,
            },
            Self::Quant { tensor, source, .. } => Self::Quant {
                path: file.to_path_buf(),
                tensor,
                source,
            },
            other => other,
        }
    }
}

/// The path errors on raw buffers carry.
pub(crate) const BUFFER_PATH: &str = "(buffer)";
