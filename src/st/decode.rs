//! Turning raw tensor bytes into f32 values or a [`QMatrix`].
//!
//! Pure functions on byte slices, shared by the memory-mapped path
//! ([`super::Checkpoint`]) and the expert decoder, which receives an expert's
//! bytes from an I/O worker rather than from a map.

use half::{bf16, f16};
use safetensors::Dtype;

use super::StError;
use super::error::BUFFER_PATH;
use crate::quant::{ByteStore, QFormat, QMatrix};

/// Converts little-endian F32, BF16 or F16 values to f32. `bytes` need not be
/// aligned; its length must be a whole number of elements.
pub fn decode_f32(dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, StError> {
    let elem = match dtype {
        Dtype::F32 => 4,
        Dtype::BF16 | Dtype::F16 => 2,
        other => {
            return Err(StError::tensor(
                BUFFER_PATH,
                "",
                format!("dtype {other} cannot be read as floating point (F32, BF16, F16)"),
            ));
        }
    };
    if !bytes.len().is_multiple_of(elem) {
        return Err(StError::tensor(
            BUFFER_PATH,
            "",
            format!("{} bytes are not a whole number of {dtype} values", bytes.len()),
        ));
    }
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    })
}

/// Names the tensor in an error raised by [`decode_f32`].
pub(crate) fn name_tensor(e: StError, name: &str) -> StError {
    match e {
        StError::Tensor { path, reason, .. } => StError::Tensor {
            path,
            tensor: name.to_string(),
            reason,
        },
        other => other,
    }
}

/// Builds the `[rows, cols]` matrix stored as `dtype` in `bytes`.
///
/// Floating-point storage (F32/BF16/F16) is converted and stored as `want`
/// (quantized at load when `want` is not F32). U8/I8 storage is an already
/// quantized tensor: `scales` (its `.qs` values) are required, the layout is
/// recognised from the byte and scale counts (docs/formats.md) and
/// `want` is ignored, since requantizing would compound rounding error.
pub fn matrix_from_bytes(
    name: &str,
    dtype: Dtype,
    rows: usize,
    cols: usize,
    bytes: ByteStore,
    scales: Option<Vec<f32>>,
    want: QFormat,
) -> Result<QMatrix, StError> {
    let quant = |source| StError::Quant {
        path: BUFFER_PATH.into(),
        tensor: name.to_string(),
        source,
    };
    match dtype {
        Dtype::F32 | Dtype::BF16 | Dtype::F16 => {
            if scales.is_some() {
                return Err(StError::tensor(
                    BUFFER_PATH,
                    name,
                    format!("{dtype} tensor has .qs scales; only U8/I8 tensors are quantized"),
                ));
            }
            let w = decode_f32(dtype, bytes.as_slice()).map_err(|e| name_tensor(e, name))?;
            if rows.checked_mul(cols) != Some(w.len()) {
                return Err(StError::tensor(
                    BUFFER_PATH,
                    name,
                    format!("{} values do not form a [{rows}, {cols}] matrix", w.len()),
                ));
            }
            QMatrix::quantize(rows, cols, w, want).map_err(quant)
        }
        Dtype::U8 | Dtype::I8 => {
            let Some(scales) = scales else {
                return Err(StError::tensor(
                    BUFFER_PATH,
                    name,
                    format!("quantized {dtype} tensor has no {name}.qs scale tensor"),
                ));
            };
            QMatrix::from_stored(rows, cols, bytes, scales).map_err(quant)
        }
        other => Err(StError::tensor(
            BUFFER_PATH,
            name,
            format!("dtype {other} cannot hold a weight matrix (F32, BF16, F16, or U8/I8 + .qs)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_unaligned_input() {
        let vals = [1.5f32, -2.25, 3.0];
        let mut b = vec![0u8];
        for v in vals {
            b.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(decode_f32(Dtype::F32, &b[1..]).unwrap(), vals);
        let h: Vec<u8> = vals
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(decode_f32(Dtype::BF16, &h).unwrap(), vals);
        let h: Vec<u8> = vals
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(decode_f32(Dtype::F16, &h).unwrap(), vals);
        assert!(decode_f32(Dtype::F32, &b).is_err());
        assert!(decode_f32(Dtype::I32, &b[1..]).is_err());
    }

    #[test]
    fn stored_tensor_needs_scales() {
        let e = matrix_from_bytes(
            "w",
            Dtype::U8,
            2,
            4,
            ByteStore::from_vec(vec![0; 8]),
            None,
            QFormat::F32,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("w.qs"), "{e}");
        let m = matrix_from_bytes(
            "w",
            Dtype::U8,
            2,
            4,
            ByteStore::from_vec(vec![0; 8]),
            Some(vec![1.0, 2.0]),
            QFormat::F32,
        )
        .unwrap();
        assert_eq!(m.format(), QFormat::Int8);
    }
}
