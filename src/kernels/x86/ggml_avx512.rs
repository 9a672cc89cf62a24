//! AVX-512 dot products of ggml block rows, 64 columns per step: the
//! K-quants Q4_K, Q5_K and Q6_K here, the 32-column types in
//! [`super::ggml_avx512_b32`], Q2_K, Q3_K and IQ4_XS in
//! [`super::ggml_avx512_k23`]; [`dot`] picks one.
//!
//! The weight bytes of a sub-block pair fill one register and meet the
//! activation bytes in `vpmaddubsw` + `vpmaddwd`. Integer sums are exact
//! (the sub-block scales are applied to the lanes in i32 and a
//! super-block summed in integers) and only the f32 terms' split over
//! lanes and their order differ from the scalar reference.

use core::arch::x86_64::*;

use super::ggml_avx512_b32 as b32;
use super::ggml_avx512_k23 as k23;
use crate::gguf::GgmlType;
use crate::kernels::ggml::GgmlActs;

/// The Q4_K and Q5_K row kernels, written out whole under their target
/// features: per super-block the eight 6-bit sub-block scales widened to
/// i16 once and spread over each 64-column step's lanes by one permute,
/// the codes of a step (32 bytes, low nibbles then high ones) split by a
/// broadcast load and one variable shift, Q5_K's fifth bits (`qh` byte `k`
/// bit `2j` for column `k` of sub-block `2j`, bit `2j + 1` for `2j + 1`)
/// added under a 64-bit mask tested from a broadcast of `qh`. Codes ×
/// activations in i16 pairs (at most 2 · 31 · 127) then × the sub-block
/// scale into i32 lanes: the exact integer sums, `d · d_a` once per
/// super-block, and the mins' term `(dmin · d_a) · Σ bsum · min`
/// subtracted at the end, all as the generic loop computed them.
macro_rules! q45_k_kernel {
    ($name:ident, $q5:expr) => {
        /// # Safety
        /// The CPU has AVX-512F/BW, AVX2, FMA and F16C; `row` and `acts`
        /// passed `check_acts` for the type.
        #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
        unsafe fn $name(row: &[u8], acts: &GgmlActs) -> f32 {
            const Q5: bool = $q5;
            const B: usize = if Q5 { 176 } else { 144 };
            const QS: usize = if Q5 { 48 } else { 16 };
            let nb = row.len() / B;
            debug_assert!(acts.q.len() >= 256 * nb && acts.d.len() >= nb && acts.bsums.len() >= 16 * nb);
            let m4 = _mm512_set1_epi8(0x0F);
            let split = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
            // i16 lanes 0..16 take scale 2j, lanes 16..32 scale 2j + 1.
            let spread = |j: i16| {
                let (l, h) = (2 * j, 2 * j + 1);
                _mm512_set_epi16(
                    h, h, h, h, h, h, h, h, h, h, h, h, h, h, h, h, l, l, l, l, l, l, l, l, l, l, l, l, l, l,
                    l, l,
                )
            };
            let spreads = [spread(0), spread(1), spread(2), spread(3)];
            // Bit `2j` of each `qh` byte for the step's first 32 columns,
            // bit `2j + 1` for the others.
            let bit = |j: u32| {
                _mm512_inserti64x4::<1>(
                    _mm512_set1_epi8((1u32 << (2 * j)) as i8),
                    _mm256_set1_epi8((1u32 << (2 * j + 1)) as i8),
                )
            };
            let bits = [bit(0), bit(1), bit(2), bit(3)];
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
                let summs = _mm512_reduce_add_epi32(_mm512_zextsi256_si512(_mm256_madd_epi16(bs, mm)));
                mins += (f16c_at(b, 2) * acts.d[i]) * summs as f32;
                let sc16 =
                    _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(sc))));
                // SAFETY: `qh`'s 32 bytes at 16 of a Q5_K block.
                let qh = if Q5 {
                    unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(b.as_ptr().add(16).cast())) }
                } else {
                    _mm512_setzero_si512()
                };
                let mut isum = _mm512_setzero_si512();
                for j in 0..4 {
                    // SAFETY: `QS + 32 j + 32 <= B` bytes of the block and
                    // `256 i + 64 j + 64 <= 256 nb` activations.
                    let (v, a) = unsafe {
                        (
                            _mm512_broadcast_i64x4(_mm256_loadu_si256(b.as_ptr().add(QS + 32 * j).cast())),
                            _mm512_loadu_si512(acts.q.as_ptr().add(256 * i + 64 * j).cast()),
                        )
                    };
                    let mut w = _mm512_and_si512(_mm512_srlv_epi64(v, split), m4);
                    if Q5 {
                        let high = _mm512_test_epi8_mask(qh, bits[j]);
                        w = _mm512_mask_add_epi8(w, high, w, _mm512_set1_epi8(0x10));
                    }
                    let s = _mm512_permutexvar_epi16(spreads[j], sc16);
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

q45_k_kernel!(q4_k, false);
q45_k_kernel!(q5_k, true);

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

/// The f16 at byte `at` of `b` widened by `vcvtph2ps` (exact).
#[inline]
#[target_feature(enable = "f16c")]
fn f16c_at(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The types with an AVX-512 kernel in [`dot`].
pub(crate) fn has(ty: GgmlType) -> bool {
    use crate::gguf::GgmlType::*;
    matches!(
        ty,
        Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | IQ4_NL | MXFP4 | Q4_K | Q5_K | Q6_K | Q2_K | Q3_K | IQ4_XS
    )
}

/// The 32-column kernel of `ty` (VNNI or not) applied to `R` rows, or
/// `None` when `ty` is not a 32-column type.
///
/// # Safety
/// As the kernels: the CPU has their features (AVX512-VNNI when `vnni`);
/// `R` rows of `rb` bytes are readable from `rows`, and a row of `rb`
/// bytes and `acts` passed `check_acts` for `ty`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn b32_rows<const R: usize>(
    ty: GgmlType,
    rows: *const u8,
    rb: usize,
    acts: &GgmlActs,
    vnni: bool,
) -> Option<[f32; R]> {
    use crate::gguf::GgmlType::*;
    // SAFETY: forwarded from the caller.
    unsafe {
        Some(match (ty, vnni) {
            (Q8_0, true) => b32::q8_0_vnni::<R>(rows, rb, acts),
            (Q8_0, false) => b32::q8_0_plain::<R>(rows, rb, acts),
            (Q4_0, true) => b32::q4_0_vnni::<R>(rows, rb, acts),
            (Q4_0, false) => b32::q4_0_plain::<R>(rows, rb, acts),
            (Q4_1, true) => b32::q4_1_vnni::<R>(rows, rb, acts),
            (Q4_1, false) => b32::q4_1_plain::<R>(rows, rb, acts),
            (Q5_0, true) => b32::q5_0_vnni::<R>(rows, rb, acts),
            (Q5_0, false) => b32::q5_0_plain::<R>(rows, rb, acts),
            (Q5_1, true) => b32::q5_1_vnni::<R>(rows, rb, acts),
            (Q5_1, false) => b32::q5_1_plain::<R>(rows, rb, acts),
            (IQ4_NL, true) => b32::iq4_nl_vnni::<R>(rows, rb, acts),
            (IQ4_NL, false) => b32::iq4_nl_plain::<R>(rows, rb, acts),
            (MXFP4, true) => b32::mxfp4_vnni::<R>(rows, rb, acts),
            (MXFP4, false) => b32::mxfp4_plain::<R>(rows, rb, acts),
            _ => return None,
        })
    }
}

/// `out[i]` = row `i` of `bytes` · `acts` for the `out.len()` rows of `rb`
/// bytes in `bytes`, four rows at a time where the type has a multi-row
/// kernel (each value equals [`dot`] of its row exactly), or `false` when
/// `ty` has no AVX-512 kernel.
///
/// # Safety
/// As [`dot`]; `bytes` holds `out.len()` rows of `rb` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows(
    ty: GgmlType,
    bytes: &[u8],
    rb: usize,
    acts: &GgmlActs,
    vnni: bool,
    out: &mut [f32],
) -> bool {
    debug_assert_eq!(bytes.len(), rb * out.len());
    if !has(ty) {
        return false;
    }
    let mut r = 0;
    // Four rows at a time where the type has a multi-row kernel (the
    // 32-column types); the rest, and any remainder, row by row.
    if ty.block_size() == 32 {
        for o in out.chunks_exact_mut(4) {
            // SAFETY: rows `r..r + 4` are whole rows of `bytes`; the rest
            // is forwarded from the caller.
            match unsafe { b32_rows::<4>(ty, bytes.as_ptr().wrapping_add(r * rb), rb, acts, vnni) } {
                Some(v) => o.copy_from_slice(&v),
                None => break,
            }
            r += 4;
        }
    }
    for (o, row) in out[r..].iter_mut().zip(bytes[r * rb..].chunks_exact(rb)) {
        // SAFETY: forwarded from the caller; `has(ty)` holds.
        *o = unsafe { dot(ty, row, acts, vnni) }.unwrap_or(f32::NAN);
    }
    true
}

/// `row · acts`, or `None` when `ty` has no AVX-512 kernel.
///
/// # Safety
/// The CPU has AVX-512F/BW, AVX2, FMA and F16C, and AVX512-VNNI when
/// `vnni`; `row` and `acts` passed `check_acts` for `ty`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) unsafe fn dot(ty: GgmlType, row: &[u8], acts: &GgmlActs, vnni: bool) -> Option<f32> {
    // SAFETY: forwarded from the caller; the kernels read whole blocks of
    // `row` and their activations only.
    unsafe {
        if let Some([v]) = b32_rows::<1>(ty, row.as_ptr(), row.len(), acts, vnni) {
            return Some(v);
        }
        match ty {
            GgmlType::Q4_K => Some(q4_k(row, acts)),
            GgmlType::Q5_K => Some(q5_k(row, acts)),
            GgmlType::Q6_K => Some(q6_k(row, acts)),
            GgmlType::Q2_K => Some(k23::q2_k(row, acts)),
            GgmlType::Q3_K => Some(k23::q3_k(row, acts)),
            GgmlType::IQ4_XS => Some(k23::iq4_xs(row, acts)),
            _ => None,
        }
    }
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
