//! Whether a model fits a memory budget, and how: the arithmetic `coli
//! plan`, `coli doctor` and `coli list` share, from the files alone (no
//! probes), so the three never disagree about a placement.

use std::path::Path;

use anyhow::Context;

use crate::engine::WORKING_SET_BYTES;
use crate::engine::context::{ContextBudget, ContextChoice, ContextRequest, choose_context, longest_fitting};
use crate::model::olmoe::LoadOptions;
use crate::st::Checkpoint;
use crate::synth::ModelShape;

/// Where the routed experts would live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Every expert fits the cache: served in place from the mapping.
    Mapped,
    /// Experts stream through a cache of part of them.
    Streamed,
    /// The dense weights, KV cache and working set alone exceed the budget.
    TooLarge,
}

/// A model's memory needs against a budget.
#[derive(Clone, Debug)]
pub struct Fit {
    pub dense_bytes: u64,
    pub expert_bytes: u64,
    /// Experts with weights (dense layers' empty slots not counted).
    pub experts: usize,
    /// The largest expert.
    pub max_expert_bytes: u64,
    pub kv_bytes: u64,
    /// Bytes the cache gets for experts (after the streamed pipeline's
    /// transient buffers when experts stream).
    pub cache_bytes: u64,
    pub placement: Placement,
    /// The cache's share of the experts' bytes (1 when mapped).
    pub cached_share: f64,
    /// Bytes of the token embedding (read one row a token, not whole).
    pub embed_bytes: u64,
}

/// The expert cache a budget leaves once the dense weights, the KV cache and
/// the working set are counted (the engine's arithmetic).
pub fn expert_cache_bytes(budget: u64, dense: u64, kv: u64) -> u64 {
    budget.saturating_sub(dense + kv + WORKING_SET_BYTES)
}

/// The part of a model's memory that does not depend on the context.
struct Sizes {
    dense_bytes: u64,
    expert_bytes: u64,
    experts: usize,
    max_expert_bytes: u64,
    embed_bytes: u64,
    /// A streamed pipeline's buffers outside the cache.
    transient_bytes: u64,
    /// [`crate::engine::least_expert_cache_bytes`] at the default placement.
    least_expert_bytes: u64,
}

fn sizes(ck: &Checkpoint, shape: &ModelShape) -> anyhow::Result<Sizes> {
    let (map, _) = shape.expert_map(ck, LoadOptions::default())?;
    let total: u64 = ck.names().filter_map(|n| ck.info(n).ok()).map(|m| m.len).sum();
    let expert_bytes: u64 = map.extents.iter().map(|e| e.bytes()).sum();
    let workers = crate::engine::EngineOptions::default().io_workers;
    let top_k = shape.num_experts_per_tok;
    Ok(Sizes {
        dense_bytes: total.saturating_sub(expert_bytes),
        expert_bytes,
        experts: map.extents.iter().filter(|e| e.bytes() > 0).count(),
        max_expert_bytes: map.max_expert_bytes(),
        embed_bytes: ["model.embed_tokens.weight", "model.embed_tokens.weight.qs"]
            .iter()
            .filter_map(|n| ck.info(n).ok())
            .map(|m| m.len)
            .sum::<u64>(),
        transient_bytes: crate::engine::streamed_transient_bytes(&map, workers, top_k),
        least_expert_bytes: crate::engine::least_expert_cache_bytes(
            &map,
            crate::engine::Placement::Auto,
            workers,
            top_k,
        ),
    })
}

/// Whether `ctx` positions for each of `slots` fit `budget` after the dense
/// weights, the working set and the least expert cache (the engine's test
/// under `--ram-gb`, the prompt cache off).
fn fits_with<'a>(
    sz: &Sizes,
    shape: &'a ModelShape,
    kv: crate::model::kv_cache::KvTypes,
    slots: usize,
    budget: u64,
) -> impl Fn(usize) -> bool + 'a {
    let fixed = sz.dense_bytes + WORKING_SET_BYTES + sz.least_expert_bytes;
    move |ctx| fixed + shape.state_bytes(kv, ctx, slots) <= budget
}

/// The context the engine would size the KV cache for: `requested` if it
/// is within the model's limit and fits, else the error the engine gives;
/// by default the model's positions, capped by `budget`.
pub fn context_for(
    ck: &Checkpoint,
    shape: &ModelShape,
    budget: u64,
    requested: Option<usize>,
    slots: usize,
    kv: crate::model::kv_cache::KvTypes,
) -> anyhow::Result<ContextChoice> {
    let sz = sizes(ck, shape)?;
    let fits = fits_with(&sz, shape, kv, slots, budget);
    let kv_bytes = |ctx: usize| shape.state_bytes(kv, ctx, slots);
    let b = ContextBudget {
        room: budget.saturating_sub(sz.dense_bytes + WORKING_SET_BYTES + sz.least_expert_bytes),
        fits: &fits,
        kv_bytes: &kv_bytes,
    };
    let req = ContextRequest {
        requested,
        declared: shape.max_positions(),
        limit: shape.position_limit(),
        slots,
        kv,
    };
    Ok(choose_context(&req, Some(&b))?)
}

/// The longest context per slot, up to the model's position limit, that
/// `slots` conversations at `kv` fit into `budget` (0: none).
pub fn longest_context(
    ck: &Checkpoint,
    shape: &ModelShape,
    budget: u64,
    slots: usize,
    kv: crate::model::kv_cache::KvTypes,
) -> anyhow::Result<usize> {
    let sz = sizes(ck, shape)?;
    let fits = fits_with(&sz, shape, kv, slots, budget);
    Ok(longest_fitting(shape.position_limit(), &fits))
}

/// How the model of `ck` / `shape` fits `budget` bytes with `kv_slots`
/// conversations of `ctx` positions, as the engine would place it with its
/// default I/O workers.
pub fn fit(
    ck: &Checkpoint,
    shape: &ModelShape,
    budget: u64,
    ctx: usize,
    kv_slots: usize,
    kv: crate::model::kv_cache::KvTypes,
) -> anyhow::Result<Fit> {
    let Sizes {
        dense_bytes,
        expert_bytes,
        experts,
        max_expert_bytes,
        embed_bytes,
        transient_bytes,
        ..
    } = sizes(ck, shape)?;
    let ctx = ctx.max(1);
    let kv_bytes = shape.state_bytes(kv, ctx, kv_slots);
    let mut cache_bytes = expert_cache_bytes(budget, dense_bytes, kv_bytes);
    let mapped = expert_bytes <= cache_bytes;
    if !mapped {
        cache_bytes = cache_bytes.saturating_sub(transient_bytes);
    }
    let placement = if mapped {
        Placement::Mapped
    } else if cache_bytes == 0 {
        Placement::TooLarge
    } else {
        Placement::Streamed
    };
    Ok(Fit {
        dense_bytes,
        expert_bytes,
        experts,
        max_expert_bytes,
        kv_bytes,
        cache_bytes,
        placement,
        cached_share: if mapped {
            1.0
        } else {
            (cache_bytes as f64 / expert_bytes.max(1) as f64).min(1.0)
        },
        embed_bytes,
    })
}

/// [`fit`] for the model in `dir` with one slot at the default KV cache
/// types, at `ctx` or (`None`) the context the engine would take by
/// default under `budget`.
pub fn fit_dir(dir: &Path, budget: u64, ctx: Option<usize>) -> anyhow::Result<Fit> {
    let ck = crate::engine::ModelFiles::resolve(dir)?
        .weights()
        .with_context(|| format!("opening {}", dir.display()))?;
    let shape = ModelShape::load(dir).with_context(|| format!("reading {}", dir.display()))?;
    let kv = crate::engine::DEFAULT_KV_TYPES;
    let ctx = match ctx {
        Some(c) => c,
        None => context_for(&ck, &shape, budget, None, 1, kv)?.ctx,
    };
    fit(&ck, &shape, budget, ctx, 1, kv)
}

impl Fit {
    /// One line for a listing: what runs, and how.
    pub fn summary(&self) -> String {
        match self.placement {
            Placement::Mapped => "yes, all in RAM".to_string(),
            Placement::Streamed => format!(
                "streamed, {:.0}% of experts cached",
                (self.cached_share * 100.0).floor()
            ),
            Placement::TooLarge => "no: dense weights and KV cache exceed the budget".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bigger_budget_never_fits_worse() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny");
        let mut last = None;
        for mb in [0u64, 64, 256, 270, 300, 1024] {
            let f = fit_dir(&dir, mb << 20, Some(1024)).expect("fit");
            let rank = match f.placement {
                Placement::TooLarge => 0,
                Placement::Streamed => 1,
                Placement::Mapped => 2,
            };
            if let Some(prev) = last {
                assert!(rank >= prev, "{mb} MB: {f:?}");
            }
            last = Some(rank);
        }
        assert_eq!(last, Some(2), "1 GB holds the 4 MB model");
        let none = fit_dir(&dir, 0, Some(1024)).expect("fit");
        assert_eq!(none.placement, Placement::TooLarge);
    }
}
