//! The resident (dense) weights of a GLM-5 / DeepSeek-V3 model.

use std::sync::Arc;

use crate::model::expert::ExpertWeights;
use crate::quant::QMatrix;

/// Multi-head latent attention of one layer.
#[derive(Debug)]
pub struct MlaWeights {
    /// `q_a_proj` `[q_lora, hidden]`; `None` when the query is one full-rank
    /// `q_proj` (DeepSeek-V3 with `q_lora_rank: null`), held in `q_b`.
    pub q_a: Option<QMatrix>,
    pub q_a_norm: Vec<f32>,
    /// `q_b_proj` `[heads * (nope + rope), q_lora]` (or `q_proj`).
    pub q_b: QMatrix,
    /// `kv_a_proj_with_mqa` `[kv_lora + rope, hidden]`.
    pub kv_a: QMatrix,
    pub kv_a_norm: Vec<f32>,
    /// The latent's up-projection to per-head keys and values.
    pub kv_b: KvProj,
    /// `o_proj` `[hidden, heads * v]`.
    pub o: QMatrix,
    pub indexer: Option<IndexerWeights>,
}

/// How a layer's latent becomes per-head keys and values.
#[derive(Debug)]
pub enum KvProj {
    /// `kv_b_proj` `[heads * (nope + v), kv_lora]`: per head, `nope` K rows
    /// then `v` V rows (checkpoints, and GGUF files of older converters).
    Joint(QMatrix),
    /// llama.cpp's split form (`attn_k_b` / `attn_v_b`, newer converters):
    /// per head, `k` `[kv_lora, nope]` (the K rows transposed, so the query
    /// is folded into latent space by one product) and `v` `[v, kv_lora]`.
    /// Always computed absorbed, as llama.cpp does.
    PerHead { k: Vec<QMatrix>, v: Vec<QMatrix> },
}

impl KvProj {
    pub fn resident_bytes(&self) -> usize {
        match self {
            Self::Joint(m) => m.resident_bytes(),
            Self::PerHead { k, v } => k.iter().chain(v).map(QMatrix::resident_bytes).sum(),
        }
    }
}

/// The DSA lightning indexer of a "full" layer.
#[derive(Debug)]
pub struct IndexerWeights {
    /// `wq_b` `[index_heads * index_head_dim, q_lora]`.
    pub wq_b: QMatrix,
    /// `wk` `[index_head_dim, hidden]`.
    pub wk: QMatrix,
    /// LayerNorm (eps 1e-6) weight and bias of the indexer key.
    pub k_norm_w: Vec<f32>,
    pub k_norm_b: Vec<f32>,
    /// `weights_proj` `[index_heads, hidden]`, kept f32 (transformers keeps it f32 too).
    pub weights_proj: QMatrix,
}

/// A layer's feed-forward block.
#[derive(Debug)]
pub enum Mlp {
    Dense(ExpertWeights),
    Moe(MoeWeights),
}

/// Router and shared experts of a sparse layer (routed experts stream).
#[derive(Debug)]
pub struct MoeWeights {
    /// Router `[n_routed, hidden]`, always f32.
    pub router: QMatrix,
    pub bias: Vec<f32>,
    pub shared: Option<ExpertWeights>,
}

#[derive(Debug)]
pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    pub attn: MlaWeights,
    pub post_norm: Vec<f32>,
    pub mlp: Mlp,
}

/// The DeepSeek-V3-style next-token module (layer index `num_hidden_layers`).
#[derive(Debug)]
pub struct MtpWeights {
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    /// `eh_proj` `[hidden, 2 * hidden]` over `[enorm(embed) ; hnorm(h)]`.
    pub eh_proj: QMatrix,
    pub layer: LayerWeights,
    pub head_norm: Vec<f32>,
    /// `shared_head.head` when the checkpoint has it; else the main lm_head.
    pub head: Option<QMatrix>,
}

/// Everything that stays in memory for the whole run.
#[derive(Debug)]
pub struct DenseWeights {
    pub embed: Arc<QMatrix>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    pub lm_head: Arc<QMatrix>,
    pub mtp: Option<MtpWeights>,
}

fn mats(l: &LayerWeights) -> usize {
    let a = &l.attn;
    let mut b = a.q_b.resident_bytes()
        + a.kv_a.resident_bytes()
        + a.kv_b.resident_bytes()
        + a.o.resident_bytes()
        + a.q_a.as_ref().map_or(0, |m| m.resident_bytes())
        + (a.q_a_norm.len() + a.kv_a_norm.len() + l.input_norm.len() + l.post_norm.len()) * 4;
    if let Some(ix) = &a.indexer {
        b += ix.wq_b.resident_bytes()
            + ix.wk.resident_bytes()
            + ix.weights_proj.resident_bytes()
            + (ix.k_norm_w.len() + ix.k_norm_b.len()) * 4;
    }
    b + match &l.mlp {
        Mlp::Dense(m) => m.resident_bytes(),
        Mlp::Moe(m) => {
            m.router.resident_bytes() + m.bias.len() * 4 + m.shared.as_ref().map_or(0, |s| s.resident_bytes())
        }
    }
}

impl DenseWeights {
    /// Resident bytes one decode step reads: everything but the embedding
    /// table (a step reads one row of it), unless the head is the same
    /// matrix, which the step then reads whole.
    pub fn step_bytes(&self) -> usize {
        let embed = if Arc::ptr_eq(&self.embed, &self.lm_head) {
            0
        } else {
            self.embed.resident_bytes()
        };
        self.resident_bytes().saturating_sub(embed)
    }

    pub fn resident_bytes(&self) -> usize {
        let head = if Arc::ptr_eq(&self.embed, &self.lm_head) {
            0
        } else {
            self.lm_head.resident_bytes()
        };
        let mtp = self.mtp.as_ref().map_or(0, |m| {
            mats(&m.layer)
                + m.eh_proj.resident_bytes()
                + m.head.as_ref().map_or(0, |h| h.resident_bytes())
                + (m.enorm.len() + m.hnorm.len() + m.head_norm.len()) * 4
        });
        self.embed.resident_bytes()
            + head
            + self.layers.iter().map(mats).sum::<usize>()
            + self.final_norm.len() * 4
            + mtp
    }
}
