//! AVX2+FMA kernels: 8 columns per vector, four accumulators per token.
//!
//! Same walk as the AVX-512 kernels with chunks of 8 columns: chunk `c` of a
//! group of four goes to accumulator `c % 4`, leftovers and the zero-padded
//! partial chunk to accumulator 0; pairwise sum, fixed horizontal reduction,
//! times the row scale. Grouped scales multiply each chunk's weights.
//!
//! Int4 rows against prepared activations take the nibble kernel
//! ([`nib_dot`]) instead.

use core::arch::x86_64::*;
use core::ptr;

use super::{NibGroups, ScaleCursor, grouping, nib_groups};
use crate::kernels::{Acts, RowRef, scalar};
use crate::quant::QFormat;

/// Columns per vector.
const W: usize = 8;

/// How far ahead of the current chunk the weights are prefetched, in bytes.
const PREFETCH: usize = 1024;

/// Turns packed weights into f32 vectors.
trait Unpack {
    /// Bytes holding one chunk of 8 columns.
    const BYTES: usize;
    /// Weights of chunk `c` (columns `8c..8c+8`); its bytes lie in the row.
    unsafe fn one(p: *const u8, c: usize) -> __m256;
    /// Chunks `c..c+4`.
    unsafe fn four(p: *const u8, c: usize) -> [__m256; 4];
}

struct F32;
struct I8;
struct I4;
struct I2;

/// The low 8 signed bytes of `v` as f32.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn bytes_to_ps(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

impl Unpack for F32 {
    const BYTES: usize = 32;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn one(p: *const u8, c: usize) -> __m256 {
        // SAFETY: the caller guarantees the chunk's 32 bytes are readable.
        unsafe { _mm256_loadu_ps(p.cast::<f32>().add(W * c)) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn four(p: *const u8, c: usize) -> [__m256; 4] {
        // SAFETY: as for `one`, for four consecutive chunks.
        unsafe {
            [
                Self::one(p, c),
                Self::one(p, c + 1),
                Self::one(p, c + 2),
                Self::one(p, c + 3),
            ]
        }
    }
}

impl Unpack for I8 {
    const BYTES: usize = 8;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn one(p: *const u8, c: usize) -> __m256 {
        // SAFETY: the caller guarantees the chunk's 8 bytes are readable.
        bytes_to_ps(unsafe { _mm_loadl_epi64(p.add(W * c).cast()) })
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn four(p: *const u8, c: usize) -> [__m256; 4] {
        // SAFETY: the caller guarantees the four chunks' 32 bytes are readable.
        let v = unsafe { _mm256_loadu_si256(p.add(W * c).cast()) };
        let lo = _mm256_castsi256_si128(v);
        let hi = _mm256_extracti128_si256::<1>(v);
        [
            bytes_to_ps(lo),
            bytes_to_ps(_mm_srli_si128::<8>(lo)),
            bytes_to_ps(hi),
            bytes_to_ps(_mm_srli_si128::<8>(hi)),
        ]
    }
}

impl Unpack for I4 {
    const BYTES: usize = 4;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn one(p: *const u8, c: usize) -> __m256 {
        // SAFETY: the caller guarantees the chunk's 4 bytes are readable.
        let u = unsafe { p.add(4 * c).cast::<u32>().read_unaligned() };
        let v = _mm_cvtepu8_epi16(_mm_cvtsi32_si128(u as i32));
        let t = _mm_and_si128(_mm_or_si128(v, _mm_slli_epi16::<4>(v)), _mm_set1_epi16(0x0F0F));
        bytes_to_ps(_mm_sub_epi8(t, _mm_set1_epi8(8)))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn four(p: *const u8, c: usize) -> [__m256; 4] {
        // SAFETY: the caller guarantees the four chunks' 16 bytes are readable.
        let b = unsafe { _mm_loadu_si128(p.add(4 * c).cast()) };
        // Byte k -> 16-bit lane k = low nibble | high nibble << 8, minus 8 per byte.
        let v = _mm256_cvtepu8_epi16(b);
        let t = _mm256_and_si256(
            _mm256_or_si256(v, _mm256_slli_epi16::<4>(v)),
            _mm256_set1_epi16(0x0F0F),
        );
        let s = _mm256_sub_epi8(t, _mm256_set1_epi8(8));
        let lo = _mm256_castsi256_si128(s);
        let hi = _mm256_extracti128_si256::<1>(s);
        [
            bytes_to_ps(lo),
            bytes_to_ps(_mm_srli_si128::<8>(lo)),
            bytes_to_ps(hi),
            bytes_to_ps(_mm_srli_si128::<8>(hi)),
        ]
    }
}

impl Unpack for I2 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn one(p: *const u8, c: usize) -> __m256 {
        // SAFETY: the caller guarantees the chunk's 2 bytes are readable.
        let u = unsafe { p.add(2 * c).cast::<u16>().read_unaligned() };
        // Column j of the chunk is bits 2j..2j+2 of the little-endian word.
        let v = _mm256_srlv_epi32(
            _mm256_set1_epi32(u as i32),
            _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
        );
        let q = _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(3)), _mm256_set1_epi32(2));
        _mm256_cvtepi32_ps(q)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn four(p: *const u8, c: usize) -> [__m256; 4] {
        // SAFETY: as for `one`, for four consecutive chunks.
        unsafe {
            [
                Self::one(p, c),
                Self::one(p, c + 1),
                Self::one(p, c + 2),
                Self::one(p, c + 3),
            ]
        }
    }
}

/// Fixed-order horizontal sum.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// `T` dot products of one row; see the AVX-512 `row_dot` for the contract.
///
/// # Safety
/// `p` holds `nbytes` readable bytes laid out for `U`, each `xs[t]` holds
/// `cols` readable values, and with `G`, `group` is a positive multiple of 8
/// and `scales` has `cols.div_ceil(group)` entries.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn row_dot<U: Unpack, const T: usize, const G: bool>(
    p: *const u8,
    nbytes: usize,
    cols: usize,
    scale: f32,
    scales: &[f32],
    group: usize,
    xs: [*const f32; T],
) -> [f32; T] {
    let nfull = cols / W;
    let mut acc = [[_mm256_setzero_ps(); 4]; T];
    // Scales: one per iteration of four chunks when groups are whole
    // iterations, else one per chunk; leftover chunks look theirs up.
    let coarse = G && group.is_multiple_of(4 * W);
    let per = if coarse {
        group / (4 * W)
    } else {
        (group / W).max(1)
    };
    let mut cursor = ScaleCursor::new(scales, per);
    let scale_at = |c: usize, w: __m256| {
        if G {
            _mm256_mul_ps(w, _mm256_set1_ps(scales[W * c / group]))
        } else {
            w
        }
    };
    let mut c = 0;
    // SAFETY (whole body): chunks below `nfull` lie inside the row's
    // `nbytes`, activation offsets stay below `cols`, and the partial chunk
    // is copied into a local buffer and read from `xs` with a mask.
    unsafe {
        while c + 4 <= nfull {
            // A hint only: never faults, so it may point past the row.
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(c * U::BYTES + PREFETCH).cast());
            let mut w = U::four(p, c);
            if coarse {
                let s = _mm256_set1_ps(cursor.next_scale());
                for wk in &mut w {
                    *wk = _mm256_mul_ps(*wk, s);
                }
            } else if G {
                for wk in &mut w {
                    *wk = _mm256_mul_ps(*wk, _mm256_set1_ps(cursor.next_scale()));
                }
            }
            for k in 0..4 {
                for t in 0..T {
                    let x = _mm256_loadu_ps(xs[t].add(W * (c + k)));
                    acc[t][k] = _mm256_fmadd_ps(w[k], x, acc[t][k]);
                }
            }
            c += 4;
        }
        while c < nfull {
            let wk = scale_at(c, U::one(p, c));
            for t in 0..T {
                acc[t][0] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(xs[t].add(W * c)), acc[t][0]);
            }
            c += 1;
        }
        let rem = cols - W * c;
        if rem > 0 {
            let mut buf = [0u8; 32];
            let off = c * U::BYTES;
            ptr::copy_nonoverlapping(p.add(off), buf.as_mut_ptr(), nbytes - off);
            let wk = scale_at(c, U::one(buf.as_ptr(), 0));
            let m = _mm256_cmpgt_epi32(
                _mm256_set1_epi32(rem as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            for t in 0..T {
                let x = _mm256_maskload_ps(xs[t].add(W * c), m);
                acc[t][0] = _mm256_fmadd_ps(wk, x, acc[t][0]);
            }
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        let [a0, a1, a2, a3] = acc[t];
        let s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        out[t] = hsum(s) * scale;
    }
    out
}

/// Columns per 32-byte block of the nibble kernel.
const NIB_BLOCK: usize = 8 * W;

/// `T` int4 dot products against activations de-interleaved by `NibActs`
/// with 8 lanes, scaled. Each 32-byte block is 8 32-bit lanes of 8 nibbles.
/// Nibble `k` (`j = k % 4`, from the lane or the lane shifted right by 16)
/// is masked in place and OR-ed into the mantissa of `2^23`, giving the
/// float `2^23 + n 16^j`; subtracting `2^23 + 8 16^j` leaves `(n - 8) 16^j`
/// exactly, which meets activation vector `k` already divided by `16^j`:
/// no conversion instruction and no shuffle. Row mode: nibble `k` goes to
/// accumulator `k % 4`, pairwise sum, fixed reduction, times `scale`.
/// Grouped: each block's products are summed in two chains (even and odd
/// `k`), added, and multiplied-added by a vector of the block's scales into
/// accumulator 0.
///
/// # Safety
/// `p` holds `nbytes = cols.div_ceil(2)` readable bytes, each `xs[t]` holds
/// `cols.div_ceil(64)` blocks of 64 values, and `scales` holds the row's
/// `cols.div_ceil(group)` scales in the grouped modes.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn nib_dot<const T: usize, const GROUPED: bool>(
    p: *const u8,
    nbytes: usize,
    cols: usize,
    scale: f32,
    scales: &[f32],
    groups: NibGroups,
    xs: [*const f32; T],
) -> [f32; T] {
    const MAGIC: i32 = 0x4B00_0000;
    const TWO23: f32 = 8_388_608.0;
    let nblocks = cols.div_ceil(NIB_BLOCK);
    let full = nbytes / 32;
    let mut tail = [0u8; 32];
    let masks = [
        _mm256_set1_epi32(0xF),
        _mm256_set1_epi32(0xF0),
        _mm256_set1_epi32(0xF00),
        _mm256_set1_epi32(0xF000),
    ];
    let offs = [
        _mm256_set1_ps(TWO23 + 8.0),
        _mm256_set1_ps(TWO23 + 128.0),
        _mm256_set1_ps(TWO23 + 2048.0),
        _mm256_set1_ps(TWO23 + 32768.0),
    ];
    let magic = _mm256_set1_epi32(MAGIC);
    let (group_blocks, shift, per) = match groups {
        NibGroups::Row => (usize::MAX, 0, 0),
        NibGroups::Wide { blocks } => (blocks, 0, 0),
        NibGroups::Narrow { shift, per } => (usize::MAX, shift, per),
    };
    let rel = _mm256_srlv_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(shift as i32),
    );
    let mut acc = [[_mm256_setzero_ps(); 4]; T];
    let (mut gi, mut left) = (0usize, 0usize);
    let mut sv = _mm256_setzero_ps();
    // SAFETY (whole body): blocks below `full` lie inside the row's `nbytes`
    // and the last partial block is copied into `tail`; activation offsets
    // stay inside the `nblocks` prepared blocks; scale loads are masked to
    // the row's scales.
    unsafe {
        if full < nblocks {
            ptr::copy_nonoverlapping(p.add(32 * full), tail.as_mut_ptr(), nbytes - 32 * full);
        }
        for b in 0..nblocks {
            let src = if b < full { p.add(32 * b) } else { tail.as_ptr() };
            // A hint only: never faults, so it may point past the row.
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(32 * b + PREFETCH).cast());
            let v = _mm256_loadu_si256(src.cast());
            let u = _mm256_srli_epi32::<16>(v);
            let mut w = [_mm256_setzero_ps(); 8];
            for k in 0..8 {
                let (src, j) = if k < 4 { (v, k) } else { (u, k - 4) };
                let f = _mm256_or_si256(_mm256_and_si256(src, masks[j]), magic);
                w[k] = _mm256_sub_ps(_mm256_castsi256_ps(f), offs[j]);
            }
            let xo = NIB_BLOCK * b;
            if GROUPED {
                if per > 0 {
                    let first = b * per;
                    let n = per.min(scales.len() - first) as i32;
                    let m =
                        _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                    sv = _mm256_permutevar8x32_ps(_mm256_maskload_ps(scales.as_ptr().add(first), m), rel);
                } else {
                    if left == 0 {
                        sv = _mm256_set1_ps(scales[gi]);
                        gi += 1;
                        left = group_blocks;
                    }
                    left -= 1;
                }
                for t in 0..T {
                    let x = xs[t].add(xo);
                    let mut e = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
                    let mut o = _mm256_mul_ps(w[1], _mm256_loadu_ps(x.add(W)));
                    for k in (2..8).step_by(2) {
                        e = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x.add(W * k)), e);
                        o = _mm256_fmadd_ps(w[k + 1], _mm256_loadu_ps(x.add(W * k + W)), o);
                    }
                    acc[t][0] = _mm256_fmadd_ps(_mm256_add_ps(e, o), sv, acc[t][0]);
                }
            } else {
                for k in 0..8 {
                    for t in 0..T {
                        let x = _mm256_loadu_ps(xs[t].add(xo + W * k));
                        acc[t][k % 4] = _mm256_fmadd_ps(w[k], x, acc[t][k % 4]);
                    }
                }
            }
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        let [a0, a1, a2, a3] = acc[t];
        let s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        out[t] = hsum(s) * scale;
    }
    out
}

/// The nibble kernel for an int4 row, when every token's activations were
/// prepared for it and the row's scale layout is one it handles.
///
/// # Safety
/// As [`dot_n`].
unsafe fn nib_row<const T: usize>(row: &RowRef<'_>, acts: [&Acts<'_>; T]) -> Option<[f32; T]> {
    let (format, cols, bytes, scales) = row.packed()?;
    let groups = nib_groups(format, W)?;
    let mut xs = [ptr::null(); T];
    for (x, a) in xs.iter_mut().zip(acts) {
        if a.x.len() != cols {
            return None;
        }
        *x = a.nib.as_ref()?.ptr(W)?;
    }
    let nb = format.row_bytes(cols);
    let p = bytes.as_ptr();
    // SAFETY: the caller's contract covers the row; `NibActs` built from
    // `cols` values with 8 lanes holds `cols.div_ceil(64)` blocks.
    Some(unsafe {
        match groups {
            NibGroups::Row => nib_dot::<T, false>(p, nb, cols, scales[0], &[], groups, xs),
            _ => nib_dot::<T, true>(p, nb, cols, 1.0, scales, groups, xs),
        }
    })
}

/// `row · x_t` for each of the `T` activations.
///
/// # Safety
/// The CPU supports AVX2 and FMA; the row's buffers and every `xs[t]` hold
/// what `RowRef::check` requires.
pub(crate) unsafe fn dot_n<const T: usize>(row: &RowRef<'_>, acts: [&Acts<'_>; T]) -> [f32; T] {
    // SAFETY: this function's contract.
    if let Some(out) = unsafe { nib_row(row, acts) } {
        return out;
    }
    let xs = acts.map(|a| a.x);
    let xp = xs.map(|x| x.as_ptr());
    match *row {
        // SAFETY (all arms): guaranteed by this function's contract; the
        // grouped arm only runs when `grouping` accepted the group size.
        RowRef::F32(w) => unsafe {
            row_dot::<F32, T, false>(w.as_ptr().cast(), w.len() * 4, w.len(), 1.0, &[], 0, xp)
        },
        RowRef::Packed {
            format,
            cols,
            bytes,
            scales,
        } => {
            let nb = format.row_bytes(cols);
            let p = bytes.as_ptr();
            let s0 = scales.first().copied().unwrap_or(1.0);
            match (format, grouping(format, W)) {
                (QFormat::Int8, Some(None)) => unsafe {
                    row_dot::<I8, T, false>(p, nb, cols, s0, &[], 0, xp)
                },
                (QFormat::Int4, Some(None)) => unsafe {
                    row_dot::<I4, T, false>(p, nb, cols, s0, &[], 0, xp)
                },
                (QFormat::Int2, Some(None)) => unsafe {
                    row_dot::<I2, T, false>(p, nb, cols, s0, &[], 0, xp)
                },
                (QFormat::Int4Grouped { .. }, Some(Some(g))) => unsafe {
                    row_dot::<I4, T, true>(p, nb, cols, 1.0, scales, g, xp)
                },
                _ => xs.map(|x| scalar::dot(row, x)),
            }
        }
    }
}
