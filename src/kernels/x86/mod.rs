//! x86_64 SIMD kernels and CPU feature detection.

pub(super) mod avx2;
pub(super) mod avx512;
pub(super) mod vnni;

/// AVX2 and FMA (the AVX2 kernel set).
pub(super) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// AVX-512 foundation and byte/word instructions, plus FMA.
pub(super) fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && has_avx2()
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
