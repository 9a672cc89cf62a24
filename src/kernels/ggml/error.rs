//! Why a ggml row or activation cannot be computed with.

use crate::gguf::GgmlType;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgmlError {
    /// No kernel here computes with this type (it can still be read).
    #[error("ggml type {ty} has no kernel (supported: {})", super::SUPPORTED.map(|t| t.name()).join(", "))]
    Unsupported { ty: GgmlType },
    /// A row length that is not a whole number of the type's blocks.
    #[error("a {ty} row of {cols} columns is not a whole number of {block}-column blocks")]
    PartialBlock { ty: GgmlType, cols: usize, block: usize },
    /// A row whose byte count does not match its columns.
    #[error("a {ty} row of {cols} columns takes {expected} bytes, got {got}")]
    RowBytes {
        ty: GgmlType,
        cols: usize,
        expected: usize,
        got: usize,
    },
    /// Activations quantized for a different vec_dot type or length.
    #[error(
        "{ty} rows of {cols} columns need {needs} activations of {cols} columns, got {got} of {got_cols}"
    )]
    Acts {
        ty: GgmlType,
        cols: usize,
        needs: GgmlType,
        got: GgmlType,
        got_cols: usize,
    },
}
