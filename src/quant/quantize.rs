//! Quantizing full-precision weights into the contract layouts.

use super::{QFormat, QuantError};

/// Smallest scale written, so an all-zero row still dequantizes to zeros.
pub const MIN_SCALE: f32 = 1e-8;

/// Rounds half to even, as numpy and torch do.
pub fn round_half_even(x: f32) -> f32 {
    x.round_ties_even()
}

/// Quantizes a row-major `[rows, cols]` matrix; returns the packed bytes and
/// the scales. `F32` is not a quantized format and is refused.
pub fn quantize_matrix(
    rows: usize,
    cols: usize,
    w: &[f32],
    format: QFormat,
) -> Result<(Vec<u8>, Vec<f32>), QuantError> {
    if w.len() != rows * cols {
        return Err(QuantError::Size {
            what: "quantize",
            rows,
            cols,
            expected: rows * cols,
            got: w.len(),
        });
    }
    if format == QFormat::F32 {
        return Err(QuantError::Bits(32));
    }
    if let QFormat::Ggml(ty) = format {
        // colibri reads ggml blocks; it never writes them.
        return Err(QuantError::GgmlTarget(ty));
    }
    let qmax = format.qmax();
    let group = format.group_len(cols);
    let row_bytes = format.row_bytes(cols);
    let mut bytes = vec![0u8; rows * row_bytes];
    let mut scales = Vec::with_capacity(rows * format.scales_per_row(cols));
    let mut q = vec![0i32; cols];
    for r in 0..rows {
        let row = &w[r * cols..(r + 1) * cols];
        for (g, chunk) in row.chunks(group).enumerate() {
            let amax = chunk.iter().fold(0f32, |m, &v| m.max(v.abs()));
            let scale = (amax / qmax as f32).max(MIN_SCALE);
            scales.push(scale);
            for (j, &v) in chunk.iter().enumerate() {
                let qv = round_half_even(v / scale) as i32;
                q[g * group + j] = qv.clamp(-qmax - 1, qmax);
            }
        }
        let out = &mut bytes[r * row_bytes..(r + 1) * row_bytes];
        pack_row(format, &q, out);
    }
    Ok((bytes, scales))
}

/// Packs signed quantized values of one row into its byte layout.
fn pack_row(format: QFormat, q: &[i32], out: &mut [u8]) {
    match format {
        QFormat::Int8 => {
            for (o, &v) in out.iter_mut().zip(q) {
                *o = (v as i8) as u8;
            }
        }
        QFormat::Int4 | QFormat::Int4Grouped { .. } => {
            for (j, o) in out.iter_mut().enumerate() {
                let lo = q.get(2 * j).map_or(8, |&v| (v + 8) as u8) & 0x0f;
                let hi = q.get(2 * j + 1).map_or(8, |&v| (v + 8) as u8) & 0x0f;
                *o = lo | (hi << 4);
            }
        }
        QFormat::Int2 => {
            for (j, o) in out.iter_mut().enumerate() {
                let mut b = 0u8;
                for k in 0..4 {
                    let f = q.get(4 * j + k).map_or(2, |&v| (v + 2) as u8) & 0x03;
                    b |= f << (2 * k);
                }
                *o = b;
            }
        }
        // Refused by `quantize_matrix` before any row is packed.
        QFormat::F32 | QFormat::Ggml(_) => {}
    }
}
