//! AVX-512F/BW kernels: 16 columns per vector, four accumulators per token.
//!
//! A row is walked in chunks of 16 columns; chunk `c` of a group of four goes
//! to accumulator `c % 4`, leftover whole chunks and the zero-padded partial
//! chunk to accumulator 0. The four are added pairwise and reduced, then
//! multiplied by the row scale. Grouped scales are applied to the weights of
//! each chunk before the multiply-add. The order is the same for any number of
//! tokens processed together.
//!
//! Int4 rows against prepared activations take the nibble kernel
//! ([`nib_dot`]) instead.

use core::arch::x86_64::*;
use core::ptr;

use super::{NibGroups, ScaleCursor, grouping, nib_groups};
use crate::kernels::{Acts, RowRef, scalar};
use crate::quant::QFormat;

/// Columns per vector.
const W: usize = 16;

/// How far ahead of the current chunk the weights are prefetched into L1,
/// in bytes: one memory latency's worth of the int4 kernel's ~15 GB/s
/// in-cache pace with room to spare. At 2048 the int4 matvec streamed at
/// 0.79-0.80 of the read baseline on the reference machine, at 4096 at
/// 0.84-0.86, and 8192 was no better (benches/matvec.rs, paired rounds).
const PREFETCH: usize = 4096;

/// How far ahead the int4 kernels also prefetch into L2. This machine's
/// hardware prefetchers leave a compute-bound stream short of requests
/// (without software prefetch the int4 matvec drops to 0.36 of the
/// baseline); a second, farther hint into L2 keeps more lines in flight
/// than the L1 fill buffers allow. With it the int4 matvec went from
/// 0.81/0.83 to 0.86-0.87/0.87-0.88 (1/2 threads) in back-to-back runs.
const PREFETCH_L2: usize = 3 * PREFETCH;

/// Turns packed weights into f32 vectors.
trait Unpack {
    /// Bytes holding one chunk of 16 columns.
    const BYTES: usize;
    /// Weights of chunk `c` (columns `16c..16c+16`); its bytes lie in the row.
    unsafe fn one(p: *const u8, c: usize) -> __m512;
    /// Chunks `c..c+4`.
    unsafe fn four(p: *const u8, c: usize) -> [__m512; 4];
}

struct F32;
struct I8;
struct I4;
struct I2;

#[inline]
#[target_feature(enable = "avx512f,avx512bw,fma")]
fn bytes_to_ps(v: __m128i) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
}

impl Unpack for F32 {
    const BYTES: usize = 64;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    unsafe fn one(p: *const u8, c: usize) -> __m512 {
        // SAFETY: the caller guarantees the chunk's 64 bytes are readable.
        unsafe { _mm512_loadu_ps(p.cast::<f32>().add(W * c)) }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    unsafe fn four(p: *const u8, c: usize) -> [__m512; 4] {
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
    const BYTES: usize = 16;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    unsafe fn one(p: *const u8, c: usize) -> __m512 {
        // SAFETY: the caller guarantees the chunk's 16 bytes are readable.
        bytes_to_ps(unsafe { _mm_loadu_si128(p.add(W * c).cast()) })
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    unsafe fn four(p: *const u8, c: usize) -> [__m512; 4] {
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

/// Nibbles of `v`'s bytes (zero-extended to 16 bits) as signed bytes in
/// column order: `lo | hi << 8`, minus 8.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,fma")]
fn nibbles_128(v: __m128i) -> __m128i {
    let t = _mm_and_si128(_mm_or_si128(v, _mm_slli_epi16::<4>(v)), _mm_set1_epi16(0x0F0F));
    _mm_sub_epi8(t, _mm_set1_epi8(8))
}

impl Unpack for I4 {
    const BYTES: usize = 8;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    unsafe fn one(p: *const u8, c: usize) -> __m512 {
        // SAFETY: the caller guarantees the chunk's 8 bytes are readable.
        let b = unsafe { _mm_loadl_epi64(p.add(8 * c).cast()) };
        bytes_to_ps(nibbles_128(_mm_cvtepu8_epi16(b)))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    unsafe fn four(p: *const u8, c: usize) -> [__m512; 4] {
        // SAFETY: the caller guarantees the four chunks' 32 bytes are readable.
        let b = unsafe { _mm256_loadu_si256(p.add(8 * c).cast()) };
        let v = _mm512_cvtepu8_epi16(b);
        let t = _mm512_and_si512(
            _mm512_or_si512(v, _mm512_slli_epi16::<4>(v)),
            _mm512_set1_epi16(0x0F0F),
        );
        let s = _mm512_sub_epi8(t, _mm512_set1_epi8(8));
        [
            bytes_to_ps(_mm512_castsi512_si128(s)),
            bytes_to_ps(_mm512_extracti32x4_epi32::<1>(s)),
            bytes_to_ps(_mm512_extracti32x4_epi32::<2>(s)),
            bytes_to_ps(_mm512_extracti32x4_epi32::<3>(s)),
        ]
    }
}

impl Unpack for I2 {
    const BYTES: usize = 4;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    unsafe fn one(p: *const u8, c: usize) -> __m512 {
        // SAFETY: the caller guarantees the chunk's 4 bytes are readable.
        let u = unsafe { p.add(4 * c).cast::<u32>().read_unaligned() };
        // Column j of the chunk is bits 2j..2j+2 of the little-endian word.
        let shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let v = _mm512_srlv_epi32(_mm512_set1_epi32(u as i32), shifts);
        let q = _mm512_sub_epi32(_mm512_and_si512(v, _mm512_set1_epi32(3)), _mm512_set1_epi32(2));
        _mm512_cvtepi32_ps(q)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    unsafe fn four(p: *const u8, c: usize) -> [__m512; 4] {
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

/// `T` dot products of one row of `cols` columns (`nbytes` bytes at `p`)
/// with the activations at `xs`. `G`: `scales` are per `group` columns;
/// otherwise the sum is multiplied by `scale`.
///
/// # Safety
/// `p` holds `nbytes` readable bytes laid out for `U`, each `xs[t]` holds
/// `cols` readable values, and with `G`, `group` is a positive multiple of 16
/// and `scales` has `cols.div_ceil(group)` entries.
#[target_feature(enable = "avx512f,avx512bw,fma")]
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
    let mut acc = [[_mm512_setzero_ps(); 4]; T];
    // Scales: one per iteration of four chunks when groups are whole
    // iterations, else one per chunk; leftover chunks look theirs up.
    let coarse = G && group.is_multiple_of(4 * W);
    let per = if coarse {
        group / (4 * W)
    } else {
        (group / W).max(1)
    };
    let mut cursor = ScaleCursor::new(scales, per);
    let scale_at = |c: usize, w: __m512| {
        if G {
            _mm512_mul_ps(w, _mm512_set1_ps(scales[W * c / group]))
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
                let s = _mm512_set1_ps(cursor.next_scale());
                for wk in &mut w {
                    *wk = _mm512_mul_ps(*wk, s);
                }
            } else if G {
                for wk in &mut w {
                    *wk = _mm512_mul_ps(*wk, _mm512_set1_ps(cursor.next_scale()));
                }
            }
            for k in 0..4 {
                for t in 0..T {
                    let x = _mm512_loadu_ps(xs[t].add(W * (c + k)));
                    acc[t][k % 4] = _mm512_fmadd_ps(w[k], x, acc[t][k % 4]);
                }
            }
            c += 4;
        }
        while c < nfull {
            let wk = scale_at(c, U::one(p, c));
            for t in 0..T {
                acc[t][0] = _mm512_fmadd_ps(wk, _mm512_loadu_ps(xs[t].add(W * c)), acc[t][0]);
            }
            c += 1;
        }
        let rem = cols - W * c;
        if rem > 0 {
            let mut buf = [0u8; 64];
            let off = c * U::BYTES;
            ptr::copy_nonoverlapping(p.add(off), buf.as_mut_ptr(), nbytes - off);
            let wk = scale_at(c, U::one(buf.as_ptr(), 0));
            let m = ((1u32 << rem) - 1) as __mmask16;
            for t in 0..T {
                let x = _mm512_maskz_loadu_ps(m, xs[t].add(W * c));
                acc[t][0] = _mm512_fmadd_ps(wk, x, acc[t][0]);
            }
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        let [a0, a1, a2, a3] = acc[t];
        let s = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
        out[t] = _mm512_reduce_add_ps(s) * scale;
    }
    out
}

/// Columns per 64-byte block of the nibble kernel.
const NIB_BLOCK: usize = 8 * W;

/// `T` int4 dot products against activations de-interleaved by
/// `NibActs` with 16 lanes. Each 64-byte block is 16 32-bit lanes of 8
/// nibbles; nibble `k` of every lane is brought to the low 4 bits (a load at
/// byte offset `k / 2`, a 4-bit shift for odd `k`) and looked up in a 16-entry table of `-8.0..=7.0` (`vpermps` reads only
/// those bits), giving 16 weights of columns `8i + k` that meet vector `k`
/// of the block's activations. Row mode: nibble `k` goes to accumulator
/// `k % 4` of its token; the four are summed pairwise, reduced, times
/// `scale`. Wide groups: the table is scaled by the group's scale at each
/// group start. Narrow groups: each block's products are summed in two
/// chains (even and odd `k`), added, and multiplied-added by a vector of the
/// block's scales into accumulator 0.
///
/// # Safety
/// `p` holds `nbytes = cols.div_ceil(2)` readable bytes, each `xs[t]` holds
/// `cols.div_ceil(128)` blocks of 128 values, and `scales` holds the row's
/// `cols.div_ceil(group)` scales in the grouped modes.
#[target_feature(enable = "avx512f,avx512bw,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn nib_dot<const T: usize, const MODE: u8>(
    p: *const u8,
    nbytes: usize,
    cols: usize,
    scale: f32,
    scales: &[f32],
    groups: NibGroups,
    xs: [*const f32; T],
) -> [f32; T] {
    let nblocks = cols.div_ceil(NIB_BLOCK);
    // Blocks are read at byte offsets 0..=3, so a block is read with plain
    // loads only when 3 more bytes of the row follow it; the (at most two)
    // last blocks are read with byte masks that stop at the row's end
    // (masked-off bytes read as zero: weights past the row meet zero
    // activations).
    let full = nbytes.saturating_sub(3) / 64;
    let table = _mm512_setr_ps(
        -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
    );
    let mut tab = table;
    let (group_blocks, shift, per) = match groups {
        NibGroups::Row => (usize::MAX, 0, 0),
        NibGroups::Wide { blocks } => (blocks, 0, 0),
        NibGroups::Narrow { shift, per } => (usize::MAX, shift, per),
    };
    let rel = _mm512_srlv_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(shift as i32),
    );
    let mut acc = [[_mm512_setzero_ps(); 4]; T];
    let (mut gi, mut left) = (0usize, 0usize);
    // Wide groups: at each group start, the table times the group's scale.
    let mut next_group = |tab: &mut __m512| {
        if left == 0 {
            *tab = _mm512_mul_ps(table, _mm512_set1_ps(scales[gi]));
            gi += 1;
            left = group_blocks;
        }
        left -= 1;
    };
    let mut b = 0;
    // SAFETY (both loops): blocks below `full`, plus 3 bytes, lie inside the
    // row's `nbytes`, and later ones are loaded masked to it (masked loads do
    // not fault on the bytes they skip); activation offsets stay inside the
    // `nblocks` prepared blocks; scale loads are masked to the row's scales.
    unsafe {
        // Loading at byte offset `m` brings byte `4i + m` (nibbles 2m and
        // 2m + 1) to the bottom of lane `i`: the load ports do the byte
        // shifts, a 4-bit shift the rest. The main loop has no masks to
        // compute, so no scalar work competes with the vector ports.
        while b < full {
            let src = p.add(64 * b);
            // Hints only: never fault, so they may point past the row.
            _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(PREFETCH).cast());
            _mm_prefetch::<_MM_HINT_T1>(src.wrapping_add(PREFETCH_L2).cast());
            if MODE == 1 {
                next_group(&mut tab);
            }
            let v = [
                _mm512_loadu_si512(src.cast()),
                _mm512_loadu_si512(src.add(1).cast()),
                _mm512_loadu_si512(src.add(2).cast()),
                _mm512_loadu_si512(src.add(3).cast()),
            ];
            nib_block::<T, MODE>(v, tab, b, per, rel, scales, &xs, &mut acc);
            b += 1;
        }
        while b < nblocks {
            let src = p.add(64 * b);
            if MODE == 1 {
                next_group(&mut tab);
            }
            let left_bytes = nbytes - 64 * b;
            let m = |o: usize| match left_bytes.saturating_sub(o) {
                n @ 0..64 => (1u64 << n) - 1,
                _ => u64::MAX,
            };
            let v = [
                _mm512_maskz_loadu_epi8(m(0), src.cast()),
                _mm512_maskz_loadu_epi8(m(1), src.add(1).cast()),
                _mm512_maskz_loadu_epi8(m(2), src.add(2).cast()),
                _mm512_maskz_loadu_epi8(m(3), src.add(3).cast()),
            ];
            nib_block::<T, MODE>(v, tab, b, per, rel, scales, &xs, &mut acc);
            b += 1;
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        let [a0, a1, a2, a3] = acc[t];
        let s = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
        out[t] = _mm512_reduce_add_ps(s) * scale;
    }
    out
}

/// One 64-byte block of the nibble kernel: `v` are the block's bytes loaded
/// at offsets 0..=3, `tab` the (scaled) lookup table.
///
/// # Safety
/// Each `xs[t]` holds block `b`'s 128 prepared values; in mode 2 `scales`
/// holds the row's scales.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,fma")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn nib_block<const T: usize, const MODE: u8>(
    v: [__m512i; 4],
    tab: __m512,
    b: usize,
    per: usize,
    rel: __m512i,
    scales: &[f32],
    xs: &[*const f32; T],
    acc: &mut [[__m512; 4]; T],
) {
    let w = [
        _mm512_permutexvar_ps(v[0], tab),
        _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v[0]), tab),
        _mm512_permutexvar_ps(v[1], tab),
        _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v[1]), tab),
        _mm512_permutexvar_ps(v[2], tab),
        _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v[2]), tab),
        _mm512_permutexvar_ps(v[3], tab),
        _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v[3]), tab),
    ];
    let xo = NIB_BLOCK * b;
    // SAFETY: the caller's contract bounds every activation and scale read.
    unsafe {
        if MODE == 2 {
            let first = b * per;
            let n = per.min(scales.len() - first);
            let m = ((1u32 << n) - 1) as __mmask16;
            let sv = _mm512_permutexvar_ps(rel, _mm512_maskz_loadu_ps(m, scales.as_ptr().add(first)));
            for t in 0..T {
                let x = xs[t].add(xo);
                let mut e = _mm512_mul_ps(w[0], _mm512_loadu_ps(x));
                let mut o = _mm512_mul_ps(w[1], _mm512_loadu_ps(x.add(W)));
                for k in (2..8).step_by(2) {
                    e = _mm512_fmadd_ps(w[k], _mm512_loadu_ps(x.add(W * k)), e);
                    o = _mm512_fmadd_ps(w[k + 1], _mm512_loadu_ps(x.add(W * k + W)), o);
                }
                acc[t][0] = _mm512_fmadd_ps(_mm512_add_ps(e, o), sv, acc[t][0]);
            }
        } else {
            for k in 0..8 {
                for t in 0..T {
                    let x = _mm512_loadu_ps(xs[t].add(xo + W * k));
                    acc[t][k % 4] = _mm512_fmadd_ps(w[k], x, acc[t][k % 4]);
                }
            }
        }
    }
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
    // `cols` values with 16 lanes holds `cols.div_ceil(128)` blocks.
    Some(unsafe {
        match groups {
            NibGroups::Row => nib_dot::<T, 0>(p, nb, cols, scales[0], &[], groups, xs),
            NibGroups::Wide { .. } => nib_dot::<T, 1>(p, nb, cols, 1.0, scales, groups, xs),
            NibGroups::Narrow { .. } => nib_dot::<T, 2>(p, nb, cols, 1.0, scales, groups, xs),
        }
    })
}

/// `row · x_t` for each of the `T` activations.
///
/// # Safety
/// The CPU supports AVX-512F, AVX-512BW and FMA; the row's buffers and every
/// `xs[t]` hold what `RowRef::check` requires.
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

/// Wrapping sum of the little-endian u64 words of `bytes` (a trailing
/// partial word is ignored), with the kernels' loads and both their prefetch
/// hints for every line, so the roofline is never handicapped against them.
///
/// # Safety
/// The CPU supports AVX-512F.
#[target_feature(enable = "avx512f,avx512bw,fma")]
pub(crate) unsafe fn read_sum(bytes: &[u8]) -> u64 {
    let p = bytes.as_ptr();
    let blocks = bytes.len() / 256;
    let mut acc = [_mm512_setzero_si512(); 4];
    for b in 0..blocks {
        // SAFETY: block `b`'s 256 bytes lie inside `bytes`; the prefetch is
        // a hint that never faults.
        unsafe {
            for line in (0..256).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(256 * b + line + PREFETCH).cast());
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(256 * b + line + PREFETCH_L2).cast());
            }
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm512_add_epi64(*a, _mm512_loadu_si512(p.add(256 * b + 64 * k).cast()));
            }
        }
    }
    let s = _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3]));
    let tail = bytes[256 * blocks..].chunks_exact(8).fold(0u64, |a, w| {
        a.wrapping_add(u64::from_le_bytes([
            w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
        ]))
    });
    (_mm512_reduce_add_epi64(s) as u64).wrapping_add(tail)
}
