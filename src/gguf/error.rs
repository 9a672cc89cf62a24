//! Why a GGUF file, or one of its keys or tensors, could not be used.

use std::path::PathBuf;

/// Every refusal names what is at fault: the byte offset for structure, the
/// key for metadata, the tensor for tensor infos and data, the file for
/// whole-file and split problems. GGUF files are downloaded from anywhere,
/// so these messages are what a user sees instead of a crash.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A parse error of the bytes of `path`.
    #[error("{path}: {source}")]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<GgufError>,
    },
    #[error("not a GGUF file: magic {found:?} at offset 0, expected \"GGUF\"")]
    Magic { found: String },
    #[error("GGUF version {found} is not supported (versions 2 and 3 are){hint}")]
    Version { found: u32, hint: &'static str },
    #[error("truncated at offset {offset}: {what} needs {need} bytes, {left} left")]
    Truncated {
        offset: u64,
        what: String,
        need: u64,
        left: u64,
    },
    /// A count that could not be honest: its entries cannot fit in what is
    /// left of the file, so nothing is allocated for it.
    #[error(
        "{what} count {count} at offset {offset} cannot fit in the {left} bytes left (each takes at least {min} bytes)"
    )]
    Count {
        what: String,
        count: u64,
        offset: u64,
        left: u64,
        min: u64,
    },
    /// A key whose name itself is unusable (empty, too long, not UTF-8).
    #[error("metadata key #{index} at offset {offset}: {reason}")]
    KeyName { index: u64, offset: u64, reason: String },
    #[error("key {key:?}: {reason}")]
    Key { key: String, reason: String },
    #[error("duplicate key {key:?} (metadata entries #{first} and #{second})")]
    DuplicateKey { key: String, first: u64, second: u64 },
    #[error("key {key:?} not found")]
    MissingKey { key: String },
    #[error("key {key:?} is {found}, expected {expected}")]
    KeyType {
        key: String,
        expected: &'static str,
        found: String,
    },
    /// A tensor whose name itself is unusable.
    #[error("tensor #{index} at offset {offset}: {reason}")]
    TensorName { index: u64, offset: u64, reason: String },
    #[error("tensor {tensor:?}: {reason}")]
    Tensor { tensor: String, reason: String },
    #[error("duplicate tensor {tensor:?} (tensor infos #{first} and #{second})")]
    DuplicateTensor { tensor: String, first: u64, second: u64 },
    #[error(
        "tensors {first:?} [{first_start}, {first_end}) and {second:?} [{second_start}, {second_end}) overlap"
    )]
    Overlap {
        first: String,
        first_start: u64,
        first_end: u64,
        second: String,
        second_start: u64,
        second_end: u64,
    },
    #[error("data section starts at offset {start}, past the end of the file ({len} bytes)")]
    DataStart { start: u64, len: u64 },
    #[error("tensor {tensor:?} not found")]
    MissingTensor { tensor: String },
    #[error("tensor {tensor:?} appears in both {first} and {second}")]
    TensorInTwoShards {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("{path}: split: {reason}")]
    Split { path: PathBuf, reason: String },
    #[error("general.architecture {found:?} is not supported (supported: {supported})")]
    Architecture { found: String, supported: String },
    /// A value the engine understands but cannot honour (a tokenizer model
    /// or pre-tokenizer it has no rebuild for), with what it does support
    /// and what to do instead.
    #[error("key {key:?}: {found:?} is not supported (supported: {supported}); {hint}")]
    Unsupported {
        key: String,
        found: String,
        supported: String,
        hint: &'static str,
    },
}

impl GgufError {
    /// Attaches the file a byte-level error came from.
    pub(crate) fn in_file(self, path: &std::path::Path) -> Self {
        match self {
            e @ (Self::Io { .. } | Self::InFile { .. } | Self::Split { .. }) => e,
            e => Self::InFile {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        }
    }

    pub(crate) fn key(key: &str, reason: impl Into<String>) -> Self {
        Self::Key {
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn tensor(tensor: &str, reason: impl Into<String>) -> Self {
        Self::Tensor {
            tensor: tensor.to_string(),
            reason: reason.into(),
        }
    }

    /// The error a byte-level parse raised, without the file it was in.
    pub fn innermost(&self) -> &GgufError {
        match self {
            Self::InFile { source, .. } => source.innermost(),
            e => e,
        }
    }
}
