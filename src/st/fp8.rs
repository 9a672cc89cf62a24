//! FP8 checkpoints (GLM-5 / DeepSeek-V3 releases): `F8_E4M3` weights with a
//! sibling `<name>_scale_inv` F32 tensor holding one scale per 128x128 block.
//! Dequantized weight = `e4m3(w) * scale_inv[r / 128][c / 128]`, in f32, as
//! the reference dequantization computes it.

use super::StError;
use super::error::BUFFER_PATH;

/// Side of the square blocks `weight_scale_inv` covers.
pub const FP8_BLOCK: usize = 128;

/// Suffix of the block-scale tensor next to an FP8 weight.
pub const SCALE_INV_SUFFIX: &str = "_scale_inv";

/// One float8 e4m3 ("fn": no infinities, 0x7f/0xff are NaN) value as f32.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = (b >> 3) & 0x0f;
    let man = (b & 0x07) as f32;
    if exp == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        // subnormal: man/8 * 2^-6
        sign * man * (1.0 / 512.0)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp as i32 - 7)
    }
}

/// Dequantizes a `[rows, cols]` FP8 matrix with its `[ceil(rows/128),
/// ceil(cols/128)]` block scales.
pub fn dequantize_fp8(
    name: &str,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    scale_inv: &[f32],
) -> Result<Vec<f32>, StError> {
    let (br, bc) = (rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK));
    if bytes.len() != rows * cols {
        return Err(StError::tensor(
            BUFFER_PATH,
            name,
            format!("{} FP8 bytes for a [{rows}, {cols}] matrix", bytes.len()),
        ));
    }
    if scale_inv.len() != br * bc {
        return Err(StError::tensor(
            BUFFER_PATH,
            name,
            format!(
                "{} block scales for a [{rows}, {cols}] matrix (want {br}x{bc} blocks of {FP8_BLOCK})",
                scale_inv.len()
            ),
        ));
    }
    let table: Vec<f32> = (0..=255u8).map(e4m3_to_f32).collect();
    let mut out = Vec::with_capacity(rows * cols);
    for (r, row) in bytes.chunks_exact(cols.max(1)).enumerate().take(rows) {
        let srow = &scale_inv[(r / FP8_BLOCK) * bc..(r / FP8_BLOCK + 1) * bc];
        for (c, &b) in row.iter().enumerate() {
            out.push(table[b as usize] * srow[c / FP8_BLOCK]);
        }
    }
    if let Some(i) = out.iter().position(|v| v.is_nan()) {
        return Err(StError::tensor(
            BUFFER_PATH,
            name,
            format!("element {i} is NaN (FP8 byte 0x7f/0xff)"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_known_values() {
        // Reference values from torch.float8_e4m3fn.
        for (b, v) in [
            (0x00u8, 0.0f32),
            (0x01, 0.001953125),
            (0x07, 0.013671875),
            (0x08, 0.015625),
            (0x38, 1.0),
            (0x7e, 448.0),
            (0xfe, -448.0),
            (0xb8, -1.0),
        ] {
            assert_eq!(e4m3_to_f32(b), v, "byte {b:#04x}");
        }
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn applies_block_scales_and_checks_sizes() {
        let (rows, cols) = (130, 3);
        let bytes = vec![0x38u8; rows * cols];
        let w = dequantize_fp8("w", &bytes, rows, cols, &[2.0, 0.5]).unwrap();
        assert_eq!(w[0], 2.0);
        assert_eq!(w[129 * 3 + 2], 0.5);
        assert!(dequantize_fp8("w", &bytes, rows, cols, &[1.0]).is_err());
        assert!(dequantize_fp8("w", &bytes[1..], rows, cols, &[1.0, 1.0]).is_err());
        assert!(dequantize_fp8("w", &[0x7f], 1, 1, &[1.0]).is_err());
    }
}
