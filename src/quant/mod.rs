//! Quantized weight matrices in the byte layouts of docs/formats.md ("Quantized tensors").
//!
//! A [`QMatrix`] is what every linear layer holds, whatever its precision, so
//! model code is written once and `--expert-bits` / `--dense-bits` only change
//! what is stored.

mod format;
mod matrix;
mod mxfp4;
mod quantize;
mod store;

pub use format::{QFormat, infer_format};
pub use matrix::QMatrix;
pub use mxfp4::mxfp4_value;
pub use quantize::{quantize_matrix, round_half_even};
pub use store::ByteStore;

/// Why a quantized tensor could not be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QuantError {
    #[error("{what}: shape [{rows}, {cols}] needs {expected} values, got {got}")]
    Size {
        what: &'static str,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("{bytes} bytes and {scales} scales match no quantized layout of shape [{rows}, {cols}]")]
    NoLayout {
        rows: usize,
        cols: usize,
        bytes: usize,
        scales: usize,
    },
    #[error(
        "{bytes} bytes and {scales} scales are ambiguous for shape [{rows}, {cols}] (they fit {first} and {second})"
    )]
    Ambiguous {
        rows: usize,
        cols: usize,
        bytes: usize,
        scales: usize,
        first: QFormat,
        second: QFormat,
    },
    #[error("unsupported bit width {0} (use >=16 for f32, 5..8 int8, 3..4 int4, 2 int2)")]
    Bits(u32),
    #[error("cannot quantize into ggml's {0} blocks: they are read from GGUF files as stored, never written")]
    GgmlTarget(crate::gguf::GgmlType),
    #[error("{ty} rows of {cols} columns: {reason}")]
    Ggml {
        ty: crate::gguf::GgmlType,
        cols: usize,
        reason: String,
    },
    #[error("scale {index} is not a finite positive number ({value})")]
    BadScale { index: usize, value: f32 },
}
