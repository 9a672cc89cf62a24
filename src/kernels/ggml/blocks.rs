//! Block geometry and the field decoding every ggml type shares: f16 and
//! E8M0 scales, the packed 6-bit scales of Q4_K/Q5_K, the non-linear value
//! tables. Field offsets are those of ggml's block structs.

use half::f16;

/// Columns per block of the legacy types, IQ4_NL, MXFP4 and Q8_0/Q8_1.
pub const QK: usize = 32;
/// Columns per super-block of the K-quants, IQ4_XS and Q8_K.
pub const QK_K: usize = 256;

/// The little-endian f16 at `b[at..at + 2]`, as f32 (exact).
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// ggml's `GGML_E8M0_TO_FP32_HALF`: `2^(e - 128)`, i.e. half the E8M0
/// scale, because ggml's MXFP4 value table holds twice the E2M1 values.
/// `e` 0 and 1 are the subnormals `2^-128`, `2^-127`; 255 is not treated
/// as NaN (ggml does not either).
#[inline(always)]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// ggml's `kvalues_iq4nl`: the 16 non-linear levels of IQ4_NL and IQ4_XS.
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// ggml's `kvalues_mxfp4`: twice the E2M1 values (so they are integers).
pub(crate) const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j`
/// (0..8) from the 12 packed bytes of a Q4_K/Q5_K super-block.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All eight (scale, min) pairs of a Q4_K/Q5_K super-block.
#[inline(always)]
pub(crate) fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], m[j]) = scale_min_k4(j, q);
    }
    (sc, m)
}

/// The sixteen 6-bit scales of a Q3_K super-block, minus 32 (ggml's `aux`
/// unpacking of its 12 scale bytes).
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = ((low | (high << 4)) as i8) - 32;
    }
    out
}
