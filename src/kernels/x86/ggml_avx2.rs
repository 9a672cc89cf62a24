//! AVX2+FMA dot products of ggml block rows (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
//! IQ4_NL, MXFP4, Q4_K, Q5_K, Q6_K) against quantized activations
//! ([`GgmlActs`]).
//!
//! Each 32-column step decodes the weights to bytes in one register and
//! multiplies them with the activation bytes by `vpmaddubsw` (unsigned ×
//! signed, pairs into i16: never saturating here, every pair is at most
//! 2 × 128 × 127) then `vpmaddwd` (pairs into i32, times ones or the
//! sub-block scale): eight exact i32 lane sums of four columns each.
//! Signed weights go through the `abs(w)`, `sign(a, w)` identity. Lane sums
//! are converted to f32 and multiply-added with the block's scale product
//! into one accumulator (the K-quants first sum a whole super-block in
//! integers); the mins terms of Q4_K/Q5_K go to a scalar f32 sum. For the
//! 32-column types that is ggml's own order, lane for lane; for the
//! K-quants only the f32 rounding differs from the scalar reference, in an
//! order fixed by the row length. Q2_K, Q3_K and IQ4_XS are in
//! [`super::ggml_avx2_k23`].

use core::arch::x86_64::*;

use crate::gguf::GgmlType;
use crate::kernels::ggml::GgmlActs;
use crate::kernels::ggml::blocks::{e8m0_half, f16_at, scales_mins_k4};

/// The types with an AVX2 kernel (the others use the scalar reference).
pub(crate) fn has(ty: GgmlType) -> bool {
    use crate::gguf::GgmlType::*;
    matches!(
        ty,
        Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | IQ4_NL | MXFP4 | Q4_K | Q5_K | Q6_K | Q2_K | Q3_K | IQ4_XS
    )
}

/// Sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Eight i32 lanes `Σ w a` of four columns each, `w` signed bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn dot_signed(w: __m256i, a: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Eight i32 lanes `Σ w a × s` (`s` per i16 pair), `w` unsigned bytes below
/// 128.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn dot_unsigned(w: __m256i, a: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), s)
}

/// 16 bytes split into 32 nibbles: low nibbles first, then high ones (the
/// column order of the 32-column ggml blocks).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn nibbles(v: __m128i) -> __m256i {
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(v), v);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// The signed weights of one 32-column block of `ty` at `p`.
///
/// # Safety
/// `p` points at one whole block of `ty` (Q8_0, Q4_0 or MXFP4).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn decode32(ty: GgmlType, p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees the block's bytes are readable: Q8_0's
    // 32 values start at 2, Q4_0's 16 bytes at 2, MXFP4's at 1.
    unsafe {
        match ty {
            GgmlType::Q8_0 => _mm256_loadu_si256(p.add(2).cast()),
            GgmlType::Q4_0 => {
                let v = _mm_loadu_si128(p.add(2).cast());
                _mm256_sub_epi8(nibbles(v), _mm256_set1_epi8(8))
            }
            _ => {
                let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    crate::kernels::ggml::blocks::KVALUES_MXFP4.as_ptr().cast(),
                ));
                _mm256_shuffle_epi8(table, nibbles(_mm_loadu_si128(p.add(1).cast())))
            }
        }
    }
}

/// 32 bytes, byte `k` 0x10 where bit `k` of `bits` is set, else 0: the
/// fifth bit of Q5_0 / Q5_1 column `k` (the nibble order of [`nibbles`]).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn fifth_bits(bits: u32) -> __m256i {
    // Byte k takes byte k / 8 of `bits`; OR-ing every bit but bit k % 8
    // and comparing with all ones leaves 0xFF exactly where bit k is set.
    let x = _mm256_set1_epi32(bits as i32);
    let spread = _mm256_setr_epi64x(
        0,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let bytes = _mm256_or_si256(
        _mm256_shuffle_epi8(x, spread),
        _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe),
    );
    let set = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The weights of one 32-column block of Q4_1, Q5_1 (unsigned, 0..32),
/// Q5_0 or IQ4_NL (signed) at `p`.
///
/// # Safety
/// `p` points at one whole block of `ty`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode32_legacy(ty: GgmlType, p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees the block's bytes are readable: Q4_1's
    // 16 bytes start at 4; Q5_0's high bits at 2 and nibbles at 6; Q5_1's
    // at 4 and 8; IQ4_NL's nibbles at 2.
    unsafe {
        match ty {
            GgmlType::Q4_1 => nibbles(_mm_loadu_si128(p.add(4).cast())),
            GgmlType::Q5_0 => {
                let qh = u32::from_le_bytes(*p.add(2).cast::<[u8; 4]>());
                let v = _mm256_or_si256(nibbles(_mm_loadu_si128(p.add(6).cast())), fifth_bits(qh));
                _mm256_sub_epi8(v, _mm256_set1_epi8(16))
            }
            GgmlType::Q5_1 => {
                let qh = u32::from_le_bytes(*p.add(4).cast::<[u8; 4]>());
                _mm256_or_si256(nibbles(_mm_loadu_si128(p.add(8).cast())), fifth_bits(qh))
            }
            _ => {
                let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    crate::kernels::ggml::blocks::KVALUES_IQ4NL.as_ptr().cast(),
                ));
                _mm256_shuffle_epi8(table, nibbles(_mm_loadu_si128(p.add(2).cast())))
            }
        }
    }
}

/// The f32 scale of block `b` of a 32-column row: weight scale times
/// activation scale.
#[inline(always)]
pub(super) fn scale32(ty: GgmlType, b: &[u8], ad: f32) -> f32 {
    match ty {
        GgmlType::MXFP4 => ad * e8m0_half(b[0]),
        _ => f16_at(b, 0) * ad,
    }
}

/// `row · acts`, or `None` when `ty` has no AVX2 kernel.
///
/// # Safety
/// The CPU has AVX2 and FMA; `row` and `acts` passed `check_acts` for `ty`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot(ty: GgmlType, row: &[u8], acts: &GgmlActs) -> Option<f32> {
    use crate::gguf::GgmlType::*;
    let size = ty.type_size() as usize;
    let q = acts.q.as_ptr();
    match ty {
        Q8_0 | Q4_0 | MXFP4 => {
            let mut acc = _mm256_setzero_ps();
            for (i, b) in row.chunks_exact(size).enumerate() {
                super::prefetch_ahead(b.as_ptr());
                // SAFETY: `b` is one whole block; `check_acts` made the
                // activations `32 × blocks` values long.
                let (w, a) = unsafe { (decode32(ty, b.as_ptr()), _mm256_loadu_si256(q.add(32 * i).cast())) };
                let s = _mm256_set1_ps(scale32(ty, b, acts.d[i]));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_signed(w, a)), s, acc);
            }
            Some(hsum(acc))
        }
        Q4_1 | Q5_0 | Q5_1 | IQ4_NL => {
            let mut acc = _mm256_setzero_ps();
            // Q4_1 / Q5_1: the offset `m` times the activation block's sum.
            let mut offsets = 0.0f32;
            for (i, b) in row.chunks_exact(size).enumerate() {
                super::prefetch_ahead(b.as_ptr());
                // SAFETY: `b` is one whole block; `check_acts` made the
                // activations `32 × blocks` values long.
                let (w, a) = unsafe {
                    (
                        decode32_legacy(ty, b.as_ptr()),
                        _mm256_loadu_si256(q.add(32 * i).cast()),
                    )
                };
                let lanes = match ty {
                    Q4_1 | Q5_1 => {
                        offsets += f16_at(b, 2) * acts.s[i];
                        dot_unsigned(w, a, _mm256_set1_epi16(1))
                    }
                    _ => dot_signed(w, a),
                };
                let s = _mm256_set1_ps(f16_at(b, 0) * acts.d[i]);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), s, acc);
            }
            Some(hsum(acc) + offsets)
        }
        Q4_K | Q5_K | Q6_K => {
            let mut acc = _mm256_setzero_ps();
            let mut mins = 0.0f32;
            for (i, b) in row.chunks_exact(size).enumerate() {
                super::prefetch_span(b.as_ptr(), size);
                // SAFETY: as above, for 256-column super-blocks.
                let a = unsafe { q.add(256 * i) };
                let bsums = &acts.bsums[16 * i..16 * i + 16];
                let isum = match ty {
                    // SAFETY: `b` is a whole block and `a` 256 values.
                    Q6_K => unsafe { q6k(b, a, bsums) },
                    _ => {
                        let (sc, m) = scales_mins_k4(&b[4..16]);
                        let summs: i32 = (0..16).map(|j| i32::from(bsums[j]) * i32::from(m[j / 2])).sum();
                        mins += (f16_at(b, 2) * acts.d[i]) * summs as f32;
                        // SAFETY: as above.
                        unsafe { q45k(b, a, &sc, ty == Q5_K) }
                    }
                };
                let d = if ty == Q6_K { f16_at(b, 208) } else { f16_at(b, 0) };
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * acts.d[i]), acc);
            }
            Some(hsum(acc) - mins)
        }
        // SAFETY: forwarded from the caller.
        Q2_K | Q3_K | IQ4_XS => Some(unsafe { super::ggml_avx2_k23::dot(ty, row, acts) }),
        _ => None,
    }
}

/// The 32 five-bit (`q5`) or four-bit codes of sub-blocks `2j` (`lo`) and
/// `2j + 1` (`hi`) of a Q4_K/Q5_K super-block.
///
/// # Safety
/// `b` is one whole Q4_K (or Q5_K when `q5`) block.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q45_codes(b: &[u8], j: usize, q5: bool) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0x0F);
    let qs = if q5 { 48 } else { 16 };
    // SAFETY: `qs + 32 j + 32 <= 144 (176)` and `16 + 32 <= 176`.
    unsafe {
        let v = _mm256_loadu_si256(b.as_ptr().add(qs + 32 * j).cast());
        let (mut lo, mut hi) = (
            _mm256_and_si256(v, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
        );
        if q5 {
            let one = _mm256_set1_epi8(1);
            let h = _mm256_loadu_si256(b.as_ptr().add(16).cast());
            let s = _mm_cvtsi32_si128(2 * j as i32);
            let h = _mm256_srl_epi16(h, s);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(_mm256_and_si256(h, one)));
            let h = _mm256_srli_epi16::<1>(h);
            hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(_mm256_and_si256(h, one)));
        }
        (lo, hi)
    }
}

/// Q4_K/Q5_K super-block: eight i32 lanes summing to `Σ sc_k Σ code q`.
///
/// # Safety
/// `b` is one whole block, `a` points at its 256 activation values.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q45k(b: &[u8], a: *const i8, sc: &[u8; 8], q5: bool) -> __m256i {
    let mut isum = _mm256_setzero_si256();
    for j in 0..4 {
        // SAFETY: the caller's guarantees; `64 j + 64 <= 256`.
        unsafe {
            let (lo, hi) = q45_codes(b, j, q5);
            let a0 = _mm256_loadu_si256(a.add(64 * j).cast());
            let a1 = _mm256_loadu_si256(a.add(64 * j + 32).cast());
            isum = _mm256_add_epi32(
                isum,
                dot_unsigned(lo, a0, _mm256_set1_epi16(i16::from(sc[2 * j]))),
            );
            isum = _mm256_add_epi32(
                isum,
                dot_unsigned(hi, a1, _mm256_set1_epi16(i16::from(sc[2 * j + 1]))),
            );
        }
    }
    isum
}

/// The unsigned six-bit codes (value + 32) of the 32 columns
/// `128 n + 32 j ..` of a Q6_K super-block.
///
/// # Safety
/// `b` is one whole Q6_K block.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q6_codes(b: &[u8], n: usize, j: usize) -> __m256i {
    // SAFETY: `64 n + 32 + 32 <= 128`, `128 + 32 n + 32 <= 192`.
    unsafe {
        let ql = _mm256_loadu_si256(b.as_ptr().add(64 * n + 32 * (j % 2)).cast());
        let qh = _mm256_loadu_si256(b.as_ptr().add(128 + 32 * n).cast());
        let low = if j < 2 { ql } else { _mm256_srli_epi16::<4>(ql) };
        let low = _mm256_and_si256(low, _mm256_set1_epi8(0x0F));
        let high = _mm256_and_si256(
            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32)),
            _mm256_set1_epi8(3),
        );
        _mm256_or_si256(low, _mm256_slli_epi16::<4>(high))
    }
}

/// `32 Σ_k sc_k bsum_k`: what the unsigned codes add over the signed ones.
#[inline(always)]
pub(super) fn q6_offset(b: &[u8], bsums: &[i16]) -> i32 {
    (0..16)
        .map(|k| 32 * i32::from(b[192 + k] as i8) * i32::from(bsums[k]))
        .sum()
}

/// Q6_K super-block: eight i32 lanes summing to `Σ sc_k Σ value q`.
///
/// # Safety
/// `b` is one whole block, `a` points at its 256 activation values.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q6k(b: &[u8], a: *const i8, bsums: &[i16]) -> __m256i {
    let mut isum = _mm256_setr_epi32(-q6_offset(b, bsums), 0, 0, 0, 0, 0, 0, 0);
    for n in 0..2 {
        for j in 0..4 {
            let k = 8 * n + 2 * j;
            let s = _mm256_set_m128i(
                _mm_set1_epi16(i16::from(b[192 + k + 1] as i8)),
                _mm_set1_epi16(i16::from(b[192 + k] as i8)),
            );
            // SAFETY: the caller's guarantees; `128 n + 32 j + 32 <= 256`.
            unsafe {
                let w = q6_codes(b, n, j);
                let av = _mm256_loadu_si256(a.add(128 * n + 32 * j).cast());
                isum = _mm256_add_epi32(isum, dot_unsigned(w, av, s));
            }
        }
    }
    isum
}
