//! The pilot's view of GLM: predict a sparse layer's experts from the
//! residual before it, with that layer's real norm and router.

use std::sync::Arc;

use super::config::GlmConfig;
use super::moe::route;
use super::weights::{DenseWeights, Mlp};
use crate::model::ops::rms_norm;

pub struct GlmPredictor {
    pub cfg: GlmConfig,
    pub weights: Arc<DenseWeights>,
}

impl GlmPredictor {
    /// The `k` most likely experts of `layer` for `residual` (best first);
    /// empty for dense layers.
    pub fn predict(&self, layer: usize, residual: &[f32], k: usize) -> Vec<u32> {
        let Some(w) = self.weights.layers.get(layer) else {
            return Vec::new();
        };
        let Mlp::Moe(m) = &w.mlp else {
            return Vec::new();
        };
        if residual.len() != self.cfg.hidden_size {
            return Vec::new();
        }
        let mut xn = vec![0f32; residual.len()];
        rms_norm(residual, &w.post_norm, self.cfg.rms_norm_eps as f32, &mut xn);
        let mut logits = vec![0f32; self.cfg.n_routed_experts];
        m.router.matvec(&xn, &mut logits);
        route(&self.cfg, &m.bias, &logits, k)
            .experts
            .into_iter()
            .map(|e| e as u32)
            .collect()
    }
}

impl colibri_actors::Predictor for GlmPredictor {
    fn predict(&self, layer: u32, residual: &[f32], k: usize) -> Vec<u32> {
        GlmPredictor::predict(self, layer as usize, residual, k)
    }
}
