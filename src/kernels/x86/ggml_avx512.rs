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

use super::ggml_avx2::{q6_codes, q6_offset, q45_codes};
use super::ggml_avx512_b32 as b32;
use crate::gguf::GgmlType;
use crate::kernels::ggml::GgmlActs;
use crate::kernels::ggml::blocks::scales_mins_k4;

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
pub(super) unsafe fn vnni_dot(u: __m512i, a: __m512i) -> __m512i {
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a)
}

/// Two 256-bit halves as one register (`lo` in lanes 0..8).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
fn halves_epi32(lo: i32, hi: i32) -> __m512i {
    _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(lo), _mm512_set1_epi32(hi))
}

/// The Q4_K row kernel written out like [`q0_kernel`]'s, with the generic
/// K-quant loop's arithmetic exactly (so its results are bit-identical to
/// it): per super-block the eight sub-block scales applied to the i32 lanes
/// in integers, `d · d_a` once per super-block, and the mins' term
/// `(dmin · d_a) · Σ bsum · min` subtracted at the end.
macro_rules! q4_k_kernel {
    ($name:ident, $features:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $name(row: &[u8], acts: &GgmlActs) -> f32 {
            const B: usize = 144;
            let nb = row.len() / B;
            debug_assert!(acts.q.len() >= 256 * nb && acts.d.len() >= nb && acts.bsums.len() >= 16 * nb);
            let zero = _mm512_setzero_si512();
            let m4 = _mm256_set1_epi8(0x0F);
            let mut acc = _mm512_setzero_ps();
            let mut mins = 0.0f32;
            for i in 0..nb {
                let b = &row[i * B..(i + 1) * B];
                super::prefetch_span(b.as_ptr(), B);
                let (sc, m) = k4_scales_mins(&b[4..16]);
                // Σ bsum_j · min_{j/2} in i32: each min against its two
                // 16-column sums.
                // SAFETY: 16 i16 sums of super-block `i`.
                let bs = unsafe { _mm256_loadu_si256(acts.bsums.as_ptr().add(16 * i).cast()) };
                let mm = _mm_cvtsi64_si128(i64::from_le_bytes(m));
                let mm = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mm, mm));
                let prod = _mm256_madd_epi16(bs, mm);
                let summs = _mm512_reduce_add_epi32(_mm512_zextsi256_si512(prod));
                mins += (f16c_at(b, 2) * acts.d[i]) * summs as f32;
                let mut isum = zero;
                for j in 0..4 {
                    // SAFETY: `16 + 32 j + 32 <= 144` bytes of the block and
                    // `256 i + 64 j + 64 <= 256 nb` activations.
                    let (v, a) = unsafe {
                        (
                            _mm256_loadu_si256(b.as_ptr().add(16 + 32 * j).cast()),
                            _mm512_loadu_si512(acts.q.as_ptr().add(256 * i + 64 * j).cast()),
                        )
                    };
                    let w = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(_mm256_and_si256(v, m4)),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
                    );
                    // Codes (0..15) × activations in i16 pairs (at most
                    // 2 · 15 · 128, no saturation), then × the sub-block
                    // scale into i32: the integer value VNNI's dot times the
                    // scale would give, in two instructions instead of a
                    // dot and a 32-bit multiply.
                    let s = _mm512_mask_blend_epi16(
                        0xFFFF_0000,
                        _mm512_set1_epi16(i16::from(sc[2 * j])),
                        _mm512_set1_epi16(i16::from(sc[2 * j + 1])),
                    );
                    isum = _mm512_add_epi32(isum, _mm512_madd_epi16(_mm512_maddubs_epi16(w, a), s));
                }
                acc = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(isum),
                    _mm512_set1_ps(f16c_at(b, 0) * acts.d[i]),
                    acc,
                );
            }
            _mm512_reduce_add_ps(acc) - mins
        }
    };
}

q4_k_kernel!(q4_k, "avx512f,avx512bw,avx2,fma,f16c");

/// The Q6_K row kernel, written out as [`q4_k_kernel`]'s is and with the
/// generic loop's lane values exactly: per 64 columns the unsigned 6-bit
/// codes × activations in i16 pairs (at most 2 · 63 · 127) times each
/// 16-column group's signed scale into i32 lanes, `-32 Σ sc · bsum` (the
/// codes' offset) in lane 0, `d · d_a` once per super-block.
///
/// # Safety
/// The CPU has AVX-512F/BW, AVX2, FMA and F16C; `row` and `acts` passed
/// `check_acts` for Q6_K.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn q6_k(row: &[u8], acts: &GgmlActs) -> f32 {
    const B: usize = 210;
    let nb = row.len() / B;
    debug_assert!(acts.q.len() >= 256 * nb && acts.d.len() >= nb && acts.bsums.len() >= 16 * nb);
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    // Lane pair p (i16 lanes 2p, 2p+1) of a 64-column step belongs to
    // 16-column group p / 8 of the step's four.
    let spread = _mm512_set_epi16(
        3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0,
    );
    let mut acc = _mm512_setzero_ps();
    for i in 0..nb {
        let b = &row[i * B..(i + 1) * B];
        super::prefetch_span(b.as_ptr(), B);
        // SAFETY: 16 i16 sums of super-block `i`; the block's 16 scale
        // bytes at 192.
        let (bs, sc16) = unsafe {
            (
                _mm256_loadu_si256(acts.bsums.as_ptr().add(16 * i).cast()),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(b.as_ptr().add(192).cast())),
            )
        };
        let offset = 32 * _mm512_reduce_add_epi32(_mm512_zextsi256_si512(_mm256_madd_epi16(bs, sc16)));
        let mut isum = _mm512_mask_set1_epi32(_mm512_setzero_si512(), 1, -offset);
        for n in 0..2 {
            // SAFETY: `64 n + 64 <= 128` low bytes, `128 + 32 n + 32 <=
            // 192` high bytes, `256 i + 128 n + 128 <= 256 nb` activations.
            let (l0, l1, h, a0, a1) = unsafe {
                let p = b.as_ptr();
                let q = acts.q.as_ptr().add(256 * i + 128 * n);
                (
                    _mm256_loadu_si256(p.add(64 * n).cast()),
                    _mm256_loadu_si256(p.add(64 * n + 32).cast()),
                    _mm256_loadu_si256(p.add(128 + 32 * n).cast()),
                    _mm512_loadu_si512(q.cast()),
                    _mm512_loadu_si512(q.add(64).cast()),
                )
            };
            let hi = |shift: i32| {
                _mm256_slli_epi16::<4>(_mm256_and_si256(
                    _mm256_srl_epi16(h, _mm_cvtsi32_si128(shift)),
                    m2,
                ))
            };
            let c0 = _mm256_or_si256(_mm256_and_si256(l0, m4), hi(0));
            let c1 = _mm256_or_si256(_mm256_and_si256(l1, m4), hi(2));
            let c2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4), hi(4));
            let c3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4), hi(6));
            for (k, (lo, up, a)) in [(c0, c1, a0), (c2, c3, a1)].into_iter().enumerate() {
                let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), up);
                // The step's four scales, each over its 8 lane pairs.
                let k4 = 192 + 8 * n + 4 * k;
                let sc4 = _mm_cvtepi8_epi16(_mm_cvtsi32_si128(i32::from_le_bytes([
                    b[k4],
                    b[k4 + 1],
                    b[k4 + 2],
                    b[k4 + 3],
                ])));
                let s = _mm512_permutexvar_epi16(spread, _mm512_castsi128_si512(sc4));
                isum = _mm512_add_epi32(isum, _mm512_madd_epi16(_mm512_maddubs_epi16(w, a), s));
            }
        }
        acc = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(isum),
            _mm512_set1_ps(f16c_at(b, 208) * acts.d[i]),
            acc,
        );
    }
    _mm512_reduce_add_ps(acc)
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K super-block from its 12
/// packed bytes, four at a time in 32-bit words (ggml's unpacking): the
/// values of [`crate::kernels::ggml::blocks::scales_mins_k4`], which a unit
/// test checks on every byte pattern class.
#[inline(always)]
fn k4_scales_mins(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let w = |k: usize| u32::from_le_bytes([q[4 * k], q[4 * k + 1], q[4 * k + 2], q[4 * k + 3]]);
    let (u0, u1, u2) = (w(0), w(1), w(2));
    let sc_lo = u0 & K1;
    let sc_hi = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let m_lo = u1 & K1;
    let m_hi = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    sc[..4].copy_from_slice(&sc_lo.to_le_bytes());
    sc[4..].copy_from_slice(&sc_hi.to_le_bytes());
    m[..4].copy_from_slice(&m_lo.to_le_bytes());
    m[4..].copy_from_slice(&m_hi.to_le_bytes());
    (sc, m)
}

#[cfg(test)]
mod tests {
    use super::k4_scales_mins;
    use crate::kernels::ggml::blocks::scales_mins_k4;

    #[test]
    fn packed_scales_unpack_as_the_reference_does() {
        let mut state = 0x9e37_79b9u32;
        for _ in 0..20_000 {
            let q: Vec<u8> = (0..12)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    state as u8
                })
                .collect();
            assert_eq!(k4_scales_mins(&q), scales_mins_k4(&q), "{q:?}");
        }
        for fill in [0u8, 0xff, 0x3f, 0xc0] {
            assert_eq!(k4_scales_mins(&[fill; 12]), scales_mins_k4(&[fill; 12]));
        }
    }
}

/// The f16 at byte `at` of `b` widened by `vcvtph2ps` (exact).
#[inline]
#[target_feature(enable = "f16c")]
fn f16c_at(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// `row · acts`, or `None` when `ty` has no AVX-512 kernel.
///
/// # Safety
/// The CPU has AVX-512F/BW, AVX2, FMA and F16C, and AVX512-VNNI when
/// `vnni`; `row` and `acts` passed `check_acts` for `ty`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) unsafe fn dot(ty: GgmlType, row: &[u8], acts: &GgmlActs, vnni: bool) -> Option<f32> {
    // SAFETY: forwarded from the caller; the Q8_0 / Q4_0 kernels read
    // whole blocks of `row` and their activations only.
    unsafe {
        match (ty, vnni) {
            (GgmlType::Q8_0, true) => return Some(b32::q8_0_vnni(row, acts)),
            (GgmlType::Q8_0, false) => return Some(b32::q8_0_plain(row, acts)),
            (GgmlType::Q4_0, true) => return Some(b32::q4_0_vnni(row, acts)),
            (GgmlType::Q4_0, false) => return Some(b32::q4_0_plain(row, acts)),
            (GgmlType::Q4_1, true) => return Some(b32::q4_1_vnni(row, acts)),
            (GgmlType::Q4_1, false) => return Some(b32::q4_1_plain(row, acts)),
            (GgmlType::Q5_0, true) => return Some(b32::q5_0_vnni(row, acts)),
            (GgmlType::Q5_0, false) => return Some(b32::q5_0_plain(row, acts)),
            (GgmlType::Q5_1, true) => return Some(b32::q5_1_vnni(row, acts)),
            (GgmlType::Q5_1, false) => return Some(b32::q5_1_plain(row, acts)),
            (GgmlType::IQ4_NL, true) => return Some(b32::iq4_nl_vnni(row, acts)),
            (GgmlType::IQ4_NL, false) => return Some(b32::iq4_nl_plain(row, acts)),
            (GgmlType::MXFP4, true) => return Some(b32::mxfp4_vnni(row, acts)),
            (GgmlType::MXFP4, false) => return Some(b32::mxfp4_plain(row, acts)),
            (GgmlType::Q4_K, _) => return Some(q4_k(row, acts)),
            (GgmlType::Q6_K, _) => return Some(q6_k(row, acts)),
            _ => {}
        }
        if vnni {
            dot_vnni(ty, row, acts)
        } else {
            dot_impl::<false>(ty, row, acts)
        }
    }
}

/// [`dot_impl`] compiled with AVX512-VNNI enabled, so that `vpdpbusd`
/// ([`vnni_dot`]) inlines into the loop instead of being called with its
/// registers spilled to the stack (what made the kernel a quarter of the
/// memory bandwidth).
///
/// # Safety
/// As [`dot`] with `vnni`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c,avx512vnni")]
unsafe fn dot_vnni(ty: GgmlType, row: &[u8], acts: &GgmlActs) -> Option<f32> {
    // SAFETY: forwarded from the caller.
    unsafe { dot_impl::<true>(ty, row, acts) }
}

/// # Safety
/// As [`dot`], with `VNNI` for `vnni`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn dot_impl<const VNNI: bool>(ty: GgmlType, row: &[u8], acts: &GgmlActs) -> Option<f32> {
    use crate::gguf::GgmlType::*;
    let size = ty.type_size() as usize;
    let q = acts.q.as_ptr();
    match ty {
        Q4_K | Q5_K | Q6_K => {
            let mut acc = _mm512_setzero_ps();
            let mut mins = 0.0f32;
            for (i, b) in row.chunks_exact(size).enumerate() {
                super::prefetch_span(b.as_ptr(), size);
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
                    mins += (f16c_at(b, 2) * acts.d[i]) * summs as f32;
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
                let d = if ty == Q6_K {
                    f16c_at(b, 208)
                } else {
                    f16c_at(b, 0)
                };
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d * acts.d[i]), acc);
            }
            Some(_mm512_reduce_add_ps(acc) - mins)
        }
        _ => None,
    }
}
