//! The pilot's view of OLMoE: predict layer L's experts from the residual
//! after layer L-1's attention, with layer L's real norm and router.

use std::sync::Arc;

use super::moe::route;
use super::weights::DenseWeights;
use crate::config::OlmoeConfig;
use crate::model::ops::rms_norm;

/// Applies a layer's post-attention norm and router to a residual.
pub struct OlmoePredictor {
    pub cfg: OlmoeConfig,
    pub weights: Arc<DenseWeights>,
}

impl OlmoePredictor {
    /// The `k` most likely experts of `layer` for `residual` (best first).
    pub fn predict(&self, layer: usize, residual: &[f32], k: usize) -> Vec<u32> {
        let Some(w) = self.weights.layers.get(layer) else {
            return Vec::new();
        };
        if residual.len() != self.cfg.hidden_size {
            return Vec::new();
        }
        let mut xn = vec![0f32; residual.len()];
        rms_norm(residual, &w.post_norm, self.cfg.rms_norm_eps as f32, &mut xn);
        let mut logits = vec![0f32; self.cfg.num_experts];
        w.router.matvec(&xn, &mut logits);
        let mut cfg = self.cfg.clone();
        cfg.num_experts_per_tok = k.min(cfg.num_experts);
        route(&cfg, &logits)
            .experts
            .into_iter()
            .map(|e| e as u32)
            .collect()
    }
}

impl colibri_actors::Predictor for OlmoePredictor {
    fn predict(&self, layer: u32, residual: &[f32], k: usize) -> Vec<u32> {
        OlmoePredictor::predict(self, layer as usize, residual, k)
    }
}
