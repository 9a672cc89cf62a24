//! Running a batch's routed experts through the expert source, shared by
//! every MoE family: whatever the router, the fetch-and-combine step is the
//! same and must stay deterministic.

use colibri_actors::{ExpertKey, ExpertSource, SourceError, Tag};
use rayon::prelude::*;

use crate::model::expert::ExpertWeights;
use crate::model::ops::{softmax_inplace, top_k};

/// The experts and weights chosen for one token.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

impl Routing {
    /// Softmax over all router logits, the `k` most probable experts, and
    /// with `renorm` their probabilities divided by their sum (transformers'
    /// OLMoE, Qwen3-MoE and Mixtral routers; Mixtral always renormalises).
    pub fn softmax_top_k(router_logits: &[f32], k: usize, renorm: bool) -> Self {
        let mut probs = router_logits.to_vec();
        softmax_inplace(&mut probs);
        let experts = top_k(&probs, k);
        let mut weights: Vec<f32> = experts.iter().map(|&e| probs[e]).collect();
        if renorm {
            let sum: f32 = weights.iter().sum();
            for w in &mut weights {
                *w /= sum;
            }
        }
        Self { experts, weights }
    }

    /// gpt-oss: the `k` largest raw logits, then a softmax over just those.
    pub fn top_k_softmax(router_logits: &[f32], k: usize) -> Self {
        let experts = top_k(router_logits, k);
        let mut weights: Vec<f32> = experts.iter().map(|&e| router_logits[e]).collect();
        softmax_inplace(&mut weights);
        Self { experts, weights }
    }
}

/// The sigmoid router of DeepSeek-V3, GLM-4.x and GLM-5: the experts are
/// split into `n_group` groups, groups are ranked by the sum of their two
/// best biased scores and only the best `topk_group` groups compete.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupLimited {
    pub n_group: usize,
    pub topk_group: usize,
    /// Divide the chosen scores by their sum (`norm_topk_prob`).
    pub renorm: bool,
    /// `routed_scaling_factor`, applied after the normalisation.
    pub scale: f32,
    /// The score an expert of a dropped group competes with: transformers'
    /// GLM-4.x and DeepSeek-V3 fill with 0.0 (so a dropped expert can beat
    /// a kept one whose biased score is negative), the GLM-5 engine with
    /// minus infinity.
    pub dropped: f32,
}

impl GroupLimited {
    /// Sigmoid scores; the correction `bias` only steers the choice; the
    /// weights are the unbiased scores, optionally normalised, times
    /// `scale`. `k` may exceed the model's top-k (the pilot asks for more).
    pub fn route(&self, bias: &[f32], logits: &[f32], k: usize) -> Routing {
        let ne = logits.len();
        let scores: Vec<f32> = logits.iter().map(|&x| sigmoid(x)).collect();
        let choice: Vec<f32> = scores
            .iter()
            .enumerate()
            .map(|(e, s)| s + bias.get(e).copied().unwrap_or(0.0))
            .collect();
        let per = (ne / self.n_group.max(1)).max(1);
        let group_scores: Vec<f32> = choice
            .chunks(per)
            .map(|g| top_k(g, 2).iter().map(|&i| g[i]).sum())
            .collect();
        let groups = top_k(&group_scores, self.topk_group);
        let masked: Vec<f32> = choice
            .iter()
            .enumerate()
            .map(|(e, &c)| {
                if groups.contains(&(e / per)) {
                    c
                } else {
                    self.dropped
                }
            })
            .collect();
        let limit = if self.dropped == f32::NEG_INFINITY {
            per * self.topk_group
        } else {
            ne
        };
        let experts = top_k(&masked, k.min(limit));
        let mut weights: Vec<f32> = experts.iter().map(|&e| scores[e]).collect();
        if self.renorm {
            let denom = weights.iter().sum::<f32>() + 1e-20;
            for w in &mut weights {
                *w /= denom;
            }
        }
        for w in &mut weights {
            *w *= self.scale;
        }
        Routing { experts, weights }
    }
}

use crate::model::ops::sigmoid;

/// How a Llama-style MoE layer turns router logits into a routing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Router {
    /// Softmax over all experts, top-k, optionally renormalised (OLMoE,
    /// Qwen3-MoE, Mixtral).
    Softmax { renorm: bool },
    /// Top-k of the logits, softmax over the chosen (gpt-oss).
    TopKSoftmax,
    /// Sigmoid with a correction bias and group-limited choice (GLM-4.x).
    Sigmoid(GroupLimited),
}

impl Router {
    /// The routing of one token's logits (router bias already added);
    /// `correction` is the sigmoid router's `e_score_correction_bias`.
    pub fn route(&self, logits: &[f32], correction: &[f32], k: usize) -> Routing {
        match self {
            Router::Softmax { renorm } => Routing::softmax_top_k(logits, k, *renorm),
            Router::TopKSoftmax => Routing::top_k_softmax(logits, k),
            Router::Sigmoid(g) => g.route(correction, logits, k),
        }
    }

    /// The `k` experts most likely chosen, best first (the pilot's guess;
    /// weights do not matter).
    pub fn predict(&self, logits: &[f32], correction: &[f32], k: usize) -> Vec<usize> {
        match self {
            Router::Softmax { .. } | Router::TopKSoftmax => top_k(logits, k),
            Router::Sigmoid(g) => g.route(correction, logits, k).experts,
        }
    }
}

/// `Σ_k w_k · expert_k(xn_t)` for every token `t` of a batch (`xn` is
/// `[n, hidden]`), returned as `[n, hidden]`. Each unique expert of the batch
/// is fetched once (batch union) and run on all its tokens at once; results
/// are summed per token in ascending expert order, whatever order the
/// experts arrived in, so placement never changes the numbers.
pub fn routed_sum(
    source: &dyn ExpertSource<ExpertWeights>,
    tag: Tag,
    routes: &[Routing],
    num_experts: usize,
    xn: &[f32],
    hidden: usize,
) -> Result<Vec<f32>, SourceError> {
    let n = routes.len();
    let mut users: Vec<Vec<(usize, f32)>> = vec![Vec::new(); num_experts];
    for (t, r) in routes.iter().enumerate() {
        for (&e, &wt) in r.experts.iter().zip(&r.weights) {
            if let Some(u) = users.get_mut(e) {
                u.push((t, wt));
            }
        }
    }
    let wanted: Vec<usize> = (0..num_experts).filter(|&e| !users[e].is_empty()).collect();
    let keys: Vec<ExpertKey> = wanted
        .iter()
        .map(|&e| ExpertKey::new(tag.layer, e as u32))
        .collect();

    // outputs[i]: expert wanted[i]'s output rows for its users, in user order.
    let mut outputs: Vec<Option<Vec<f32>>> = vec![None; wanted.len()];
    source.fetch_batch(tag, &keys, &mut |group| {
        // One group is everything that is ready (all resident experts of the
        // layer at once): its experts run side by side on the compute
        // threads, each writing only its own output slot.
        let run = |&(i, ref expert): &(usize, std::sync::Arc<ExpertWeights>)| {
            let e = wanted[i];
            let _s = tracing::trace_span!("expert_matmul", layer = tag.layer, expert = e).entered();
            let m = users[e].len();
            let mut xin = Vec::with_capacity(m * hidden);
            for &(t, _) in &users[e] {
                xin.extend_from_slice(&xn[t * hidden..(t + 1) * hidden]);
            }
            let mut y = vec![0f32; m * hidden];
            expert.forward(&xin, m, &mut y);
            (i, y)
        };
        let done: Vec<(usize, Vec<f32>)> = if group.len() == 1 {
            group.iter().map(run).collect()
        } else {
            group.par_iter().map(run).collect()
        };
        for (i, y) in done {
            if let Some(slot) = outputs.get_mut(i) {
                *slot = Some(y);
            }
        }
        Ok(())
    })?;

    let mut acc = vec![0f32; n * hidden];
    for (i, &e) in wanted.iter().enumerate() {
        let Some(y) = outputs[i].as_ref() else {
            return Err(SourceError::Shutdown(format!(
                "expert {e} of layer {} was never delivered",
                tag.layer
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
    Ok(acc)
}
