//! AVX2 row kernels of Q2_K, Q3_K and IQ4_XS, the low-bit types that big
//! models are published in (a 2- or 3-bit GLM or DeepSeek is what fits a
//! 64 GB box), so that an AVX2-only CPU does not fall back to the scalar
//! loop for them.
//!
//! Per super-block, 32 columns a step: the codes in bytes, times the
//! activations in i16 pairs (`vpmaddubsw`), times the sub-block scale into
//! i32 lanes (`vpmaddwd`), all exact; the super-block's integer sum then
//! goes through the reference's own f32 terms (`k_terms`), so the result
//! equals the scalar reference bit for bit. Q3_K multiplies its unsigned
//! codes `value + 4` and subtracts `4 Σ scale · bsum` from Q8_K's
//! 16-column sums.

use core::arch::x86_64::*;

use crate::gguf::GgmlType;
use crate::kernels::ggml::GgmlActs;
use crate::kernels::ggml::blocks::{KVALUES_IQ4NL, QK_K, q3k_scales};
use crate::kernels::ggml::iq4::xs_scale;
use crate::kernels::ggml::k_quants::k_terms;

/// Sum of the eight i32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<1>(s));
    _mm_cvtsi128_si32(s)
}

/// i16 lanes 0..8 `lo`, 8..16 `hi`: the scales of a 32-column step's two
/// 16-column halves after `vpmaddubsw`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn halves(lo: i16, hi: i16) -> __m256i {
    _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi))
}

/// The 2-bit fields at bit `2j` of each of 32 bytes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn crumbs(bits: __m256i, j: usize) -> __m256i {
    let shifted = _mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * j as i32));
    _mm256_and_si256(shifted, _mm256_set1_epi8(3))
}

/// A super-block's exact integer sum.
///
/// # Safety
/// `b` is one whole super-block of `ty` (Q2_K, Q3_K or IQ4_XS) and `q`
/// points at its 256 activations.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn isum(ty: GgmlType, b: &[u8], q: *const i8, bsums: &[i16]) -> i32 {
    let p = b.as_ptr();
    let mut acc = _mm256_setzero_si256();
    // SAFETY: the loads lie in the super-block (Q2_K's qs at 16, Q3_K's
    // hmask at 0 and qs at 32, IQ4_XS's nibbles at 8 + 16 ib) and in the
    // 256 activations.
    unsafe {
        match ty {
            GgmlType::Q2_K | GgmlType::Q3_K => {
                let q3 = ty == GgmlType::Q3_K;
                let sc: [i8; 16] = if q3 {
                    q3k_scales(&b[96..108])
                } else {
                    core::array::from_fn(|k| (b[k] & 0xF) as i8)
                };
                let hm = _mm256_loadu_si256(p.cast());
                let qs = if q3 { 32 } else { 16 };
                for n in 0..2 {
                    let bits = _mm256_loadu_si256(p.add(qs + 32 * n).cast());
                    for j in 0..4 {
                        let mut codes = crumbs(bits, j);
                        if q3 {
                            let m = _mm256_set1_epi8((1u8 << (4 * n + j)) as i8);
                            let set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, m), m);
                            codes = _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(4)));
                        }
                        let a = _mm256_loadu_si256(q.add(128 * n + 32 * j).cast());
                        let k = 8 * n + 2 * j;
                        let s = halves(i16::from(sc[k]), i16::from(sc[k + 1]));
                        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(codes, a), s));
                    }
                }
                let sum = hsum_i32(acc);
                if q3 {
                    let offset: i32 = (0..16).map(|k| i32::from(sc[k]) * i32::from(bsums[k])).sum();
                    sum - 4 * offset
                } else {
                    sum
                }
            }
            _ => {
                let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
                for ib in 0..8 {
                    let idx = super::ggml_avx2::nibbles(_mm_loadu_si128(p.add(8 + 16 * ib).cast()));
                    let w = _mm256_shuffle_epi8(table, idx);
                    let a = _mm256_loadu_si256(q.add(32 * ib).cast());
                    let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
                    let s = _mm256_set1_epi16(xs_scale(b, ib) as i16);
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, s));
                }
                hsum_i32(acc)
            }
        }
    }
}

/// `row · acts` for a Q2_K, Q3_K or IQ4_XS row.
///
/// # Safety
/// The CPU has AVX2 and FMA; `ty` is one of the three types; `row` and
/// `acts` passed `check_acts` for it.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot(ty: GgmlType, row: &[u8], acts: &GgmlActs) -> f32 {
    let size = ty.type_size() as usize;
    let mut total = 0.0f32;
    for (i, b) in row.chunks_exact(size).enumerate() {
        super::prefetch_ahead(b.as_ptr());
        let bsums = acts.bsums.get(16 * i..16 * i + 16).unwrap_or(&[]);
        // SAFETY: `b` is one whole super-block; `check_acts` made the
        // activations 256 values a super-block, with 16 sums each.
        let s = unsafe { isum(ty, b, acts.q.as_ptr().add(QK_K * i), bsums) };
        let [t0, t1] = k_terms(ty, b, s, acts.d[i], bsums);
        total += t0 + t1;
    }
    total
}
