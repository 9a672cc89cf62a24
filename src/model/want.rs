//! What a loader asks of the matrices it builds.

use crate::quant::{QFormat, QMatrix};
use crate::st::{Checkpoint, StError};

/// The format full-precision matrices are stored in (stored quantized
/// tensors keep theirs) and whether their products use int8 activations
/// ([`QMatrix::with_int8_acts`]). One value per group of matrices that a
/// loader treats alike: the dense part, the routed experts, the MTP layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixWant {
    pub format: QFormat,
    pub int8_acts: bool,
}

impl MatrixWant {
    /// Reads tensor `name` of `[rows, cols]` as asked.
    pub fn load(self, ck: &Checkpoint, name: &str, rows: usize, cols: usize) -> Result<QMatrix, StError> {
        Ok(ck
            .matrix(name, rows, cols, self.format)?
            .with_int8_acts(self.int8_acts))
    }

    /// The same choice with another storage format.
    pub fn with_format(self, format: QFormat) -> Self {
        Self { format, ..self }
    }
}
