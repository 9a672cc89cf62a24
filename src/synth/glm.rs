//! The multi-head latent attention (MLA) shape of a synthetic model, which
//! GLM-5 (`glm_moe_dsa`), DeepSeek-V3.2 and GLM-4.7-Flash share: MLA
//! attention (with the DSA indexer where the family has one), dense leading
//! layers, then sparse layers of routed experts plus shared ones behind a
//! sigmoid router. Each family's [`super::SynthFamily`] (in its folder)
//! adds its `model_type`, layer pattern and indexer keys.
//!
//! Only what the loaders read is generated (no MTP layer): the point is a
//! container whose expert reads are exactly the real model's size, so a
//! benchmark on it meets the real disk traffic, with as many layers as the
//! disk holds.

use super::SynthTensor;

/// The MLA families' hyper-parameters of a [`super::SynthSpec`] (the shared
/// ones, hidden size, heads, experts, top-k, expert intermediate size and
/// vocabulary, stay in the spec itself).
#[derive(Clone, Debug, PartialEq)]
pub struct GlmShape {
    /// Intermediate size of the dense leading layers' MLP.
    pub dense_intermediate: usize,
    /// Leading layers with a dense MLP (`first_k_dense_replace`).
    pub first_dense: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub n_shared_experts: usize,
    pub routed_scaling_factor: f64,
}

impl GlmShape {
    /// A few MB, every code path of the real shape kept (grouped routing
    /// included, so group-limited selection is exercised too).
    pub fn tiny() -> Self {
        Self {
            dense_intermediate: 96,
            first_dense: 1,
            q_lora_rank: 32,
            kv_lora_rank: 24,
            qk_nope_head_dim: 16,
            qk_rope_head_dim: 8,
            v_head_dim: 12,
            index_n_heads: 4,
            index_head_dim: 16,
            index_topk: 6,
            n_group: 2,
            topk_group: 1,
            n_shared_experts: 1,
            routed_scaling_factor: 2.5,
        }
    }

    /// The config.json keys every MLA family (GLM-5, DeepSeek-V3.2,
    /// GLM-4.7-Flash) writes alike, in DeepSeek-V3's names; each family
    /// adds its `model_type`, its layer pattern and its indexer's keys.
    pub(crate) fn mla_config_json(&self, s: &super::SynthSpec) -> serde_json::Map<String, serde_json::Value> {
        let v = serde_json::json!({
            "vocab_size": s.vocab,
            "hidden_size": s.hidden,
            "intermediate_size": self.dense_intermediate,
            "moe_intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads,
            "num_key_value_heads": s.heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "qk_head_dim": self.qk_nope_head_dim + self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "n_routed_experts": s.experts,
            "n_shared_experts": self.n_shared_experts,
            "num_experts_per_tok": s.top_k,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "norm_topk_prob": true,
            "routed_scaling_factor": self.routed_scaling_factor,
            "max_position_embeddings": s.max_position_embeddings,
            "rope_parameters": { "rope_type": "default", "rope_theta": s.rope_theta },
            "rms_norm_eps": s.rms_norm_eps,
            "attention_bias": false,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "num_nextn_predict_layers": 0,
            "bos_token_id": null,
            "eos_token_id": s.eos_id(),
            "colibri_synthetic": { "seed": s.seed },
        });
        match v {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        }
    }

    /// [`Self::mla_config_json`] with a family's own keys set over it.
    pub(crate) fn mla_config_with(
        &self,
        s: &super::SynthSpec,
        own: Vec<(&str, serde_json::Value)>,
    ) -> serde_json::Value {
        let mut m = self.mla_config_json(s);
        for (k, v) in own {
            m.insert(k.to_string(), v);
        }
        serde_json::Value::Object(m)
    }

    /// `mlp_layer_types`: the leading `first_dense` layers dense.
    pub(crate) fn mlp_layer_types(&self, layers: usize) -> Vec<&'static str> {
        (0..layers)
            .map(|l| if l < self.first_dense { "dense" } else { "sparse" })
            .collect()
    }

    /// Decoder layer `l`'s tensors of an MLA model of `(hidden, heads,
    /// experts, expert intermediate)` (unsorted), with the DSA indexer's
    /// when `indexer` (GLM-5, DeepSeek-V3.2; GLM-4.7-Flash has none).
    pub(crate) fn mla_layer_tensors(
        &self,
        l: usize,
        (h, heads, experts, inter): (usize, usize, usize, usize),
        indexer: bool,
    ) -> Vec<(String, Vec<usize>)> {
        let n = |rest: &str| format!("model.layers.{l}.{rest}");
        let (q, kv, rope) = (self.q_lora_rank, self.kv_lora_rank, self.qk_rope_head_dim);
        let (ih, ihd) = (self.index_n_heads, self.index_head_dim);
        let mut out = vec![
            (n("input_layernorm.weight"), vec![h]),
            (n("post_attention_layernorm.weight"), vec![h]),
            (n("self_attn.q_a_proj.weight"), vec![q, h]),
            (n("self_attn.q_a_layernorm.weight"), vec![q]),
            (
                n("self_attn.q_b_proj.weight"),
                vec![heads * (self.qk_nope_head_dim + rope), q],
            ),
            (n("self_attn.kv_a_proj_with_mqa.weight"), vec![kv + rope, h]),
            (n("self_attn.kv_a_layernorm.weight"), vec![kv]),
            (
                n("self_attn.kv_b_proj.weight"),
                vec![heads * (self.qk_nope_head_dim + self.v_head_dim), kv],
            ),
            (n("self_attn.o_proj.weight"), vec![h, heads * self.v_head_dim]),
        ];
        if indexer {
            out.extend([
                (n("self_attn.indexer.wq_b.weight"), vec![ih * ihd, q]),
                (n("self_attn.indexer.wk.weight"), vec![ihd, h]),
                (n("self_attn.indexer.k_norm.weight"), vec![ihd]),
                (n("self_attn.indexer.k_norm.bias"), vec![ihd]),
                (n("self_attn.indexer.weights_proj.weight"), vec![ih, h]),
            ]);
        }
        out.extend(deepseek_mlp(
            l,
            (h, experts, inter),
            (self.first_dense, self.dense_intermediate),
            inter * self.n_shared_experts,
        ));
        out
    }
}

/// Layer `l`'s MLP as the DeepSeek-style families name it (GLM-4.x, GLM-5,
/// DeepSeek-V3.2, GLM-4.7-Flash; unsorted), in a model of hidden size `h`
/// with `experts` routed experts of intermediate size `inter`: in the
/// `first_dense` leading layers a dense SwiGLU of `dense_intermediate`
/// rows, after them the sigmoid router with its correction bias, a shared
/// SwiGLU of `shared` rows and the routed experts.
pub(crate) fn deepseek_mlp(
    l: usize,
    (h, experts, inter): (usize, usize, usize),
    (first_dense, dense_intermediate): (usize, usize),
    shared: usize,
) -> Vec<SynthTensor> {
    let n = |rest: &str| format!("model.layers.{l}.{rest}");
    let mlp = |prefix: &str, i: usize| {
        [
            (n(&format!("{prefix}.gate_proj.weight")), vec![i, h]),
            (n(&format!("{prefix}.up_proj.weight")), vec![i, h]),
            (n(&format!("{prefix}.down_proj.weight")), vec![h, i]),
        ]
    };
    if l < first_dense {
        return mlp("mlp", dense_intermediate).to_vec();
    }
    let mut out = vec![
        (n("mlp.gate.weight"), vec![experts, h]),
        (n("mlp.gate.e_score_correction_bias"), vec![experts]),
    ];
    out.extend(mlp("mlp.shared_experts", shared));
    for e in 0..experts {
        out.extend(mlp(&format!("mlp.experts.{e}"), inter));
    }
    out
}
