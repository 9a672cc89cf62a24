//! NEON versions of the attention inner loops (see
//! [`crate::kernels::Kernels::dot_f32`] for the contract): bit-identical to
//! the scalar definitions, so separate `vmulq` and `vaddq` (never `vfmaq`,
//! which rounds once instead of twice) and the scalar reference's lanes:
//! accumulator `k` of four holds lanes `4k..4k + 4` of
//! [`crate::model::ops::dot`]'s 16, and its tree `acc[i] += acc[i + 8]`,
//! `+ 4`, `+ 2`, `+ 1` is `a0 += a2, a1 += a3`, `a0 += a1`, low half plus
//! high half, lane 0 plus lane 1.
//!
//! The f16 cache conversion stays scalar here: stable Rust has no NEON
//! half-precision vector types yet.

use core::arch::aarch64::*;

/// `Σ a_i b_i` in [`crate::model::ops::dot`]'s order.
///
/// # Safety
/// The CPU supports NEON.
#[target_feature(enable = "neon")]
pub(in crate::kernels) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let body = n / 16 * 16;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i < body {
        for (k, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `i + 4k + 4 <= i + 16 <= body <= n`, and both slices
            // hold `n` values.
            let p = unsafe { vmulq_f32(vld1q_f32(pa.add(i + 4 * k)), vld1q_f32(pb.add(i + 4 * k))) };
            *acc = vaddq_f32(*acc, p);
        }
        i += 16;
    }
    let a0 = vaddq_f32(acc[0], acc[2]);
    let a1 = vaddq_f32(acc[1], acc[3]);
    let a0 = vaddq_f32(a0, a1);
    let s2 = vadd_f32(vget_low_f32(a0), vget_high_f32(a0));
    let s1 = vget_lane_f32::<0>(s2) + vget_lane_f32::<1>(s2);
    s1 + a[body..n]
        .iter()
        .zip(&b[body..n])
        .map(|(x, y)| x * y)
        .sum::<f32>()
}

/// `out_i = out_i + w x_i` (multiply, then add) over the common length.
///
/// # Safety
/// The CPU supports NEON.
#[target_feature(enable = "neon")]
pub(in crate::kernels) unsafe fn axpy(out: &mut [f32], w: f32, x: &[f32]) {
    let n = out.len().min(x.len());
    let body = n / 4 * 4;
    let (po, px) = (out.as_mut_ptr(), x.as_ptr());
    let wv = vdupq_n_f32(w);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 4 <= body <= n`, and both slices hold `n` values.
        unsafe {
            vst1q_f32(
                po.add(i),
                vaddq_f32(vld1q_f32(po.add(i)), vmulq_f32(wv, vld1q_f32(px.add(i)))),
            )
        };
        i += 4;
    }
    for (o, &v) in out[body..n].iter_mut().zip(&x[body..n]) {
        *o += w * v;
    }
}

/// `out_i = q_i as f32 * d` over the common length (exact widening, then
/// one multiply, as the scalar reference).
///
/// # Safety
/// The CPU supports NEON.
#[target_feature(enable = "neon")]
pub(in crate::kernels) unsafe fn dequant_i8(q: &[i8], d: f32, out: &mut [f32]) {
    let n = out.len().min(q.len());
    let body = n / 8 * 8;
    let (pq, po) = (q.as_ptr(), out.as_mut_ptr());
    let dv = vdupq_n_f32(d);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n`: 8 bytes of `q`, 32 of `out`.
        unsafe {
            let w = vmovl_s8(vld1_s8(pq.add(i)));
            vst1q_f32(
                po.add(i),
                vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), dv),
            );
            vst1q_f32(po.add(i + 4), vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(w)), dv));
        }
        i += 8;
    }
    for (o, &v) in out[body..n].iter_mut().zip(&q[body..n]) {
        *o = v as f32 * d;
    }
}
