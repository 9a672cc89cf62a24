//! Views of a matrix inside a larger stored tensor: the strided and
//! interleaved layouts some releases fuse their experts into (gpt-oss keeps
//! gate and up interleaved column by column in one input-major tensor, or
//! as MXFP4 blocks). `coli convert` gathers through a view once, when it
//! splits the experts; the expert codec gathers through the same view each
//! time it decodes an expert streamed from the fused tensor, so a converted
//! container and the original release hold the same values.

use safetensors::Dtype;

/// Which stored elements make the output, in output order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Consecutive elements.
    Contiguous,
    /// Output `(r, c)` of a `[rows, cols]` result is stored element
    /// `start + r·row_stride + c·col_stride`.
    Strided {
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    },
    /// As `Strided`, over the values an MXFP4 tensor (two FP4 values a byte,
    /// low nibble first) decodes to with its scales (one biased
    /// power-of-two exponent byte per 32 values).
    Mxfp4 {
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    },
}

impl View {
    /// The largest stored element index the view reads, plus one, for a view
    /// of `elems` values starting at `start`.
    pub fn end(self, start: usize, elems: usize) -> usize {
        match self.grid() {
            None => start + elems,
            Some((rows, cols, rs, cs)) => {
                if rows == 0 || cols == 0 {
                    start
                } else {
                    start + (rows - 1) * rs + (cols - 1) * cs + 1
                }
            }
        }
    }

    /// Values the view yields (`None` for a contiguous view, whose length
    /// its user gives).
    pub fn values(self) -> Option<usize> {
        self.grid().map(|(rows, cols, _, _)| rows * cols)
    }

    fn grid(self) -> Option<(usize, usize, usize, usize)> {
        match self {
            View::Contiguous => None,
            View::Strided {
                rows,
                cols,
                row_stride,
                col_stride,
            }
            | View::Mxfp4 {
                rows,
                cols,
                row_stride,
                col_stride,
            } => Some((rows, cols, row_stride, col_stride)),
        }
    }
}

/// The `elems` values of `view` starting at stored element `start` of
/// `bytes` (stored as `dtype`; MXFP4 views read `scales` beside the
/// blocks), in output order. `Err` says what runs past what.
pub fn gather(
    view: View,
    dtype: Dtype,
    start: usize,
    elems: usize,
    bytes: &[u8],
    scales: Option<&[u8]>,
) -> Result<Vec<f32>, String> {
    let (rows, cols, rs, cs) = view.grid().unwrap_or((1, elems, 0, 1));
    let end = view.end(start, rows * cols);
    let mut out = Vec::with_capacity(rows * cols);
    if let View::Mxfp4 { .. } = view {
        let Some(scales) = scales else {
            return Err("MXFP4 blocks without their scales".into());
        };
        if end.div_ceil(2) > bytes.len() || end.div_ceil(32) > scales.len() {
            return Err("MXFP4 view runs past its blocks or scales".into());
        }
        for r in 0..rows {
            for c in 0..cols {
                let i = start + r * rs + c * cs;
                let byte = bytes[i / 2];
                let nibble = if i.is_multiple_of(2) {
                    byte & 0x0f
                } else {
                    byte >> 4
                };
                out.push(crate::quant::mxfp4_value(nibble, scales[i / 32]));
            }
        }
        return Ok(out);
    }
    let (size, read): (usize, fn(&[u8]) -> f32) = match dtype {
        Dtype::F32 => (4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        Dtype::BF16 => (2, |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        Dtype::F16 => (2, |b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
        other => return Err(format!("{other} values cannot be viewed as floats")),
    };
    if end.checked_mul(size).is_none_or(|b| b > bytes.len()) {
        return Err("view runs past the tensor".into());
    }
    for r in 0..rows {
        for c in 0..cols {
            let i = (start + r * rs + c * cs) * size;
            out.push(read(&bytes[i..i + size]));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn strided_views_transpose_and_deinterleave() {
        // A [2, 4] input-major tensor holding gate (even columns) and up
        // (odd columns) of a [2 out, 2 in] pair.
        let stored = [0., 1., 2., 3., 10., 11., 12., 13.];
        let b = f32_bytes(&stored);
        let gate = View::Strided {
            rows: 2,
            cols: 2,
            row_stride: 2,
            col_stride: 4,
        };
        assert_eq!(
            gather(gate, Dtype::F32, 0, 4, &b, None).unwrap(),
            [0., 10., 2., 12.]
        );
        assert_eq!(
            gather(gate, Dtype::F32, 1, 4, &b, None).unwrap(),
            [1., 11., 3., 13.]
        );
        assert!(gather(gate, Dtype::F32, 2, 4, &b, None).is_err());
        assert_eq!(
            gather(View::Contiguous, Dtype::F32, 6, 2, &b, None).unwrap(),
            [12., 13.]
        );
        assert!(gather(View::Contiguous, Dtype::U8, 0, 2, &b, None).is_err());
    }

    #[test]
    fn mxfp4_views_decode_low_nibble_first() {
        // One block of 32 values: byte j holds values 2j (low) and 2j+1.
        let blocks: Vec<u8> = (0..16u8).map(|j| (j % 16) | (((j + 1) % 16) << 4)).collect();
        let scales = [128u8];
        let view = View::Mxfp4 {
            rows: 1,
            cols: 32,
            row_stride: 0,
            col_stride: 1,
        };
        let v = gather(view, Dtype::U8, 0, 32, &blocks, Some(&scales)).unwrap();
        for (i, x) in v.iter().enumerate() {
            let nibble = if i % 2 == 0 {
                blocks[i / 2] & 15
            } else {
                blocks[i / 2] >> 4
            };
            assert_eq!(*x, crate::quant::mxfp4_value(nibble, 128));
        }
        assert!(gather(view, Dtype::U8, 0, 32, &blocks, None).is_err());
        assert!(gather(view, Dtype::U8, 2, 32, &blocks, Some(&scales)).is_err());
    }
}
