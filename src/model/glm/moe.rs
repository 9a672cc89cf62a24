//! The sigmoid, group-limited router (DeepSeek-V3 / GLM-5) and the sparse
//! block: routed experts streamed through the runtime plus resident shared
//! experts, combined in a fixed order.

use colibri_actors::{ExpertSource, SourceError, Tag};

use super::config::GlmConfig;
use super::weights::MoeWeights;
use crate::model::expert::ExpertWeights;
pub use crate::model::routed::Routing;
use crate::model::routed::{GroupLimited, routed_sum};

/// transformers' GlmMoeDsaTopkRouter, the shared [`GroupLimited`] router
/// with the config's groups and scaling (dropped groups never compete).
/// `k` overrides `num_experts_per_tok` (the pilot asks for more).
pub fn route(cfg: &GlmConfig, bias: &[f32], logits: &[f32], k: usize) -> Routing {
    GroupLimited {
        n_group: cfg.n_group,
        topk_group: cfg.topk_group,
        renorm: cfg.norm_topk_prob,
        scale: cfg.routed_scaling_factor as f32,
        dropped: f32::NEG_INFINITY,
    }
    .route(bias, logits, k)
}

/// Adds the MoE output for `n` tokens to the residual `x` (`xn` are the
/// post-attention-normalised inputs). Each unique expert of the batch is
/// fetched once; per token the routed outputs are summed in ascending expert
/// order whatever order they arrived in, then the shared experts' output is
/// added, as transformers does (`experts(x) + shared_experts(x)`).
pub fn moe_block(
    cfg: &GlmConfig,
    w: &MoeWeights,
    source: &dyn ExpertSource<ExpertWeights>,
    tag: Tag,
    xn: &[f32],
    n: usize,
    x: &mut [f32],
) -> Result<Vec<Routing>, SourceError> {
    let hidden = cfg.hidden_size;
    let ne = cfg.n_routed_experts;
    let mut logits = vec![0f32; n * ne];
    w.router.matmul(xn, n, &mut logits);
    let routes: Vec<Routing> = (0..n)
        .map(|t| {
            route(
                cfg,
                &w.bias,
                &logits[t * ne..(t + 1) * ne],
                cfg.num_experts_per_tok,
            )
        })
        .collect();

    let mut acc = routed_sum(source, tag, &routes, ne, xn, hidden)?;
    if let Some(shared) = &w.shared {
        let mut s = vec![0f32; n * hidden];
        shared.forward(xn, n, &mut s);
        for (a, b) in acc.iter_mut().zip(&s) {
            *a += b;
        }
    }
    for (xv, a) in x.iter_mut().zip(&acc) {
        *xv += a;
    }
    Ok(routes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cfg(n_group: usize, topk_group: usize, norm: bool) -> GlmConfig {
        GlmConfig::from_json(
            Path::new("c.json"),
            serde_json::json!({
                "model_type": "deepseek_v3", "vocab_size": 8, "hidden_size": 4, "intermediate_size": 4,
                "moe_intermediate_size": 2, "num_hidden_layers": 1, "num_attention_heads": 1,
                "kv_lora_rank": 2, "qk_rope_head_dim": 2, "qk_nope_head_dim": 2, "v_head_dim": 2,
                "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": n_group,
                "topk_group": topk_group, "norm_topk_prob": norm, "routed_scaling_factor": 2.0
            }),
        )
        .unwrap()
    }

    #[test]
    fn bias_steers_choice_but_not_weights() {
        let c = cfg(1, 1, false);
        let logits = [0.0, 1.0, 2.0, -1.0, 0.5, 0.0, 0.0, 0.0];
        let mut bias = [0.0f32; 8];
        bias[3] = 10.0;
        let r = route(&c, &bias, &logits, 2);
        assert_eq!(r.experts, vec![3, 2]);
        let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
        assert!((r.weights[0] - 2.0 * sigmoid(-1.0)).abs() < 1e-6);
        assert!((r.weights[1] - 2.0 * sigmoid(2.0)).abs() < 1e-6);
    }

    #[test]
    fn groups_limit_the_choice_and_weights_normalise() {
        // groups {0..4} and {4..8}: group 1 has the two best pair sums.
        let c = cfg(2, 1, true);
        let logits = [3.0, -3.0, -3.0, -3.0, 1.0, 1.0, 0.5, -2.0];
        let r = route(&c, &[0.0; 8], &logits, 2);
        assert_eq!(r.experts, vec![4, 5]);
        let sum: f32 = r.weights.iter().sum();
        assert!((sum - 2.0).abs() < 1e-5, "{sum}");
    }
}
