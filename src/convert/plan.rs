//! Deciding what the container holds: one job per logical output tensor,
//! in file order, with every size known before a byte is written (the
//! header, which comes first, needs all offsets).

use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::ConvertError;
use crate::gguf::GgmlType;
use crate::model::expert::ExpertNaming;
use crate::quant::QFormat;
use crate::st::fp8::{FP8_BLOCK, SCALE_INV_SUFFIX};
use crate::st::{Checkpoint, SCALE_SUFFIX};

/// A dense tensor's output format from its name and shape.
pub(crate) type DenseRule = dyn Fn(&str, &[usize]) -> QFormat;

/// What the planner needs to know about a model family: where routed
/// experts are, their shapes, and which format every tensor is written in.
/// Each family builds one (its `FamilyConfig::convert_spec`); the
/// planning itself is shared (by `coli convert` and `coli synth`).
pub(crate) struct ModelSpec {
    /// One entry per decoder layer that may hold tensors (`model.layers.N.`
    /// with N beyond it is refused); true where the layer has routed experts.
    pub expert_layers: Vec<bool>,
    /// Layers from this index on are next-token (MTP) layers that a
    /// checkpoint may lack entirely: transformers drops them when it loads a
    /// release, so a fine-tune it saves declares them in config.json without
    /// their weights. Such a layer is left out; one that is there in part is
    /// still an error. `usize::MAX`: every layer is required.
    pub optional_layers_from: usize,
    pub n_experts: usize,
    pub hidden: usize,
    /// Rows of an expert's gate/up projection.
    pub inter: usize,
    /// Format of each layer's routed experts (indexed like `expert_layers`).
    pub expert_format: Vec<QFormat>,
    /// Format of a dense tensor given its name and shape (F32 = kept full
    /// precision; non-matrices must map to F32).
    pub dense_format: Box<DenseRule>,
    /// Extra `__metadata__` entries describing the choices.
    pub metadata: Vec<(&'static str, String)>,
    /// How routed experts are named (read and written under the same names).
    pub naming: ExpertNaming,
    /// How the input may fuse the experts of a layer into one tensor.
    pub fused: FusedLayout,
    /// Routed experts carry gate/up/down biases (written as
    /// `….experts.E.{gate,up,down}_proj.bias`).
    pub expert_bias: bool,
}

/// The fused expert tensors a family's checkpoints may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FusedLayout {
    /// transformers 5: `mlp.experts.gate_up_proj [E, 2I, H]` (gate rows,
    /// then up rows) and `mlp.experts.down_proj [E, H, I]`.
    Stacked,
    /// gpt-oss: `gate_up_proj [E, H, 2I]` with gate and up interleaved
    /// column by column, `down_proj [E, I, H]` (input-major), their biases
    /// `gate_up_proj_bias [E, 2I]` and `down_proj_bias [E, H]`, or the
    /// MXFP4 form `{gate_up,down}_proj_{blocks,scales}` (output-major).
    GptOss,
}

impl ModelSpec {
    /// Routed experts in the whole model.
    pub fn experts(&self) -> usize {
        self.expert_layers.iter().filter(|&&x| x).count() * self.n_experts
    }
}

/// `model.layers.N.…` -> N.
pub(crate) fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?
        .split_once('.')?
        .0
        .parse()
        .ok()
}

/// One tensor of the input as the planner sees it: a checkpoint's tensor, or
/// one a generator will produce (`coli synth`). Keeping the planner on this
/// description, not on a [`Checkpoint`], is what lets both share one layout.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct InputTensor {
    pub name: String,
    pub dtype: Dtype,
    /// Logical shape (elements, outermost first).
    pub shape: Vec<usize>,
    /// ggml's block type of a GGUF tensor stored quantized (then `dtype` is
    /// `U8`): copied as stored, never requantized ([`crate::st::ggml_blocks`]).
    pub block: Option<GgmlType>,
    /// Named in errors about this tensor.
    pub path: PathBuf,
}

/// The tensors of a checkpoint, in its (sorted) name order.
pub(crate) fn checkpoint_inputs(ck: &Checkpoint) -> Result<Vec<InputTensor>, ConvertError> {
    ck.names()
        .map(|name| {
            let meta = ck.info(name)?;
            Ok(InputTensor {
                name: name.to_string(),
                dtype: meta.dtype,
                shape: meta.shape.clone(),
                block: meta.block,
                path: ck.path_of(meta).to_path_buf(),
            })
        })
        .collect()
}

/// How a job's data is produced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    /// Bytes copied unchanged (same dtype): F32 tensors kept F32, and
    /// non-float tensors.
    Raw,
    /// BF16/F16 widened to F32.
    F32,
    /// Quantized to U8 bytes plus `.qs` F32 scales.
    Quant(QFormat),
}

/// Where a job's input values are: a whole tensor, or one expert's rows of
/// a fused `[E, R, C]` tensor (transformers 5 layout).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Source {
    pub tensor: String,
    pub dtype: Dtype,
    /// First element and element count inside the tensor.
    pub elem_start: usize,
    pub elems: usize,
    /// The `_scale_inv` block-scale tensor of an `F8_E4M3` weight (consumed,
    /// never copied: the weight is dequantized through it).
    pub scale_inv: Option<String>,
    /// How the output's values are picked from the input's.
    pub view: View,
}

/// Which input elements make the output, in output order.
pub(crate) use crate::st::View;

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Job {
    pub name: String,
    pub source: Source,
    /// Logical shape of the output tensor.
    pub shape: Vec<usize>,
    pub kind: Kind,
    /// First tensor of an expert: starts on a 4096-byte boundary.
    pub align: bool,
    pub expert: bool,
}

/// One tensor as it appears in the output header.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub len: u64,
}

impl Job {
    /// The header entries this job writes, in order.
    pub fn entries(&self) -> Vec<Entry> {
        let elems = self.source.elems as u64;
        match self.kind {
            Kind::Raw => vec![Entry {
                name: self.name.clone(),
                dtype: self.source.dtype,
                shape: self.shape.clone(),
                len: elems * dtype_bytes(self.source.dtype),
            }],
            Kind::F32 => vec![Entry {
                name: self.name.clone(),
                dtype: Dtype::F32,
                shape: self.shape.clone(),
                len: elems * 4,
            }],
            Kind::Quant(f) => {
                let (rows, cols) = (self.shape[0], self.shape[1]);
                let rb = f.row_bytes(cols);
                let spr = f.scales_per_row(cols);
                let scale_shape = if spr == 1 { vec![rows] } else { vec![rows, spr] };
                vec![
                    Entry {
                        name: self.name.clone(),
                        dtype: Dtype::U8,
                        shape: vec![rows, rb],
                        len: (rows * rb) as u64,
                    },
                    Entry {
                        name: format!("{}{SCALE_SUFFIX}", self.name),
                        dtype: Dtype::F32,
                        shape: scale_shape,
                        len: (rows * spr * 4) as u64,
                    },
                ]
            }
        }
    }
}

pub(crate) fn dtype_bytes(d: Dtype) -> u64 {
    match d {
        Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        Dtype::F32 | Dtype::I32 | Dtype::U32 => 4,
        Dtype::F16 | Dtype::BF16 | Dtype::I16 | Dtype::U16 => 2,
        _ => 1,
    }
}

fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::F32 | Dtype::BF16 | Dtype::F16)
}

/// Readable as floating point: F32/BF16/F16, or a 2-D F8_E4M3 matrix whose
/// block scales sit beside it.
fn is_readable(d: Dtype) -> bool {
    is_float(d) || d == Dtype::F8_E4M3
}

/// The `_scale_inv` tensor of an F8_E4M3 matrix, checked: F32/BF16, shape
/// `[ceil(rows/128), ceil(cols/128)]`.
fn fp8_scales(
    by_name: &BTreeMap<&str, &InputTensor>,
    meta: &InputTensor,
) -> Result<Option<String>, ConvertError> {
    if meta.dtype != Dtype::F8_E4M3 {
        return Ok(None);
    }
    let bad = |reason: String| ConvertError::Input {
        path: meta.path.clone(),
        tensor: meta.name.clone(),
        reason,
    };
    let [rows, cols] = meta.shape[..] else {
        return Err(bad(format!(
            "an F8_E4M3 tensor must be a 2-D matrix, found shape {:?}",
            meta.shape
        )));
    };
    let sname = format!("{}{SCALE_INV_SUFFIX}", meta.name);
    let Some(s) = by_name.get(sname.as_str()) else {
        return Err(bad(format!("F8_E4M3 weight without its block scales {sname:?}")));
    };
    let want = vec![rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK)];
    if !is_float(s.dtype) || s.shape != want {
        return Err(bad(format!(
            "{sname}: expected a float tensor of shape {want:?} ({FP8_BLOCK}x{FP8_BLOCK} blocks), found {} {:?}",
            s.dtype, s.shape
        )));
    }
    Ok(Some(sname))
}

/// `model.layers.L.mlp.experts.{gate_up_proj,down_proj}` -> (L, is_down).
fn split_fused(name: &str) -> Option<(usize, bool)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (l, rest) = rest.split_once('.')?;
    let is_down = match rest {
        "mlp.experts.gate_up_proj" => false,
        "mlp.experts.down_proj" => true,
        _ => return None,
    };
    Some((l.parse().ok()?, is_down))
}

/// The parts of gpt-oss's fused expert tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GptOssPart {
    GateUp,
    Down,
    GateUpBias,
    DownBias,
    GateUpBlocks,
    DownBlocks,
    /// `_scales` of an MXFP4 tensor: consumed by its `_blocks`.
    Scales,
}

/// `model.layers.L.mlp.experts.<part>` -> (L, part).
fn gpt_oss_fused(name: &str) -> Option<(usize, GptOssPart)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (l, rest) = rest.split_once('.')?;
    let part = match rest.strip_prefix("mlp.experts.")? {
        "gate_up_proj" => GptOssPart::GateUp,
        "down_proj" => GptOssPart::Down,
        "gate_up_proj_bias" => GptOssPart::GateUpBias,
        "down_proj_bias" => GptOssPart::DownBias,
        "gate_up_proj_blocks" => GptOssPart::GateUpBlocks,
        "down_proj_blocks" => GptOssPart::DownBlocks,
        "gate_up_proj_scales" | "down_proj_scales" => GptOssPart::Scales,
        _ => return None,
    };
    Some((l.parse().ok()?, part))
}

/// One expert's part of a fused tensor: (which, element offset, view).
type ExpertPart = (usize, usize, View);

/// The per-expert sources of one gpt-oss fused tensor: gate/up/down
/// matrices (which 0..3) and their biases (which 3..6), as strided views.
fn gpt_oss_sources(
    spec: &ModelSpec,
    by_name: &BTreeMap<&str, &InputTensor>,
    meta: &InputTensor,
    l: usize,
    part: GptOssPart,
    out: &mut BTreeMap<(usize, usize, usize), Source>,
) -> Result<(), ConvertError> {
    let (n_exp, h, inter) = (spec.n_experts, spec.hidden, spec.inter);
    let name = meta.name.as_str();
    let bad = |reason: String| ConvertError::Input {
        path: meta.path.clone(),
        tensor: name.to_string(),
        reason,
    };
    if !spec.expert_layers.get(l).copied().unwrap_or(false) {
        return Err(bad(format!("layer {l} has no routed experts")));
    }
    let strided = |rows, cols, row_stride, col_stride| View::Strided {
        rows,
        cols,
        row_stride,
        col_stride,
    };
    let mxfp4 = |rows, cols, row_stride, col_stride| View::Mxfp4 {
        rows,
        cols,
        row_stride,
        col_stride,
    };
    // (expected shape, per-expert element count, [(which, offset, view)], scales)
    let (want, per, parts, scales): (Vec<usize>, usize, Vec<ExpertPart>, Option<String>) = match part {
        GptOssPart::Scales => {
            let blocks = format!("{}_blocks", name.trim_end_matches("_scales"));
            if !by_name.contains_key(blocks.as_str()) {
                return Err(bad(format!("MXFP4 scales without their blocks {blocks:?}")));
            }
            return Ok(());
        }
        GptOssPart::GateUp => (
            vec![n_exp, h, 2 * inter],
            h * 2 * inter,
            vec![
                (0, 0, strided(inter, h, 2, 2 * inter)),
                (1, 1, strided(inter, h, 2, 2 * inter)),
            ],
            None,
        ),
        GptOssPart::Down => (
            vec![n_exp, inter, h],
            inter * h,
            vec![(2, 0, strided(h, inter, 1, h))],
            None,
        ),
        GptOssPart::GateUpBias => (
            vec![n_exp, 2 * inter],
            2 * inter,
            vec![(3, 0, strided(1, inter, 0, 2)), (4, 1, strided(1, inter, 0, 2))],
            None,
        ),
        GptOssPart::DownBias => (vec![n_exp, h], h, vec![(5, 0, View::Contiguous)], None),
        GptOssPart::GateUpBlocks | GptOssPart::DownBlocks => {
            let (rows, cols) = if part == GptOssPart::GateUpBlocks {
                (2 * inter, h)
            } else {
                (h, inter)
            };
            if !cols.is_multiple_of(32) {
                return Err(bad(format!(
                    "MXFP4 rows of {cols} values are not whole blocks of 32"
                )));
            }
            let sname = format!("{}_scales", name.trim_end_matches("_blocks"));
            let Some(s) = by_name.get(sname.as_str()) else {
                return Err(bad(format!("MXFP4 blocks without their scales {sname:?}")));
            };
            let swant = vec![n_exp, rows, cols / 32];
            if s.dtype != Dtype::U8 || s.shape != swant {
                return Err(bad(format!(
                    "{sname}: expected U8 {swant:?}, found {} {:?}",
                    s.dtype, s.shape
                )));
            }
            let parts = if part == GptOssPart::GateUpBlocks {
                // Output-major [2I, H]: gate is every even row, up every odd.
                vec![
                    (0, 0, mxfp4(inter, h, 2 * h, 1)),
                    (1, h, mxfp4(inter, h, 2 * h, 1)),
                ]
            } else {
                vec![(2, 0, mxfp4(h, inter, inter, 1))]
            };
            (vec![n_exp, rows, cols / 32, 16], rows * cols, parts, Some(sname))
        }
    };
    let is_blocks = scales.is_some();
    let dtype_ok = if is_blocks {
        meta.dtype == Dtype::U8
    } else {
        is_float(meta.dtype)
    };
    if meta.shape != want || !dtype_ok {
        return Err(bad(format!(
            "expected {} {want:?}, found {} {:?}",
            if is_blocks {
                "U8"
            } else {
                "a float tensor of shape"
            },
            meta.dtype,
            meta.shape
        )));
    }
    for e in 0..n_exp {
        for &(which, offset, view) in &parts {
            let elems = match view {
                View::Contiguous => per,
                View::Strided { rows, cols, .. } | View::Mxfp4 { rows, cols, .. } => rows * cols,
            };
            let src = Source {
                tensor: name.to_string(),
                dtype: meta.dtype,
                elem_start: e * per + offset,
                elems,
                scale_inv: scales.clone(),
                view,
            };
            if out.insert((l, e, which), src).is_some() {
                return Err(bad(format!("expert {e} of layer {l} is given twice")));
            }
        }
    }
    Ok(())
}

/// Dense tensors that stay F32 whatever `--dense` says (docs/formats.md).
pub(crate) fn keeps_f32(name: &str, shape: &[usize]) -> bool {
    shape.len() != 2
        || name.contains("norm")
        || name.ends_with(".bias")
        || name.ends_with("mlp.gate.weight")
        || name.ends_with("block_sparse_moe.gate.weight")
        || name.ends_with("mlp.router.weight")
        // Qwen3-Next's one-row sigmoid gate of the shared expert: a router
        // of one output, as sensitive to rounding as the others.
        || name.ends_with("shared_expert_gate.weight")
}

/// Builds the job list: dense tensors (sorted by name), then experts
/// layer-major, expert-minor, each gate, up, down. `_scale_inv` tensors are
/// consumed by the FP8 weights they scale.
/// `inputs` must be sorted by name (dense tensors are written in that order);
/// `dir` is named in errors about missing tensors.
/// The source of a tensor of ggml `ty` blocks, copied byte for byte, and
/// the shape it is stored under (`U8 [rows, bytes_per_row]`).
fn block_source(meta: &InputTensor, ty: GgmlType) -> Result<(Source, Vec<usize>), String> {
    let stored = crate::st::ggml_blocks::stored_shape(ty, &meta.shape)
        .ok_or_else(|| format!("shape {:?} is not whole {ty} blocks", meta.shape))?;
    if meta.dtype != Dtype::U8 {
        return Err(format!("{ty} blocks must be U8 bytes, found {}", meta.dtype));
    }
    let source = Source {
        tensor: meta.name.clone(),
        dtype: Dtype::U8,
        elem_start: 0,
        elems: stored.iter().product(),
        scale_inv: None,
        view: View::Contiguous,
    };
    Ok((source, stored))
}

pub(crate) fn plan(inputs: &[InputTensor], dir: &Path, spec: &ModelSpec) -> Result<Vec<Job>, ConvertError> {
    let (layers, n_exp) = (spec.expert_layers.len(), spec.n_experts);
    let (h, inter) = (spec.hidden, spec.inter);
    let by_name: BTreeMap<&str, &InputTensor> = inputs.iter().map(|t| (t.name.as_str(), t)).collect();
    let shapes = [[inter, h], [inter, h], [h, inter]];
    let mut jobs = Vec::new();
    // (layer, expert, which) -> source
    let mut expert_src: BTreeMap<(usize, usize, usize), Source> = BTreeMap::new();
    // Stored shapes of the experts kept as ggml blocks, by name.
    let mut block_shapes: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for meta in inputs {
        let name = meta.name.as_str();
        let bad = |reason: String| ConvertError::Input {
            path: meta.path.clone(),
            tensor: name.to_string(),
            reason,
        };
        if spec.fused == FusedLayout::GptOss
            && let Some((l, part)) = gpt_oss_fused(name)
        {
            gpt_oss_sources(spec, &by_name, meta, l, part, &mut expert_src)?;
            continue;
        }
        if let Some(ty) = meta.block {
            if let Some(l) = layer_of(name)
                && l >= layers
            {
                return Err(bad(format!(
                    "layer {l} is beyond the {layers} layers the config declares"
                )));
            }
            let (source, stored) = block_source(meta, ty).map_err(bad)?;
            if let Some((l, e, which)) = spec.naming.parse(name) {
                if !spec.expert_layers[l] || e >= n_exp || meta.shape != shapes[which] {
                    return Err(bad(format!(
                        "expected routed expert {e} of layer {l} ({n_exp} per layer) of shape {:?}, found {ty} {:?}",
                        shapes[which], meta.shape
                    )));
                }
                if expert_src.insert((l, e, which), source).is_some() {
                    return Err(bad(format!("expert {e} is given twice")));
                }
                block_shapes.insert(name.to_string(), stored);
            } else {
                jobs.push(Job {
                    name: name.to_string(),
                    source,
                    shape: stored,
                    kind: Kind::Raw,
                    align: false,
                    expert: false,
                });
            }
            continue;
        }
        if name.ends_with(SCALE_SUFFIX) || matches!(meta.dtype, Dtype::U8 | Dtype::I8) {
            return Err(bad(
                "the input is already quantized; convert needs a full-precision or FP8 checkpoint".into(),
            ));
        }
        if let Some(weight) = name.strip_suffix(SCALE_INV_SUFFIX) {
            // Consumed by its weight; an orphan would be silently lost.
            if !matches!(by_name.get(weight), Some(m) if m.dtype == Dtype::F8_E4M3) {
                return Err(bad(format!("block scales without an F8_E4M3 tensor {weight:?}")));
            }
            continue;
        }
        if matches!(meta.dtype, Dtype::F8_E5M2 | Dtype::F8_E8M0) {
            return Err(bad(format!(
                "{} weights are not supported (F8_E4M3 with 128x128 block scales is)",
                meta.dtype
            )));
        }
        if let Some(l) = layer_of(name)
            && l >= layers
        {
            return Err(bad(format!(
                "layer {l} is beyond the {layers} layers the config declares"
            )));
        }
        let scale_inv = fp8_scales(&by_name, meta)?;
        let elems: usize = meta.shape.iter().product();
        if let Some((l, e, which)) = spec.naming.parse(name) {
            if !spec.expert_layers[l] || e >= n_exp {
                return Err(bad(format!(
                    "no such routed expert (layer {l} {} routed experts, the model has {n_exp} per layer)",
                    if spec.expert_layers[l] { "has" } else { "has no" }
                )));
            }
            if meta.shape != shapes[which] || !is_readable(meta.dtype) {
                return Err(bad(format!(
                    "expected a float tensor of shape {:?}, found {} {:?}",
                    shapes[which], meta.dtype, meta.shape
                )));
            }
            let src = Source {
                tensor: name.to_string(),
                dtype: meta.dtype,
                elem_start: 0,
                elems,
                scale_inv,
                view: View::Contiguous,
            };
            if expert_src.insert((l, e, which), src).is_some() {
                return Err(bad(format!("expert {e} is given both fused and per-expert")));
            }
        } else if let Some((l, e, which)) = spec.naming.parse_bias(name).filter(|_| spec.expert_bias) {
            // A per-expert bias, as a gpt-oss container (or `coli synth`)
            // writes it: which 3, 4, 5 for gate, up, down.
            if !spec.expert_layers[l] || e >= n_exp {
                return Err(bad(format!(
                    "no such routed expert (layer {l} {} routed experts, the model has {n_exp} per layer)",
                    if spec.expert_layers[l] { "has" } else { "has no" }
                )));
            }
            let want = if which == 2 { h } else { inter };
            if meta.shape != [want] || !is_float(meta.dtype) {
                return Err(bad(format!(
                    "expected a float expert bias of shape [{want}], found {} {:?}",
                    meta.dtype, meta.shape
                )));
            }
            let src = Source {
                tensor: name.to_string(),
                dtype: meta.dtype,
                elem_start: 0,
                elems,
                scale_inv: None,
                view: View::Contiguous,
            };
            if expert_src.insert((l, e, 3 + which), src).is_some() {
                return Err(bad(format!("expert {e} is given both fused and per-expert")));
            }
        } else if let Some((l, is_down)) = split_fused(name).filter(|_| spec.fused == FusedLayout::Stacked) {
            let want = if is_down {
                vec![n_exp, h, inter]
            } else {
                vec![n_exp, 2 * inter, h]
            };
            if !spec.expert_layers[l] || meta.shape != want || !is_float(meta.dtype) {
                return Err(bad(format!(
                    "expected a float fused expert tensor of shape {want:?} in a layer with experts, found {} {:?}",
                    meta.dtype, meta.shape
                )));
            }
            let per = inter * h;
            for e in 0..n_exp {
                let parts: &[usize] = if is_down { &[2] } else { &[0, 1] };
                for (k, &which) in parts.iter().enumerate() {
                    let base = if is_down { e * per } else { e * 2 * per + k * per };
                    let src = Source {
                        tensor: name.to_string(),
                        dtype: meta.dtype,
                        elem_start: base,
                        elems: per,
                        scale_inv: None,
                        view: View::Contiguous,
                    };
                    if expert_src.insert((l, e, which), src).is_some() {
                        return Err(bad(format!("expert {e} is given both fused and per-expert")));
                    }
                }
            }
        } else {
            let format = (spec.dense_format)(name, &meta.shape);
            let kind = if !is_readable(meta.dtype) {
                Kind::Raw
            } else if format == QFormat::F32 || meta.shape.len() != 2 {
                if meta.dtype == Dtype::F32 {
                    Kind::Raw
                } else {
                    Kind::F32
                }
            } else {
                Kind::Quant(format)
            };
            jobs.push(Job {
                name: name.to_string(),
                source: Source {
                    tensor: name.to_string(),
                    dtype: meta.dtype,
                    elem_start: 0,
                    elems,
                    scale_inv,
                    view: View::Contiguous,
                },
                shape: meta.shape.clone(),
                kind,
                align: false,
                expert: false,
            });
        }
    }
    let bias_shapes = [[inter], [inter], [h]];
    for l in (0..layers).filter(|&l| spec.expert_layers[l]) {
        if l >= spec.optional_layers_from && !expert_src.keys().any(|k| k.0 == l) {
            continue;
        }
        for e in 0..n_exp {
            for (which, shape) in shapes.iter().enumerate() {
                let name = spec.naming.tensor(l, e, which);
                let source = expert_src
                    .remove(&(l, e, which))
                    .ok_or_else(|| ConvertError::Input {
                        path: dir.to_path_buf(),
                        tensor: name.clone(),
                        reason: "missing from the input checkpoint".into(),
                    })?;
                let stored = block_shapes.remove(&name);
                let kind = match spec.expert_format[l] {
                    _ if stored.is_some() => Kind::Raw,
                    QFormat::F32 if source.dtype == Dtype::F32 && source.view == View::Contiguous => {
                        Kind::Raw
                    }
                    QFormat::F32 => Kind::F32,
                    f => Kind::Quant(f),
                };
                jobs.push(Job {
                    name,
                    source,
                    shape: stored.unwrap_or_else(|| shape.to_vec()),
                    kind,
                    align: which == 0,
                    expert: true,
                });
            }
            if !spec.expert_bias {
                continue;
            }
            for (which, shape) in bias_shapes.iter().enumerate() {
                let name = spec.naming.bias(l, e, which);
                let source = expert_src
                    .remove(&(l, e, 3 + which))
                    .ok_or_else(|| ConvertError::Input {
                        path: dir.to_path_buf(),
                        tensor: name.clone(),
                        reason: "missing from the input checkpoint".into(),
                    })?;
                let kind = if source.dtype == Dtype::F32 && source.view == View::Contiguous {
                    Kind::Raw
                } else {
                    Kind::F32
                };
                jobs.push(Job {
                    name,
                    source,
                    shape: shape.to_vec(),
                    kind,
                    align: false,
                    expert: true,
                });
            }
        }
    }
    for job in &jobs {
        if let Kind::Quant(QFormat::Int4Grouped { group }) = job.kind {
            let cols = job.shape[1];
            if cols > group && !cols.is_multiple_of(group) {
                return Err(ConvertError::Input {
                    path: dir.to_path_buf(),
                    tensor: job.name.clone(),
                    reason: format!(
                        "{cols} columns are not a multiple of the group size {group}; a reader could not \
                         recover the group size from the scale count"
                    ),
                });
            }
        }
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_expert_names() {
        let mlp = ExpertNaming::MLP;
        assert_eq!(
            mlp.parse("model.layers.3.mlp.experts.17.down_proj.weight"),
            Some((3, 17, 2))
        );
        assert_eq!(
            mlp.parse("model.layers.3.mlp.experts.17.down_proj.weight.qs"),
            None
        );
        assert_eq!(mlp.parse("model.layers.3.mlp.gate.weight"), None);
        assert!(keeps_f32("model.layers.0.block_sparse_moe.gate.weight", &[8, 32]));
        assert_eq!(
            split_fused("model.layers.0.mlp.experts.gate_up_proj"),
            Some((0, false))
        );
        assert!(keeps_f32("model.layers.0.mlp.gate.weight", &[64, 32]));
        assert!(keeps_f32("model.layers.0.self_attn.q_norm.weight", &[32]));
        assert!(!keeps_f32("model.layers.0.self_attn.q_proj.weight", &[32, 32]));
        assert_eq!(layer_of("model.layers.12.mlp.gate.weight"), Some(12));
        assert_eq!(layer_of("model.norm.weight"), None);
    }
}

#[cfg(test)]
mod expert_bias_tests {
    use super::*;
    fn gpt_oss_spec() -> ModelSpec {
        let cfg = crate::model::moe_decoder::gpt_oss::from_json(
            Path::new("c.json"),
            serde_json::json!({
                "model_type": "gpt_oss", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 8, "num_local_experts": 2, "num_experts_per_tok": 1,
                "max_position_embeddings": 256, "rope_scaling": null
            }),
        )
        .unwrap();
        crate::model::family::FamilyConfig::convert_spec(
            &cfg,
            Path::new("c.json"),
            QFormat::Int8,
            QFormat::Int8,
        )
        .unwrap()
    }

    fn input(name: String, shape: Vec<usize>) -> InputTensor {
        InputTensor {
            block: None,
            name,
            dtype: Dtype::F32,
            shape,
            path: PathBuf::from("x"),
        }
    }

    /// Every expert of a per-expert gpt-oss checkpoint (a container, or
    /// `coli synth`'s inputs): matrices and biases, sorted by name.
    fn per_expert_inputs(spec: &ModelSpec) -> Vec<InputTensor> {
        let (h, i) = (spec.hidden, spec.inter);
        let mut out = vec![input("model.norm.weight".into(), vec![h])];
        for l in 0..2 {
            for e in 0..spec.n_experts {
                for (which, shape) in [[i, h], [i, h], [h, i]].into_iter().enumerate() {
                    out.push(input(spec.naming.tensor(l, e, which), shape.to_vec()));
                    let len = if which == 2 { h } else { i };
                    out.push(input(spec.naming.bias(l, e, which), vec![len]));
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    #[test]
    fn per_expert_biases_are_expert_sources() {
        let spec = gpt_oss_spec();
        assert!(spec.expert_bias);
        let naming = spec.naming;
        assert_eq!(
            naming.parse_bias("model.layers.1.mlp.experts.3.up_proj.bias"),
            Some((1, 3, 1))
        );
        assert_eq!(
            naming.parse_bias("model.layers.1.mlp.experts.3.up_proj.weight"),
            None
        );
        assert_eq!(naming.parse("model.layers.1.mlp.experts.3.up_proj.bias"), None);

        let inputs = per_expert_inputs(&spec);
        let jobs = plan(&inputs, Path::new("x"), &spec).unwrap();
        assert_eq!(jobs.len(), 1 + 2 * 2 * 6, "the norm, then six tensors per expert");
        assert!(!jobs[0].expert);
        // Each expert: gate, up, down (quantized, the gate aligned), then
        // their biases (kept f32, copied), in the converter's order.
        for (k, job) in jobs[1..].iter().enumerate() {
            let (le, which) = (k / 6, k % 6);
            let (l, e) = (le / 2, le % 2);
            assert!(job.expert);
            assert_eq!(job.align, which == 0, "{}", job.name);
            if which < 3 {
                assert_eq!(job.name, naming.tensor(l, e, which));
                assert_eq!(job.kind, Kind::Quant(QFormat::Int8));
            } else {
                assert_eq!(job.name, naming.bias(l, e, which - 3));
                assert_eq!(job.source.tensor, job.name, "read from the per-expert bias");
                assert_eq!(job.kind, Kind::Raw);
                assert_eq!(job.shape, vec![if which == 5 { 32 } else { 16 }]);
            }
        }

        // A missing bias, a bias of the wrong size, and a bias of an
        // expert that does not exist are refused by name.
        let missing: Vec<_> = inputs
            .iter()
            .filter(|t| t.name != naming.bias(1, 1, 2))
            .cloned()
            .collect();
        let err = plan(&missing, Path::new("x"), &spec).unwrap_err().to_string();
        assert!(
            err.contains(&naming.bias(1, 1, 2)) && err.contains("missing"),
            "{err}"
        );
        let mut wrong = inputs.clone();
        let at = wrong.iter().position(|t| t.name == naming.bias(0, 1, 0)).unwrap();
        wrong[at].shape = vec![32];
        let err = plan(&wrong, Path::new("x"), &spec).unwrap_err().to_string();
        assert!(err.contains("expert bias of shape [16]"), "{err}");
        let mut extra = inputs;
        extra.push(input(naming.bias(0, 2, 2), vec![32]));
        extra.sort_by(|a, b| a.name.cmp(&b.name));
        let err = plan(&extra, Path::new("x"), &spec).unwrap_err().to_string();
        assert!(err.contains("no such routed expert"), "{err}");

        // Without expert biases (every other family) a per-expert `.bias`
        // stays an ordinary tensor, as before.
        let mut plain = gpt_oss_spec();
        plain.expert_bias = false;
        let weights: Vec<_> = per_expert_inputs(&plain)
            .into_iter()
            .filter(|t| !t.name.ends_with(".bias") || t.name == naming.bias(0, 0, 0))
            .collect();
        let jobs = plan(&weights, Path::new("x"), &plain).unwrap();
        assert_eq!(jobs.len(), 2 + 2 * 2 * 3);
        let bias = jobs.iter().find(|j| j.name == naming.bias(0, 0, 0)).unwrap();
        assert!(!bias.expert);
    }
}

#[cfg(test)]
mod next_token_layer_tests {
    use super::*;

    /// GLM-4.x with two main layers (the first dense) and one next-token layer.
    fn glm4_spec() -> ModelSpec {
        let cfg = crate::model::moe_decoder::glm4_moe::from_json(
            Path::new("c.json"),
            serde_json::json!({
                "model_type": "glm4_moe", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 24,
                "moe_intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 8, "n_routed_experts": 2, "num_experts_per_tok": 1,
                "first_k_dense_replace": 1, "num_nextn_predict_layers": 1
            }),
        )
        .unwrap();
        crate::model::family::FamilyConfig::convert_spec(
            &cfg,
            Path::new("c.json"),
            QFormat::Int8,
            QFormat::Int8,
        )
        .unwrap()
    }

    fn experts_of(spec: &ModelSpec, l: usize) -> Vec<InputTensor> {
        let (h, i) = (spec.hidden, spec.inter);
        (0..spec.n_experts)
            .flat_map(|e| {
                [[i, h], [i, h], [h, i]]
                    .into_iter()
                    .enumerate()
                    .map(move |(which, shape)| (e, which, shape))
            })
            .map(|(e, which, shape)| InputTensor {
                block: None,
                name: spec.naming.tensor(l, e, which),
                dtype: Dtype::F32,
                shape: shape.to_vec(),
                path: PathBuf::from("x"),
            })
            .collect()
    }

    #[test]
    fn a_next_token_layer_saved_without_weights_is_left_out_and_one_in_part_is_refused() {
        let spec = glm4_spec();
        assert_eq!(spec.expert_layers, vec![false, true, true]);
        let main = experts_of(&spec, 1);
        let jobs = plan(&main, Path::new("x"), &spec).unwrap();
        assert_eq!(jobs.len(), main.len());
        assert!(jobs.iter().all(|j| layer_of(&j.name) == Some(1)));

        let mut with_mtp = main.clone();
        with_mtp.extend(experts_of(&spec, 2));
        assert_eq!(
            plan(&with_mtp, Path::new("x"), &spec).unwrap().len(),
            2 * main.len()
        );

        let mut part = main;
        part.push(experts_of(&spec, 2).remove(0));
        let err = plan(&part, Path::new("x"), &spec).unwrap_err().to_string();
        assert!(
            err.contains("model.layers.2.") && err.contains("missing"),
            "{err}"
        );
    }

    #[test]
    fn a_main_layer_without_experts_is_still_refused() {
        let spec = glm4_spec();
        let err = plan(&experts_of(&spec, 2), Path::new("x"), &spec)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("model.layers.1.") && err.contains("missing"),
            "{err}"
        );
    }
}
