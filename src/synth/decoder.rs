//! The Llama-style MoE decoders' attention in a synthetic model (Qwen3-MoE,
//! Mixtral, GLM-4.x MoE, gpt-oss and MiniMax-M2 build their layers on it):
//! grouped-query attention with an explicit head size, and the plain
//! layer of SwiGLU experts behind a top-k router under a family's own
//! tensor names (the engine's [`ExpertNaming`]).

use super::SynthTensor;
use crate::model::expert::ExpertNaming;

/// The attention sizes of a Llama-style decoder [`super::SynthSpec`] that
/// the spec's shared fields do not give (hidden size, query heads,
/// experts, top-k, expert intermediate size and vocabulary stay in the
/// spec itself).
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderShape {
    /// Key/value heads (grouped-query attention: they divide the query heads).
    pub kv_heads: usize,
    /// Size of one attention head, independent of hidden / heads.
    pub head_dim: usize,
}

/// `(hidden, query heads, routed experts, expert intermediate size)`.
pub(crate) type Dims = (usize, usize, usize, usize);

impl DecoderShape {
    /// The two layer norms and the four attention projections of layer `l`
    /// (with q/k/v biases when `qkv_bias`, and an o bias when `o_bias`).
    pub(crate) fn attention(
        &self,
        l: usize,
        h: usize,
        heads: usize,
        qkv_bias: bool,
        o_bias: bool,
    ) -> Vec<SynthTensor> {
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let (q, kv) = (heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut out = vec![
            (n("input_layernorm.weight"), vec![h]),
            (n("post_attention_layernorm.weight"), vec![h]),
            (n("self_attn.q_proj.weight"), vec![q, h]),
            (n("self_attn.k_proj.weight"), vec![kv, h]),
            (n("self_attn.v_proj.weight"), vec![kv, h]),
            (n("self_attn.o_proj.weight"), vec![h, q]),
        ];
        if qkv_bias {
            out.push((n("self_attn.q_proj.bias"), vec![q]));
            out.push((n("self_attn.k_proj.bias"), vec![kv]));
            out.push((n("self_attn.v_proj.bias"), vec![kv]));
        }
        if o_bias {
            out.push((n("self_attn.o_proj.bias"), vec![h]));
        }
        out
    }

    /// Per-head q/k norms of layer `l`.
    pub(crate) fn qk_norms(&self, l: usize) -> [SynthTensor; 2] {
        [
            (
                format!("model.layers.{l}.self_attn.q_norm.weight"),
                vec![self.head_dim],
            ),
            (
                format!("model.layers.{l}.self_attn.k_norm.weight"),
                vec![self.head_dim],
            ),
        ]
    }

    /// Per-layer tensors of decoder layer `l` as a Hugging Face checkpoint
    /// of the family names them (unsorted), for a model of hidden size `h`,
    /// `heads` query heads, `experts` routed experts of intermediate size
    /// `inter`; q/k norms (of one head's size) when `qk_norm` (Qwen3-MoE
    /// has them, Mixtral not).
    pub(crate) fn layer_tensors(
        &self,
        l: usize,
        dims: Dims,
        qk_norm: bool,
        naming: ExpertNaming,
    ) -> Vec<SynthTensor> {
        let (h, heads, experts, inter) = dims;
        let mut out = self.attention(l, h, heads, false, false);
        out.push((naming.router(l), vec![experts, h]));
        if qk_norm {
            out.extend(self.qk_norms(l));
        }
        for e in 0..experts {
            out.push((naming.tensor(l, e, 0), vec![inter, h]));
            out.push((naming.tensor(l, e, 1), vec![inter, h]));
            out.push((naming.tensor(l, e, 2), vec![h, inter]));
        }
        out
    }
}
