//! What the integer (int8-activation) kernels need to know about a row,
//! shared by the AVX512-VNNI and AVX2 kernels.

use super::{NibGroups, nib_groups};
use crate::kernels::RowRef;
use crate::kernels::q8::{Lanes, QActs};
use crate::quant::QFormat;

/// How the weight scales of a row apply to a 64-byte chunk's 16 lanes.
#[derive(Clone, Copy)]
pub(super) enum Scaling {
    /// One scale for the row, applied after the reduction.
    Row(f32),
    /// Groups of whole activation blocks: lanes 0..8 and 8..16 each take
    /// the scale of their half's group (`group` columns per scale).
    Halves { group: usize },
    /// Groups of `8 << shift` columns: lane `i` takes the chunk's scale
    /// `i >> shift`, `per` scales per chunk.
    Narrow { shift: u32, per: usize },
}

/// A packed row ready for an integer kernel.
pub(super) struct Q8Row<'a> {
    /// Columns per weight byte: 1 int8, 2 int4, 4 int2.
    pub pack: usize,
    pub bytes: &'a [u8],
    /// Bytes of the row (`bytes` may be longer).
    pub nbytes: usize,
    pub scales: &'a [f32],
    pub scaling: Scaling,
    /// The activation laid out for `pack`.
    pub lanes: &'a Lanes,
}

/// The row as the integer kernels take it, or `None` when they do not
/// handle it (f32 rows, activations not laid out for the row's packing,
/// group sizes that are neither whole activation blocks nor a power of two
/// from 8 to 32): the caller then uses the scalar reference.
pub(super) fn q8_row<'a>(row: &RowRef<'a>, a: &'a QActs) -> Option<Q8Row<'a>> {
    let (format, cols, bytes, scales) = row.packed()?;
    let pack = match format {
        QFormat::Int8 => 1,
        QFormat::Int2 => 4,
        QFormat::Int4 | QFormat::Int4Grouped { .. } => 2,
        QFormat::F32 => return None,
    };
    let lanes = a.lanes(pack)?;
    let scaling = match format {
        QFormat::Int4Grouped { .. } => {
            let group = format.group_len(cols);
            match nib_groups(format, 16) {
                // Whole activation blocks per group (128-column chunks included).
                _ if group > 0 && group.is_multiple_of(64) => Scaling::Halves { group },
                Some(NibGroups::Narrow { shift, per }) => Scaling::Narrow { shift, per },
                _ => return None,
            }
        }
        _ => Scaling::Row(*scales.first()?),
    };
    Some(Q8Row {
        pack,
        bytes,
        nbytes: format.row_bytes(cols),
        scales,
        scaling,
        lanes,
    })
}
