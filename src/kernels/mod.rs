//! Dot-product kernels over one weight row, in every storage format.
//!
//! The scalar versions are the reference; SIMD versions are chosen once at run
//! time from the CPU's features and are property-tested against them.

pub mod scalar;

use crate::quant::QFormat;

/// One row of a weight matrix, borrowed.
#[derive(Clone, Copy, Debug)]
pub enum RowRef<'a> {
    F32(&'a [f32]),
    Packed {
        format: QFormat,
        cols: usize,
        bytes: &'a [u8],
        scales: &'a [f32],
    },
}

/// The kernel set selected for this CPU.
#[derive(Clone, Copy, Debug)]
pub struct Kernels {
    pub name: &'static str,
}

impl Kernels {
    /// `row · x` in the row's format.
    #[inline]
    pub fn dot(&self, row: &RowRef<'_>, x: &[f32]) -> f32 {
        scalar::dot(row, x)
    }
}

/// The best kernels this CPU supports.
pub fn dispatch() -> Kernels {
    Kernels { name: "scalar" }
}
