//! The sparse MoE block: softmax router, top-k, experts fetched through the
//! runtime, results combined in a fixed order.

use colibri_actors::{ExpertSource, SourceError, Tag};

use super::weights::LayerWeights;
use crate::config::OlmoeConfig;
use crate::model::expert::ExpertWeights;
pub use crate::model::routed::Routing;
use crate::model::routed::routed_sum;

/// Softmax over all experts, top-k, optional renormalisation (transformers'
/// OlmoeTopKRouter).
pub fn route(cfg: &OlmoeConfig, router_logits: &[f32]) -> Routing {
    Routing::softmax_top_k(router_logits, cfg.num_experts_per_tok, cfg.norm_topk_prob)
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

    let acc = routed_sum(source, tag, &routes, ne, xn, hidden)?;
    for (xv, a) in x.iter_mut().zip(&acc) {
        *xv += a;
    }
    Ok(routes)
}
