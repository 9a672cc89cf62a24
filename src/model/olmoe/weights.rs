//! The resident (dense) weights of an OLMoE model.

use std::sync::Arc;

use crate::model::attention::AttnWeights;
use crate::quant::QMatrix;

/// Attention, norms and router of one decoder layer (experts are streamed).
#[derive(Debug)]
pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    /// Projections and the full-width q/k norms.
    pub attn: AttnWeights,
    pub post_norm: Vec<f32>,
    /// Router `[num_experts, hidden]`, always f32 (routing decides which
    /// weights are read; quantizing it would change the routing).
    pub router: QMatrix,
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
    pub fn resident_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.attn.resident_bytes()
                    + l.router.resident_bytes()
                    + (l.input_norm.len() + l.post_norm.len()) * 4
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
