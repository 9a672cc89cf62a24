//! The ggml tensor types a GGUF tensor info may name: their ids, and the
//! block geometry that turns a shape into a byte count.
//!
//! The numbers are ggml's (`ggml.h` ids; block sizes and bytes per block
//! from the block structs of `ggml-common.h`). Reading a file only needs
//! the geometry, so every type ggml still writes is listed, including the
//! ones no kernel here can compute with yet.

/// A ggml tensor type. Names follow ggml's so they read the same as in
/// llama.cpp's tools and file listings.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
    Q2_0,
}

/// Elements per super-block of the k-quants and i-quants.
const QK_K: u64 = 256;

/// (type, id, name, elements per block, bytes per block).
const TABLE: &[(GgmlType, u32, &str, u64, u64)] = {
    use GgmlType::*;
    &[
        (F32, 0, "F32", 1, 4),
        (F16, 1, "F16", 1, 2),
        (Q4_0, 2, "Q4_0", 32, 2 + 16),
        (Q4_1, 3, "Q4_1", 32, 2 + 2 + 16),
        (Q5_0, 6, "Q5_0", 32, 2 + 4 + 16),
        (Q5_1, 7, "Q5_1", 32, 2 + 2 + 4 + 16),
        (Q8_0, 8, "Q8_0", 32, 2 + 32),
        (Q8_1, 9, "Q8_1", 32, 2 + 2 + 32),
        (Q2_K, 10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
        (Q3_K, 11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
        (Q4_K, 12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2),
        (Q5_K, 13, "Q5_K", QK_K, 2 + 2 + 12 + QK_K / 2 + QK_K / 8),
        (Q6_K, 14, "Q6_K", QK_K, 2 + QK_K / 16 + 3 * QK_K / 4),
        (Q8_K, 15, "Q8_K", QK_K, 4 + QK_K + QK_K / 16 * 2),
        (IQ2_XXS, 16, "IQ2_XXS", QK_K, 2 + QK_K / 8 * 2),
        (IQ2_XS, 17, "IQ2_XS", QK_K, 2 + QK_K / 8 * 2 + QK_K / 32),
        (IQ3_XXS, 18, "IQ3_XXS", QK_K, 2 + 3 * (QK_K / 8)),
        (IQ1_S, 19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
        (IQ4_NL, 20, "IQ4_NL", 32, 2 + 16),
        (IQ3_S, 21, "IQ3_S", QK_K, 2 + 13 * (QK_K / 32) + 4),
        (IQ2_S, 22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
        (IQ4_XS, 23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 64 + QK_K / 2),
        (I8, 24, "I8", 1, 1),
        (I16, 25, "I16", 1, 2),
        (I32, 26, "I32", 1, 4),
        (I64, 27, "I64", 1, 8),
        (F64, 28, "F64", 1, 8),
        (IQ1_M, 29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
        (BF16, 30, "BF16", 1, 2),
        (
            TQ1_0,
            34,
            "TQ1_0",
            QK_K,
            2 + QK_K / 64 + (QK_K - 4 * QK_K / 64) / 5,
        ),
        (TQ2_0, 35, "TQ2_0", QK_K, 2 + QK_K / 4),
        (MXFP4, 39, "MXFP4", 32, 1 + 16),
        (NVFP4, 40, "NVFP4", 64, 64 / 16 + 64 / 2),
        (Q1_0, 41, "Q1_0", 128, 2 + 128 / 8),
        (Q2_0, 42, "Q2_0", 64, 2 + 64 / 4),
    ]
};

impl GgmlType {
    /// The type with ggml id `id`; `None` for ids ggml never assigned or
    /// has retired (4, 5, 31..=33, 36..=38), which no reader can size.
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, u64, u64) {
        // Every variant has a row (a unit test checks it); F32's is the
        // fallback only to keep this total.
        TABLE.iter().find(|r| r.0 == self).unwrap_or(&TABLE[0])
    }

    pub fn id(self) -> u32 {
        self.row().1
    }

    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements in one block: a row's length must be a multiple of it.
    pub fn block_size(self) -> u64 {
        self.row().3
    }

    /// Bytes one block takes.
    pub fn type_size(self) -> u64 {
        self.row().4
    }

    /// Bytes `n` elements take (`n` a multiple of the block size), `None`
    /// on overflow.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        (n / self.block_size()).checked_mul(self.type_size())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_one_row_and_ids_are_unique() {
        for (i, r) in TABLE.iter().enumerate() {
            assert_eq!(GgmlType::from_id(r.1), Some(r.0));
            assert_eq!(r.0.id(), r.1);
            assert_eq!(r.0.name(), format!("{:?}", r.0));
            for s in &TABLE[i + 1..] {
                assert!(s.0 != r.0 && s.1 != r.1, "{:?}", r.0);
            }
        }
        assert_eq!(TABLE.len(), 35);
        for retired in [4, 5, 31, 32, 33, 36, 37, 38, 43, u32::MAX] {
            assert_eq!(GgmlType::from_id(retired), None);
        }
    }

    /// The block structs' sizes as ggml's static asserts spell them out.
    #[test]
    fn block_geometry_is_ggmls() {
        use GgmlType::*;
        for (t, block, bytes) in [
            (F32, 1, 4),
            (F16, 1, 2),
            (BF16, 1, 2),
            (Q4_0, 32, 18),
            (Q4_1, 32, 20),
            (Q5_0, 32, 22),
            (Q5_1, 32, 24),
            (Q8_0, 32, 34),
            (Q8_1, 32, 36),
            (Q2_K, 256, 84),
            (Q3_K, 256, 110),
            (Q4_K, 256, 144),
            (Q5_K, 256, 176),
            (Q6_K, 256, 210),
            (Q8_K, 256, 292),
            (IQ2_XXS, 256, 66),
            (IQ2_XS, 256, 74),
            (IQ3_XXS, 256, 98),
            (IQ1_S, 256, 50),
            (IQ4_NL, 32, 18),
            (IQ3_S, 256, 110),
            (IQ2_S, 256, 82),
            (IQ4_XS, 256, 136),
            (IQ1_M, 256, 56),
            (TQ1_0, 256, 54),
            (TQ2_0, 256, 66),
            (MXFP4, 32, 17),
            (NVFP4, 64, 36),
            (Q1_0, 128, 18),
            (Q2_0, 64, 18),
        ] {
            assert_eq!((t.block_size(), t.type_size()), (block, bytes), "{t}");
        }
        assert_eq!(Q8_0.bytes_for(64 * 32), Some(64 * 34));
        assert_eq!(F32.bytes_for(u64::MAX), None);
    }
}
