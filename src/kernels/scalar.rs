//! Scalar reference kernels: obviously correct, used to check the SIMD ones.

use super::RowRef;
use crate::quant::QFormat;

/// Signed value of weight `j` of a packed row.
#[inline]
pub fn unpack(format: QFormat, bytes: &[u8], j: usize) -> i32 {
    match format {
        QFormat::Int8 => bytes[j] as i8 as i32,
        QFormat::Int4 | QFormat::Int4Grouped { .. } => {
            let b = bytes[j / 2];
            let nib = if j.is_multiple_of(2) { b & 0x0f } else { b >> 4 };
            nib as i32 - 8
        }
        QFormat::Int2 => ((bytes[j / 4] >> (2 * (j % 4))) & 0x03) as i32 - 2,
        // No per-weight code: f32 rows are not packed, and ggml rows are
        // decoded block by block ([`ggml_row`]) before anything unpacks.
        QFormat::F32 | QFormat::Ggml(_) => 0,
    }
}

/// `row · x`: per scale group, an f32 sum of `q_j * x_j`, times the scale,
/// summed over groups in order.
pub fn dot(row: &RowRef<'_>, x: &[f32]) -> f32 {
    if let Some(w) = ggml_row(row) {
        return w.iter().zip(x).map(|(a, b)| a * b).sum();
    }
    match *row {
        RowRef::F32(w) => w.iter().zip(x).map(|(a, b)| a * b).sum(),
        RowRef::Packed {
            format,
            cols,
            bytes,
            scales,
        } => {
            let group = format.group_len(cols);
            let mut total = 0f32;
            for (g, &s) in scales.iter().enumerate() {
                let lo = g * group;
                let hi = (lo + group).min(cols);
                let mut acc = 0f32;
                for (j, xv) in x.iter().enumerate().take(hi).skip(lo) {
                    acc += unpack(format, bytes, j) as f32 * xv;
                }
                total += acc * s;
            }
            total
        }
    }
}

/// The row as f32 weights (`q * scale`).
pub fn dequantize_row(row: &RowRef<'_>, out: &mut [f32]) {
    if let Some(w) = ggml_row(row) {
        out[..w.len()].copy_from_slice(&w);
        return;
    }
    match *row {
        RowRef::F32(w) => out.copy_from_slice(w),
        RowRef::Packed {
            format,
            cols,
            bytes,
            scales,
        } => {
            let group = format.group_len(cols);
            for (j, o) in out.iter_mut().enumerate().take(cols) {
                *o = unpack(format, bytes, j) as f32 * scales[j / group];
            }
        }
    }
}

/// A ggml row decoded to f32, as ggml's `dequantize_row_*` writes it
/// (`None` for the engine's own formats). A row that is not whole blocks
/// decodes to zeros: matrices check their row length when built.
fn ggml_row(row: &RowRef<'_>) -> Option<Vec<f32>> {
    let RowRef::Packed {
        format: QFormat::Ggml(ty),
        cols,
        bytes,
        ..
    } = *row
    else {
        return None;
    };
    let mut out = vec![0f32; cols];
    if super::ggml::dequantize_row(ty, bytes, &mut out).is_err() {
        out.fill(0.0);
    }
    Some(out)
}

/// `out_i += w * x_i` over the common length (multiply, then add).
pub fn axpy(out: &mut [f32], w: f32, x: &[f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o += w * v;
    }
}

/// `out_i = src_i` as f32 over the common length (`half`'s conversion).
pub fn f16_to_f32(src: &[half::f16], out: &mut [f32]) {
    for (o, x) in out.iter_mut().zip(src) {
        *o = x.to_f32();
    }
}

/// `out_i = q_i as f32 * d` over the common length.
pub fn dequant_i8(q: &[i8], d: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(q) {
        *o = v as f32 * d;
    }
}

/// `out[i] += Σ_m a[i][m] · b[m]` for the `r` rows of `out` (`d` values
/// each), `a` being `r × kk` and `b` `kk × d`, all row-major: per element,
/// the terms in the order of `m`, each a rounded multiply then a rounded
/// add (never fused). The definition the SIMD versions equal bit for bit.
pub fn gemm_acc(out: &mut [f32], a: &[f32], b: &[f32], kk: usize, d: usize) {
    if kk == 0 || d == 0 {
        return;
    }
    for (o, ai) in out.chunks_exact_mut(d).zip(a.chunks_exact(kk)) {
        for (m, &w) in ai.iter().enumerate() {
            axpy(o, w, &b[m * d..(m + 1) * d]);
        }
    }
}
