//! AVX-512 row kernels of the 32-column ggml types (Q8_0, Q4_0, Q4_1,
//! Q5_0, Q5_1, IQ4_NL, MXFP4): the integer work two blocks (64 columns) to
//! a register, the f32 work in ggml's own order, so that a row's result is
//! bit for bit the one llama.cpp's x86 kernels give.
//!
//! The weights are decoded to unsigned codes. A type whose values are
//! signed stores `value + c` with `c` a power of two (Q4_0: 8, Q5_0: 16;
//! Q8_0, IQ4_NL and MXFP4 go through a table or an XOR to `value + 128`),
//! and with AVX512-VNNI each 4-column lane starts from `-c Σ q` of its
//! columns ([`GgmlActs`]'s `lane_nsums`, shifted) before `vpdpbusd` adds
//! `Σ code q`: exactly ggml's lane `Σ value q`, with none of the sign
//! juggling `vpdpbusd`'s unsigned first operand would otherwise need.
//! Without VNNI the codes go back to signed values and through
//! `vpmaddubsw`'s `|w|`, `sign(q, w)` identity, as the AVX2 kernels do.
//! Q4_1 and Q5_1 have unsigned codes and a per-block offset `m` whose term
//! `m · s` is summed apart.
//!
//! Why ggml's order and not a faster one: the activations of the next
//! layer are rounded to int8 and the experts chosen by a top-k, so a
//! last-bit difference in one dot product can move a rounding or a routing
//! choice and change later logits by far more than a rounding error. Equal
//! lanes added in equal order keep colibri on llama.cpp's path token after
//! token. The cost is one dependent FMA per block, which the memory stream
//! hides. A last odd block runs as a pair whose second half has zero
//! activations and a zero correction, and is not added.

use core::arch::x86_64::*;

use crate::kernels::ggml::GgmlActs;
use crate::kernels::ggml::blocks::{KVALUES_IQ4NL, KVALUES_MXFP4};

/// How a type's codes relate to its values.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `value = code - (1 << shift)`.
    Offset(u32),
    /// `value = d · code + m` (Q4_1, Q5_1): unsigned codes, a min term.
    Min,
}

/// A table's 16 values plus 128, as the unsigned bytes of a shuffle table.
const fn shifted(t: [i8; 16]) -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = (t[i] as i16 + 128) as u8;
        i += 1;
    }
    out
}

const IQ4NL_CODES: [u8; 16] = shifted(KVALUES_IQ4NL);
const MXFP4_CODES: [u8; 16] = shifted(KVALUES_MXFP4);

/// The 16 nibble bytes at `p0` and at `p1` as 64 codes 0..15 in column
/// order: `p0`'s low nibbles (columns 0..16), its high ones (16..32), then
/// `p1`'s.
///
/// # Safety
/// 16 bytes are readable at each pointer.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn nibble_pair(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: the caller guarantees both 16-byte loads.
    let x = unsafe {
        _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(p0.cast())),
            _mm_loadu_si128(p1.cast()),
        )
    };
    // 128-bit lanes [p0, p0, p1, p1], the second copy of each shifted by 4.
    let y = _mm512_permutexvar_epi64(
        _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
        _mm512_castsi256_si512(x),
    );
    let z = _mm512_srlv_epi64(y, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    _mm512_and_si512(z, _mm512_set1_epi8(0x0F))
}

/// The 32 bytes at `p0` and at `p1` as one register.
///
/// # Safety
/// 32 bytes are readable at each pointer.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn bytes_pair(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: the caller guarantees both 32-byte loads.
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_loadu_si256(p0.cast())),
            _mm256_loadu_si256(p1.cast()),
        )
    }
}

/// The little-endian u32 at `p`.
///
/// # Safety
/// 4 bytes are readable at `p`.
#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees the 4 bytes.
    unsafe { u32::from_le_bytes(*p.cast::<[u8; 4]>()) }
}

/// The little-endian u16 (an f16's bits) at `p`.
///
/// # Safety
/// 2 bytes are readable at `p`.
#[inline(always)]
unsafe fn u16_at(p: *const u8) -> u16 {
    // SAFETY: the caller guarantees the 2 bytes.
    unsafe { u16::from_le_bytes(*p.cast::<[u8; 2]>()) }
}

/// ggml's E8M0 half scale of every exponent byte
/// ([`crate::kernels::ggml::blocks::e8m0_half`]), so a
/// kernel loads it instead of branching per block.
static E8M0_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut e = 0;
    while e < 256 {
        let bits = if e < 2 {
            0x0020_0000u32 << e
        } else {
            (e as u32 - 1) << 23
        };
        t[e] = f32::from_bits(bits);
        e += 1;
    }
    t
};

/// One 32-column type's kernel over `R` rows at once, written out whole
/// under its target features (helpers across feature boundaries were not
/// inlined, see ggml_avx512.rs). `$codes(b0, b1)` gives the 64 unsigned
/// codes of blocks at `b0` and `b1`; `$kind` relates codes to values;
/// `$e8m0` says the block scale is MXFP4's E8M0 byte rather than an f16.
/// Each row keeps its own accumulator in ggml's order, a chain of one
/// dependent FMA per block; the `R` rows' chains are independent, so their
/// latencies overlap and a row's result does not depend on `R`. Four
/// blocks a step: their four scales (and Q4_1/Q5_1's four offsets) are
/// widened and multiplied by the activations' in one 128-bit vector.
macro_rules! b32_kernel {
    ($name:ident, $features:literal, $block:expr, $vnni:expr, $kind:expr, $e8m0:expr, $codes:expr) => {
        /// `out[r]` = row `r` · `acts` for the `R` rows of `rb` bytes from
        /// `rows`.
        ///
        /// # Safety
        /// The CPU has the features this function is compiled for; `R`
        /// rows of `rb` bytes are readable from `rows`, and a row of `rb`
        /// bytes and `acts` passed `check_acts` for the type.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name<const R: usize>(rows: *const u8, rb: usize, acts: &GgmlActs) -> [f32; R] {
            const B: usize = $block;
            const KIND: Kind = $kind;
            let nb = rb / B;
            debug_assert!(acts.q.len() >= 32 * nb && acts.d.len() >= nb);
            debug_assert!(KIND == Kind::Min || acts.lane_nsums.len() >= 16 * nb.div_ceil(2));
            debug_assert!(KIND != Kind::Min || acts.s.len() >= nb);
            let qp = acts.q.as_ptr();
            let zero = _mm512_setzero_si512();
            let codes = $codes;
            // Blocks `i` and (when `two`) `i + 1` of the row at `rp`: the
            // exact i32 lane sums (lanes 0..8 block `i`, 8..16 the next,
            // zero when absent), ggml's lanes of four columns.
            let isum = |rp: *const u8, i: usize, two: bool| -> __m512i {
                // SAFETY: blocks `i` and (when `two`) `i + 1` are whole
                // blocks of the row; their activations and lane sums
                // (padded to whole pairs) are in `acts` (`check_acts`). A
                // lone last block reads its own bytes twice against zero
                // activations and zero lane sums.
                unsafe {
                    let b0 = rp.add(i * B);
                    let b1 = if two { rp.add((i + 1) * B) } else { b0 };
                    let c = codes(b0, b1);
                    let a = if two {
                        _mm512_loadu_si512(qp.add(32 * i).cast())
                    } else {
                        _mm512_zextsi256_si512(_mm256_loadu_si256(qp.add(32 * i).cast()))
                    };
                    match KIND {
                        Kind::Offset(shift) if $vnni => {
                            let n = _mm512_loadu_si512(acts.lane_nsums.as_ptr().add(8 * i).cast());
                            _mm512_dpbusd_epi32(_mm512_sll_epi32(n, _mm_cvtsi32_si128(shift as i32)), c, a)
                        }
                        Kind::Offset(shift) => {
                            let w = _mm512_sub_epi8(c, _mm512_set1_epi8((1i32 << shift) as i8));
                            let neg = _mm512_movepi8_mask(w);
                            let a = _mm512_mask_sub_epi8(a, neg, zero, a);
                            _mm512_madd_epi16(
                                _mm512_maddubs_epi16(_mm512_abs_epi8(w), a),
                                _mm512_set1_epi16(1),
                            )
                        }
                        Kind::Min if $vnni => _mm512_dpbusd_epi32(zero, c, a),
                        Kind::Min => _mm512_madd_epi16(_mm512_maddubs_epi16(c, a), _mm512_set1_epi16(1)),
                    }
                }
            };
            // The weight scales of the `n` (1..=4) blocks from `i` of the
            // row at `rp` times their activation scales, lane k block
            // `i + k` (zero past `n`), and for Q4_1/Q5_1 the blocks'
            // `m · s` likewise, as arrays.
            let scales = |rp: *const u8, i: usize, n: usize| -> ([f32; 4], [f32; 4]) {
                let full = n == 4;
                // SAFETY: blocks `i..i + n` are whole blocks of the row,
                // with their activation scales (and sums) in `acts`; lanes
                // past `n` read nothing; the stores fill local arrays.
                unsafe {
                    let b = |k: usize| rp.add((i + k) * B);
                    let dw = if $e8m0 {
                        let e = |k: usize| {
                            if full || k < n {
                                E8M0_HALF[usize::from(*b(k))]
                            } else {
                                0.0
                            }
                        };
                        _mm_setr_ps(e(0), e(1), e(2), e(3))
                    } else {
                        let h = |k: usize| {
                            if full || k < n {
                                u16_at(b(k)) as i16
                            } else {
                                0
                            }
                        };
                        _mm_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), 0, 0, 0, 0))
                    };
                    let lanes = |v: *const f32| {
                        if full {
                            _mm_loadu_ps(v.add(i))
                        } else {
                            let x = |k: usize| if k < n { *v.add(i + k) } else { 0.0 };
                            _mm_setr_ps(x(0), x(1), x(2), x(3))
                        }
                    };
                    let (mut d, mut m) = ([0f32; 4], [0f32; 4]);
                    _mm_storeu_ps(d.as_mut_ptr(), _mm_mul_ps(dw, lanes(acts.d.as_ptr())));
                    if KIND == Kind::Min {
                        let h = |k: usize| {
                            if full || k < n {
                                u16_at(b(k).add(2)) as i16
                            } else {
                                0
                            }
                        };
                        let mw = _mm_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), 0, 0, 0, 0));
                        _mm_storeu_ps(m.as_mut_ptr(), _mm_mul_ps(mw, lanes(acts.s.as_ptr())));
                    }
                    (d, m)
                }
            };
            // ggml's order per row: one 8-lane accumulator, each block's
            // lanes times its scale added in block order, Q4_1/Q5_1's
            // `m · s` to a scalar in block order, then
            // [`super::ggml_avx2::hsum`].
            let mut acc = [_mm256_setzero_ps(); R];
            let mut offsets = [0.0f32; R];
            let add = |acc: __m256, x: __m512i, d: &[f32; 4], k: usize, two: bool| {
                let x = _mm512_cvtepi32_ps(x);
                let acc = _mm256_fmadd_ps(_mm512_castps512_ps256(x), _mm256_set1_ps(d[k]), acc);
                if two {
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
                    _mm256_fmadd_ps(hi, _mm256_set1_ps(d[k + 1]), acc)
                } else {
                    acc
                }
            };
            let row = |r: usize| rows.wrapping_add(r * rb);
            let mut i = 0;
            while i + 4 <= nb {
                for r in 0..R {
                    super::prefetch_span(row(r).wrapping_add(i * B), 4 * B);
                    let (x0, x1) = (isum(row(r), i, true), isum(row(r), i + 2, true));
                    let (d, m) = scales(row(r), i, 4);
                    acc[r] = add(acc[r], x0, &d, 0, true);
                    acc[r] = add(acc[r], x1, &d, 2, true);
                    if KIND == Kind::Min {
                        for m in m {
                            offsets[r] += m;
                        }
                    }
                }
                i += 4;
            }
            if i < nb {
                let n = nb - i;
                for r in 0..R {
                    let (d, m) = scales(row(r), i, n);
                    acc[r] = add(acc[r], isum(row(r), i, n >= 2), &d, 0, n >= 2);
                    if n == 3 {
                        acc[r] = add(acc[r], isum(row(r), i + 2, false), &d, 2, false);
                    }
                    if KIND == Kind::Min {
                        for &m in &m[..n] {
                            offsets[r] += m;
                        }
                    }
                }
            }
            let mut out = [0f32; R];
            for r in 0..R {
                out[r] = super::ggml_avx2::hsum(acc[r]) + offsets[r];
            }
            out
        }
    };
}

/// Q8_0: the 32 signed bytes at 2, XOR 0x80 (`value + 128`).
macro_rules! q8_0_codes {
    () => {
        // SAFETY (at each use): both are whole 34-byte blocks.
        |b0: *const u8, b1: *const u8| unsafe {
            _mm512_xor_si512(bytes_pair(b0.add(2), b1.add(2)), _mm512_set1_epi8(-128))
        }
    };
}

/// Q4_0 / Q4_1: the nibbles at byte `$at`.
macro_rules! nibble_codes {
    ($at:expr) => {
        // SAFETY (at each use): both are whole blocks holding 16 nibble
        // bytes at `$at`.
        |b0: *const u8, b1: *const u8| unsafe { nibble_pair(b0.add($at), b1.add($at)) }
    };
}

/// Q5_0 / Q5_1: the nibbles at `$at` and bit `j` of the u32 at `$qh` as
/// bit 4 of column `j`: both blocks' 32 bits are one 64-bit mask.
macro_rules! q5_codes {
    ($qh:expr, $at:expr) => {
        // SAFETY (at each use): both are whole blocks (`qh` at `$qh`, 16
        // nibble bytes at `$at`).
        |b0: *const u8, b1: *const u8| unsafe {
            let n = nibble_pair(b0.add($at), b1.add($at));
            let bits = u64::from(u32_at(b0.add($qh))) | (u64::from(u32_at(b1.add($qh))) << 32);
            _mm512_mask_add_epi8(n, bits, n, _mm512_set1_epi8(0x10))
        }
    };
}

/// IQ4_NL / MXFP4: the nibbles at `$at` through a 16-entry table of
/// `value + 128`.
macro_rules! table_codes {
    ($table:expr, $at:expr) => {
        // SAFETY (at each use): both are whole blocks with 16 nibble bytes
        // at `$at`; the table has 16 bytes.
        |b0: *const u8, b1: *const u8| unsafe {
            let t = _mm512_broadcast_i32x4(_mm_loadu_si128($table.as_ptr().cast()));
            _mm512_shuffle_epi8(t, nibble_pair(b0.add($at), b1.add($at)))
        }
    };
}

b32_kernel!(
    q8_0_vnni,
    "avx512f,avx512bw,avx2,fma,f16c,avx512vnni",
    34,
    true,
    Kind::Offset(7),
    false,
    q8_0_codes!()
);
b32_kernel!(
    q8_0_plain,
    "avx512f,avx512bw,avx2,fma,f16c",
    34,
    false,
    Kind::Offset(7),
    false,
    q8_0_codes!()
);
b32_kernel!(
    q4_0_vnni,
    "avx512f,avx512bw,avx2,fma,f16c,avx512vnni",
    18,
    true,
    Kind::Offset(3),
    false,
    nibble_codes!(2)
);
b32_kernel!(
    q4_0_plain,
    "avx512f,avx512bw,avx2,fma,f16c",
    18,
    false,
    Kind::Offset(3),
    false,
    nibble_codes!(2)
);
b32_kernel!(
    q4_1_vnni,
    "avx512f,avx512bw,avx2,fma,f16c,avx512vnni",
    20,
    true,
    Kind::Min,
    false,
    nibble_codes!(4)
);
b32_kernel!(
    q4_1_plain,
    "avx512f,avx512bw,avx2,fma,f16c",
    20,
    false,
    Kind::Min,
    false,
    nibble_codes!(4)
);
b32_kernel!(
    q5_0_vnni,
    "avx512f,avx512bw,avx2,fma,f16c,avx512vnni",
    22,
    true,
    Kind::Offset(4),
    false,
    q5_codes!(2, 6)
);
b32_kernel!(
    q5_0_plain,
    "avx512f,avx512bw,avx2,fma,f16c",
    22,
    false,
    Kind::Offset(4),
    false,
    q5_codes!(2, 6)
);
b32_kernel!(
    q5_1_vnni,
    "avx512f,avx512bw,avx2,fma,f16c,avx512vnni",
    24,
    true,
    Kind::Min,
    false,
    q5_codes!(4, 8)
);
b32_kernel!(
    q5_1_plain,
    "avx512f,avx512bw,avx2,fma,f16c",
    24,
    false,
    Kind::Min,
    false,
    q5_codes!(4, 8)
);
b32_kernel!(
    iq4_nl_vnni,
    "avx512f,avx512bw,avx2,fma,f16c,avx512vnni",
    18,
    true,
    Kind::Offset(7),
    false,
    table_codes!(IQ4NL_CODES, 2)
);
b32_kernel!(
    iq4_nl_plain,
    "avx512f,avx512bw,avx2,fma,f16c",
    18,
    false,
    Kind::Offset(7),
    false,
    table_codes!(IQ4NL_CODES, 2)
);
b32_kernel!(
    mxfp4_vnni,
    "avx512f,avx512bw,avx2,fma,f16c,avx512vnni",
    17,
    true,
    Kind::Offset(7),
    true,
    table_codes!(MXFP4_CODES, 1)
);
b32_kernel!(
    mxfp4_plain,
    "avx512f,avx512bw,avx2,fma,f16c",
    17,
    false,
    Kind::Offset(7),
    true,
    table_codes!(MXFP4_CODES, 1)
);

#[cfg(test)]
mod tests {
    use super::{E8M0_HALF, IQ4NL_CODES, MXFP4_CODES};
    use crate::kernels::ggml::blocks::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_half};

    #[test]
    fn tables_hold_the_reference_values() {
        for e in 0..=255u8 {
            assert_eq!(
                E8M0_HALF[usize::from(e)].to_bits(),
                e8m0_half(e).to_bits(),
                "exponent {e}"
            );
        }
        for k in 0..16 {
            assert_eq!(i16::from(IQ4NL_CODES[k]) - 128, i16::from(KVALUES_IQ4NL[k]));
            assert_eq!(i16::from(MXFP4_CODES[k]) - 128, i16::from(KVALUES_MXFP4[k]));
        }
    }
}
