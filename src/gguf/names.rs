//! llama.cpp's tensor names and the Hugging Face names the family loaders
//! read: the one place that knows both spellings. llama.cpp names every
//! decoder's tensors from one table (`blk.N.attn_q.weight` for
//! `model.layers.N.self_attn.q_proj.weight` in every architecture), so the
//! common part is shared; what differs between families (where the routed
//! experts and the router live) comes from the family's
//! [`ExpertNaming`], and the per-layer tensors only one family has (GLM's
//! shared experts, post-attention norm and next-token layer) from the
//! table its GGUF mapping passes.

use crate::model::expert::ExpertNaming;

/// Per-layer tensors, llama.cpp suffix → Hugging Face suffix (after
/// `blk.N.` and `model.layers.N.`).
const LAYER: &[(&str, &str)] = &[
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.bias", "self_attn.o_proj.bias"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

/// Whole-model tensors.
const GLOBAL: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// What a GGUF tensor is to the loaders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renamed {
    /// A tensor read under this Hugging Face name.
    Tensor(String),
    /// Layer `layer`'s stacked routed experts of projection `which` (0
    /// gate, 1 up, 2 down), split into one tensor per expert.
    Experts { layer: usize, which: usize },
    /// Layer `layer`'s stacked expert biases of projection `which` (gpt-oss),
    /// split into one vector per expert.
    ExpertBiases { layer: usize, which: usize },
    /// A tensor no loader reads (kept under its GGUF name).
    Unknown,
}

/// What a family's GGUF mapping tells [`rename`]: where its experts and
/// router live, and its own per-layer tensors (llama.cpp suffix after
/// `blk.N.` → Hugging Face suffix after `model.layers.N.`), which take
/// precedence over the shared table.
#[derive(Clone, Copy, Debug)]
pub struct GgufNaming {
    pub experts: ExpertNaming,
    pub layer: &'static [(&'static str, &'static str)],
}

impl GgufNaming {
    /// Only the shared names.
    pub const fn plain(experts: ExpertNaming) -> Self {
        Self { experts, layer: &[] }
    }
}

/// The role of GGUF tensor `name` in a model named as `naming` says.
pub fn rename(name: &str, naming: GgufNaming) -> Renamed {
    let experts = naming.experts;
    if let Some((_, hf)) = GLOBAL.iter().find(|(g, _)| *g == name) {
        return Renamed::Tensor((*hf).to_string());
    }
    let Some((layer, rest)) = name
        .strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(l, rest)| Some((l.parse::<usize>().ok()?, rest)))
    else {
        return Renamed::Unknown;
    };
    if let Some((_, hf)) = naming.layer.iter().chain(LAYER).find(|(g, _)| *g == rest) {
        return Renamed::Tensor(format!("model.layers.{layer}.{hf}"));
    }
    match rest {
        "ffn_gate_inp.weight" => Renamed::Tensor(experts.router(layer)),
        "ffn_gate_exps.weight" => Renamed::Experts { layer, which: 0 },
        "ffn_up_exps.weight" => Renamed::Experts { layer, which: 1 },
        "ffn_down_exps.weight" => Renamed::Experts { layer, which: 2 },
        "ffn_gate_exps.bias" => Renamed::ExpertBiases { layer, which: 0 },
        "ffn_up_exps.bias" => Renamed::ExpertBiases { layer, which: 1 },
        "ffn_down_exps.bias" => Renamed::ExpertBiases { layer, which: 2 },
        _ => Renamed::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_the_llama_cpp_names() {
        let n = |s| rename(s, GgufNaming::plain(ExpertNaming::MLP));
        assert_eq!(
            n("blk.3.attn_q.weight"),
            Renamed::Tensor("model.layers.3.self_attn.q_proj.weight".into())
        );
        assert_eq!(
            n("blk.12.ffn_gate_inp.weight"),
            Renamed::Tensor("model.layers.12.mlp.gate.weight".into())
        );
        assert_eq!(
            n("blk.0.ffn_down_exps.weight"),
            Renamed::Experts { layer: 0, which: 2 }
        );
        assert_eq!(n("output.weight"), Renamed::Tensor("lm_head.weight".into()));
        assert_eq!(
            n("blk.2.ffn_up_exps.bias"),
            Renamed::ExpertBiases { layer: 2, which: 1 }
        );
        assert_eq!(n("rope_freqs.weight"), Renamed::Unknown);
        assert_eq!(n("blk.x.attn_q.weight"), Renamed::Unknown);
        assert_eq!(
            rename(
                "blk.1.ffn_gate_inp.weight",
                GgufNaming::plain(ExpertNaming::BLOCK_SPARSE)
            ),
            Renamed::Tensor("model.layers.1.block_sparse_moe.gate.weight".into())
        );
        let own = GgufNaming {
            experts: ExpertNaming::MLP,
            layer: &[("ffn_norm.weight", "other_norm.weight")],
        };
        assert_eq!(
            rename("blk.2.ffn_norm.weight", own),
            Renamed::Tensor("model.layers.2.other_norm.weight".into()),
            "a family's own names come first"
        );
    }
}
