//! Whether a model fits a memory budget, and how: the arithmetic `coli
//! plan`, `coli doctor` and `coli list` share, from the files alone (no
//! probes), so the three never disagree about a placement.

use std::path::Path;

use anyhow::Context;

use crate::engine::WORKING_SET_BYTES;
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
    let (map, _) = shape.expert_map(ck, LoadOptions::default())?;
    let total: u64 = ck.names().filter_map(|n| ck.info(n).ok()).map(|m| m.len).sum();
    let expert_bytes: u64 = map.extents.iter().map(|e| e.bytes()).sum();
    let experts = map.extents.iter().filter(|e| e.bytes() > 0).count();
    let dense_bytes = total.saturating_sub(expert_bytes);
    let embed_bytes = ["model.embed_tokens.weight", "model.embed_tokens.weight.qs"]
        .iter()
        .filter_map(|n| ck.info(n).ok())
        .map(|m| m.len)
        .sum::<u64>();
    let ctx = ctx.min(shape.max_positions()).max(1);
    let kv_bytes = shape.kv_bytes_per_position(kv) * ctx as u64 * kv_slots.max(1) as u64;
    let mut cache_bytes = expert_cache_bytes(budget, dense_bytes, kv_bytes);
    let mapped = expert_bytes <= cache_bytes;
    if !mapped {
        let workers = crate::engine::EngineOptions::default().io_workers;
        let transient = crate::engine::streamed_transient_bytes(&map, workers, shape.num_experts_per_tok);
        cache_bytes = cache_bytes.saturating_sub(transient);
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
        max_expert_bytes: map.max_expert_bytes(),
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

/// [`fit`] for the model in `dir`, with the default KV cache types.
pub fn fit_dir(dir: &Path, budget: u64, ctx: usize, kv_slots: usize) -> anyhow::Result<Fit> {
    let ck = Checkpoint::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let shape = ModelShape::load(dir).with_context(|| format!("reading {}", dir.display()))?;
    fit(
        &ck,
        &shape,
        budget,
        ctx,
        kv_slots,
        crate::engine::DEFAULT_KV_TYPES,
    )
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
            let f = fit_dir(&dir, mb << 20, 1024, 1).expect("fit");
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
        let none = fit_dir(&dir, 0, 1024, 1).expect("fit");
        assert_eq!(none.placement, Placement::TooLarge);
    }
}
