//! Kernels for the ggml block types GGUF files store weights in, computed
//! on the blocks directly (no requantization).
//!
//! For each supported type ([`SUPPORTED`]): [`dequantize_row`] exactly as
//! ggml's `dequantize_row_*`, and a row dot product against the activation
//! quantized the way llama.cpp's CPU backend multiplies it ([`GgmlActs`]:
//! Q8_0 for Q8_0, Q4_0, Q5_0, IQ4_NL and MXFP4; Q8_1 for Q4_1 and Q5_1;
//! Q8_K for the K-quants and IQ4_XS).
//!
//! The dot product's definition is the scalar reference [`vec_dot`]: per
//! block an exact integer sum of weight codes times activation values
//! (sub-block scales applied in integers where the type has them), then one
//! or two f32 terms per block (`(d_w · d_a) × isum`, plus `m_w · s_a` for
//! Q4_1/Q5_1 or `− (dmin_w · d_a) × Σ min × bsum` for the K-quants with
//! mins), added in block order. The SIMD kernels (AVX2, AVX-512, with VNNI
//! where the CPU has it) keep every integer part exact and differ only in
//! how the f32 terms are split across lanes and summed, in an order fixed
//! by the row's length: a row's result depends only on the row and the
//! activations, never on threads or on which other rows are computed.
//! NEON uses the scalar reference.

mod acts;
pub(crate) mod blocks;
mod error;
pub(crate) mod iq4;
pub(crate) mod k_quants;
mod legacy;
mod mxfp4;
mod q8_0;

pub use acts::GgmlActs;
pub use blocks::{QK, QK_K};
pub use error::GgmlError;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::Isa;
use super::Kernels;
pub use crate::gguf::GgmlType;

/// The weight types these kernels compute with.
pub const SUPPORTED: [GgmlType; 13] = {
    use crate::gguf::GgmlType::*;
    [
        Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4,
    ]
};

/// One activation block as the per-type dot products read it.
#[derive(Clone, Copy)]
pub(crate) struct ActBlock<'a> {
    pub(crate) q: &'a [i8],
    pub(crate) d: f32,
    /// Q8_1's `s` (0 otherwise).
    pub(crate) s: f32,
    /// Q8_K's 16-column sums (empty otherwise).
    pub(crate) bsums: &'a [i16],
}

type Dequant = fn(&[u8], &mut [f32]);
type Dot = fn(&[u8], ActBlock<'_>) -> [f32; 2];

/// The per-block functions of a supported weight type.
fn funcs(ty: GgmlType) -> Result<(Dequant, Dot), GgmlError> {
    use crate::gguf::GgmlType::*;
    Ok(match ty {
        Q8_0 => (q8_0::dequant, q8_0::dot),
        Q4_0 => (legacy::dequant_q4_0, legacy::dot_q4_0),
        Q4_1 => (legacy::dequant_q4_1, legacy::dot_q4_1),
        Q5_0 => (legacy::dequant_q5_0, legacy::dot_q5_0),
        Q5_1 => (legacy::dequant_q5_1, legacy::dot_q5_1),
        Q2_K => (k_quants::dequant_q2_k, k_quants::dot_q2_k),
        Q3_K => (k_quants::dequant_q3_k, k_quants::dot_q3_k),
        Q4_K => (k_quants::dequant_q4_k, k_quants::dot_q4_k),
        Q5_K => (k_quants::dequant_q5_k, k_quants::dot_q5_k),
        Q6_K => (k_quants::dequant_q6_k, k_quants::dot_q6_k),
        IQ4_NL => (iq4::dequant_nl, iq4::dot_nl),
        IQ4_XS => (iq4::dequant_xs, iq4::dot_xs),
        MXFP4 => (mxfp4::dequant, mxfp4::dot),
        ty => return Err(GgmlError::Unsupported { ty }),
    })
}

/// The activation type ggml-cpu multiplies `ty` rows with (its
/// `vec_dot_type`).
pub fn vec_dot_type(ty: GgmlType) -> Result<GgmlType, GgmlError> {
    use crate::gguf::GgmlType::*;
    match ty {
        Q8_0 | Q4_0 | Q5_0 | IQ4_NL | MXFP4 => Ok(Q8_0),
        Q4_1 | Q5_1 => Ok(Q8_1),
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS => Ok(Q8_K),
        ty => Err(GgmlError::Unsupported { ty }),
    }
}

/// Bytes of a `ty` row of `cols` columns; an error unless `cols` is a whole
/// number of `ty`'s blocks. Sized from the one type table in
/// [`crate::gguf::types`].
pub fn row_bytes(ty: GgmlType, cols: usize) -> Result<usize, GgmlError> {
    let block = ty.block_size() as usize;
    if !cols.is_multiple_of(block) {
        return Err(GgmlError::PartialBlock { ty, cols, block });
    }
    Ok(cols / block * ty.type_size() as usize)
}

/// Checks that `row` is exactly one `ty` row of `cols` columns.
pub fn check_row(ty: GgmlType, cols: usize, row: &[u8]) -> Result<(), GgmlError> {
    check_row_len(ty, cols, row.len())
}

/// Columns of a `ty` row of `bytes` bytes, checked.
fn cols_of(ty: GgmlType, bytes: usize) -> Result<usize, GgmlError> {
    let (block, size) = (ty.block_size() as usize, ty.type_size() as usize);
    let cols = bytes / size * block;
    check_row_len(ty, cols, bytes)?;
    Ok(cols)
}

fn check_row_len(ty: GgmlType, cols: usize, got: usize) -> Result<(), GgmlError> {
    let expected = row_bytes(ty, cols)?;
    if got != expected {
        return Err(GgmlError::RowBytes {
            ty,
            cols,
            expected,
            got,
        });
    }
    Ok(())
}

/// `row` (one `ty` row) decoded into `out`, value for value what ggml's
/// `dequantize_row_*` writes. The row's columns are `out.len()`.
pub fn dequantize_row(ty: GgmlType, row: &[u8], out: &mut [f32]) -> Result<(), GgmlError> {
    let (dequant, _) = funcs(ty)?;
    check_row(ty, out.len(), row)?;
    let (block, size) = (ty.block_size() as usize, ty.type_size() as usize);
    for (b, o) in row.chunks_exact(size).zip(out.chunks_exact_mut(block)) {
        dequant(b, o);
    }
    Ok(())
}

/// Checks that `acts` fit `ty` rows of `row_len` bytes; returns the columns.
fn check_acts(ty: GgmlType, row_len: usize, acts: &GgmlActs) -> Result<usize, GgmlError> {
    funcs(ty)?;
    let cols = cols_of(ty, row_len)?;
    let needs = vec_dot_type(ty)?;
    if acts.ty != needs || acts.cols != cols {
        return Err(GgmlError::Acts {
            ty,
            cols,
            needs,
            got: acts.ty,
            got_cols: acts.cols,
        });
    }
    Ok(cols)
}

/// The per-block f32 terms of `row · acts`, in block order (checked).
fn terms(ty: GgmlType, row: &[u8], acts: &GgmlActs) -> Result<impl Iterator<Item = [f32; 2]>, GgmlError> {
    check_acts(ty, row.len(), acts)?;
    let (_, dot) = funcs(ty)?;
    let (block, size) = (ty.block_size() as usize, ty.type_size() as usize);
    Ok(row.chunks_exact(size).enumerate().map(move |(i, b)| {
        // A Q8_K block spans a whole super-block; Q8_0/Q8_1 blocks are 32.
        let a = ActBlock {
            q: &acts.q[i * block..(i + 1) * block],
            d: acts.d[i],
            s: acts.s.get(i).copied().unwrap_or(0.0),
            bsums: acts.bsums.get(i * 16..(i + 1) * 16).unwrap_or(&[]),
        };
        dot(b, a)
    }))
}

/// The scalar reference `row · acts` (the definition the SIMD kernels are
/// tested against): the block terms added in block order from 0.
pub fn vec_dot(ty: GgmlType, row: &[u8], acts: &GgmlActs) -> Result<f32, GgmlError> {
    Ok(terms(ty, row, acts)?.fold(0.0f32, |s, [a, b]| s + (a + b)))
}

/// `Σ |term|` over the f32 terms of [`vec_dot`]: the magnitude the SIMD
/// kernels' rounding differences (and ggml's own) are bounded against, so
/// tests can state a relative tolerance that cancellation cannot defeat.
pub fn vec_dot_magnitude(ty: GgmlType, row: &[u8], acts: &GgmlActs) -> Result<f32, GgmlError> {
    Ok(terms(ty, row, acts)?.fold(0.0f32, |s, [a, b]| s + a.abs() + b.abs()))
}

impl Kernels {
    /// Whether this kernel set has a SIMD kernel for `ty` rows (otherwise
    /// [`Kernels::ggml_dot`] uses the scalar reference).
    pub fn ggml_has_simd(&self, ty: GgmlType) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if self.isa == Isa::Avx512 && self.f16c && super::x86::ggml_avx512::has(ty) {
                return true;
            }
            if matches!(self.isa, Isa::Avx2 | Isa::Avx512) {
                return super::x86::ggml_avx2::has(ty);
            }
        }
        #[cfg(target_arch = "aarch64")]
        if self.isa == Isa::Neon {
            return super::neon_ggml::has(ty);
        }
        let _ = ty;
        false
    }

    /// `row · acts` for one `ty` row, with `acts` from
    /// [`GgmlActs::for_weights`]. Panics when the row is not a whole
    /// number of blocks or `acts` does not fit it: rows come from tensors
    /// validated with [`row_bytes`] at load, so a mismatch is a bug, and the
    /// SIMD kernels rely on the check to stay in bounds.
    pub fn ggml_dot(&self, ty: GgmlType, row: &[u8], acts: &GgmlActs) -> f32 {
        if let Err(e) = check_acts(ty, row.len(), acts) {
            panic!("ggml_dot: {e}");
        }
        self.ggml_dot_checked(ty, row, acts)
    }

    /// `out[i] = row_i · acts` for the `out.len()` consecutive `ty` rows of
    /// `bytes` (each `bytes.len() / out.len()` bytes). Each value equals
    /// [`Kernels::ggml_dot`] of its row exactly. Panics as `ggml_dot` does,
    /// or when `bytes` is not `out.len()` rows.
    pub fn ggml_dot_rows(&self, ty: GgmlType, bytes: &[u8], acts: &GgmlActs, out: &mut [f32]) {
        let rows = out.len();
        let rb = row_bytes(ty, acts.cols).unwrap_or_else(|e| panic!("ggml_dot_rows: {e}"));
        assert!(
            bytes.len() == rows * rb,
            "ggml_dot_rows: {rows} {ty} rows of {} columns need {} bytes, got {}",
            acts.cols,
            rows * rb,
            bytes.len()
        );
        if rb == 0 {
            out.fill(0.0);
            return;
        }
        if let Err(e) = check_acts(ty, rb, acts) {
            panic!("ggml_dot_rows: {e}");
        }
        #[cfg(target_arch = "x86_64")]
        if self.isa == Isa::Avx512 && self.f16c {
            // SAFETY: as in `ggml_dot_checked`; `bytes` is `rows` rows of
            // `rb` bytes (asserted above), each validated by `check_acts`.
            if unsafe { super::x86::ggml_avx512::dot_rows(ty, bytes, rb, acts, self.vnni, out) } {
                return;
            }
        }
        for (o, row) in out.iter_mut().zip(bytes.chunks_exact(rb)) {
            *o = self.ggml_dot_checked(ty, row, acts);
        }
    }

    /// `row · acts` after `check_acts` succeeded.
    #[inline]
    fn ggml_dot_checked(&self, ty: GgmlType, row: &[u8], acts: &GgmlActs) -> f32 {
        #[cfg(target_arch = "x86_64")]
        {
            if self.isa == Isa::Avx512 && self.f16c {
                // SAFETY: `Isa::Avx512` is only built after detecting
                // AVX-512F/BW and AVX2+FMA, `f16c` after detecting F16C,
                // `vnni` only set after detecting AVX512-VNNI; `check_acts`
                // validated the row and the
                // activations for `ty`.
                if let Some(v) = unsafe { super::x86::ggml_avx512::dot(ty, row, acts, self.vnni) } {
                    return v;
                }
            }
            if matches!(self.isa, Isa::Avx2 | Isa::Avx512) {
                // SAFETY: both sets are only built after detecting AVX2 and
                // FMA; `check_acts` validated the row and activations.
                if let Some(v) = unsafe { super::x86::ggml_avx2::dot(ty, row, acts) } {
                    return v;
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        if self.isa == Isa::Neon {
            // SAFETY: `Isa::Neon` is only built after detecting NEON;
            // `check_acts` validated the row and activations.
            if let Some(v) = unsafe { super::neon_ggml::dot(ty, row, acts) } {
                return v;
            }
        }
        // Checked by the caller: the reference cannot fail here.
        vec_dot(ty, row, acts).unwrap_or(f32::NAN)
    }
}
