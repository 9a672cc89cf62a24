//! The K-quants: 256-column super-blocks with one or two f16 super-scales
//! and 16 (Q2_K, Q3_K, Q6_K) or 8 (Q4_K, Q5_K) sub-block scales.
//!
//! Layouts (`ggml-common.h`):
//! - Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin;
//! - Q3_K: hmask[32], qs[64], scales[12] (6-bit, minus 32), d;
//! - Q4_K: d, dmin, scales[12] (6-bit scale and min per 32), qs[128];
//! - Q5_K: d, dmin, scales[12], qh[32], qs[128];
//! - Q6_K: ql[128], qh[64], scales[16] (int8), d.
//!
//! Each dot product is one exact integer sum per super-block (sub-block
//! scale times its integer sum, summed) and, for the types with mins, the
//! exact integer `Σ min × bsum` from Q8_K's 16-column sums; then
//! `(d · d8) × isum − (dmin · d8) × summs` in f32.

use super::ActBlock;
use super::blocks::{f16_at, q3k_scales, scales_mins_k4};
use crate::gguf::GgmlType;

/// The f32 terms of super-block `b` of `ty` (a K-quant or IQ4_XS) from its
/// exact integer sum `isum` (sub-block scales applied), the activation
/// scale `d` and the activation's 16-column sums: the one place these
/// terms are formed, so that the SIMD kernels that compute `isum` their own
/// way give the reference's value bit for bit.
pub(crate) fn k_terms(ty: GgmlType, b: &[u8], isum: i32, d: f32, bsums: &[i16]) -> [f32; 2] {
    match ty {
        GgmlType::Q2_K => {
            let summs: i32 = (0..16).map(|j| i32::from(bsums[j]) * i32::from(b[j] >> 4)).sum();
            let (dall, dmin) = (d * f16_at(b, 80), d * f16_at(b, 82));
            [dall * isum as f32, -(dmin * summs as f32)]
        }
        GgmlType::Q3_K => [(f16_at(b, 108) * d) * isum as f32, 0.0],
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (_, m) = scales_mins_k4(&b[4..16]);
            let summs: i32 = (0..16).map(|j| i32::from(bsums[j]) * i32::from(m[j / 2])).sum();
            let (dd, dmin) = (f16_at(b, 0) * d, f16_at(b, 2) * d);
            [dd * isum as f32, -(dmin * summs as f32)]
        }
        GgmlType::Q6_K => [(f16_at(b, 208) * d) * isum as f32, 0.0],
        // IQ4_XS.
        _ => [(f16_at(b, 0) * d) * isum as f32, 0.0],
    }
}

/// Q2_K's 2-bit code of column `c` (0..256).
#[inline(always)]
fn q2(b: &[u8], c: usize) -> i32 {
    let (n, r) = (c / 128, c % 128);
    let (j, l) = (r / 32, r % 32);
    i32::from((b[16 + 32 * n + l] >> (2 * j)) & 3)
}

pub(super) fn dequant_q2_k(b: &[u8], out: &mut [f32]) {
    let (d, min) = (f16_at(b, 80), f16_at(b, 82));
    for (c, o) in out[..256].iter_mut().enumerate() {
        let sc = b[c / 16];
        let (dl, ml) = (d * f32::from(sc & 0xF), min * f32::from(sc >> 4));
        *o = dl * q2(b, c) as f32 - ml;
    }
}

pub(super) fn dot_q2_k(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    let isum: i32 = (0..16)
        .map(|k| {
            let s: i32 = (16 * k..16 * k + 16).map(|c| i32::from(a.q[c]) * q2(b, c)).sum();
            i32::from(b[k] & 0xF) * s
        })
        .sum();
    k_terms(GgmlType::Q2_K, b, isum, a.d, a.bsums)
}

/// Q3_K's signed 3-bit value of column `c`.
#[inline(always)]
fn q3(b: &[u8], c: usize) -> i32 {
    let (n, r) = (c / 128, c % 128);
    let (j, l) = (r / 32, r % 32);
    let low = i32::from((b[32 + 32 * n + l] >> (2 * j)) & 3);
    let m = 1u8 << (4 * n + j);
    low - if b[l] & m != 0 { 0 } else { 4 }
}

pub(super) fn dequant_q3_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 108);
    let sc = q3k_scales(&b[96..108]);
    for (c, o) in out[..256].iter_mut().enumerate() {
        *o = (d * f32::from(sc[c / 16])) * q3(b, c) as f32;
    }
}

pub(super) fn dot_q3_k(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    let sc = q3k_scales(&b[96..108]);
    let isum: i32 = (0..16)
        .map(|k| {
            let s: i32 = (16 * k..16 * k + 16).map(|c| i32::from(a.q[c]) * q3(b, c)).sum();
            i32::from(sc[k]) * s
        })
        .sum();
    k_terms(GgmlType::Q3_K, b, isum, a.d, a.bsums)
}

/// Q4_K's (`hb` false) or Q5_K's code of column `c`: the nibble of
/// `qs[32 (c / 64) + c % 32]` (low for the first 32 of each 64), plus
/// Q5_K's fifth bit `c / 32` of `qh[c % 32]`.
#[inline(always)]
fn q45(b: &[u8], c: usize, q5: bool) -> i32 {
    let qs = if q5 { 48 } else { 16 };
    let byte = b[qs + 32 * (c / 64) + c % 32];
    let nib = if c % 64 < 32 { byte & 0xF } else { byte >> 4 };
    let hi = if q5 {
        ((b[16 + c % 32] >> (c / 32)) & 1) << 4
    } else {
        0
    };
    i32::from(nib + hi)
}

fn dequant_q45(b: &[u8], out: &mut [f32], q5: bool) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = scales_mins_k4(&b[4..16]);
    for (c, o) in out[..256].iter_mut().enumerate() {
        let k = c / 32;
        let (d1, m1) = (d * f32::from(sc[k]), min * f32::from(m[k]));
        *o = d1 * q45(b, c, q5) as f32 - m1;
    }
}

fn dot_q45(b: &[u8], a: ActBlock<'_>, q5: bool) -> [f32; 2] {
    let (sc, _) = scales_mins_k4(&b[4..16]);
    let isum: i32 = (0..8)
        .map(|k| {
            let s: i32 = (32 * k..32 * k + 32)
                .map(|c| i32::from(a.q[c]) * q45(b, c, q5))
                .sum();
            i32::from(sc[k]) * s
        })
        .sum();
    let ty = if q5 { GgmlType::Q5_K } else { GgmlType::Q4_K };
    k_terms(ty, b, isum, a.d, a.bsums)
}

pub(super) fn dequant_q4_k(b: &[u8], out: &mut [f32]) {
    dequant_q45(b, out, false)
}

pub(super) fn dot_q4_k(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    dot_q45(b, a, false)
}

pub(super) fn dequant_q5_k(b: &[u8], out: &mut [f32]) {
    dequant_q45(b, out, true)
}

pub(super) fn dot_q5_k(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    dot_q45(b, a, true)
}

/// Q6_K's signed 6-bit value of column `c`.
#[inline(always)]
fn q6(b: &[u8], c: usize) -> i32 {
    let (n, r) = (c / 128, c % 128);
    let (j, l) = (r / 32, r % 32);
    let ql = b[64 * n + l + 32 * (j % 2)];
    let low = if j < 2 { ql & 0xF } else { ql >> 4 };
    let high = (b[128 + 32 * n + l] >> (2 * j)) & 3;
    i32::from(low | (high << 4)) - 32
}

pub(super) fn dequant_q6_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for (c, o) in out[..256].iter_mut().enumerate() {
        *o = d * f32::from(b[192 + c / 16] as i8) * q6(b, c) as f32;
    }
}

pub(super) fn dot_q6_k(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    let isum: i32 = (0..16)
        .map(|k| {
            let s: i32 = (16 * k..16 * k + 16).map(|c| i32::from(a.q[c]) * q6(b, c)).sum();
            i32::from(b[192 + k] as i8) * s
        })
        .sum();
    k_terms(GgmlType::Q6_K, b, isum, a.d, a.bsums)
}
