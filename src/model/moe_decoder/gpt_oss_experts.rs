//! gpt-oss's routed experts as its releases store them: one fused tensor
//! per layer and projection, the expert outermost. The BF16 release keeps
//! `gate_up_proj [E, H, 2I]` input-major with gate and up interleaved
//! column by column and `down_proj [E, I, H]` input-major; the MXFP4
//! release keeps `{gate_up,down}_proj_blocks [E, rows, cols/32, 16]`
//! output-major (gate and up interleaved row by row) with their exponent
//! bytes in `_scales [E, rows, cols/32]`; both keep `gate_up_proj_bias
//! [E, 2I]` (interleaved) and `down_proj_bias [E, H]`.
//!
//! Because the expert is outermost, each expert's share of every fused
//! tensor is one contiguous byte range, so the expert streams as a handful
//! of reads, exactly as a converted container's would; the codec then
//! gathers gate, up and down out of those ranges through
//! [`View`](crate::st::View)s, the same views `coli convert` splits the
//! experts with, so both give the same values.

use colibri_actors::{ExpertExtent, ExpertKey, Piece};
use safetensors::Dtype;

use crate::model::ModelError;
use crate::model::expert::{BiasSlot, ExpertLayout, MatrixSlot};
use crate::st::{Checkpoint, View};

/// The fused tensors' names in layer `l`.
fn name(l: usize, part: &str) -> String {
    format!("model.layers.{l}.mlp.experts.{part}")
}

/// Whether layer `l` keeps its experts fused (either release's form).
pub(super) fn is_fused(ck: &Checkpoint, l: usize) -> bool {
    [
        "gate_up_proj",
        "gate_up_proj_blocks",
        "down_proj",
        "down_proj_blocks",
    ]
    .iter()
    .any(|p| ck.has(&name(l, p)))
}

/// Expert `key`'s byte ranges of the fused tensors of its layer and the
/// layout that reads gate, up and down (and their biases) out of them.
pub(super) fn fused_expert(
    ck: &Checkpoint,
    key: ExpertKey,
    n_experts: usize,
    hidden: usize,
    inter: usize,
) -> Result<(ExpertExtent, ExpertLayout), ModelError> {
    let (l, e) = (key.layer as usize, key.expert as usize);
    let mut fused = Fused {
        ck,
        n_experts,
        e,
        pieces: Vec::with_capacity(6),
    };
    let mxfp4 = ck.has(&name(l, "gate_up_proj_blocks"));
    let (gate, up) = if mxfp4 {
        // Output-major [2I, H]: gate is every even row, up every odd.
        let [data, scales] = fused.mxfp4(&name(l, "gate_up_proj"), 2 * inter, hidden)?;
        let view = View::Mxfp4 {
            rows: inter,
            cols: hidden,
            row_stride: 2 * hidden,
            col_stride: 1,
        };
        let slot = |first| MatrixSlot {
            dtype: Dtype::U8,
            block: None,
            rows: inter,
            cols: hidden,
            data,
            scales: Some(scales),
            view: Some((view, first)),
        };
        (slot(0), slot(hidden))
    } else {
        // Input-major [H, 2I]: gate is every even column, up every odd.
        let (dtype, data) = fused.float(&name(l, "gate_up_proj"), &[hidden, 2 * inter])?;
        let view = View::Strided {
            rows: inter,
            cols: hidden,
            row_stride: 2,
            col_stride: 2 * inter,
        };
        let slot = |first| MatrixSlot {
            dtype,
            block: None,
            rows: inter,
            cols: hidden,
            data,
            scales: None,
            view: Some((view, first)),
        };
        (slot(0), slot(1))
    };
    let down = if ck.has(&name(l, "down_proj_blocks")) {
        let [data, scales] = fused.mxfp4(&name(l, "down_proj"), hidden, inter)?;
        MatrixSlot {
            dtype: Dtype::U8,
            block: None,
            rows: hidden,
            cols: inter,
            data,
            scales: Some(scales),
            view: Some((
                View::Mxfp4 {
                    rows: hidden,
                    cols: inter,
                    row_stride: inter,
                    col_stride: 1,
                },
                0,
            )),
        }
    } else {
        let (dtype, data) = fused.float(&name(l, "down_proj"), &[inter, hidden])?;
        MatrixSlot {
            dtype,
            block: None,
            rows: hidden,
            cols: inter,
            data,
            scales: None,
            view: Some((
                View::Strided {
                    rows: hidden,
                    cols: inter,
                    row_stride: 1,
                    col_stride: hidden,
                },
                0,
            )),
        }
    };
    let (dtype, data) = fused.float(&name(l, "gate_up_proj_bias"), &[2 * inter])?;
    let every_other = View::Strided {
        rows: 1,
        cols: inter,
        row_stride: 0,
        col_stride: 2,
    };
    let bias = |first| BiasSlot {
        dtype,
        len: inter,
        data,
        view: Some((every_other, first)),
    };
    let (gate_bias, up_bias) = (bias(0), bias(1));
    let (dtype, data) = fused.float(&name(l, "down_proj_bias"), &[hidden])?;
    let down_bias = BiasSlot {
        dtype,
        len: hidden,
        data,
        view: None,
    };
    let layout = ExpertLayout {
        gate,
        up,
        down,
        bias: Some([gate_bias, up_bias, down_bias]),
    };
    Ok((ExpertExtent { pieces: fused.pieces }, layout))
}

/// A piece index and its byte length, as the expert slots hold them.
type Range = (usize, usize);

/// Cuts one expert's ranges out of fused tensors, checking each tensor's
/// shape, dtype and size first.
struct Fused<'a> {
    ck: &'a Checkpoint,
    n_experts: usize,
    e: usize,
    pieces: Vec<Piece>,
}

impl Fused<'_> {
    /// Expert `e`'s range of `tensor`, which must be `[E, inner..]` with
    /// `elem` bytes a value; returns (piece index, bytes).
    fn slice(&mut self, tensor: &str, inner: &[usize], elem: u64) -> Result<(usize, usize), ModelError> {
        let meta = self.ck.info(tensor)?;
        let mut want = vec![self.n_experts];
        want.extend_from_slice(inner);
        if meta.shape != want {
            return Err(ModelError::Weights(format!(
                "{tensor}: expected shape {want:?} (experts outermost), found {:?}",
                meta.shape
            )));
        }
        // Shapes were validated against the file at open, so these fit.
        let values = want.iter().map(|&d| d as u64).product::<u64>();
        let per = inner.iter().map(|&d| d as u64).product::<u64>() * elem;
        if meta.len != values * elem || self.e >= self.n_experts {
            return Err(ModelError::Weights(format!(
                "{tensor}: {} bytes for {values} values of {:?}",
                meta.len, meta.dtype
            )));
        }
        let whole = meta.piece();
        self.pieces.push(Piece {
            file: whole.file,
            offset: whole.offset + self.e as u64 * per,
            len: per,
        });
        Ok((self.pieces.len() - 1, per as usize))
    }

    /// A float tensor's range: (dtype, (piece index, bytes)).
    fn float(&mut self, tensor: &str, inner: &[usize]) -> Result<(Dtype, (usize, usize)), ModelError> {
        let dtype = self.ck.info(tensor)?.dtype;
        let elem = match dtype {
            Dtype::F32 => 4,
            Dtype::BF16 | Dtype::F16 => 2,
            other => {
                return Err(ModelError::Weights(format!(
                    "{tensor}: fused experts must be F32, BF16 or F16 (or MXFP4 _blocks), found {other:?}"
                )));
            }
        };
        Ok((dtype, self.slice(tensor, inner, elem)?))
    }

    /// An MXFP4 matrix `[rows, cols]`: its `_blocks` and `_scales` ranges.
    fn mxfp4(&mut self, stem: &str, rows: usize, cols: usize) -> Result<[Range; 2], ModelError> {
        let (blocks, scales) = (format!("{stem}_blocks"), format!("{stem}_scales"));
        if !cols.is_multiple_of(32) {
            return Err(ModelError::Weights(format!(
                "{blocks}: MXFP4 rows of {cols} values are not whole blocks of 32"
            )));
        }
        for t in [&blocks, &scales] {
            let meta = self.ck.info(t)?;
            if meta.dtype != Dtype::U8 {
                return Err(ModelError::Weights(format!(
                    "{t}: MXFP4 tensors are U8, found {:?}",
                    meta.dtype
                )));
            }
        }
        let b = self.slice(&blocks, &[rows, cols / 32, 16], 1)?;
        let s = self.slice(&scales, &[rows, cols / 32], 1)?;
        Ok([b, s])
    }
}
