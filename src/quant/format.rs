//! The quantized layouts and how a stored tensor's format is recognised.

use std::fmt;

use super::QuantError;
use crate::gguf::GgmlType;

/// How a matrix's weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QFormat {
    F32,
    /// One signed byte per weight, one scale per row.
    Int8,
    /// Two weights per byte (low nibble first, value = nibble - 8), one scale per row.
    Int4,
    /// As `Int4` with one scale per `group` columns of each row.
    Int4Grouped {
        group: usize,
    },
    /// Four weights per byte (low bits first, value = field - 2), one scale per row.
    Int2,
    /// ggml's blocks of a GGUF file, kept as stored (scales inside the
    /// blocks, so no separate scale vector) and multiplied as llama.cpp
    /// multiplies them: the activation quantized to the type's
    /// `vec_dot_type` (Q8_0, Q8_1 or Q8_K) and integer block sums
    /// ([`crate::kernels::ggml`]). Only the types those kernels support.
    Ggml(GgmlType),
}

impl QFormat {
    /// The format `--expert-bits` / `--dense-bits` ask for.
    pub fn from_bits(bits: u32) -> Result<Self, QuantError> {
        match bits {
            16.. => Ok(Self::F32),
            5..=8 => Ok(Self::Int8),
            3..=4 => Ok(Self::Int4),
            2 => Ok(Self::Int2),
            _ => Err(QuantError::Bits(bits)),
        }
    }

    /// Largest quantized magnitude (`2^(bits-1) - 1`).
    pub fn qmax(self) -> i32 {
        match self {
            Self::F32 => 0,
            Self::Int8 => 127,
            Self::Int4 | Self::Int4Grouped { .. } => 7,
            Self::Int2 => 1,
            Self::Ggml(_) => 0,
        }
    }

    /// Bytes one row of `cols` weights occupies.
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            Self::F32 => cols * 4,
            Self::Int8 => cols,
            Self::Int4 | Self::Int4Grouped { .. } => cols.div_ceil(2),
            Self::Int2 => cols.div_ceil(4),
            // Whole blocks: a matrix of this format is only built after
            // its row length was checked against the block size.
            Self::Ggml(ty) => cols / ty.block_size() as usize * ty.type_size() as usize,
        }
    }

    /// Scales per row.
    pub fn scales_per_row(self, cols: usize) -> usize {
        match self {
            Self::F32 | Self::Ggml(_) => 0,
            Self::Int4Grouped { group } => cols.div_ceil(group),
            _ => 1,
        }
    }

    /// The ggml block type, for a matrix kept in a GGUF's blocks.
    pub fn ggml(self) -> Option<GgmlType> {
        match self {
            Self::Ggml(ty) => Some(ty),
            _ => None,
        }
    }

    /// Columns one scale covers.
    pub fn group_len(self, cols: usize) -> usize {
        match self {
            Self::Int4Grouped { group } => group,
            _ => cols.max(1),
        }
    }
}

impl fmt::Display for QFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::F32 => write!(f, "f32"),
            Self::Int8 => write!(f, "int8"),
            Self::Int4 => write!(f, "int4"),
            Self::Int4Grouped { group } => write!(f, "int4-g{group}"),
            Self::Int2 => write!(f, "int2"),
            Self::Ggml(ty) => write!(f, "{}", ty.name()),
        }
    }
}

/// Recognises the layout of a stored quantized tensor of logical shape
/// `[rows, cols]` from its byte and scale counts. Exactly one layout must
/// match; anything else is refused rather than guessed.
pub fn infer_format(rows: usize, cols: usize, bytes: usize, scales: usize) -> Result<QFormat, QuantError> {
    let mut candidates: Vec<QFormat> = Vec::new();
    let fits = |f: QFormat| {
        rows.checked_mul(f.row_bytes(cols)) == Some(bytes)
            && rows.checked_mul(f.scales_per_row(cols)) == Some(scales)
    };
    for f in [QFormat::Int8, QFormat::Int4, QFormat::Int2] {
        if fits(f) {
            candidates.push(f);
        }
    }
    if rows > 0 && scales.is_multiple_of(rows) && scales / rows > 1 {
        let per_row = scales / rows;
        // The group size is the smallest one giving `per_row` groups.
        let gs = cols.div_ceil(per_row);
        let f = QFormat::Int4Grouped { group: gs };
        if (16..=256).contains(&gs) && cols.div_ceil(gs) == per_row && fits(f) {
            candidates.push(f);
        }
    }
    match candidates.as_slice() {
        [one] => Ok(*one),
        [] => Err(QuantError::NoLayout {
            rows,
            cols,
            bytes,
            scales,
        }),
        [first, second, ..] => Err(QuantError::Ambiguous {
            rows,
            cols,
            bytes,
            scales,
            first: *first,
            second: *second,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_each_layout() {
        assert_eq!(infer_format(4, 64, 256, 4), Ok(QFormat::Int8));
        assert_eq!(infer_format(4, 64, 128, 4), Ok(QFormat::Int4));
        assert_eq!(infer_format(4, 64, 64, 4), Ok(QFormat::Int2));
        assert_eq!(
            infer_format(4, 128, 256, 8),
            Ok(QFormat::Int4Grouped { group: 64 })
        );
        assert!(matches!(
            infer_format(4, 64, 100, 4),
            Err(QuantError::NoLayout { .. })
        ));
        // 2 columns: int4 and int2 both take one byte per row.
        assert!(matches!(
            infer_format(3, 2, 3, 3),
            Err(QuantError::Ambiguous { .. })
        ));
    }
}
