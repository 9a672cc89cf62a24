//! Activation quantization as ggml-cpu does it before a quantized matvec:
//! each weight type names a `vec_dot_type` (Q8_0, Q8_1 or Q8_K) and the f32
//! activation is quantized to it once per matvec.
//!
//! Rounding. ggml has two Q8_0/Q8_1 quantizers: the scalar reference
//! (`quantize_row_q8_0_ref`: `id = 1 / (amax / 127)`, `roundf`, i.e. half
//! away from zero) and the x86 SIMD one that ggml-cpu's type traits
//! actually call on AVX/AVX2/AVX-512 builds (`quantize_row_q8_0` in
//! `arch/x86/quants.c`: `id = 127 / amax`, `_mm256_round_ps(..,
//! _MM_ROUND_NEAREST)`, i.e. half to even). They differ on exact halves
//! and where `1 / (amax / 127)` and `127 / amax` round apart. This module
//! implements the x86 one, because that is what llama.cpp multiplies with
//! on the machines colibri targets; the fixtures from ggml-cpu check it
//! byte for byte. Q8_1's `s` is `f16(d * Σ q)` as there. Q8_K has a single
//! quantizer in ggml (x86 calls the reference): `iscale = -127 / max`
//! where `max` is the first value of largest magnitude (sign kept),
//! `nearest_int` (half to even), clamped to 127, `d = 1 / iscale`, and the
//! 16-column sums `bsums`.

use half::f16;

use super::GgmlError;
use super::blocks::{QK, QK_K};
use crate::gguf::GgmlType;

/// One activation vector quantized for one ggml `vec_dot_type`, built once
/// per matvec and shared by every row. Values are kept decoded (scales as
/// f32) for the kernels; [`GgmlActs::to_bytes`] gives ggml's block bytes.
#[derive(Clone, Debug)]
pub struct GgmlActs {
    pub(crate) ty: GgmlType,
    pub(crate) cols: usize,
    /// The int8 values, `cols` of them.
    pub(crate) q: Vec<i8>,
    /// Per block: the scale as f32 (Q8_0/Q8_1: the stored f16, widened).
    pub(crate) d: Vec<f32>,
    /// Q8_0/Q8_1: the stored f16 bits of `d`, for [`GgmlActs::to_bytes`].
    d16: Vec<u16>,
    /// Q8_1 per block: `s` (f16 bits; the f32 value is in `s`).
    s16: Vec<u16>,
    pub(crate) s: Vec<f32>,
    /// Q8_K per 16 columns: the sum of the values.
    pub(crate) bsums: Vec<i16>,
    /// Q8_0/Q8_1: minus the sum of each 4 consecutive values (entry `j`
    /// for columns `4j..4j + 4`), zero-padded to a whole pair of blocks. A
    /// kernel that multiplies unsigned codes `w + c` with VNNI starts each
    /// 4-column lane from `c` times its entry and so gets exactly the lane
    /// `Σ w q` that ggml's kernels convert and add: the same lanes, hence
    /// the same f32 rounding (built once per matvec).
    pub(crate) lane_nsums: Vec<i32>,
}

/// `max` of ggml's x86 code: `_mm256_max_ps` keeps the second operand when
/// either is NaN; for finite values it is the plain maximum.
fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| {
        let a = v.abs();
        if m > a { m } else { a }
    })
}

impl GgmlActs {
    /// `x` quantized for `ty` (Q8_0, Q8_1 or Q8_K); `x.len()` must be a
    /// whole number of `ty`'s blocks.
    pub fn quantize(ty: GgmlType, x: &[f32]) -> Result<Self, GgmlError> {
        let cols = x.len();
        super::row_bytes(ty, cols)?;
        let mut a = Self {
            ty,
            cols,
            q: vec![0; cols],
            d: Vec::new(),
            d16: Vec::new(),
            s16: Vec::new(),
            s: Vec::new(),
            bsums: Vec::new(),
            lane_nsums: Vec::new(),
        };
        match ty {
            GgmlType::Q8_0 | GgmlType::Q8_1 => {
                a.lane_nsums = vec![0; 16 * (cols / QK).div_ceil(2)];
                for (b, (xb, qb)) in x.chunks_exact(QK).zip(a.q.chunks_exact_mut(QK)).enumerate() {
                    let m = amax(xb);
                    let d = m / 127.0;
                    let id = if m != 0.0 { 127.0 / m } else { 0.0 };
                    let mut sum = 0i32;
                    for (q, &v) in qb.iter_mut().zip(xb) {
                        // `as` saturates like ggml's pack instructions.
                        *q = (v * id).round_ties_even() as i8;
                        sum += i32::from(*q);
                    }
                    for (n, g) in a.lane_nsums[8 * b..8 * b + 8].iter_mut().zip(qb.chunks_exact(4)) {
                        *n = -g.iter().map(|&v| i32::from(v)).sum::<i32>();
                    }
                    let d16 = f16::from_f32(d);
                    a.d16.push(d16.to_bits());
                    a.d.push(d16.to_f32());
                    if ty == GgmlType::Q8_1 {
                        let s16 = f16::from_f32(d * sum as f32);
                        a.s16.push(s16.to_bits());
                        a.s.push(s16.to_f32());
                    }
                }
            }
            GgmlType::Q8_K => {
                for (xb, qb) in x.chunks_exact(QK_K).zip(a.q.chunks_exact_mut(QK_K)) {
                    let (mut max, mut am) = (0.0f32, 0.0f32);
                    for &v in xb {
                        if v.abs() > am {
                            am = v.abs();
                            max = v;
                        }
                    }
                    if am == 0.0 {
                        a.d.push(0.0);
                        a.bsums.extend([0; QK_K / 16]);
                        continue;
                    }
                    let iscale = -127.0 / max;
                    for (q, &v) in qb.iter_mut().zip(xb) {
                        *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
                    }
                    for s in qb.chunks_exact(16) {
                        a.bsums.push(s.iter().map(|&v| i16::from(v)).sum());
                    }
                    a.d.push(1.0 / iscale);
                }
            }
            ty => return Err(GgmlError::Unsupported { ty }),
        }
        Ok(a)
    }

    /// `x` quantized for the `vec_dot_type` of weight type `weights`.
    pub fn for_weights(weights: GgmlType, x: &[f32]) -> Result<Self, GgmlError> {
        Self::quantize(super::vec_dot_type(weights)?, x)
    }

    /// The activation type (Q8_0, Q8_1 or Q8_K).
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The int8 values.
    pub fn values(&self) -> &[i8] {
        &self.q
    }

    /// The per-block scales as f32.
    pub fn scales(&self) -> &[f32] {
        &self.d
    }

    /// The values times their block's scale (what the dot product sees).
    pub fn dequantize(&self) -> Vec<f32> {
        let block = if self.ty == GgmlType::Q8_K { QK_K } else { QK };
        self.q
            .iter()
            .enumerate()
            .map(|(j, &q)| f32::from(q) * self.d[j / block])
            .collect()
    }

    /// ggml's block bytes (`block_q8_0`, `block_q8_1`, `block_q8_K`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self.ty {
            GgmlType::Q8_K => {
                for (b, qb) in self.q.chunks_exact(QK_K).enumerate() {
                    out.extend(self.d[b].to_le_bytes());
                    out.extend(qb.iter().map(|&q| q as u8));
                    for s in &self.bsums[b * 16..(b + 1) * 16] {
                        out.extend(s.to_le_bytes());
                    }
                }
            }
            _ => {
                for (b, qb) in self.q.chunks_exact(QK).enumerate() {
                    out.extend(self.d16[b].to_le_bytes());
                    if let Some(s) = self.s16.get(b) {
                        out.extend(s.to_le_bytes());
                    }
                    out.extend(qb.iter().map(|&q| q as u8));
                }
            }
        }
        out
    }
}
