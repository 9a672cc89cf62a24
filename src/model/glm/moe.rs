//! The sigmoid, group-limited router (DeepSeek-V3 / GLM-5) and the sparse
//! block: routed experts streamed through the runtime plus resident shared
//! experts, combined in a fixed order.

use colibri_actors::{ExpertSource, SourceError, Tag};

use super::weights::MoeWeights;
use crate::config::GlmConfig;
use crate::model::expert::ExpertWeights;
use crate::model::ops::top_k;
pub use crate::model::routed::Routing;
use crate::model::routed::routed_sum;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// transformers' GlmMoeDsaTopkRouter: sigmoid scores; the correction bias
/// only steers the choice; groups ranked by the sum of their two best biased
/// scores, `topk_group` groups kept; top-k experts within them; weights are
/// the unbiased scores, optionally normalised, times `routed_scaling_factor`.
/// `k` overrides `num_experts_per_tok` (the pilot asks for more).
pub fn route(cfg: &GlmConfig, bias: &[f32], logits: &[f32], k: usize) -> Routing {
    let ne = logits.len();
    let scores: Vec<f32> = logits.iter().map(|&x| sigmoid(x)).collect();
    let choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    let per = ne / cfg.n_group;
    let group_scores: Vec<f32> = choice
        .chunks(per)
        .map(|g| top_k(g, 2).iter().map(|&i| g[i]).sum())
        .collect();
    let groups = top_k(&group_scores, cfg.topk_group);
    let masked: Vec<f32> = choice
        .iter()
        .enumerate()
        .map(|(e, &c)| {
            if groups.contains(&(e / per)) {
                c
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    let experts = top_k(&masked, k.min(per * cfg.topk_group));
    let mut weights: Vec<f32> = experts.iter().map(|&e| scores[e]).collect();
    if cfg.norm_topk_prob {
        let denom = weights.iter().sum::<f32>() + 1e-20;
        for w in &mut weights {
            *w /= denom;
        }
    }
    let rsf = cfg.routed_scaling_factor as f32;
    for w in &mut weights {
        *w *= rsf;
    }
    Routing { experts, weights }
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
