//! The pilot's view of Qwen3-Next / Qwen3.5: a sparse layer's experts
//! guessed from the residual with that layer's real norm and router.

use std::sync::Arc;

use super::config::Qwen3NextConfig;
use super::weights::Weights;
use crate::model::moe_decoder::Ffn;
use crate::model::ops::rms_norm;
use crate::model::routed::Router;

pub struct Qwen3NextPredictor {
    hidden: usize,
    eps: f32,
    num_experts: usize,
    router: Router,
    weights: Arc<Weights>,
}

impl Qwen3NextPredictor {
    pub fn new(cfg: &Qwen3NextConfig, weights: Arc<Weights>) -> Self {
        Self {
            hidden: cfg.base.hidden_size,
            eps: cfg.base.rms_norm_eps as f32,
            num_experts: cfg.base.num_experts,
            router: Router::Softmax {
                renorm: cfg.base.norm_topk_prob,
            },
            weights,
        }
    }
}

impl colibri_actors::Predictor for Qwen3NextPredictor {
    fn predict(&self, layer: u32, residual: &[f32], k: usize) -> Vec<u32> {
        let Some(w) = self.weights.layers.get(layer as usize) else {
            return Vec::new();
        };
        let Ffn::Moe { router, .. } = &w.ffn else {
            return Vec::new();
        };
        if residual.len() != self.hidden {
            return Vec::new();
        }
        let mut xn = vec![0f32; self.hidden];
        rms_norm(residual, &w.post_norm, self.eps, &mut xn);
        let mut logits = vec![0f32; self.num_experts];
        router.matvec(&xn, &mut logits);
        self.router
            .predict(&logits, &[], k.min(self.num_experts))
            .into_iter()
            .map(|e| e as u32)
            .collect()
    }
}
