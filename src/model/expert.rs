//! A routed gated expert as compute sees it, and how its bytes become one.

use colibri_actors::{ExpertDecoder, ExpertExtent, ExpertKey, Piece, SharedBytes};
use safetensors::Dtype;

use crate::model::ModelError;
use crate::quant::{ByteStore, QFormat, QMatrix};
use crate::st::{self, Checkpoint, SCALE_SUFFIX, View};

/// gate / up / down projections of one expert (or dense MLP), with the
/// biases and gating function of its family.
#[derive(Debug)]
pub struct ExpertWeights {
    pub gate: QMatrix,
    pub up: QMatrix,
    pub down: QMatrix,
    pub bias: Option<ExpertBias>,
    pub act: Activation,
}

/// Biases of an expert's gate, up and down projections (gpt-oss).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertBias {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

/// How `gate x` and `up x` combine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `silu(g) * u` (Llama, Qwen, Mixtral, OLMoE, GLM, DeepSeek).
    SiluGlu,
    /// gpt-oss: `g' = min(g, limit)`, `u' = clamp(u, ±limit)`,
    /// `(u' + 1) * g' * sigmoid(alpha g')`.
    ClampedSwiglu { limit: f32, alpha: f32 },
}

impl Activation {
    /// gpt-oss's gating with its `swiglu_limit` (alpha is fixed at 1.702).
    pub fn gpt_oss(limit: f32) -> Self {
        Activation::ClampedSwiglu { limit, alpha: 1.702 }
    }

    fn apply(self, g: &mut [f32], u: &[f32]) {
        match self {
            Activation::SiluGlu => {
                for (gv, uv) in g.iter_mut().zip(u) {
                    *gv = crate::model::ops::silu(*gv) * uv;
                }
            }
            Activation::ClampedSwiglu { limit, alpha } => {
                for (gv, &uv) in g.iter_mut().zip(u) {
                    let gc = gv.min(limit);
                    let uc = uv.clamp(-limit, limit);
                    let glu = gc * (1.0 / (1.0 + (-(gc * alpha)).exp()));
                    *gv = (uc + 1.0) * glu;
                }
            }
        }
    }
}

impl ExpertWeights {
    /// A plain SwiGLU expert without biases.
    pub fn swiglu(gate: QMatrix, up: QMatrix, down: QMatrix) -> Self {
        Self {
            gate,
            up,
            down,
            bias: None,
            act: Activation::SiluGlu,
        }
    }

    /// `down(act(gate x, up x))` (biases added after each product when
    /// present) for `n` tokens (`x` is `[n, hidden]`), written to `out`
    /// (`[n, hidden]`).
    pub fn forward(&self, x: &[f32], n: usize, out: &mut [f32]) {
        let inter = self.gate.rows();
        let mut g = vec![0f32; n * inter];
        let mut u = vec![0f32; n * inter];
        self.gate.matmul(x, n, &mut g);
        self.up.matmul(x, n, &mut u);
        if let Some(b) = &self.bias {
            crate::model::attention::add_bias(&mut g, &b.gate);
            crate::model::attention::add_bias(&mut u, &b.up);
        }
        self.act.apply(&mut g, &u);
        self.down.matmul(&g, n, out);
        if let Some(b) = &self.bias {
            crate::model::attention::add_bias(out, &b.down);
        }
    }

    pub fn resident_bytes(&self) -> usize {
        let bias = self
            .bias
            .as_ref()
            .map_or(0, |b| (b.gate.len() + b.up.len() + b.down.len()) * 4);
        self.gate.resident_bytes() + self.up.resident_bytes() + self.down.resident_bytes() + bias
    }
}

/// Loads a dense SwiGLU MLP `prefix.{gate,up,down}_proj.weight` (GLM's and
/// Qwen3's dense layers, shared experts).
pub fn load_swiglu(
    ck: &Checkpoint,
    prefix: &str,
    hidden: usize,
    inter: usize,
    f: crate::model::want::MatrixWant,
) -> Result<ExpertWeights, ModelError> {
    Ok(ExpertWeights::swiglu(
        f.load(ck, &format!("{prefix}.gate_proj.weight"), inter, hidden)?,
        f.load(ck, &format!("{prefix}.up_proj.weight"), inter, hidden)?,
        f.load(ck, &format!("{prefix}.down_proj.weight"), hidden, inter)?,
    ))
}

/// Where one of an expert's matrices sits among the pieces of its extent.
#[derive(Clone, Debug, PartialEq)]
pub struct MatrixSlot {
    pub dtype: Dtype,
    /// ggml's block type for an expert kept in a GGUF's blocks.
    pub block: Option<crate::gguf::GgmlType>,
    pub rows: usize,
    pub cols: usize,
    /// Piece index and byte length of the weights.
    pub data: (usize, usize),
    /// Piece index and byte length of the `.qs` scales of a quantized matrix
    /// (of the exponent bytes, for an MXFP4 view).
    pub scales: Option<(usize, usize)>,
    /// Where the matrix's values sit in a fused piece shared with other
    /// matrices (the view and its first element); `None` when the piece
    /// holds just this matrix, row-major.
    pub view: Option<(View, usize)>,
}

/// Where one of an expert's bias vectors sits among the pieces of its extent.
#[derive(Clone, Debug, PartialEq)]
pub struct BiasSlot {
    pub dtype: Dtype,
    pub len: usize,
    /// Piece index and byte length.
    pub data: (usize, usize),
    /// As [`MatrixSlot::view`], for a bias fused with another.
    pub view: Option<(View, usize)>,
}

/// The piece layout shared by every expert of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertLayout {
    pub gate: MatrixSlot,
    pub up: MatrixSlot,
    pub down: MatrixSlot,
    /// gate, up and down biases, when the experts have them.
    pub bias: Option<[BiasSlot; 3]>,
}

/// How the experts of one layer are stored and what full-precision ones
/// become at load.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerCodec {
    pub layout: ExpertLayout,
    pub want: QFormat,
}

/// Decodes expert bytes delivered by the runtime: quantized tensors point
/// into the delivered buffer (no copy); full-precision ones are converted and
/// quantized to the requested expert format.
///
/// Layouts are per layer, not per model, because a container may store some
/// layers differently: GLM containers keep the MTP layer's experts int8 in an
/// otherwise int4 file (int4 draft heads collapse acceptance). Within a layer
/// every expert shares one layout (the loaders check it).
pub struct ExpertCodec {
    /// Indexed by layer; `None` for layers without routed experts.
    pub layers: Vec<Option<LayerCodec>>,
    /// Decoded experts multiply through int8 activations
    /// ([`QMatrix::with_int8_acts`]).
    pub int8_acts: bool,
    /// The gating function of every decoded expert.
    pub act: Activation,
}

/// Collects per-layer expert layouts while a loader walks the experts,
/// refusing an expert stored differently from the first of its layer.
#[derive(Debug, Default)]
pub struct LayoutCollector {
    layers: Vec<Option<ExpertLayout>>,
}

impl LayoutCollector {
    pub fn new(layers: usize) -> Self {
        Self {
            layers: vec![None; layers],
        }
    }

    /// Records expert `key`'s layout; `Err` names the mismatch.
    pub fn add(&mut self, key: ExpertKey, layout: ExpertLayout) -> Result<(), String> {
        let slot = self
            .layers
            .get_mut(key.layer as usize)
            .ok_or_else(|| format!("expert {key}: layer out of range"))?;
        match slot {
            None => *slot = Some(layout),
            Some(first) if *first != layout => {
                return Err(format!(
                    "expert {key} is stored differently from the first routed expert of its layer \
                     ({layout:?} vs {first:?})"
                ));
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The codec, with `want(layer)` as each layer's load-time format.
    /// `Err` when no layer has experts.
    pub fn finish(self, want: impl Fn(usize) -> QFormat) -> Result<ExpertCodec, String> {
        if self.layers.iter().all(Option::is_none) {
            return Err("the model has no routed experts".into());
        }
        let layers = self
            .layers
            .into_iter()
            .enumerate()
            .map(|(l, layout)| {
                layout.map(|layout| LayerCodec {
                    layout,
                    want: want(l),
                })
            })
            .collect();
        Ok(ExpertCodec {
            layers,
            int8_acts: false,
            act: Activation::SiluGlu,
        })
    }
}

impl ExpertCodec {
    /// The same codec, decoding experts whose products use int8
    /// activations when `on`.
    pub fn with_int8_acts(self, on: bool) -> Self {
        Self {
            int8_acts: on,
            ..self
        }
    }

    /// The same codec, gating decoded experts with `act`.
    pub fn with_activation(self, act: Activation) -> Self {
        Self { act, ..self }
    }

    fn bias(&self, slot: &BiasSlot, bytes: &SharedBytes, piece_at: &[usize]) -> Result<Vec<f32>, String> {
        let (i, len) = slot.data;
        let start = *piece_at.get(i).ok_or_else(|| format!("piece {i} missing"))?;
        let b = ByteStore::slice_of(bytes.clone(), start, len)
            .ok_or_else(|| format!("piece {i} runs past the buffer"))?;
        let v = match slot.view {
            Some((view, first)) => st::view::gather(view, slot.dtype, first, slot.len, b.as_slice(), None)?,
            None => st::decode_f32(slot.dtype, b.as_slice()).map_err(|e| e.to_string())?,
        };
        if v.len() != slot.len {
            return Err(format!("{} values, expected {}", v.len(), slot.len));
        }
        Ok(v)
    }

    fn matrix(
        &self,
        want: QFormat,
        slot: &MatrixSlot,
        bytes: &SharedBytes,
        piece_at: &[usize],
    ) -> Result<QMatrix, String> {
        let store = |(i, len): (usize, usize)| {
            let start = *piece_at.get(i).ok_or_else(|| format!("piece {i} missing"))?;
            ByteStore::slice_of(bytes.clone(), start, len)
                .ok_or_else(|| format!("piece {i} runs past the buffer"))
        };
        let data = store(slot.data)?;
        if let Some((view, first)) = slot.view {
            let scales = match slot.scales {
                Some(p) => Some(store(p)?),
                None => None,
            };
            let elems = slot.rows * slot.cols;
            if view.values().is_some_and(|n| n != elems) {
                return Err(format!(
                    "a view of {view:?} does not hold [{}, {}]",
                    slot.rows, slot.cols
                ));
            }
            let values = st::view::gather(
                view,
                slot.dtype,
                first,
                elems,
                data.as_slice(),
                scales.as_ref().map(ByteStore::as_slice),
            )?;
            return QMatrix::quantize(slot.rows, slot.cols, values, want)
                .map(|m| m.with_int8_acts(self.int8_acts))
                .map_err(|e| e.to_string());
        }
        if let Some(ty) = slot.block {
            return QMatrix::from_ggml(slot.rows, slot.cols, ty, data).map_err(|e| e.to_string());
        }
        let scales = match slot.scales {
            Some(p) => Some(st::decode_f32(Dtype::F32, store(p)?.as_slice()).map_err(|e| e.to_string())?),
            None => None,
        };
        st::matrix_from_bytes("expert", slot.dtype, slot.rows, slot.cols, data, scales, want)
            .map(|m| m.with_int8_acts(self.int8_acts))
            .map_err(|e| e.to_string())
    }
}

impl ExpertDecoder<ExpertWeights> for ExpertCodec {
    fn decode(&self, key: ExpertKey, buf: SharedBytes, piece_at: &[usize]) -> Result<ExpertWeights, String> {
        let lc = self
            .layers
            .get(key.layer as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| format!("expert {key}: its layer has no routed experts"))?;
        let (l, want) = (&lc.layout, lc.want);
        let bias = match &l.bias {
            None => None,
            Some([g, u, d]) => Some(ExpertBias {
                gate: self
                    .bias(g, &buf, piece_at)
                    .map_err(|e| format!("gate_proj bias: {e}"))?,
                up: self
                    .bias(u, &buf, piece_at)
                    .map_err(|e| format!("up_proj bias: {e}"))?,
                down: self
                    .bias(d, &buf, piece_at)
                    .map_err(|e| format!("down_proj bias: {e}"))?,
            }),
        };
        Ok(ExpertWeights {
            bias,
            act: self.act,
            gate: self
                .matrix(want, &l.gate, &buf, piece_at)
                .map_err(|e| format!("gate_proj: {e}"))?,
            up: self
                .matrix(want, &l.up, &buf, piece_at)
                .map_err(|e| format!("up_proj: {e}"))?,
            down: self
                .matrix(want, &l.down, &buf, piece_at)
                .map_err(|e| format!("down_proj: {e}"))?,
        })
    }

    fn resident_bytes(&self, value: &ExpertWeights) -> usize {
        value.resident_bytes()
    }
}

/// How a family names its routed experts' matrices in a checkpoint:
/// `model.layers.L.{block}.experts.E.{projection}.weight`, router
/// `model.layers.L.{block}.gate.weight`. A family whose checkpoints use
/// other names defines its own constant; the loaders and `coli convert`
/// read and write under whatever names it gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertNaming {
    /// The layer's MoE block (`mlp`, `block_sparse_moe`).
    pub block: &'static str,
    /// The projection names in gate, up, down order.
    pub projections: [&'static str; 3],
}

impl ExpertNaming {
    /// `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`, router
    /// `model.layers.L.mlp.gate.weight` (OLMoE, Qwen3-MoE, GLM, DeepSeek).
    pub const MLP: ExpertNaming = ExpertNaming {
        block: "mlp",
        projections: ["gate_proj", "up_proj", "down_proj"],
    };
    /// `model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight` (gate,
    /// up, down), router `model.layers.L.block_sparse_moe.gate.weight` (Mixtral).
    pub const BLOCK_SPARSE: ExpertNaming = ExpertNaming {
        block: "block_sparse_moe",
        projections: ["w1", "w3", "w2"],
    };

    /// The schemes the built-in families use, for tests that recognise
    /// expert tensors by name.
    pub const ALL: [ExpertNaming; 2] = [ExpertNaming::MLP, ExpertNaming::BLOCK_SPARSE];

    /// The tensor of `which` (0 gate, 1 up, 2 down) of expert `e` in layer `l`.
    pub fn tensor(self, l: usize, e: usize, which: usize) -> String {
        let proj = self.projections[which.min(2)];
        format!("model.layers.{l}.{}.experts.{e}.{proj}.weight", self.block)
    }

    /// The bias of `which` (0 gate, 1 up, 2 down) of expert `e` in layer `l`
    /// (gpt-oss containers).
    pub fn bias(self, l: usize, e: usize, which: usize) -> String {
        let proj = self.projections[which.min(2)];
        format!("model.layers.{l}.{}.experts.{e}.{proj}.bias", self.block)
    }

    /// The router weight of layer `l`.
    pub fn router(self, l: usize) -> String {
        format!("model.layers.{l}.{}.gate.weight", self.block)
    }

    /// `(layer, expert, which)` of an expert tensor named in this scheme.
    pub fn parse(self, name: &str) -> Option<(usize, usize, usize)> {
        self.parse_suffix(name, ".weight")
    }

    /// `(layer, expert, which)` of an expert bias named in this scheme
    /// (`….experts.E.{gate,up,down}_proj.bias`, gpt-oss containers).
    pub fn parse_bias(self, name: &str) -> Option<(usize, usize, usize)> {
        self.parse_suffix(name, ".bias")
    }

    fn parse_suffix(self, name: &str, suffix: &str) -> Option<(usize, usize, usize)> {
        let rest = name.strip_prefix("model.layers.")?;
        let (l, rest) = rest.split_once('.')?;
        let rest = rest.strip_prefix(self.block)?.strip_prefix(".experts.")?;
        let (e, rest) = rest.split_once('.')?;
        let proj = rest.strip_suffix(suffix)?;
        let which = self.projections.iter().position(|p| *p == proj)?;
        Some((l.parse().ok()?, e.parse().ok()?, which))
    }
}

/// Where one routed SwiGLU expert lives in a checkpoint (names per
/// `naming`): its gate/up/down matrices, each followed by its `.qs` scales
/// when quantized, as pieces in read order, and the matching layout.
/// Shared by every family.
pub fn checkpoint_expert(
    ck: &Checkpoint,
    key: ExpertKey,
    hidden: usize,
    inter: usize,
    naming: ExpertNaming,
) -> Result<(ExpertExtent, ExpertLayout), ModelError> {
    let mut pieces = Vec::with_capacity(6);
    let mut slot = |which: usize, rows: usize, cols: usize| -> Result<MatrixSlot, ModelError> {
        let name = naming.tensor(key.layer as usize, key.expert as usize, which);
        if !ck.has(&name)
            && let Some((dtype, piece)) = stacked_piece(ck, key, which, hidden, inter)?
        {
            let data = (pieces.len(), piece.len as usize);
            pieces.push(piece);
            return Ok(MatrixSlot {
                dtype,
                block: None,
                rows,
                cols,
                data,
                scales: None,
                view: None,
            });
        }
        let meta = ck.info(&name)?;
        let data = (pieces.len(), meta.len as usize);
        pieces.push(ck.piece(&name)?);
        let qs = format!("{name}{SCALE_SUFFIX}");
        let scales = if ck.has(&qs) {
            let m = ck.info(&qs)?;
            let s = (pieces.len(), m.len as usize);
            pieces.push(ck.piece(&qs)?);
            Some(s)
        } else {
            None
        };
        Ok(MatrixSlot {
            dtype: meta.dtype,
            block: meta.block,
            rows,
            cols,
            data,
            scales,
            view: None,
        })
    };
    let (gate, up, down) = (
        slot(0, inter, hidden)?,
        slot(1, inter, hidden)?,
        slot(2, hidden, inter)?,
    );
    let (l, e) = (key.layer as usize, key.expert as usize);
    let bias = if ck.has(&naming.bias(l, e, 0)) {
        let mut slot = |which: usize, len: usize| -> Result<BiasSlot, ModelError> {
            let name = naming.bias(l, e, which);
            let meta = ck.info(&name)?;
            if meta.shape != [len] {
                return Err(ModelError::Weights(format!(
                    "{name}: expected shape [{len}], found {:?}",
                    meta.shape
                )));
            }
            let data = (pieces.len(), meta.len as usize);
            pieces.push(ck.piece(&name)?);
            Ok(BiasSlot {
                dtype: meta.dtype,
                len,
                data,
                view: None,
            })
        };
        Some([slot(0, inter)?, slot(1, inter)?, slot(2, hidden)?])
    } else {
        None
    };
    let layout = ExpertLayout { gate, up, down, bias };
    Ok((ExpertExtent { pieces }, layout))
}

/// One projection of one expert inside the stacked tensors transformers 5
/// keeps in memory (`model.layers.L.mlp.experts.gate_up_proj [E, 2I, H]`,
/// gate rows then up rows, and `down_proj [E, H, I]`), which a checkpoint
/// written from its state dict holds as they are. Each expert's matrix is
/// one contiguous range of rows, so streaming reads just that range. `None`
/// when the layer has no such tensor.
fn stacked_piece(
    ck: &Checkpoint,
    key: ExpertKey,
    which: usize,
    hidden: usize,
    inter: usize,
) -> Result<Option<(Dtype, Piece)>, ModelError> {
    let (l, e) = (key.layer as usize, key.expert as usize);
    let name = format!(
        "model.layers.{l}.mlp.experts.{}",
        if which == 2 { "down_proj" } else { "gate_up_proj" }
    );
    if !ck.has(&name) {
        return Ok(None);
    }
    let meta = ck.info(&name)?;
    let (rows, cols) = if which == 2 {
        (hidden, inter)
    } else {
        (2 * inter, hidden)
    };
    let n_experts = meta.shape.first().copied().unwrap_or(0);
    if meta.shape != [n_experts, rows, cols] || e >= n_experts {
        return Err(ModelError::Weights(format!(
            "{name}: expected stacked experts of shape [E, {rows}, {cols}] holding expert {e}, found {:?}",
            meta.shape
        )));
    }
    let elems = (n_experts * rows * cols) as u64;
    let elem = match meta.dtype {
        Dtype::F32 => 4,
        Dtype::BF16 | Dtype::F16 => 2,
        other => {
            return Err(ModelError::Weights(format!(
                "{name}: stacked experts must be F32, BF16 or F16, found {other:?}"
            )));
        }
    };
    if meta.len != elems * elem {
        return Err(ModelError::Weights(format!(
            "{name}: {} bytes for {elems} {:?} values",
            meta.len, meta.dtype
        )));
    }
    let matrix = (inter * hidden) as u64 * elem;
    let offset = match which {
        2 => e as u64 * matrix,
        _ => e as u64 * 2 * matrix + which as u64 * matrix,
    };
    let whole = meta.piece();
    Ok(Some((
        meta.dtype,
        Piece {
            file: whole.file,
            offset: whole.offset + offset,
            len: matrix,
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names_round_trip() {
        for naming in ExpertNaming::ALL {
            for which in 0..3 {
                let name = naming.tensor(3, 17, which);
                assert_eq!(naming.parse(&name), Some((3, 17, which)), "{name}");
                let other = ExpertNaming::ALL.iter().find(|&&n| n != naming).copied();
                assert_eq!(other.and_then(|o| o.parse(&name)), None, "{name}");
            }
        }
        assert_eq!(
            ExpertNaming::BLOCK_SPARSE.parse("model.layers.1.block_sparse_moe.experts.2.w3.weight"),
            Some((1, 2, 1))
        );
        assert_eq!(ExpertNaming::MLP.parse("model.layers.1.mlp.gate.weight"), None);
    }
}
