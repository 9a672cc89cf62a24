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
        QFormat::F32 | QFormat::Ggml(_) => return None,
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

/// Consecutive rows of one packed matrix, analysed once: every row shares
/// the packing, the activation layout and the scaling kind, so the per-row
/// work of the integer kernels is two slices and a scale.
pub(crate) struct Q8Rows<'a> {
    first: Q8Row<'a>,
    /// Bytes and scales per row.
    row_bytes: usize,
    row_scales: usize,
    bytes: &'a [u8],
    scales: &'a [f32],
    rows: usize,
    cols: usize,
}

impl<'a> Q8Rows<'a> {
    /// `None` when the kernels do not take these rows (see [`q8_row`]) or
    /// the buffers are shorter than `rows` rows.
    pub(crate) fn new(
        format: QFormat,
        cols: usize,
        bytes: &'a [u8],
        scales: &'a [f32],
        rows: usize,
        a: &'a QActs,
    ) -> Option<Self> {
        let row_bytes = format.row_bytes(cols);
        let row_scales = format.scales_per_row(cols);
        if rows == 0
            || bytes.len() < rows.checked_mul(row_bytes)?
            || scales.len() < rows.checked_mul(row_scales)?
        {
            return None;
        }
        let head = RowRef::Packed {
            format,
            cols,
            bytes: &bytes[..row_bytes],
            scales: &scales[..row_scales],
        };
        let first = q8_row(&head, a)?;
        Some(Self {
            first,
            row_bytes,
            row_scales,
            bytes,
            scales,
            rows,
            cols,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.rows
    }

    pub(super) fn pack(&self) -> usize {
        self.first.pack
    }

    /// Bytes of one row.
    pub(super) fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Whether one scale per row applies (no group scales inside rows).
    pub(super) fn row_scaled(&self) -> bool {
        matches!(self.first.scaling, Scaling::Row(_))
    }

    /// Whether `a` is laid out for these rows (same length and packing).
    pub(crate) fn accepts(&self, a: &QActs) -> bool {
        a.cols() == self.cols
            && a.lanes(self.first.pack)
                .is_some_and(|l| l.chunks() == self.first.lanes.chunks())
    }

    /// `a`'s layout for these rows; callers checked [`Q8Rows::accepts`].
    pub(super) fn lanes_of<'b>(&self, a: &'b QActs) -> &'b Lanes
    where
        'a: 'b,
    {
        a.lanes(self.first.pack).unwrap_or(self.first.lanes)
    }

    /// What a tile of rows `first..first + R` against tokens
    /// `t0..t0 + T` reads: each row's bytes, each token's layout, and each
    /// row's scale (applied after the tile's sums; 1 for grouped rows).
    pub(super) fn tile_inputs<'b, const R: usize, const T: usize>(
        &self,
        first: usize,
        acts: &[&'b QActs],
        t0: usize,
    ) -> ([*const u8; R], [&'b Lanes; T], [f32; R])
    where
        'a: 'b,
    {
        let rows: [Q8Row<'_>; R] = std::array::from_fn(|r| self.row(first + r));
        let lanes = std::array::from_fn(|t| self.lanes_of(acts[t0 + t]));
        let scales = rows.each_ref().map(|r| match r.scaling {
            Scaling::Row(s) => s,
            _ => 1.0,
        });
        (rows.each_ref().map(|r| r.bytes.as_ptr()), lanes, scales)
    }

    /// Row `i` against activation `a` instead of the one analysed.
    pub(super) fn row_for<'b>(&self, i: usize, a: &'b QActs) -> Q8Row<'b>
    where
        'a: 'b,
    {
        Q8Row {
            lanes: self.lanes_of(a),
            ..self.row(i)
        }
    }

    /// Row `i < len()`.
    #[inline]
    pub(super) fn row(&self, i: usize) -> Q8Row<'a> {
        let bytes = &self.bytes[i * self.row_bytes..(i + 1) * self.row_bytes];
        let scales = &self.scales[i * self.row_scales..(i + 1) * self.row_scales];
        let scaling = match self.first.scaling {
            Scaling::Row(_) => Scaling::Row(scales[0]),
            other => other,
        };
        Q8Row {
            pack: self.first.pack,
            bytes,
            nbytes: self.row_bytes,
            scales,
            scaling,
            lanes: self.first.lanes,
        }
    }
}

/// Writes a tile's sums, each times its row's scale, to
/// `out[(t0 + t) * ldo + first + r]`.
pub(super) fn store_tile<const R: usize, const T: usize>(
    v: [[f32; T]; R],
    scales: [f32; R],
    out: &mut [f32],
    ldo: usize,
    first: usize,
    t0: usize,
) {
    for (r, (row, scale)) in v.iter().zip(scales).enumerate() {
        for (t, x) in row.iter().enumerate() {
            out[(t0 + t) * ldo + first + r] = x * scale;
        }
    }
}
