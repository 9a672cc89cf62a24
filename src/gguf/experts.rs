//! Routed experts in a GGUF: each MoE layer stacks its experts in three
//! 3-D tensors `blk.N.ffn_{gate,up,down}_exps.weight` whose outermost
//! dimension (`dims[2]`) is the expert, so one expert is one contiguous
//! byte range in each, which is what the streaming runtime reads.

use super::GgufError;
use super::header::TensorInfo;
use super::split::GgufModel;

/// The three projections of a SwiGLU expert, in llama.cpp's tensor names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertProj {
    Gate,
    Up,
    Down,
}

impl ExpertProj {
    pub const ALL: [ExpertProj; 3] = [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down];

    fn infix(self) -> &'static str {
        match self {
            ExpertProj::Gate => "gate",
            ExpertProj::Up => "up",
            ExpertProj::Down => "down",
        }
    }
}

/// `blk.{layer}.ffn_{gate,up,down}_exps.weight`.
pub fn expert_tensor_name(layer: usize, proj: ExpertProj) -> String {
    format!("blk.{layer}.ffn_{}_exps.weight", proj.infix())
}

/// One expert's bytes in one stacked tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertSpan {
    /// Index into [`GgufModel::shards`].
    pub shard: usize,
    /// Absolute offset in the shard's file.
    pub offset: u64,
    pub len: u64,
}

/// One expert of one layer: its gate, up and down byte ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertRanges {
    pub gate: ExpertSpan,
    pub up: ExpertSpan,
    pub down: ExpertSpan,
}

/// Experts stacked in `info` (`dims[2]`); refused unless it is 3-D.
pub fn stacked_experts(info: &TensorInfo) -> Result<u64, GgufError> {
    match info.dims.as_slice() {
        [_, _, n] if *n > 0 => Ok(*n),
        dims => Err(GgufError::tensor(
            &info.name,
            format!("stacked experts need 3 dims with a non-zero expert count, found {dims:?}"),
        )),
    }
}

/// Absolute `(offset, len)` of expert `expert` in the stacked tensor
/// `info`: the tensor's bytes split evenly by its outermost dimension. The
/// split is exact because a row is whole blocks, so each matrix is too.
pub fn expert_slice(info: &TensorInfo, expert: u64) -> Result<(u64, u64), GgufError> {
    let n = stacked_experts(info)?;
    if expert >= n {
        return Err(GgufError::tensor(
            &info.name,
            format!("expert {expert} out of range (the tensor stacks {n})"),
        ));
    }
    let per = info.n_bytes() / n;
    Ok((info.data.start + expert * per, per))
}

impl GgufModel {
    /// The byte ranges of expert `expert` of layer `layer`; the three
    /// tensors must stack the same number of experts.
    pub fn expert_ranges(&self, layer: usize, expert: u64) -> Result<ExpertRanges, GgufError> {
        let mut spans = [ExpertSpan {
            shard: 0,
            offset: 0,
            len: 0,
        }; 3];
        let mut counts = [0u64; 3];
        for (i, proj) in ExpertProj::ALL.into_iter().enumerate() {
            let loc = self.tensor(&expert_tensor_name(layer, proj))?;
            counts[i] = stacked_experts(loc.info)?;
            let (offset, len) = expert_slice(loc.info, expert)?;
            spans[i] = ExpertSpan {
                shard: loc.shard,
                offset,
                len,
            };
        }
        if counts[0] != counts[1] || counts[0] != counts[2] {
            return Err(GgufError::tensor(
                &expert_tensor_name(layer, ExpertProj::Gate),
                format!(
                    "stacks {} experts, the up and down tensors {} and {}",
                    counts[0], counts[1], counts[2]
                ),
            ));
        }
        let [gate, up, down] = spans;
        Ok(ExpertRanges { gate, up, down })
    }
}
