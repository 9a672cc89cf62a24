//! The pilot's view of a Llama-style MoE decoder (Qwen3-MoE, Mixtral,
//! GLM-4.x, gpt-oss, OLMoE): predict a sparse layer's experts from the
//! residual after the previous layer's attention, with that layer's real
//! norm, router (and router biases).

use std::sync::Arc;

use super::config::MoeDecoderConfig;
use super::weights::{DenseWeights, Ffn};
use crate::model::attention::add_bias;
use crate::model::ops::rms_norm;
use crate::model::routed::Router;

pub struct RouterPredictor {
    pub hidden: usize,
    pub rms_norm_eps: f32,
    pub num_experts: usize,
    pub router: Router,
    pub weights: Arc<DenseWeights>,
}

impl RouterPredictor {
    /// The predictor of a decoder built from `cfg` over its resident weights.
    pub fn for_decoder(cfg: &MoeDecoderConfig, weights: Arc<DenseWeights>) -> Self {
        Self {
            hidden: cfg.hidden_size,
            rms_norm_eps: cfg.rms_norm_eps as f32,
            num_experts: cfg.num_experts,
            router: super::forward::router_of(cfg),
            weights,
        }
    }

    /// The `k` most likely experts of `layer` for `residual` (best first);
    /// empty for dense layers.
    pub fn predict(&self, layer: usize, residual: &[f32], k: usize) -> Vec<u32> {
        let Some(w) = self.weights.layers.get(layer) else {
            return Vec::new();
        };
        let Ffn::Moe {
            router,
            router_bias,
            correction,
            ..
        } = &w.ffn
        else {
            return Vec::new();
        };
        if residual.len() != self.hidden {
            return Vec::new();
        }
        let mut xn = vec![0f32; residual.len()];
        rms_norm(residual, &w.post_norm, self.rms_norm_eps, &mut xn);
        let mut logits = vec![0f32; self.num_experts];
        router.matvec(&xn, &mut logits);
        add_bias(&mut logits, router_bias);
        self.router
            .predict(&logits, correction, k.min(self.num_experts))
            .into_iter()
            .map(|e| e as u32)
            .collect()
    }
}

impl colibri_actors::Predictor for RouterPredictor {
    fn predict(&self, layer: u32, residual: &[f32], k: usize) -> Vec<u32> {
        RouterPredictor::predict(self, layer as usize, residual, k)
    }
}
