//! The resident weights of a Qwen3-Next / Qwen3.5-MoE model, and their
//! loading: every matrix is read in the checkpoint's own layout and split
//! into the projections the forward pass uses by row selection
//! ([`QMatrix::select_rows`]), so quantized and float checkpoints load the
//! same way and no value is rounded twice.

use std::sync::Arc;

use super::config::{LayerKind, LinearShape, ProjLayout, Qwen3NextConfig};
use super::gguf::Stored;
use crate::model::ModelError;
use crate::model::attention::{AttnBias, AttnWeights};
use crate::model::expert::{ExpertWeights, load_swiglu};
use crate::model::moe_decoder::Ffn;
use crate::model::olmoe::LoadOptions;
use crate::quant::QMatrix;
use crate::st::Checkpoint;

/// A Gated DeltaNet layer's weights, split per role.
#[derive(Debug)]
pub struct LinearWeights {
    /// `[conv_dim, hidden]`: q (all key heads), then k, then v (all value
    /// heads): the convolution's channel order.
    pub qkv: QMatrix,
    /// The output gate `[value_heads * value_dim, hidden]`.
    pub z: QMatrix,
    /// Write strength (before the sigmoid) and decay input, `[value_heads, hidden]` each.
    pub b: QMatrix,
    pub a: QMatrix,
    /// The depthwise causal convolution `[conv_dim, kernel]`.
    pub conv: Vec<f32>,
    /// `-exp(A_log)` per value head: the decay rate.
    pub neg_a: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// The gated RMSNorm's weight `[value_dim]`.
    pub norm: Vec<f32>,
    pub out: QMatrix,
    /// Value head `j` reads key head `j % key_heads` (llama.cpp's Qwen3.5
    /// order) rather than `j / (value_heads / key_heads)`.
    pub tiled_heads: bool,
}

impl LinearWeights {
    fn resident_bytes(&self) -> usize {
        [&self.qkv, &self.z, &self.b, &self.a, &self.out]
            .iter()
            .map(|m| m.resident_bytes())
            .sum::<usize>()
            + (self.conv.len() + self.neg_a.len() + self.dt_bias.len() + self.norm.len()) * 4
    }
}

/// What a layer mixes tokens with.
#[derive(Debug)]
pub enum Mixer {
    Linear(LinearWeights),
    /// Gated attention (its `gate` set); q/k norms already `1 + w`.
    Full(AttnWeights),
}

/// One decoder layer. Norm weights are stored as `1 + w` (the checkpoint
/// holds zero-centred weights), so the shared RMSNorm applies them.
#[derive(Debug)]
pub struct Layer {
    pub input_norm: Vec<f32>,
    pub mixer: Mixer,
    pub post_norm: Vec<f32>,
    pub ffn: Ffn,
    /// The shared expert's sigmoid gate `[hidden]` (sparse layers).
    pub shared_gate: Vec<f32>,
}

#[derive(Debug)]
pub struct Weights {
    pub embed: Arc<QMatrix>,
    pub layers: Vec<Layer>,
    pub final_norm: Vec<f32>,
    pub lm_head: Arc<QMatrix>,
}

impl Weights {
    pub fn resident_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                (l.input_norm.len() + l.post_norm.len() + l.shared_gate.len()) * 4
                    + match &l.mixer {
                        Mixer::Linear(w) => w.resident_bytes(),
                        Mixer::Full(w) => w.resident_bytes(),
                    }
                    + match &l.ffn {
                        Ffn::Moe { router, shared, .. } => {
                            router.resident_bytes() + shared.as_ref().map_or(0, ExpertWeights::resident_bytes)
                        }
                        Ffn::Dense(mlp) => mlp.resident_bytes(),
                    }
            })
            .sum();
        let head = if Arc::ptr_eq(&self.embed, &self.lm_head) {
            0
        } else {
            self.lm_head.resident_bytes()
        };
        self.embed.resident_bytes() + head + layers + self.final_norm.len() * 4
    }

    /// What one decode step reads whole: all but the embedding table,
    /// unless the head is that same matrix.
    pub fn step_bytes(&self) -> usize {
        let embed = if Arc::ptr_eq(&self.embed, &self.lm_head) {
            0
        } else {
            self.embed.resident_bytes()
        };
        self.resident_bytes().saturating_sub(embed)
    }
}

/// A zero-centred norm weight read as the `1 + w` it multiplies by
/// (llama.cpp's converter stores that sum already).
fn centred(ck: &Checkpoint, stored: Stored, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    let w = ck.f32_tensor(name, &[n])?;
    Ok(match stored {
        Stored::HuggingFace => w.into_iter().map(|w| 1.0 + w).collect(),
        Stored::LlamaCpp | Stored::LlamaCppTiled => w,
    })
}

/// The shared expert's gate `[1, hidden]`; llama.cpp reads it as a vector
/// `[hidden]`, and a GGUF may store it either way.
fn shared_gate(ck: &Checkpoint, name: &str, h: usize) -> Result<Vec<f32>, ModelError> {
    let shape: &[usize] = if ck.info(name)?.shape.len() == 1 {
        &[h]
    } else {
        &[1, h]
    };
    Ok(ck.f32_tensor(name, shape)?)
}

fn split(m: &QMatrix, rows: &[usize], name: &str) -> Result<QMatrix, ModelError> {
    m.select_rows(rows)
        .ok_or_else(|| ModelError::Weights(format!("{name}: cannot split its rows")))
}

/// Two row selections of one matrix.
type RowPair = (Vec<usize>, Vec<usize>);

/// The row order of Qwen3-Next's interleaved `in_proj_qkvz` (per key head:
/// q, k, that head's values, their gates) as (qkv rows, z rows), and of
/// `in_proj_ba` (per key head: b, a) as (b rows, a rows).
fn interleaved_rows(s: &LinearShape) -> (RowPair, RowPair) {
    let r = s.value_heads / s.key_heads;
    let group = 2 * s.key_dim + 2 * r * s.value_dim;
    let (mut q, mut k, mut v, mut z) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut b, mut a) = (Vec::new(), Vec::new());
    for g in 0..s.key_heads {
        let base = g * group;
        q.extend(base..base + s.key_dim);
        k.extend(base + s.key_dim..base + 2 * s.key_dim);
        let v0 = base + 2 * s.key_dim;
        v.extend(v0..v0 + r * s.value_dim);
        z.extend(v0 + r * s.value_dim..v0 + 2 * r * s.value_dim);
        b.extend(g * 2 * r..g * 2 * r + r);
        a.extend(g * 2 * r + r..(g + 1) * 2 * r);
    }
    q.extend(k);
    q.extend(v);
    ((q, z), (b, a))
}

fn load_linear(
    cfg: &Qwen3NextConfig,
    ck: &Checkpoint,
    opts: LoadOptions,
    l: usize,
) -> Result<LinearWeights, ModelError> {
    let s = cfg.linear;
    let h = cfg.base.hidden_size;
    let dense = opts.dense();
    let n = |rest: &str| format!("model.layers.{l}.linear_attn.{rest}");
    let conv_dim = s.conv_dim();
    let vdim = s.value_heads * s.value_dim;
    let stored = Stored::of(ck);
    let ((qkv_rows, z_rows), (b_rows, a_rows)) = interleaved_rows(&s);
    // llama.cpp's converter splits Qwen3-Next's in_proj_qkvz into Qwen3.5's
    // two matrices and keeps in_proj_ba as it is.
    let (qkv, z) = if cfg.proj == ProjLayout::Split || stored.by_llama_cpp() {
        (
            dense.load(ck, &n("in_proj_qkv.weight"), conv_dim, h)?,
            dense.load(ck, &n("in_proj_z.weight"), vdim, h)?,
        )
    } else {
        let name = n("in_proj_qkvz.weight");
        let qkvz = dense.load(ck, &name, conv_dim + vdim, h)?;
        (split(&qkvz, &qkv_rows, &name)?, split(&qkvz, &z_rows, &name)?)
    };
    let (b, a) = match cfg.proj {
        ProjLayout::Split => (
            dense.load(ck, &n("in_proj_b.weight"), s.value_heads, h)?,
            dense.load(ck, &n("in_proj_a.weight"), s.value_heads, h)?,
        ),
        ProjLayout::Interleaved => {
            let name = n("in_proj_ba.weight");
            let ba = dense.load(ck, &name, 2 * s.value_heads, h)?;
            (split(&ba, &b_rows, &name)?, split(&ba, &a_rows, &name)?)
        }
    };
    let (conv, neg_a) = match stored {
        Stored::HuggingFace => (
            ck.f32_tensor(&n("conv1d.weight"), &[conv_dim, 1, s.conv_kernel])?,
            ck.f32_tensor(&n("A_log"), &[s.value_heads])?
                .into_iter()
                .map(|x| -x.exp())
                .collect(),
        ),
        Stored::LlamaCpp | Stored::LlamaCppTiled => (
            ck.f32_tensor(&n("conv1d.weight"), &[conv_dim, s.conv_kernel])?,
            ck.f32_tensor(&n("A"), &[s.value_heads])?,
        ),
    };
    Ok(LinearWeights {
        qkv,
        z,
        b,
        a,
        conv,
        neg_a,
        dt_bias: ck.f32_tensor(&n("dt_bias"), &[s.value_heads])?,
        norm: ck.f32_tensor(&n("norm.weight"), &[s.value_dim])?,
        out: dense.load(ck, &n("out_proj.weight"), h, vdim)?,
        tiled_heads: stored.tiled_value_heads(),
    })
}

fn load_full(
    cfg: &Qwen3NextConfig,
    ck: &Checkpoint,
    opts: LoadOptions,
    l: usize,
) -> Result<AttnWeights, ModelError> {
    let c = &cfg.base;
    let (h, hd) = (c.hidden_size, c.head_dim);
    let q_dim = c.num_attention_heads * hd;
    let kv_dim = c.num_key_value_heads * hd;
    let dense = opts.dense();
    let n = |rest: &str| format!("model.layers.{l}.self_attn.{rest}");
    let stored = Stored::of(ck);
    // Per head: its query rows, then its gate rows.
    let name = n("q_proj.weight");
    let qg = dense.load(ck, &name, 2 * q_dim, h)?;
    let rows = |off: usize| -> Vec<usize> {
        (0..c.num_attention_heads)
            .flat_map(|head| head * 2 * hd + off..head * 2 * hd + off + hd)
            .collect()
    };
    Ok(AttnWeights {
        q: split(&qg, &rows(0), &name)?,
        gate: Some(split(&qg, &rows(hd), &name)?),
        k: dense.load(ck, &n("k_proj.weight"), kv_dim, h)?,
        v: dense.load(ck, &n("v_proj.weight"), kv_dim, h)?,
        o: dense.load(ck, &n("o_proj.weight"), h, q_dim)?,
        q_norm: centred(ck, stored, &n("q_norm.weight"), hd)?,
        k_norm: centred(ck, stored, &n("k_norm.weight"), hd)?,
        bias: AttnBias::default(),
        sinks: Vec::new(),
    })
}

/// Loads every resident tensor, checking names, shapes and formats.
pub fn load_weights(
    cfg: &Qwen3NextConfig,
    ck: &Checkpoint,
    opts: LoadOptions,
) -> Result<Weights, ModelError> {
    let c = &cfg.base;
    let h = c.hidden_size;
    let dense = opts.dense();
    let stored = Stored::of(ck);
    let embed = Arc::new(dense.load(ck, "model.embed_tokens.weight", c.vocab_size, h)?);
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for (l, kind) in cfg.layers.iter().enumerate() {
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let mixer = match kind {
            LayerKind::Linear => Mixer::Linear(load_linear(cfg, ck, opts, l)?),
            LayerKind::Full => Mixer::Full(load_full(cfg, ck, opts, l)?),
        };
        let (ffn, shared_gate) = if c.is_sparse(l) {
            let ne = c.num_experts;
            let name = n("mlp.gate.weight");
            let router = QMatrix::from_f32(ne, h, ck.f32_tensor(&name, &[ne, h])?)
                .map_err(|e| ModelError::Weights(format!("{name}: {e}")))?;
            let shared = load_swiglu(ck, &n("mlp.shared_expert"), h, cfg.shared_intermediate, dense)?;
            (
                Ffn::Moe {
                    router,
                    router_bias: Vec::new(),
                    correction: Vec::new(),
                    shared: Some(shared),
                },
                shared_gate(ck, &n("mlp.shared_expert_gate.weight"), h)?,
            )
        } else {
            (
                Ffn::Dense(load_swiglu(ck, &n("mlp"), h, c.intermediate_size, dense)?),
                Vec::new(),
            )
        };
        layers.push(Layer {
            input_norm: centred(ck, stored, &n("input_layernorm.weight"), h)?,
            mixer,
            post_norm: centred(ck, stored, &n("post_attention_layernorm.weight"), h)?,
            ffn,
            shared_gate,
        });
    }
    let final_norm = centred(ck, stored, "model.norm.weight", h)?;
    let lm_head = if c.tie_word_embeddings {
        embed.clone()
    } else if ck.has("lm_head.weight") {
        Arc::new(dense.load(ck, "lm_head.weight", c.vocab_size, h)?)
    } else {
        return Err(ModelError::Weights(
            "lm_head.weight is missing and tie_word_embeddings is false".into(),
        ));
    };
    Ok(Weights {
        embed,
        layers,
        final_norm,
        lm_head,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_rows_follow_the_key_head_groups() {
        // 2 key heads of 2, 4 value heads of 1 (2 per key head).
        let s = LinearShape {
            key_heads: 2,
            value_heads: 4,
            key_dim: 2,
            value_dim: 1,
            conv_kernel: 4,
        };
        let ((qkv, z), (b, a)) = interleaved_rows(&s);
        // Group g: rows g*8 .. g*8+8 = q q k k v v z z.
        assert_eq!(qkv, vec![0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13]);
        assert_eq!(z, vec![6, 7, 14, 15]);
        assert_eq!(b, vec![0, 1, 4, 5]);
        assert_eq!(a, vec![2, 3, 6, 7]);
    }
}
