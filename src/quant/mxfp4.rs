//! MXFP4, the OCP microscaling format gpt-oss ships its experts in: blocks
//! of 32 FP4 (e2m1) values sharing one power-of-two scale stored as a
//! biased exponent byte. `coli convert` decodes it (the engine's own
//! formats are requantized from the decoded values).

/// The sixteen e2m1 values by nibble (sign in bit 3).
const FP4: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// The value of FP4 `nibble` (low four bits) scaled by `2^(scale - 127)`.
pub fn mxfp4_value(nibble: u8, scale: u8) -> f32 {
    FP4[(nibble & 0x0f) as usize] * exp2i(i32::from(scale) - 127)
}

/// `2^e` exactly, for e in -149..=127 (zero below, infinity above).
fn exp2i(e: i32) -> f32 {
    if e > 127 {
        f32::INFINITY
    } else if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else if e >= -149 {
        f32::from_bits(1u32 << (e + 149))
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_exact_powers_of_two() {
        for e in -149..=127 {
            assert_eq!(exp2i(e), 2f64.powi(e) as f32, "2^{e}");
        }
        assert_eq!(exp2i(128), f32::INFINITY);
        assert_eq!(exp2i(-150), 0.0);
    }

    #[test]
    fn decodes_the_e2m1_table() {
        assert_eq!(mxfp4_value(0x7, 127), 6.0);
        assert_eq!(mxfp4_value(0xf, 128), -12.0);
        assert_eq!(mxfp4_value(0x1, 125), 0.125);
        assert_eq!(mxfp4_value(0x3, 0), 1.5 * 2f32.powi(-127));
        assert_eq!(mxfp4_value(0x8, 127).to_bits(), (-0.0f32).to_bits());
        // Only the low nibble counts.
        assert_eq!(mxfp4_value(0xf2, 127), 1.0);
    }
}
