//! NEON kernels (aarch64): f32 and int8 rows; the other formats use the
//! scalar reference. Four accumulators of 4 lanes over chunks of 16 columns,
//! pairwise sum, lane reduction, then the leftover columns in order.

use core::arch::aarch64::*;

use super::{RowRef, scalar};
use crate::quant::QFormat;

/// # Safety
/// `w` holds `cols` values (f32 when `I8` is false, i8 bytes otherwise) and
/// `x` holds `cols` values.
#[target_feature(enable = "neon")]
unsafe fn row_dot<const I8: bool>(w: *const u8, cols: usize, x: *const f32) -> f32 {
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut j = 0;
    // SAFETY: every load reads columns below `cols`.
    unsafe {
        while j + 16 <= cols {
            let ws = if I8 {
                let v = vld1q_s8(w.add(j).cast());
                let lo = vmovl_s8(vget_low_s8(v));
                let hi = vmovl_high_s8(v);
                [
                    vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
                    vcvtq_f32_s32(vmovl_high_s16(lo)),
                    vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
                    vcvtq_f32_s32(vmovl_high_s16(hi)),
                ]
            } else {
                let p = w.cast::<f32>().add(j);
                [
                    vld1q_f32(p),
                    vld1q_f32(p.add(4)),
                    vld1q_f32(p.add(8)),
                    vld1q_f32(p.add(12)),
                ]
            };
            for (k, wk) in ws.into_iter().enumerate() {
                acc[k] = vfmaq_f32(acc[k], wk, vld1q_f32(x.add(j + 4 * k)));
            }
            j += 16;
        }
        let mut total = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
        while j < cols {
            let wv = if I8 {
                *w.add(j).cast::<i8>() as f32
            } else {
                *w.cast::<f32>().add(j)
            };
            total += wv * *x.add(j);
            j += 1;
        }
        total
    }
}

/// `row · x_t` for each of the `T` activations.
///
/// # Safety
/// The CPU supports NEON; the row's buffers and every `xs[t]` hold what
/// `RowRef::check` requires.
pub(super) unsafe fn dot_n<const T: usize>(row: &RowRef<'_>, xs: [&[f32]; T]) -> [f32; T] {
    match *row {
        // SAFETY: guaranteed by this function's contract.
        RowRef::F32(w) => xs.map(|x| unsafe { row_dot::<false>(w.as_ptr().cast(), w.len(), x.as_ptr()) }),
        RowRef::Packed {
            format: QFormat::Int8,
            cols,
            bytes,
            scales,
        } => {
            let s = scales.first().copied().unwrap_or(1.0);
            // SAFETY: guaranteed by this function's contract.
            xs.map(|x| unsafe { row_dot::<true>(bytes.as_ptr(), cols, x.as_ptr()) } * s)
        }
        _ => xs.map(|x| scalar::dot(row, x)),
    }
}
