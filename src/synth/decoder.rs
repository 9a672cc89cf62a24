//! The Llama-style MoE decoders' shape of a synthetic model (Qwen3-MoE and
//! Mixtral): grouped-query attention with an explicit head size, every
//! layer sparse, SwiGLU experts behind a softmax top-k router, under each
//! family's own tensor names (the engine's [`ExpertNaming`]).

use crate::model::expert::ExpertNaming;

/// The attention sizes of a Qwen3-MoE or Mixtral [`super::SynthSpec`]
/// that OLMoE's fields do not give (the shared ones, hidden size, query
/// heads, experts, top-k, expert intermediate size and vocabulary, stay in
/// the spec itself).
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderShape {
    /// Key/value heads (grouped-query attention: they divide the query heads).
    pub kv_heads: usize,
    /// Size of one attention head, independent of hidden / heads.
    pub head_dim: usize,
}

impl DecoderShape {
    /// Per-layer tensors of decoder layer `l` as a Hugging Face checkpoint
    /// of the family names them (unsorted), for a model of hidden size `h`,
    /// `heads` query heads, `experts` routed experts of intermediate size
    /// `inter`; q/k norms (of one head's size) when `qk_norm`.
    pub(crate) fn layer_tensors(
        &self,
        l: usize,
        dims: (usize, usize, usize, usize),
        qk_norm: bool,
        naming: ExpertNaming,
    ) -> Vec<(String, Vec<usize>)> {
        let (h, heads, experts, inter) = dims;
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let (q, kv) = (heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut out = vec![
            (n("input_layernorm.weight"), vec![h]),
            (n("post_attention_layernorm.weight"), vec![h]),
            (n("self_attn.q_proj.weight"), vec![q, h]),
            (n("self_attn.k_proj.weight"), vec![kv, h]),
            (n("self_attn.v_proj.weight"), vec![kv, h]),
            (n("self_attn.o_proj.weight"), vec![h, q]),
            (naming.router(l), vec![experts, h]),
        ];
        if qk_norm {
            out.push((n("self_attn.q_norm.weight"), vec![self.head_dim]));
            out.push((n("self_attn.k_norm.weight"), vec![self.head_dim]));
        }
        for e in 0..experts {
            out.push((naming.tensor(l, e, 0), vec![inter, h]));
            out.push((naming.tensor(l, e, 1), vec![inter, h]));
            out.push((naming.tensor(l, e, 2), vec![h, inter]));
        }
        out
    }
}
