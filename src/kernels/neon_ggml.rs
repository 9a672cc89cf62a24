//! NEON dot products of ggml block rows (aarch64), every supported type.
//!
//! The expensive part of a block's dot product is its integer sum: the
//! codes decoded to signed bytes in NEON registers (nibble splits, fifth
//! and high bits by bit tests, IQ4/MXFP4 values by a table lookup) and
//! multiplied against the int8 activations with widening multiplies
//! (`vmull_s8` + `vmlal_high_s8`: two products of at most 128 · 127 fit an
//! i16 lane) and pairwise widening adds. The K-quants decode a whole
//! 256-column super-block and take one exact i32 sum per 16 columns, then
//! the sub-block scales in integers. Integer sums are exact in any order,
//! and the f32 terms are then formed and added exactly as the scalar
//! reference ([`super::ggml::vec_dot`]) forms and adds them, so a NEON
//! result equals the reference bit for bit (the aarch64 property test
//! checks it).

use core::arch::aarch64::*;

use super::ggml::GgmlActs;
use super::ggml::blocks::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_half, f16_at, q3k_scales, scales_mins_k4};
use super::ggml::iq4::xs_scale;
use super::ggml::k_quants::k_terms;
use crate::gguf::GgmlType;

/// The types with a NEON kernel.
pub(super) fn has(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | IQ4_NL | MXFP4 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS
    )
}

/// `Σ w a` over 32 columns held as two 16-byte halves each.
#[inline]
#[target_feature(enable = "neon")]
fn dot32(w: (int8x16_t, int8x16_t), a: (int8x16_t, int8x16_t)) -> i32 {
    vaddvq_s32(vaddq_s32(pair_sums(w.0, a.0), pair_sums(w.1, a.1)))
}

/// Four i32 lanes summing the 16 products `w a`.
#[inline]
#[target_feature(enable = "neon")]
fn pair_sums(w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let p = vmlal_high_s8(vmull_s8(vget_low_s8(w), vget_low_s8(a)), w, a);
    vpaddlq_s16(p)
}

/// 16 bytes as their low nibbles (columns `j`) and high nibbles (`j + 16`).
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(v: uint8x16_t) -> (uint8x16_t, uint8x16_t) {
    (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v))
}

/// Bit `k` of `bits` for `k` in `0..16`, as 0x10 in byte `k` or 0.
#[inline]
#[target_feature(enable = "neon")]
fn fifth_bits(bits: u16) -> uint8x16_t {
    let [lo, hi] = bits.to_le_bytes();
    let x = vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi));
    let sel = vcombine_u8(
        vcreate_u8(0x8040_2010_0804_0201),
        vcreate_u8(0x8040_2010_0804_0201),
    );
    vandq_u8(vtstq_u8(x, sel), vdupq_n_u8(0x10))
}

/// 16 indices (0..16) through a 16-entry signed table.
#[inline]
#[target_feature(enable = "neon")]
fn lookup(table: int8x16_t, idx: uint8x16_t) -> int8x16_t {
    vqtbl1q_s8(table, idx)
}

/// The signed values of one 32-column block (as two halves) and, for Q4_1
/// and Q5_1, nothing more: their codes are unsigned, offsets apart.
///
/// # Safety
/// `b` is one whole block of `ty`, a 32-column type.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn decode32(ty: GgmlType, b: &[u8]) -> (int8x16_t, int8x16_t) {
    let p = b.as_ptr();
    let s = vreinterpretq_s8_u8;
    // SAFETY: every load lies inside the block (the caller's guarantee):
    // Q8_0's 32 values at 2, the 16 nibble bytes at 2 (Q4_0, IQ4_NL), 4
    // (Q4_1), 6 (Q5_0), 8 (Q5_1) or 1 (MXFP4), the 5th bits at 2 or 4.
    unsafe {
        match ty {
            GgmlType::Q8_0 => (vld1q_s8(p.add(2).cast()), vld1q_s8(p.add(18).cast())),
            GgmlType::Q4_0 => {
                let (lo, hi) = nibbles(vld1q_u8(p.add(2)));
                let eight = vdupq_n_s8(8);
                (vsubq_s8(s(lo), eight), vsubq_s8(s(hi), eight))
            }
            GgmlType::Q4_1 => {
                let (lo, hi) = nibbles(vld1q_u8(p.add(4)));
                (s(lo), s(hi))
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let (qh_at, qs_at) = if ty == GgmlType::Q5_0 { (2, 6) } else { (4, 8) };
                let qh = u32::from_le_bytes([b[qh_at], b[qh_at + 1], b[qh_at + 2], b[qh_at + 3]]);
                let (lo, hi) = nibbles(vld1q_u8(p.add(qs_at)));
                let lo = vorrq_u8(lo, fifth_bits(qh as u16));
                let hi = vorrq_u8(hi, fifth_bits((qh >> 16) as u16));
                if ty == GgmlType::Q5_0 {
                    let sixteen = vdupq_n_s8(16);
                    (vsubq_s8(s(lo), sixteen), vsubq_s8(s(hi), sixteen))
                } else {
                    (s(lo), s(hi))
                }
            }
            GgmlType::IQ4_NL => {
                let t = vld1q_s8(KVALUES_IQ4NL.as_ptr());
                let (lo, hi) = nibbles(vld1q_u8(p.add(2)));
                (lookup(t, lo), lookup(t, hi))
            }
            _ => {
                let t = vld1q_s8(KVALUES_MXFP4.as_ptr());
                let (lo, hi) = nibbles(vld1q_u8(p.add(1)));
                (lookup(t, lo), lookup(t, hi))
            }
        }
    }
}

/// The 256 signed values of one K-quant super-block in column order.
///
/// # Safety
/// `b` is one whole super-block of `ty` (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or
/// IQ4_XS).
#[target_feature(enable = "neon")]
unsafe fn decode256(ty: GgmlType, b: &[u8], out: &mut [i8; 256]) {
    let p = b.as_ptr();
    let o = out.as_mut_ptr();
    let s = vreinterpretq_s8_u8;
    let three = vdupq_n_u8(3);
    // SAFETY: every load lies inside the super-block (the offsets below
    // are those of the layouts in ggml/k_quants.rs and ggml/iq4.rs), every
    // store inside `out`.
    unsafe {
        match ty {
            GgmlType::Q2_K | GgmlType::Q3_K => {
                // Column 128n + 32j + l: bits 2j of byte l of the n-th 32.
                let qs = if ty == GgmlType::Q2_K { 16 } else { 32 };
                let hm = [vld1q_u8(p), vld1q_u8(p.add(16))];
                for n in 0..2 {
                    for (h, &hm) in hm.iter().enumerate() {
                        let q = vld1q_u8(p.add(qs + 32 * n + 16 * h));
                        for j in 0..4 {
                            let shift = vdupq_n_s8(-(2 * j as i8));
                            let mut v = s(vandq_u8(vshlq_u8(q, shift), three));
                            if ty == GgmlType::Q3_K {
                                // Minus 4 where the high-mask bit 4n + j
                                // of byte l is clear.
                                let bit = vdupq_n_u8(1 << (4 * n + j));
                                let set = vtstq_u8(hm, bit);
                                v = vsubq_s8(v, s(vbicq_u8(vdupq_n_u8(4), set)));
                            }
                            vst1q_s8(o.add(128 * n + 32 * j + 16 * h), v);
                        }
                    }
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                // Column 64n + l (l < 32): low nibble of qs[32n + l], the
                // next 32 its high nibble; Q5_K's bit c / 32 of qh[l].
                let q5 = ty == GgmlType::Q5_K;
                let qs = if q5 { 48 } else { 16 };
                let qh = [vld1q_u8(p.add(16)), vld1q_u8(p.add(32))];
                for n in 0..4 {
                    for (h, &qh) in qh.iter().enumerate() {
                        let (mut lo, mut hi) = nibbles(vld1q_u8(p.add(qs + 32 * n + 16 * h)));
                        if q5 {
                            let bit = |k: usize| vandq_u8(vtstq_u8(qh, vdupq_n_u8(1 << k)), vdupq_n_u8(0x10));
                            lo = vorrq_u8(lo, bit(2 * n));
                            hi = vorrq_u8(hi, bit(2 * n + 1));
                        }
                        vst1q_s8(o.add(64 * n + 16 * h), s(lo));
                        vst1q_s8(o.add(64 * n + 32 + 16 * h), s(hi));
                    }
                }
            }
            GgmlType::Q6_K => {
                // Column 128n + 32j + l: nibble (low for j < 2) of
                // ql[64n + l + 32 (j % 2)], bits 2j of qh[32n + l] above.
                let m32 = vdupq_n_s8(32);
                for n in 0..2 {
                    for h in 0..2 {
                        let qh = vld1q_u8(p.add(128 + 32 * n + 16 * h));
                        for j in 0..4 {
                            let ql = vld1q_u8(p.add(64 * n + 16 * h + 32 * (j % 2)));
                            let low = if j < 2 {
                                vandq_u8(ql, vdupq_n_u8(0x0F))
                            } else {
                                vshrq_n_u8::<4>(ql)
                            };
                            let high = vandq_u8(vshlq_u8(qh, vdupq_n_s8(-(2 * j as i8))), three);
                            let v = vorrq_u8(low, vshlq_n_u8::<4>(high));
                            vst1q_s8(o.add(128 * n + 32 * j + 16 * h), vsubq_s8(s(v), m32));
                        }
                    }
                }
            }
            _ => {
                // IQ4_XS: sub-block ib's 16 nibble bytes at 8 + 16 ib.
                let t = vld1q_s8(KVALUES_IQ4NL.as_ptr());
                for ib in 0..8 {
                    let (lo, hi) = nibbles(vld1q_u8(p.add(8 + 16 * ib)));
                    vst1q_s8(o.add(32 * ib), lookup(t, lo));
                    vst1q_s8(o.add(32 * ib + 16), lookup(t, hi));
                }
            }
        }
    }
}

/// The exact `Σ w q` of each 16 columns of a super-block.
///
/// # Safety
/// `q` holds 256 activations.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn sums16(w: &[i8; 256], q: &[i8]) -> [i32; 16] {
    debug_assert!(q.len() >= 256);
    let mut s = [0i32; 16];
    for (g, sg) in s.iter_mut().enumerate() {
        // SAFETY: 16 values at `16 g < 256` in both.
        let (wv, av) = unsafe { (vld1q_s8(w.as_ptr().add(16 * g)), vld1q_s8(q.as_ptr().add(16 * g))) };
        *sg = vaddvq_s32(pair_sums(wv, av));
    }
    s
}

/// A super-block's exact integer sum from its 16-column sums: each
/// sub-block's sum times its scale.
fn k_isum(ty: GgmlType, b: &[u8], s: &[i32; 16]) -> i32 {
    let pair = |k: usize| s[2 * k] + s[2 * k + 1];
    match ty {
        GgmlType::Q2_K => (0..16).map(|k| i32::from(b[k] & 0xF) * s[k]).sum(),
        GgmlType::Q3_K => {
            let sc = q3k_scales(&b[96..108]);
            (0..16).map(|k| i32::from(sc[k]) * s[k]).sum()
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (sc, _) = scales_mins_k4(&b[4..16]);
            (0..8).map(|k| i32::from(sc[k]) * pair(k)).sum()
        }
        GgmlType::Q6_K => (0..16).map(|k| i32::from(b[192 + k] as i8) * s[k]).sum(),
        _ => (0..8).map(|ib| xs_scale(b, ib) * pair(ib)).sum(),
    }
}

/// `row · acts`, or `None` when `ty` has no NEON kernel.
///
/// # Safety
/// The CPU has NEON; `row` and `acts` passed `check_acts` for `ty`.
#[target_feature(enable = "neon")]
pub(super) unsafe fn dot(ty: GgmlType, row: &[u8], acts: &GgmlActs) -> Option<f32> {
    if !has(ty) {
        return None;
    }
    let (block, size) = (ty.block_size() as usize, ty.type_size() as usize);
    let mut total = 0.0f32;
    if block == 32 {
        for (i, b) in row.chunks_exact(size).enumerate() {
            let q = &acts.q[32 * i..32 * i + 32];
            // SAFETY: `b` is one whole block; `q` has 32 values.
            let (w, a) = unsafe {
                (
                    decode32(ty, b),
                    (vld1q_s8(q.as_ptr()), vld1q_s8(q.as_ptr().add(16))),
                )
            };
            let isum = dot32(w, a);
            let d = acts.d[i];
            let [t0, t1] = match ty {
                GgmlType::MXFP4 => [(d * e8m0_half(b[0])) * isum as f32, 0.0],
                GgmlType::Q4_1 | GgmlType::Q5_1 => {
                    [(f16_at(b, 0) * d) * isum as f32, f16_at(b, 2) * acts.s[i]]
                }
                _ => [isum as f32 * (f16_at(b, 0) * d), 0.0],
            };
            total += t0 + t1;
        }
    } else {
        let mut w = [0i8; 256];
        for (i, b) in row.chunks_exact(size).enumerate() {
            // SAFETY: `b` is one whole super-block of `ty`; `check_acts`
            // made the activations 256 values a super-block.
            let s = unsafe {
                decode256(ty, b, &mut w);
                sums16(&w, &acts.q[256 * i..256 * i + 256])
            };
            let bsums = acts.bsums.get(16 * i..16 * i + 16).unwrap_or(&[]);
            let [t0, t1] = k_terms(ty, b, k_isum(ty, b, &s), acts.d[i], bsums);
            total += t0 + t1;
        }
    }
    Some(total)
}
