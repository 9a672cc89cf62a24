//! Safetensors checkpoints and colibri streaming containers.
//!
//! Both Hugging Face checkpoint directories and the containers written by
//! `coli convert` are read through one [`Checkpoint`]: every file is memory
//! mapped and its header validated completely at open, so a hostile or
//! truncated file is refused with a message naming the file and the tensor
//! instead of crashing later in model code.
//!
//! Quantized tensors (docs/formats.md) are U8/I8 bytes plus a sibling
//! `<name>.qs` F32 tensor. The byte tensor may be 2-D `[O, bytes_per_row]`
//! (what `coli convert` writes, upstream compatible) or 1-D flat; either way
//! its total byte count must match exactly one layout for the logical
//! `[rows, cols]` the model asks for.
//!
//! Tensors whose name starts with [`PAD_PREFIX`] are alignment filler written
//! by `coli convert`; they are validated like any tensor but never listed.

mod checkpoint;
mod decode;
mod error;
pub mod fp8;
pub mod ggml_blocks;
mod header;
pub mod view;

pub use checkpoint::{Checkpoint, MatrixParts, TensorMeta};
pub use decode::{decode_f32, matrix_from_bytes};
pub use error::StError;
pub use header::{HeaderTensor, ParsedHeader, parse_header};
pub use safetensors::Dtype;
pub use view::View;

/// Name prefix of the padding tensors that align experts in a container.
pub const PAD_PREFIX: &str = "__pad__.";

/// Suffix of the F32 scale tensor that accompanies a quantized tensor.
pub const SCALE_SUFFIX: &str = ".qs";

/// Largest header accepted (the limit the safetensors crate uses too).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;
