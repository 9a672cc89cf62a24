//! AVX-512 row kernels of Q2_K, Q3_K and IQ4_XS: the super-block types
//! whose low-bit codes, sub-block scales or non-linear values the other
//! kernels do not share. 64 columns per step.
//!
//! - Q2_K and Q3_K hold a 128-column half of a super-block as 32 bytes of
//!   2-bit fields: field `j` of byte `l` is column `32 j + l`. A step takes
//!   two fields of those bytes by one variable shift of a broadcast load.
//!   Q3_K's third bit (`hmask` byte `l`, bit `4 n + j` for half `n`) is
//!   added under a 64-bit mask tested from a broadcast of `hmask`.
//! - Codes (Q2_K 0..3, Q3_K 0..7: `value + 4`) × activations in i16 pairs,
//!   then × the 16-column sub-block's scale into i32 lanes: exact.
//!   Q3_K's offset comes off the lanes once per super-block, as
//!   `4 Σ_k sc_k bsum_k` from Q8_K's 16-column sums, and Q2_K's mins term
//!   is `Σ_k min_k bsum_k`, as the scalar reference computes it.
//! - IQ4_XS: the nibbles through the signed value table, then the
//!   `|w|`, `sign(q, w)` identity and `vpmaddubsw` (every pair at most
//!   2 · 127 · 127), × the 32-column sub-block's 6-bit scale (minus 32).
//!
//! Only the f32 terms' split over lanes and their order differ from the
//! scalar reference.

use core::arch::x86_64::*;

use crate::kernels::ggml::GgmlActs;
use crate::kernels::ggml::blocks::KVALUES_IQ4NL;

/// The f16 at `b[at..]` widened by `vcvtph2ps` (exact).
#[inline]
#[target_feature(enable = "f16c")]
fn f16c_at(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The little-endian u64 at `b[at..at + 8]`.
#[inline(always)]
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The sixteen 6-bit Q3_K scales (not yet minus 32) from the 12 packed
/// bytes, as two u64 of eight bytes: the values of
/// [`crate::kernels::ggml::blocks::q3k_scales`] plus 32 (a unit test
/// checks them).
#[inline(always)]
fn q3k_scales_u8(s: &[u8]) -> (u64, u64) {
    const LO: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    const HI: u32 = 0x0303_0303;
    let low = u64_at(s, 0);
    let h = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let high = |a: u32, b: u32| u64::from((h >> a) & HI) | (u64::from((h >> b) & HI) << 32);
    (
        (low & LO) | (high(0, 2) << 4),
        ((low >> 4) & LO) | (high(4, 6) << 4),
    )
}

/// The eight IQ4_XS scales (not yet minus 32) as the bytes of a u64:
/// low nibble `k` of `scales_l`, bits `2k..2k + 2` of `scales_h` above it.
#[inline(always)]
fn iq4xs_scales_u8(b: &[u8]) -> u64 {
    let l = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let h = u16::from_le_bytes([b[2], b[3]]);
    let mut out = 0u64;
    for k in 0..8 {
        let lo = u64::from((l >> (4 * k)) & 0xF);
        let hi = u64::from((h >> (2 * k)) & 3);
        out |= (lo | (hi << 4)) << (8 * k);
    }
    out
}

/// `Σ` of the 16 i32 lanes `bsums × scales` (i16 each) of a super-block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
fn sum_products(bsums: __m256i, scales: __m256i) -> i32 {
    _mm512_reduce_add_epi32(_mm512_zextsi256_si512(_mm256_madd_epi16(bsums, scales)))
}

/// i16 lane index vectors: step `t` of a super-block (64 columns, four
/// 16-column sub-blocks `4t..4t + 4`) spreads sub-block `4t + p / 16` over
/// i16 lane `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn spread16(t: i16) -> __m512i {
    let (a, b, c, d) = (4 * t, 4 * t + 1, 4 * t + 2, 4 * t + 3);
    _mm512_set_epi16(
        d, d, d, d, d, d, d, d, c, c, c, c, c, c, c, c, b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a,
    )
}

/// Q2_K (`Q3` false) or Q3_K row kernel.
macro_rules! q23_k_kernel {
    ($name:ident, $q3:expr) => {
        /// # Safety
        /// The CPU has AVX-512F/BW, AVX2, FMA and F16C; `row` and `acts`
        /// passed `check_acts` for the type.
        #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
        pub(super) unsafe fn $name(row: &[u8], acts: &GgmlActs) -> f32 {
            const Q3: bool = $q3;
            const B: usize = if Q3 { 110 } else { 84 };
            const QS: usize = if Q3 { 32 } else { 16 };
            let nb = row.len() / B;
            debug_assert!(acts.q.len() >= 256 * nb && acts.d.len() >= nb && acts.bsums.len() >= 16 * nb);
            let m2 = _mm512_set1_epi8(3);
            // Fields j = 0, 1 (step 0 of a half) or 2, 3 (step 1).
            let shifts = [
                _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2),
                _mm512_setr_epi64(4, 4, 4, 4, 6, 6, 6, 6),
            ];
            let spreads = [spread16(0), spread16(1), spread16(2), spread16(3)];
            // Q3_K: bit `4 n + j` of each hmask byte for the step's first
            // 32 columns, bit `4 n + j + 1` for the others (step t = 2n + j / 2).
            let bit = |t: u32| {
                let k = 4 * (t / 2) + 2 * (t % 2);
                _mm512_inserti64x4::<1>(
                    _mm512_set1_epi8((1u32 << k) as i8),
                    _mm256_set1_epi8((1u32 << (k + 1)) as i8),
                )
            };
            let bits = [bit(0), bit(1), bit(2), bit(3)];
            let mut acc = _mm512_setzero_ps();
            let mut tail = 0.0f32;
            for i in 0..nb {
                let b = &row[i * B..(i + 1) * B];
                super::prefetch_span(b.as_ptr(), B);
                // SAFETY: 16 i16 sums of super-block `i`.
                let bs = unsafe { _mm256_loadu_si256(acts.bsums.as_ptr().add(16 * i).cast()) };
                let (sc16, d, hm) = if Q3 {
                    let (lo, hi) = q3k_scales_u8(&b[96..108]);
                    let sc = _mm256_sub_epi16(
                        _mm256_cvtepu8_epi16(_mm_set_epi64x(hi as i64, lo as i64)),
                        _mm256_set1_epi16(32),
                    );
                    // SAFETY: hmask's 32 bytes at 0.
                    let hm = unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(b.as_ptr().cast())) };
                    (sc, f16c_at(b, 108), hm)
                } else {
                    // SAFETY: the 16 scale bytes at 0.
                    let raw = unsafe { _mm256_cvtepu8_epi16(_mm_loadu_si128(b.as_ptr().cast())) };
                    let mins = _mm256_srli_epi16::<4>(raw);
                    tail -= (f16c_at(b, 82) * acts.d[i]) * sum_products(bs, mins) as f32;
                    (
                        _mm256_and_si256(raw, _mm256_set1_epi16(0xF)),
                        f16c_at(b, 80),
                        _mm512_setzero_si512(),
                    )
                };
                // Q3_K's codes' offset, `4 Σ_k sc_k bsum_k`, starts lane 0
                // negative, so the lanes sum to the exact integer.
                let mut isum = if Q3 {
                    _mm512_mask_set1_epi32(_mm512_setzero_si512(), 1, -4 * sum_products(bs, sc16))
                } else {
                    _mm512_setzero_si512()
                };
                let sc16 = _mm512_castsi256_si512(sc16);
                for n in 0..2 {
                    // SAFETY: the half's 32 code bytes at `QS + 32 n`.
                    let v = unsafe {
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(b.as_ptr().add(QS + 32 * n).cast()))
                    };
                    for h in 0..2 {
                        let t = 2 * n + h;
                        let mut w = _mm512_and_si512(_mm512_srlv_epi64(v, shifts[h]), m2);
                        if Q3 {
                            let high = _mm512_test_epi8_mask(hm, bits[t]);
                            w = _mm512_mask_add_epi8(w, high, w, _mm512_set1_epi8(4));
                        }
                        // SAFETY: `256 i + 64 t + 64 <= 256 nb` activations.
                        let a = unsafe { _mm512_loadu_si512(acts.q.as_ptr().add(256 * i + 64 * t).cast()) };
                        let s = _mm512_permutexvar_epi16(spreads[t], sc16);
                        isum = _mm512_add_epi32(isum, _mm512_madd_epi16(_mm512_maddubs_epi16(w, a), s));
                    }
                }
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(d * acts.d[i]), acc);
            }
            _mm512_reduce_add_ps(acc) + tail
        }
    };
}

q23_k_kernel!(q2_k, false);
q23_k_kernel!(q3_k, true);

/// The IQ4_XS row kernel.
///
/// # Safety
/// The CPU has AVX-512F/BW, AVX2, FMA and F16C; `row` and `acts` passed
/// `check_acts` for IQ4_XS.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn iq4_xs(row: &[u8], acts: &GgmlActs) -> f32 {
    const B: usize = 136;
    let nb = row.len() / B;
    debug_assert!(acts.q.len() >= 256 * nb && acts.d.len() >= nb);
    // SAFETY: the table has 16 bytes.
    let table = unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast())) };
    let m4 = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    // i16 lanes 0..16 take sub-block scale 2j, lanes 16..32 scale 2j + 1.
    let spread = |j: i16| {
        let (l, h) = (2 * j, 2 * j + 1);
        _mm512_set_epi16(
            h, h, h, h, h, h, h, h, h, h, h, h, h, h, h, h, l, l, l, l, l, l, l, l, l, l, l, l, l, l, l, l,
        )
    };
    let spreads = [spread(0), spread(1), spread(2), spread(3)];
    let mut acc = _mm512_setzero_ps();
    for i in 0..nb {
        let b = &row[i * B..(i + 1) * B];
        super::prefetch_span(b.as_ptr(), B);
        let sc = _mm_sub_epi16(
            _mm_cvtepu8_epi16(_mm_cvtsi64_si128(iq4xs_scales_u8(b) as i64)),
            _mm_set1_epi16(32),
        );
        let sc = _mm512_castsi128_si512(sc);
        let mut isum = _mm512_setzero_si512();
        for (j, spread) in spreads.iter().enumerate() {
            // SAFETY: sub-blocks 2j and 2j + 1: 32 bytes at `8 + 32 j`;
            // `256 i + 64 j + 64 <= 256 nb` activations.
            let (x, a) = unsafe {
                (
                    _mm256_loadu_si256(b.as_ptr().add(8 + 32 * j).cast()),
                    _mm512_loadu_si512(acts.q.as_ptr().add(256 * i + 64 * j).cast()),
                )
            };
            // 128-bit lanes: sub-block 2j's low nibbles, its high ones,
            // then 2j + 1's.
            let y = _mm512_permutexvar_epi64(
                _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                _mm512_castsi256_si512(x),
            );
            let nib = _mm512_and_si512(
                _mm512_srlv_epi64(y, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                m4,
            );
            let w = _mm512_shuffle_epi8(table, nib);
            let neg = _mm512_movepi8_mask(w);
            let a = _mm512_mask_sub_epi8(a, neg, zero, a);
            let s = _mm512_permutexvar_epi16(*spread, sc);
            isum = _mm512_add_epi32(
                isum,
                _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w), a), s),
            );
        }
        acc = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(isum),
            _mm512_set1_ps(f16c_at(b, 0) * acts.d[i]),
            acc,
        );
    }
    _mm512_reduce_add_ps(acc)
}

#[cfg(test)]
mod tests {
    use super::{iq4xs_scales_u8, q3k_scales_u8};
    use crate::kernels::ggml::blocks::q3k_scales;

    fn bytes(state: &mut u32, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| {
                *state ^= *state << 13;
                *state ^= *state >> 17;
                *state ^= *state << 5;
                *state as u8
            })
            .collect()
    }

    #[test]
    fn packed_scales_unpack_as_the_reference_does() {
        let mut state = 0x1234_5679u32;
        for _ in 0..20_000 {
            let s = bytes(&mut state, 12);
            let (lo, hi) = q3k_scales_u8(&s);
            let got: Vec<i8> = lo
                .to_le_bytes()
                .iter()
                .chain(&hi.to_le_bytes())
                .map(|&v| v as i8 - 32)
                .collect();
            assert_eq!(got, q3k_scales(&s), "{s:?}");
            let b = bytes(&mut state, 8);
            let h = u16::from_le_bytes([b[2], b[3]]);
            for (k, v) in iq4xs_scales_u8(&b).to_le_bytes().into_iter().enumerate() {
                let l = (b[4 + k / 2] >> (4 * (k % 2))) & 0xF;
                assert_eq!(v, l | ((((h >> (2 * k)) & 3) as u8) << 4), "{b:?} scale {k}");
            }
        }
    }
}
