//! x86_64 SIMD kernels and CPU feature detection.

pub(super) mod attn_tile;
pub(super) mod avx2;
pub(super) mod avx2_q8;
pub(super) mod avx512;
pub(super) mod ggml_avx2;
pub(super) mod ggml_avx2_k23;
pub(super) mod ggml_avx512;
pub(super) mod ggml_avx512_b32;
pub(super) mod ggml_avx512_k23;
pub(super) mod q8_row;
pub(super) mod vec;
pub(super) mod vnni;

/// How far ahead the memory-bound ggml kernels prefetch weights into L1
/// and into L2, in bytes: the distances the int4 and int8 kernels settled
/// on (avx512.rs explains them), since the ggml kernels stream the same
/// way, one contiguous row after another.
const GGML_PREFETCH: usize = 4096;
const GGML_PREFETCH_L2: usize = 3 * GGML_PREFETCH;

/// Prefetch hints for the lines [`GGML_PREFETCH`] (into L1) and
/// [`GGML_PREFETCH_L2`] (into L2) bytes past `p`: without them a kernel
/// whose compute per byte is high leaves the hardware prefetchers short of
/// requests and stalls on memory (the Q4_K matvec streamed at half the
/// read baseline while its in-cache pace was 1.4 times it).
#[inline(always)]
pub(super) fn prefetch_ahead(p: *const u8) {
    use core::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
    // SAFETY: a prefetch is a hint that never faults, whatever the address;
    // the addresses are computed with wrapping arithmetic.
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(GGML_PREFETCH).cast());
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(GGML_PREFETCH_L2).cast());
    }
}

/// [`prefetch_ahead`] for every 64-byte line of the `len` bytes at `p`.
#[inline(always)]
pub(super) fn prefetch_span(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        prefetch_ahead(p.wrapping_add(off));
        off += 64;
    }
}

/// AVX2 and FMA (the AVX2 kernel set).
pub(super) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// AVX-512 foundation and byte/word instructions, plus FMA.
pub(super) fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && has_avx2()
}

/// F16C half-precision conversion (the vectorised f16 KV cache reads).
pub(super) fn has_f16c() -> bool {
    is_x86_feature_detected!("f16c")
}

/// AVX512-VNNI integer dot products (on top of [`has_avx512`]).
pub(super) fn has_vnni() -> bool {
    has_avx512() && is_x86_feature_detected!("avx512vnni")
}

/// Walks the scale groups of a row chunk by chunk, for groups that are a
/// whole number of chunks.
pub(super) struct ScaleCursor<'a> {
    scales: &'a [f32],
    chunks_per_group: usize,
    left: usize,
    index: usize,
}

impl<'a> ScaleCursor<'a> {
    pub(super) fn new(scales: &'a [f32], chunks_per_group: usize) -> Self {
        Self {
            scales,
            chunks_per_group,
            left: chunks_per_group,
            index: 0,
        }
    }

    /// Scale of the next chunk.
    #[inline(always)]
    pub(super) fn next_scale(&mut self) -> f32 {
        if self.left == 0 {
            self.index += 1;
            self.left = self.chunks_per_group;
        }
        self.left -= 1;
        self.scales[self.index]
    }
}

/// How a packed row is laid out, as the SIMD loops need it: the format's
/// group length when its scales are per group (`None`: one scale per row).
/// `None` overall when the layout has no SIMD path (the caller falls back to
/// the scalar kernel).
pub(super) fn grouping(format: crate::quant::QFormat, chunk: usize) -> Option<Option<usize>> {
    use crate::quant::QFormat;
    match format {
        QFormat::Int8 | QFormat::Int4 | QFormat::Int2 => Some(None),
        QFormat::Int4Grouped { group } if group > 0 && group.is_multiple_of(chunk) => Some(Some(group)),
        _ => None,
    }
}

/// How the scales of an int4 row apply to the blocks of the nibble kernels
/// (a block is `8 * lanes` columns: 32-bit lane `i` holds its columns
/// `8i..8i+8`, one nibble each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NibGroups {
    /// One scale for the whole row, applied to the final sum.
    Row,
    /// Groups of `blocks` whole blocks: one scale per block.
    Wide { blocks: usize },
    /// Groups of `8 << shift` columns, several per block: lane `i` takes the
    /// block's scale `i >> shift`, `per` scales per block.
    Narrow { shift: u32, per: usize },
}

/// The scale layout of `format` for the nibble kernels with `lanes` lanes
/// per vector, or `None` when they do not handle it (the caller falls back
/// to the chunked kernels on the plain activations).
pub(super) fn nib_groups(format: crate::quant::QFormat, lanes: usize) -> Option<NibGroups> {
    use crate::quant::QFormat;
    let block = 8 * lanes;
    match format {
        QFormat::Int4 => Some(NibGroups::Row),
        QFormat::Int4Grouped { group } if group > 0 && group.is_multiple_of(block) => Some(NibGroups::Wide {
            blocks: group / block,
        }),
        QFormat::Int4Grouped { group } if group >= 8 && group.is_power_of_two() && group < block => {
            Some(NibGroups::Narrow {
                shift: (group / 8).trailing_zeros(),
                per: block / group,
            })
        }
        _ => None,
    }
}

/// Activations de-interleaved for the nibble kernels: per block of
/// `8 * lanes` columns, nibble `k` of every lane is one vector, so value
/// `k * lanes + i` of a block is column `8i + k`, times `2^(-4 (k % 4))`
/// when `scaled` (the AVX2 kernel's weights carry that factor). Zero past
/// the last column, so padding weights add nothing; the values start on a
/// 64-byte boundary so no vector load splits a cache line.
#[derive(Clone, Debug)]
pub(crate) struct NibActs {
    lanes: usize,
    buf: Vec<f32>,
    off: usize,
}

impl NibActs {
    pub(super) fn new(x: &[f32], lanes: usize, scaled: bool) -> Self {
        let block = 8 * lanes;
        let len = x.len().div_ceil(block) * block;
        let mut buf = vec![0f32; len + 16];
        let off = buf.as_ptr().align_offset(64).min(16);
        const POW: [f32; 4] = [1.0, 1.0 / 16.0, 1.0 / 256.0, 1.0 / 4096.0];
        for (j, &v) in x.iter().enumerate() {
            let (b, r) = (j / block, j % block);
            let (i, k) = (r / 8, r % 8);
            let f = if scaled { POW[k % 4] } else { 1.0 };
            buf[off + b * block + k * lanes + i] = v * f;
        }
        Self { lanes, buf, off }
    }

    /// The first value, when laid out for `lanes` lanes per vector; the
    /// buffer holds `cols.div_ceil(8 * lanes)` whole blocks.
    pub(super) fn ptr(&self, lanes: usize) -> Option<*const f32> {
        (self.lanes == lanes).then(|| self.buf[self.off..].as_ptr())
    }
}
