//! AVX-512 dot products of ggml block rows (Q8_0, Q4_0, MXFP4, Q4_K,
//! Q5_K, Q6_K), 64 columns per step.
//!
//! The weight bytes of two 32-column blocks (or sub-block pairs) fill one
//! register and meet the activation bytes in `vpdpbusd` on AVX512-VNNI
//! (unsigned × signed bytes, four columns into each i32 lane, exact) or in
//! `vpmaddubsw` + `vpmaddwd` without it. Signed weights become `|w|` with
//! the activation negated where `w < 0`. As in the AVX2 kernels, integer
//! sums are exact (the K-quants' sub-block scales are applied to the lanes
//! in i32 and a super-block summed in integers) and only the f32 terms'
//! split over lanes and their summation order differ from the scalar
//! reference; an odd last 32-column block is computed with the upper half
//! zero.

use core::arch::x86_64::*;

use super::ggml_avx2::{decode32, q6_codes, q6_offset, q45_codes, scale32};
use crate::gguf::GgmlType;
use crate::kernels::ggml::GgmlActs;
use crate::kernels::ggml::blocks::{f16_at, scales_mins_k4};

/// Sixteen i32 lanes `Σ u a` of four columns each, `u` unsigned bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
fn dot_u<const VNNI: bool>(u: __m512i, a: __m512i) -> __m512i {
    if VNNI {
        // SAFETY: `VNNI` is only true when the caller's `Kernels` value was
        // built after detecting AVX512-VNNI (see `dot`).
        unsafe { vnni_dot(u, a) }
    } else {
        _mm512_madd_epi16(_mm512_maddubs_epi16(u, a), _mm512_set1_epi16(1))
    }
}

/// `vpdpbusd` from zero.
///
/// # Safety
/// The CPU has AVX512-VNNI.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vnni_dot(u: __m512i, a: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a)
}

/// Sixteen i32 lanes `Σ w a`, `w` signed bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
fn dot_s<const VNNI: bool>(w: __m512i, a: __m512i) -> __m512i {
    let neg = _mm512_movepi8_mask(w);
    let a = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
    dot_u::<VNNI>(_mm512_abs_epi8(w), a)
}

/// Two 256-bit halves as one register (`lo` in lanes 0..8).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Lanes 0..8 `lo`, 8..16 `hi`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
fn halves_ps(lo: f32, hi: f32) -> __m512 {
    _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(lo), _mm512_set1_ps(hi))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
fn halves_epi32(lo: i32, hi: i32) -> __m512i {
    _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(lo), _mm512_set1_epi32(hi))
}

/// `row · acts`, or `None` when `ty` has no AVX-512 kernel.
///
/// # Safety
/// The CPU has AVX-512F/BW, AVX2 and FMA, and AVX512-VNNI when `vnni`;
/// `row` and `acts` passed `check_acts` for `ty`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
pub(crate) unsafe fn dot(ty: GgmlType, row: &[u8], acts: &GgmlActs, vnni: bool) -> Option<f32> {
    // SAFETY: forwarded from the caller.
    unsafe {
        if vnni {
            dot_impl::<true>(ty, row, acts)
        } else {
            dot_impl::<false>(ty, row, acts)
        }
    }
}

/// # Safety
/// As [`dot`], with `VNNI` for `vnni`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn dot_impl<const VNNI: bool>(ty: GgmlType, row: &[u8], acts: &GgmlActs) -> Option<f32> {
    use crate::gguf::GgmlType::*;
    let size = ty.type_size() as usize;
    let q = acts.q.as_ptr();
    match ty {
        Q8_0 | Q4_0 | MXFP4 => {
            let mut acc = _mm512_setzero_ps();
            let mut pairs = row.chunks_exact(2 * size);
            let mut i = 0;
            for p in pairs.by_ref() {
                let (b0, b1) = p.split_at(size);
                // SAFETY: `b0`, `b1` are whole blocks and the activations
                // hold `32 × blocks` values (`check_acts`).
                let (w, a) = unsafe {
                    (
                        join(decode32(ty, b0.as_ptr()), decode32(ty, b1.as_ptr())),
                        _mm512_loadu_si512(q.add(32 * i).cast()),
                    )
                };
                let s = halves_ps(scale32(ty, b0, acts.d[i]), scale32(ty, b1, acts.d[i + 1]));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_s::<VNNI>(w, a)), s, acc);
                i += 2;
            }
            let b = pairs.remainder();
            if !b.is_empty() {
                // SAFETY: `b` is the last whole block, its 32 activations
                // the last ones.
                let (w, a) = unsafe {
                    (
                        _mm512_zextsi256_si512(decode32(ty, b.as_ptr())),
                        _mm512_zextsi256_si512(_mm256_loadu_si256(q.add(32 * i).cast())),
                    )
                };
                let s = halves_ps(scale32(ty, b, acts.d[i]), 0.0);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_s::<VNNI>(w, a)), s, acc);
            }
            Some(_mm512_reduce_add_ps(acc))
        }
        Q4_K | Q5_K | Q6_K => {
            let mut acc = _mm512_setzero_ps();
            let mut mins = 0.0f32;
            for (i, b) in row.chunks_exact(size).enumerate() {
                // SAFETY: 256 activation values per super-block.
                let a = unsafe { q.add(256 * i) };
                let bsums = &acts.bsums[16 * i..16 * i + 16];
                let mut isum = _mm512_setzero_si512();
                if ty == Q6_K {
                    isum = _mm512_mask_set1_epi32(isum, 1, -q6_offset(b, bsums));
                    for n in 0..2 {
                        for j in [0, 2] {
                            // SAFETY: `b` is a whole block; `128 n + 32 j +
                            // 64 <= 256` activations.
                            let (w, av) = unsafe {
                                (
                                    join(q6_codes(b, n, j), q6_codes(b, n, j + 1)),
                                    _mm512_loadu_si512(a.add(128 * n + 32 * j).cast()),
                                )
                            };
                            let k = 192 + 8 * n + 2 * j;
                            let sc = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(
                                _mm_cvtsi32_si128(i32::from_le_bytes([b[k], b[k + 1], b[k + 2], b[k + 3]])),
                                _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                            ));
                            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(dot_u::<VNNI>(w, av), sc));
                        }
                    }
                } else {
                    let (sc, m) = scales_mins_k4(&b[4..16]);
                    let summs: i32 = (0..16).map(|j| i32::from(bsums[j]) * i32::from(m[j / 2])).sum();
                    mins += (f16_at(b, 2) * acts.d[i]) * summs as f32;
                    for j in 0..4 {
                        // SAFETY: as above; `64 j + 64 <= 256`.
                        let (w, av) = unsafe {
                            let (lo, hi) = q45_codes(b, j, ty == Q5_K);
                            (join(lo, hi), _mm512_loadu_si512(a.add(64 * j).cast()))
                        };
                        let s = halves_epi32(i32::from(sc[2 * j]), i32::from(sc[2 * j + 1]));
                        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(dot_u::<VNNI>(w, av), s));
                    }
                }
                let d = if ty == Q6_K { f16_at(b, 208) } else { f16_at(b, 0) };
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d * acts.d[i]), acc);
            }
            Some(_mm512_reduce_add_ps(acc) - mins)
        }
        _ => None,
    }
}
