//! The Llama-style MoE decoders' shape of a synthetic model (Qwen3-MoE,
//! Mixtral, GLM-4.x MoE and gpt-oss): grouped-query attention with an
//! explicit head size, SwiGLU experts behind a top-k router, under each
//! family's own tensor names (the engine's [`ExpertNaming`]).

use crate::model::expert::ExpertNaming;

/// The attention sizes of a Llama-style decoder [`super::SynthSpec`] that
/// OLMoE's fields do not give (the shared ones, hidden size, query heads,
/// experts, top-k, expert intermediate size and vocabulary, stay in the
/// spec itself).
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderShape {
    /// Key/value heads (grouped-query attention: they divide the query heads).
    pub kv_heads: usize,
    /// Size of one attention head, independent of hidden / heads.
    pub head_dim: usize,
}

/// `(hidden, query heads, routed experts, expert intermediate size)`.
type Dims = (usize, usize, usize, usize);

/// A tensor's name and shape.
type Tensor = (String, Vec<usize>);

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
    ) -> Vec<Tensor> {
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
    fn qk_norms(&self, l: usize) -> [Tensor; 2] {
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
    /// and Mixtral).
    pub(crate) fn layer_tensors(
        &self,
        l: usize,
        dims: Dims,
        qk_norm: bool,
        naming: ExpertNaming,
    ) -> Vec<Tensor> {
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

    /// Per-layer tensors of gpt-oss decoder layer `l` as a per-expert
    /// checkpoint (a container) names them (unsorted): biases on every
    /// attention projection, one sink per head, a biased router
    /// `mlp.router`, and each expert's gate/up/down matrices with their
    /// biases `mlp.experts.E.{gate,up,down}_proj.bias`.
    pub(crate) fn gpt_oss_layer_tensors(&self, l: usize, dims: Dims) -> Vec<Tensor> {
        let (h, heads, experts, inter) = dims;
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let naming = ExpertNaming::MLP;
        let mut out = self.attention(l, h, heads, true, true);
        out.push((n("self_attn.sinks"), vec![heads]));
        out.push((n("mlp.router.weight"), vec![experts, h]));
        out.push((n("mlp.router.bias"), vec![experts]));
        for e in 0..experts {
            for (which, (shape, bias)) in [
                (vec![inter, h], inter),
                (vec![inter, h], inter),
                (vec![h, inter], h),
            ]
            .into_iter()
            .enumerate()
            {
                out.push((naming.tensor(l, e, which), shape));
                out.push((naming.bias(l, e, which), vec![bias]));
            }
        }
        out
    }
}

/// The sizes of a GLM-4.x MoE (`glm4_moe`) [`super::SynthSpec`] beyond the
/// spec's own (whose `intermediate` is the routed experts'
/// `moe_intermediate_size`).
#[derive(Clone, Debug, PartialEq)]
pub struct Glm4Shape {
    pub attn: DecoderShape,
    /// The dense leading layers' MLP size (`intermediate_size`).
    pub dense_intermediate: usize,
    /// Leading dense layers (`first_k_dense_replace`).
    pub first_dense: usize,
    /// Shared experts, one SwiGLU of `intermediate × n_shared_experts` rows.
    pub n_shared_experts: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f64,
    /// Share of each head that is rotated.
    pub partial_rotary_factor: f64,
    /// Per-head q/k norms (`use_qk_norm`).
    pub qk_norm: bool,
}

impl Glm4Shape {
    /// Per-layer tensors of GLM-4.x decoder layer `l` as a Hugging Face
    /// checkpoint names them (unsorted): q/k/v biases, then a dense MLP
    /// for the leading layers, else the sigmoid router with its correction
    /// bias, the shared expert and the routed ones.
    pub(crate) fn layer_tensors(&self, l: usize, dims: Dims) -> Vec<Tensor> {
        let (h, heads, experts, inter) = dims;
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let mut out = self.attn.attention(l, h, heads, true, false);
        if self.qk_norm {
            out.extend(self.attn.qk_norms(l));
        }
        let mlp = |prefix: &str, i: usize| {
            [
                (n(&format!("{prefix}.gate_proj.weight")), vec![i, h]),
                (n(&format!("{prefix}.up_proj.weight")), vec![i, h]),
                (n(&format!("{prefix}.down_proj.weight")), vec![h, i]),
            ]
        };
        if l < self.first_dense {
            out.extend(mlp("mlp", self.dense_intermediate));
        } else {
            out.push((n("mlp.gate.weight"), vec![experts, h]));
            out.push((n("mlp.gate.e_score_correction_bias"), vec![experts]));
            out.extend(mlp("mlp.shared_experts", inter * self.n_shared_experts));
            for e in 0..experts {
                out.extend(mlp(&format!("mlp.experts.{e}"), inter));
            }
        }
        out
    }
}
