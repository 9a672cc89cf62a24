//! GGUF files (llama.cpp's model format), versions 2 and 3, little-endian,
//! single or split into `name-NNNNN-of-MMMMM.gguf` shards: the header,
//! metadata and tensor infos read and validated completely at open, the
//! ggml type table that sizes each tensor, the byte ranges of each routed
//! expert, the family hook that turns metadata into a model config, and
//! the tokenizer rebuilt from `tokenizer.ggml.*` metadata.
//! [`checkpoint`] presents a model's tensors under the names the family
//! loaders read, experts streamed from the file in place (docs/gguf.md).
//!
//! Written here rather than taken from a crate: the GGUF crates parse but
//! do not validate what a hostile file needs (docs/dependencies.md).

pub mod build;
pub mod checkpoint;
pub mod config;
mod cursor;
mod error;
pub mod experts;
mod file;
mod header;
pub mod hparams;
mod metadata;
pub mod names;
pub mod split;
pub mod tokenizer;
mod types;
mod value;

pub use error::GgufError;
pub use experts::{ExpertProj, ExpertRanges, ExpertSpan, expert_slice, expert_tensor_name, stacked_experts};
pub use file::GgufFile;
pub use header::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, Gguf, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_KEY_BYTES,
    MAX_TENSOR_NAME_BYTES, TensorInfo, parse,
};
pub use metadata::{Metadata, optional};
pub use split::{GgufModel, TensorLoc};
pub use tokenizer::{GgufTokenizer, SpecialTokens, TokenizerKind, tokenizer_from_gguf};
pub use types::GgmlType;
pub use value::{Array, Value, ValueType, f32_as_decimal};
