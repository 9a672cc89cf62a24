//! A GGUF model presented as the [`Checkpoint`] a family's loader reads:
//! every tensor under its Hugging Face name ([`super::names`]), in place in
//! the GGUF's files. Quantized tensors keep their ggml blocks
//! ([`TensorMeta::block`]); each routed expert of a stacked
//! `ffn_*_exps` tensor becomes a tensor of its own whose bytes are that
//! expert's contiguous slice, so the expert map, the I/O workers and the
//! cache stream it from the GGUF exactly as from a safetensors file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use colibri_actors::FileId;
use safetensors::Dtype;

use super::names::{GgufNaming, Renamed, rename};
use super::{GgmlType, GgufError, GgufModel, TensorInfo, expert_slice, stacked_experts};
use crate::st::{Checkpoint, TensorMeta};

/// Metadata key of the view naming the architecture it was read as.
pub const ARCHITECTURE_KEY: &str = "gguf.architecture";

/// The checkpoint view of `model`, whose family names its tensors as
/// `naming` says.
pub fn checkpoint(model: &GgufModel, naming: GgufNaming) -> Result<Checkpoint, GgufError> {
    let experts = naming.experts;
    let files: Vec<PathBuf> = model.shards().iter().map(|s| s.path().to_path_buf()).collect();
    let first = files.first().cloned().unwrap_or_default();
    let in_file = |e: GgufError| e.in_file(&first);
    let mut tensors = BTreeMap::new();
    let mut insert = |name: String, meta: TensorMeta, from: &str| -> Result<(), GgufError> {
        if tensors.insert(name.clone(), meta).is_some() {
            return Err(GgufError::tensor(
                from,
                format!("a second tensor is read as {name:?}"),
            ));
        }
        Ok(())
    };
    for loc in model.tensors() {
        let info = loc.info;
        let file = FileId::try_from(loc.shard)
            .map_err(|_| in_file(GgufError::tensor(&info.name, "too many shards")))?;
        let renamed = rename(&info.name, naming);
        if renamed != Renamed::Unknown {
            computable(info).map_err(in_file)?;
        }
        match renamed {
            Renamed::Tensor(hf) => {
                let shape = shape_of(info, &info.shape())?;
                let meta = meta(info, shape, file, info.data.start, info.n_bytes());
                insert(hf, meta, &info.name).map_err(in_file)?;
            }
            Renamed::Unknown => {
                let shape = shape_of(info, &info.shape())?;
                let meta = meta(info, shape, file, info.data.start, info.n_bytes());
                insert(info.name.clone(), meta, &info.name).map_err(in_file)?;
            }
            Renamed::Experts { layer, which } => {
                let n = stacked_experts(info).map_err(in_file)?;
                // Outermost first: [experts, rows, cols]; one expert is [rows, cols].
                let shape = shape_of(info, &info.shape()[1..])?;
                for e in 0..n {
                    let (offset, len) = expert_slice(info, e).map_err(in_file)?;
                    let name = experts.tensor(layer, e as usize, which);
                    insert(name, meta(info, shape.clone(), file, offset, len), &info.name)
                        .map_err(in_file)?;
                }
            }
            Renamed::ExpertBiases { layer, which } => {
                // [experts, len]: one vector per expert, contiguous.
                let (n, len) = match info.dims.as_slice() {
                    [len, n] if *n > 0 => (*n, *len),
                    dims => {
                        return Err(in_file(GgufError::tensor(
                            &info.name,
                            format!(
                                "stacked expert biases need 2 dims with a non-zero expert count, found {dims:?}"
                            ),
                        )));
                    }
                };
                let shape = shape_of(info, &[len])?;
                let per = info.n_bytes() / n;
                for e in 0..n {
                    let name = experts.bias(layer, e as usize, which);
                    let offset = info.data.start + e * per;
                    insert(name, meta(info, shape.clone(), file, offset, per), &info.name)
                        .map_err(in_file)?;
                }
            }
        }
    }
    let mut metadata = BTreeMap::new();
    if let Ok(arch) = model.architecture() {
        metadata.insert(ARCHITECTURE_KEY.to_string(), arch.to_string());
    }
    let dir = first
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    Checkpoint::from_index(&dir, files, tensors, metadata)
        .map_err(|e| GgufError::tensor("(index)", e.to_string()).in_file(&first))
}

/// Refuses, at load, a tensor the loaders read whose type colibri cannot
/// compute with (rather than when the first token reaches that expert).
fn computable(info: &TensorInfo) -> Result<(), GgufError> {
    let (_, block) = storage(info.ggml_type);
    match block {
        Some(ty) if crate::kernels::ggml::vec_dot_type(ty).is_err() => Err(GgufError::tensor(
            &info.name,
            format!(
                "type {ty} has no kernel in colibri (quantized types it runs: {})",
                crate::kernels::ggml::SUPPORTED
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        _ => Ok(()),
    }
}

/// A tensor's shape as `usize`s (outermost first).
fn shape_of(info: &TensorInfo, dims: &[u64]) -> Result<Vec<usize>, GgufError> {
    dims.iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| GgufError::tensor(&info.name, format!("dimension {d} is too large")))
        })
        .collect()
}

fn meta(info: &TensorInfo, shape: Vec<usize>, file: FileId, offset: u64, len: u64) -> TensorMeta {
    let (dtype, block) = storage(info.ggml_type);
    TensorMeta {
        dtype,
        block,
        shape,
        file,
        offset,
        len,
    }
}

/// The safetensors dtype a ggml type reads as, and the block type when the
/// tensor is quantized (then its bytes are `U8`).
fn storage(ty: GgmlType) -> (Dtype, Option<GgmlType>) {
    match ty {
        GgmlType::F32 => (Dtype::F32, None),
        GgmlType::F16 => (Dtype::F16, None),
        GgmlType::BF16 => (Dtype::BF16, None),
        GgmlType::F64 => (Dtype::F64, None),
        GgmlType::I8 => (Dtype::I8, None),
        GgmlType::I16 => (Dtype::I16, None),
        GgmlType::I32 => (Dtype::I32, None),
        GgmlType::I64 => (Dtype::I64, None),
        quantized => (Dtype::U8, Some(quantized)),
    }
}
