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
//! product. Implementations may only differ in the order the f32 segment
//! values are added. F32 weight rows use `w_j × (q_j × d_b)` in f32.

use super::RowRef;
use super::scalar::unpack;
use crate::quant::QFormat;

/// Activation columns per quantization block.
pub const Q8_BLOCK: usize = 64;

/// An activation vector quantized to int8 per block of 64 columns, padded
/// with zeros to a whole number of blocks.
#[derive(Clone, Debug)]
pub struct QActs {
    cols: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    lane_sums: Vec<i32>,
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
                for (o, v) in qb.iter_mut().zip(xb) {
                    *o = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
                }
            }
        }
        let lane_sums = q
            .chunks_exact(4)
            .map(|c| c.iter().map(|&v| v as i32).sum())
            .collect();
        Self {
            cols: x.len(),
            q,
            d,
            lane_sums,
        }
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

    /// Sum of each run of 4 quantized values (the SIMD path's offset
    /// correction).
    pub(crate) fn lane_sums(&self) -> &[i32] {
        &self.lane_sums
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
        assert_eq!(a.lane_sums().len(), 48);
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
