//! AVX512-VNNI integer dot products against int8-quantized activations.
//!
//! One activation block (64 columns) per step: the weights are turned into
//! unsigned bytes `u = w + o` (int8: xor 0x80, o = 128; int4: the raw nibble,
//! o = 8; int2: the raw field, o = 2), `vpdpbusd` adds `u × q` in 16 lanes of
//! 4 columns, starting from `-o × (sum of those 4 q)` so every lane holds the
//! exact integer `Σ w q` of its 4 columns. The lanes are converted to f32 and
//! multiplied-added with the block's factor `d_b × s_g` into two alternating
//! accumulators, which are summed and reduced at the end.

use core::arch::x86_64::*;
use core::ptr;

use crate::kernels::RowRef;
use crate::kernels::q8::{Q8_BLOCK, QActs, dot_ref};
use crate::quant::QFormat;

/// How far ahead of the current block the weights are prefetched, in bytes.
const PREFETCH: usize = 2048;

/// Turns one block of packed weights into 64 unsigned bytes.
trait Bytes64 {
    /// Packed bytes per 64 columns.
    const BYTES: usize;
    /// log2 of the offset `o` added to each weight.
    const SHIFT: u32;
    /// Unsigned weights of block `b`; its bytes lie in the row.
    unsafe fn load(p: *const u8, b: usize) -> __m512i;
}

struct I8;
struct I4;
struct I2;

impl Bytes64 for I8 {
    const BYTES: usize = 64;
    const SHIFT: u32 = 7;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn load(p: *const u8, b: usize) -> __m512i {
        // SAFETY: the caller guarantees the block's 64 bytes are readable.
        let v = unsafe { _mm512_loadu_si512(p.add(64 * b).cast()) };
        _mm512_xor_si512(v, _mm512_set1_epi8(i8::MIN))
    }
}

impl Bytes64 for I4 {
    const BYTES: usize = 32;
    const SHIFT: u32 = 3;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn load(p: *const u8, b: usize) -> __m512i {
        // SAFETY: the caller guarantees the block's 32 bytes are readable.
        let v = _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(p.add(32 * b).cast()) });
        _mm512_and_si512(
            _mm512_or_si512(v, _mm512_slli_epi16::<4>(v)),
            _mm512_set1_epi16(0x0F0F),
        )
    }
}

impl Bytes64 for I2 {
    const BYTES: usize = 16;
    const SHIFT: u32 = 1;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn load(p: *const u8, b: usize) -> __m512i {
        // SAFETY: the caller guarantees the block's 16 bytes are readable.
        let v = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p.add(16 * b).cast()) });
        // Byte k's four fields land in the four bytes of 32-bit lane k.
        let t = _mm512_or_si512(
            _mm512_or_si512(v, _mm512_slli_epi32::<6>(v)),
            _mm512_or_si512(_mm512_slli_epi32::<12>(v), _mm512_slli_epi32::<18>(v)),
        );
        _mm512_and_si512(t, _mm512_set1_epi32(0x0303_0303))
    }
}

/// # Safety
/// `p` holds `nbytes` bytes laid out for `U` for `a.cols()` columns; with `G`,
/// `group` is a positive multiple of 64 and `scales` has one entry per group,
/// else `scales[0]` is the row scale.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn row_dot<U: Bytes64, const G: bool>(
    p: *const u8,
    nbytes: usize,
    scales: &[f32],
    group: usize,
    a: &QActs,
) -> f32 {
    let cols = a.cols();
    let blocks = cols.div_ceil(Q8_BLOCK);
    let full = cols / Q8_BLOCK;
    let (q, d, ls) = (a.values().as_ptr(), a.block_scales(), a.lane_sums().as_ptr());
    let mut acc = [_mm512_setzero_ps(); 2];
    for b in 0..blocks {
        // A hint only: never faults, so it may point past the row.
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(b * U::BYTES + PREFETCH).cast());
        // SAFETY: blocks below `full` lie inside the row; the last, partial
        // one is copied into a zeroed local buffer. `q` and `ls` are padded
        // to whole blocks.
        let (w, x, sums) = unsafe {
            let w = if b < full {
                U::load(p, b)
            } else {
                let mut buf = [0u8; 64];
                let off = b * U::BYTES;
                ptr::copy_nonoverlapping(p.add(off), buf.as_mut_ptr(), nbytes - off);
                U::load(buf.as_ptr(), 0)
            };
            (
                w,
                _mm512_loadu_si512(q.add(64 * b).cast()),
                _mm512_loadu_si512(ls.add(16 * b).cast()),
            )
        };
        let init = _mm512_sub_epi32(
            _mm512_setzero_si512(),
            _mm512_sll_epi32(sums, _mm_cvtsi32_si128(U::SHIFT as i32)),
        );
        let lanes = _mm512_dpbusd_epi32(init, w, x);
        let s = if G {
            scales[b * Q8_BLOCK / group]
        } else {
            scales[0]
        };
        let f = _mm512_set1_ps(d[b] * s);
        acc[b & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), f, acc[b & 1]);
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

/// `row · x̂` for quantized activations.
///
/// # Safety
/// The CPU supports AVX-512F/BW and AVX512-VNNI; the row's buffers hold what
/// `RowRef::check` requires and `row.cols() == a.cols()`.
pub(crate) unsafe fn dot(row: &RowRef<'_>, a: &QActs) -> f32 {
    let RowRef::Packed {
        format,
        cols,
        bytes,
        scales,
    } = *row
    else {
        return dot_ref(row, a);
    };
    let nb = format.row_bytes(cols);
    let p = bytes.as_ptr();
    // SAFETY (all arms): guaranteed by this function's contract; the grouped
    // arm only runs for groups that are whole activation blocks.
    match format {
        QFormat::Int8 => unsafe { row_dot::<I8, false>(p, nb, scales, 0, a) },
        QFormat::Int4 => unsafe { row_dot::<I4, false>(p, nb, scales, 0, a) },
        QFormat::Int2 => unsafe { row_dot::<I2, false>(p, nb, scales, 0, a) },
        QFormat::Int4Grouped { group } if group > 0 && group.is_multiple_of(Q8_BLOCK) => unsafe {
            row_dot::<I4, true>(p, nb, scales, group, a)
        },
        _ => dot_ref(row, a),
    }
}
