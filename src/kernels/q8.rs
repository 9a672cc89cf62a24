//! Int8-quantized activations for the opt-in integer dot-product path.
//!
//! Scheme: the activation is cut into blocks of [`Q8_BLOCK`] = 64 columns;
//! block `b` gets the scale `d_b = amax_b / 127` and values
//! `q_j = round_half_even(x_j / d_b)` in `[-127, 127]` (0 when the block is all
//! zero). A row dot product is defined as
//!
//! `Σ over segments (integer Σ_j w_j q_j) as f32 × (d_b × s_g)`
//!
//! where a segment is a run of columns sharing activation block `b` and weight
//! scale group `g`, the integer sums are exact and `d_b × s_g` is one f32
//! product. That is the scalar reference; the SIMD kernels cut segments into
//! smaller exact integer runs (16 lanes of a 64-byte weight chunk) and may
//! apply a row scale once at the end, so they differ from it only in f32
//! rounding, in an order fixed by the row's length. F32 weight rows use
//! `w_j × (q_j × d_b)` in f32.

use super::RowRef;
use super::scalar::unpack;
use crate::quant::QFormat;

/// Activation columns per quantization block.
pub const Q8_BLOCK: usize = 64;

/// An activation vector quantized to int8 per block of 64 columns, padded
/// with zeros to a whole number of blocks; optionally also laid out for the
/// integer SIMD kernels of one weight packing ([`QActs::quantize_for`]).
#[derive(Clone, Debug)]
pub struct QActs {
    cols: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    lanes: Option<Lanes>,
}

/// Columns per weight byte of a packed format (1 int8, 2 int4, 4 int2).
fn pack_of(format: QFormat) -> Option<usize> {
    match format {
        QFormat::Int8 => Some(1),
        QFormat::Int4 | QFormat::Int4Grouped { .. } => Some(2),
        QFormat::Int2 => Some(4),
        // ggml blocks bring their own activation types (`kernels::ggml`).
        QFormat::F32 | QFormat::Ggml(_) => None,
    }
}

/// A zeroed buffer whose first element sits on a 64-byte boundary, so the
/// kernels' 64-byte loads never split a cache line.
// The layout is read only by the x86 integer kernels (no NEON one yet).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Clone, Debug)]
pub(crate) struct Aligned<T> {
    buf: Vec<T>,
    off: usize,
    len: usize,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl<T: Copy + Default> Aligned<T> {
    fn zeroed(len: usize) -> Self {
        let spare = 64 / size_of::<T>();
        let buf = vec![T::default(); len + spare];
        let off = buf.as_ptr().align_offset(64).min(spare);
        Self { buf, off, len }
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        &self.buf[self.off..self.off + self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.buf[self.off..self.off + self.len]
    }
}

/// The activations as the integer kernels read them against weights
/// packed `pack` columns to a byte. The row is cut in chunks of
/// `64 * pack` columns (64 weight bytes); a chunk's weight bytes are read
/// as 16 lanes of 4 bytes, lane `i` holding the chunk's columns
/// `4 pack i .. 4 pack (i + 1)`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Clone, Debug)]
pub(crate) struct Lanes {
    /// Columns per weight byte.
    pub(crate) pack: usize,
    /// Per chunk, `pack` planes of 64 values: byte `j` of plane `k` is the
    /// value of column `pack j + k`, the one that meets field `k` of weight
    /// byte `j`.
    pub(crate) planes: Aligned<i8>,
    /// Per chunk, per lane: `-offset × Σ q` over the lane's columns, where
    /// the kernels read weight `w` as the unsigned `w + offset` (128 for
    /// int8, 8 for int4, 2 for int2). Starting a lane from it leaves the
    /// exact `Σ w q` of its columns.
    pub(crate) corr: Aligned<i32>,
    /// Per chunk, per lane: the scale of the activation block holding the
    /// lane's columns (0 past the end).
    pub(crate) dvec: Aligned<f32>,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl Lanes {
    fn new(q: &[i8], d: &[f32], cols: usize, pack: usize) -> Self {
        let chunk = 64 * pack;
        let chunks = cols.div_ceil(chunk);
        let offset = match pack {
            1 => 128,
            2 => 8,
            _ => 2,
        };
        let mut planes = Aligned::<i8>::zeroed(chunks * chunk);
        let mut corr = Aligned::<i32>::zeroed(chunks * 16);
        let mut dvec = Aligned::<f32>::zeroed(chunks * 16);
        // The values padded with zeros to whole chunks, so every chunk is a
        // plain slice.
        let mut padded = vec![0i8; chunks * chunk];
        let n = q.len().min(padded.len());
        padded[..n].copy_from_slice(&q[..n]);
        let pl = planes.as_mut_slice().chunks_exact_mut(chunk);
        let co = corr.as_mut_slice().chunks_exact_mut(16);
        let dv = dvec.as_mut_slice().chunks_exact_mut(16);
        for (c, (((src, pl), co), dv)) in padded.chunks_exact(chunk).zip(pl).zip(co).zip(dv).enumerate() {
            if pack == 1 {
                pl.copy_from_slice(src);
            } else {
                for (j, cols) in src.chunks_exact(pack).enumerate() {
                    for (k, &v) in cols.iter().enumerate() {
                        pl[64 * k + j] = v;
                    }
                }
            }
            // Lane `i` holds the chunk's columns `4 pack i .. 4 pack (i + 1)`.
            for (i, (lane, slot)) in src.chunks_exact(4 * pack).zip(co.iter_mut()).enumerate() {
                *slot = -offset * lane.iter().map(|&v| v as i32).sum::<i32>();
                dv[i] = d
                    .get((c * chunk + 4 * pack * i) / Q8_BLOCK)
                    .copied()
                    .unwrap_or(0.0);
            }
        }
        Self {
            pack,
            planes,
            corr,
            dvec,
        }
    }

    /// Chunks of `64 * pack` columns.
    pub(crate) fn chunks(&self) -> usize {
        self.dvec.len / 16
    }
}

impl QActs {
    /// Quantizes `x` (see the module docs for the scheme).
    pub fn quantize(x: &[f32]) -> Self {
        let blocks = x.len().div_ceil(Q8_BLOCK);
        let mut q = vec![0i8; blocks * Q8_BLOCK];
        let mut d = Vec::with_capacity(blocks);
        for (xb, qb) in x.chunks(Q8_BLOCK).zip(q.chunks_mut(Q8_BLOCK)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / 127.0;
            d.push(scale);
            if scale > 0.0 && scale.is_finite() {
                let inv = 1.0 / scale;
                // Round half to even by adding and removing 1.5 × 2^23: exact
                // for |v × inv| <= 127 (f32 addition rounds to nearest even),
                // the same as `round_ties_even`, and vectorizes where that
                // is a library call.
                const SHIFT: f32 = 12_582_912.0;
                for (o, v) in qb.iter_mut().zip(xb) {
                    let r = ((v * inv).clamp(-127.0, 127.0) + SHIFT) - SHIFT;
                    *o = r as i8;
                }
            }
        }
        Self {
            cols: x.len(),
            q,
            d,
            lanes: None,
        }
    }

    /// [`QActs::quantize`], plus the layout the integer SIMD kernels want
    /// for rows in `format`: prepare once per matvec, then every row of that
    /// format takes the fast path. The values are the same either way.
    pub fn quantize_for(format: QFormat, x: &[f32]) -> Self {
        let mut a = Self::quantize(x);
        a.lanes = pack_of(format).map(|pack| Lanes::new(&a.q, &a.d, a.cols, pack));
        a
    }

    /// Logical length (before padding).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Quantized values, padded to a multiple of 64.
    pub fn values(&self) -> &[i8] {
        &self.q
    }

    /// One scale per block of 64 columns.
    pub fn block_scales(&self) -> &[f32] {
        &self.d
    }

    /// The SIMD layout, when it was built for rows packed `pack` columns to
    /// a byte.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn lanes(&self, pack: usize) -> Option<&Lanes> {
        self.lanes.as_ref().filter(|l| l.pack == pack)
    }
}

/// Scalar reference of the quantized-activation dot product.
pub fn dot_ref(row: &RowRef<'_>, a: &QActs) -> f32 {
    match *row {
        RowRef::F32(w) => w
            .iter()
            .enumerate()
            .map(|(j, wv)| wv * (a.q[j] as f32 * a.d[j / Q8_BLOCK]))
            .sum(),
        RowRef::Packed {
            format,
            cols,
            bytes,
            scales,
        } => {
            if format == QFormat::F32 {
                return 0.0;
            }
            let group = format.group_len(cols);
            let mut total = 0f32;
            let mut j = 0;
            while j < cols {
                let (b, g) = (j / Q8_BLOCK, j / group);
                let end = ((b + 1) * Q8_BLOCK).min((g + 1) * group).min(cols);
                let isum: i32 = (j..end).map(|k| unpack(format, bytes, k) * a.q[k] as i32).sum();
                total += isum as f32 * (a.d[b] * scales[g]);
                j = end;
            }
            total
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantizes_per_block_within_half_a_step() {
        let x: Vec<f32> = (0..150).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.3).collect();
        let a = QActs::quantize(&x);
        assert_eq!(a.values().len(), 192);
        assert_eq!(a.block_scales().len(), 3);
        for (j, &v) in x.iter().enumerate() {
            let d = a.block_scales()[j / Q8_BLOCK];
            assert!((a.values()[j] as f32 * d - v).abs() <= d * 0.5 + 1e-6, "col {j}");
        }
        assert!(a.values()[150..].iter().all(|&v| v == 0));
    }

    #[test]
    fn rounding_is_round_half_to_even() {
        // Ties on both sides of zero, and values next to them.
        let x: Vec<f32> = (-254..=254)
            .flat_map(|i| [i as f32 * 0.5, i as f32 * 0.5 + 0.01, i as f32 * 0.5 - 0.01])
            .chain([127.0])
            .collect();
        for block in x.chunks(Q8_BLOCK) {
            let a = QActs::quantize(block);
            let inv = 1.0 / a.block_scales()[0];
            for (&v, &q) in block.iter().zip(a.values()) {
                let want = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
                assert_eq!(q, want, "{v}");
            }
        }
    }

    #[test]
    fn zero_block_has_zero_scale() {
        let a = QActs::quantize(&[0.0; 70]);
        assert!(a.values().iter().all(|&v| v == 0));
        assert_eq!(a.block_scales(), &[0.0, 0.0]);
    }

    #[test]
    fn reference_is_close_to_f32_dot() {
        let cols = 200;
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.31).sin()).collect();
        let bytes: Vec<u8> = (0..cols).map(|i| (i * 29 % 251) as u8).collect();
        let row = RowRef::Packed {
            format: QFormat::Int8,
            cols,
            bytes: &bytes,
            scales: &[0.01],
        };
        let exact = super::super::scalar::dot(&row, &x);
        let approx = dot_ref(&row, &QActs::quantize(&x));
        let mag: f32 = bytes
            .iter()
            .zip(&x)
            .map(|(&b, v)| (b as i8 as f32 * v).abs())
            .sum::<f32>()
            * 0.01;
        assert!((exact - approx).abs() < 0.01 * mag, "{exact} vs {approx}");
    }
}
