//! The resident (dense) weights of a Llama-style MoE decoder (Qwen3-MoE,
//! Mixtral, GLM-4.x, gpt-oss; OLMoE's layers too).

use std::sync::Arc;

use crate::model::attention::AttnWeights;
use crate::model::expert::ExpertWeights;
use crate::quant::QMatrix;

/// A layer's feed-forward block.
#[derive(Debug)]
pub enum Ffn {
    /// Routed experts (streamed); the router `[num_experts, hidden]` stays
    /// f32 (quantizing it would change the routing).
    Moe {
        router: QMatrix,
        /// Added to the router logits (gpt-oss); empty: none.
        router_bias: Vec<f32>,
        /// The sigmoid router's `e_score_correction_bias` (GLM-4.x); empty: none.
        correction: Vec<f32>,
        /// The always-on shared expert (GLM-4.x), resident.
        shared: Option<ExpertWeights>,
    },
    /// A dense SwiGLU MLP (Qwen3 `mlp_only_layers` / `decoder_sparse_step`).
    Dense(ExpertWeights),
}

/// Attention, norms and feed-forward block of one decoder layer.
#[derive(Debug)]
pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    pub attn: AttnWeights,
    pub post_norm: Vec<f32>,
    pub ffn: Ffn,
}

/// Everything that stays in memory for the whole run.
#[derive(Debug)]
pub struct DenseWeights {
    pub embed: Arc<QMatrix>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    /// The output projection; the same matrix as `embed` when tied.
    pub lm_head: Arc<QMatrix>,
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
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.attn.resident_bytes()
                    + (l.input_norm.len() + l.post_norm.len()) * 4
                    + match &l.ffn {
                        Ffn::Moe {
                            router,
                            router_bias,
                            correction,
                            shared,
                        } => {
                            router.resident_bytes()
                                + (router_bias.len() + correction.len()) * 4
                                + shared.as_ref().map_or(0, ExpertWeights::resident_bytes)
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
}
