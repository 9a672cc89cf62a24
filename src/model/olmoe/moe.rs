//! The sparse MoE block: softmax router, top-k, experts fetched through the
//! runtime, results combined in a fixed order.

use colibri_actors::{ExpertKey, ExpertSource, SourceError, Tag};

use super::weights::LayerWeights;
use crate::config::OlmoeConfig;
use crate::model::expert::ExpertWeights;
use crate::model::ops::{softmax_inplace, top_k};

/// The experts and weights chosen for one token.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Softmax over all experts, top-k, optional renormalisation (transformers'
/// OlmoeTopKRouter).
pub fn route(cfg: &OlmoeConfig, router_logits: &[f32]) -> Routing {
    let mut probs = router_logits.to_vec();
    softmax_inplace(&mut probs);
    let experts = top_k(&probs, cfg.num_experts_per_tok);
    let mut weights: Vec<f32> = experts.iter().map(|&e| probs[e]).collect();
    if cfg.norm_topk_prob {
        let sum: f32 = weights.iter().sum();
        for w in &mut weights {
            *w /= sum;
        }
    }
    Routing { experts, weights }
}

/// Adds the MoE output for `n` tokens to the residual `x`; `xn` are the
/// post-attention-normalised inputs. Each unique expert of the batch is
/// fetched once; results are summed per token in ascending expert order
/// whatever order the experts arrived in, so placement never changes the
/// numbers.
pub fn moe_block(
    cfg: &OlmoeConfig,
    w: &LayerWeights,
    source: &dyn ExpertSource<ExpertWeights>,
    tag: Tag,
    xn: &[f32],
    n: usize,
    x: &mut [f32],
) -> Result<Vec<Routing>, SourceError> {
    let hidden = cfg.hidden_size;
    let ne = cfg.num_experts;
    let mut logits = vec![0f32; n * ne];
    w.router.matmul(xn, n, &mut logits);
    let routes: Vec<Routing> = (0..n)
        .map(|t| route(cfg, &logits[t * ne..(t + 1) * ne]))
        .collect();

    // Batch union: which tokens use each expert.
    let mut users: Vec<Vec<(usize, f32)>> = vec![Vec::new(); ne];
    for (t, r) in routes.iter().enumerate() {
        for (&e, &wt) in r.experts.iter().zip(&r.weights) {
            users[e].push((t, wt));
        }
    }
    let wanted: Vec<usize> = (0..ne).filter(|&e| !users[e].is_empty()).collect();
    let keys: Vec<ExpertKey> = wanted
        .iter()
        .map(|&e| ExpertKey::new(tag.layer, e as u32))
        .collect();

    // outputs[i] = the expert wanted[i]'s output rows for its users.
    let mut outputs: Vec<Option<Vec<f32>>> = vec![None; wanted.len()];
    source.fetch(tag, &keys, &mut |i, expert| {
        let e = wanted[i];
        let _s = tracing::trace_span!("expert_matmul", layer = tag.layer, expert = e).entered();
        let m = users[e].len();
        let mut xin = Vec::with_capacity(m * hidden);
        for &(t, _) in &users[e] {
            xin.extend_from_slice(&xn[t * hidden..(t + 1) * hidden]);
        }
        let mut y = vec![0f32; m * hidden];
        expert.forward(&xin, m, &mut y);
        outputs[i] = Some(y);
        Ok(())
    })?;

    let mut acc = vec![0f32; n * hidden];
    for (i, &e) in wanted.iter().enumerate() {
        let Some(y) = outputs[i].as_ref() else {
            return Err(SourceError::Shutdown(format!(
                "expert {} of layer {} was never delivered",
                e, tag.layer
            )));
        };
        for (j, &(t, wt)) in users[e].iter().enumerate() {
            for (a, &v) in acc[t * hidden..(t + 1) * hidden]
                .iter_mut()
                .zip(&y[j * hidden..(j + 1) * hidden])
            {
                *a += v * wt;
            }
        }
    }
    for (xv, a) in x.iter_mut().zip(&acc) {
        *xv += a;
    }
    Ok(routes)
}
