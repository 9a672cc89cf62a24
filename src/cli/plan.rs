//! `coli plan`: what a model will do on this machine, before it runs.
//!
//! From the config and the container alone, plus two short probes (a read
//! of expert extents for the disk, a few experts multiplied for compute),
//! it says what stays resident, how big the expert cache is, which
//! placement `auto` picks, and the decode speed range the run is bounded
//! by: at best the slower of the memory roofline and I/O (every weight
//! only read, reads fully overlapped), at worst the probe's kernel pace plus
//! the reads (no overlap). The hit rate assumed when experts stream is
//! the cache's share of the experts (uniform routing: random-weight models
//! route that way; trained models skew, and usually do better).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use colibri_actors::{BlockingSource, ExpertKey, ExpertSource, Tag};
use rayon::prelude::*;
use serde::Serialize;

use super::ModelArg;
use super::fit::{Placement, fit};
use crate::bounds::{ProbeOptions, memory_bandwidth, probe};
use crate::engine::context::ContextChoice;
use crate::model::expert::ExpertWeights;
use crate::model::kv_cache::{KvType, KvTypes};
use crate::model::olmoe::LoadOptions;
use crate::st::Checkpoint;
use crate::synth::ModelShape;

use crate::engine::WORKING_SET_BYTES;

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Memory budget of the whole engine in GB (2^30 bytes), as the
    /// commands that run a model take `--ram-gb` (default: 90% of what is
    /// free here, by MemAvailable or the cgroup limit, whichever is smaller).
    #[arg(long, allow_negative_numbers = true)]
    pub ram_gb: Option<f64>,
    /// Context per conversation the KV cache is sized for (default: the
    /// model's max_position_embeddings as far as the budget holds it, as
    /// `coli serve`, `coli chat` and `coli run` size it).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::runtime::limits::context)]
    pub ctx: Option<usize>,
    /// Conversations held at once.
    #[arg(long, default_value_t = 1)]
    pub kv_slots: usize,
    /// MB of expert extents the disk probe reads.
    #[arg(long, default_value_t = 256)]
    pub probe_mb: u64,
    /// Experts the compute probe multiplies (each once per round, 3 rounds).
    #[arg(long, default_value_t = 64)]
    pub probe_experts: usize,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kv: super::KvTypeArgs,
}

/// The plan (what `--json` prints).
#[derive(Debug, Serialize)]
pub struct Plan {
    pub model: String,
    pub model_type: String,
    pub dense_bytes: u64,
    pub expert_bytes: u64,
    pub experts: usize,
    pub bytes_per_expert: f64,
    /// Positions per conversation the KV cache is sized for, and why.
    pub ctx: usize,
    pub ctx_source: String,
    pub kv_bytes: u64,
    pub budget_bytes: u64,
    pub budget_source: String,
    pub cache_bytes: u64,
    pub placement: &'static str,
    pub expected_hit_rate: f64,
    pub disk_bytes_per_sec: f64,
    pub compute_bytes_per_sec: f64,
    pub memory_bytes_per_sec: f64,
    pub bytes_per_token: f64,
    pub miss_bytes_per_token: f64,
    pub compute_tok_per_s: f64,
    pub io_tok_per_s: Option<f64>,
    pub tok_per_s_low: f64,
    pub tok_per_s_high: f64,
    pub flags: Vec<String>,
    /// The longest context per slot the budget holds, for 1, 2, 4 and 8
    /// slots at each KV cache type (at most the model's position limit).
    pub longest_ctx: Vec<LongestCtx>,
    /// The most positions `--ctx` may ask for.
    pub position_limit: usize,
}

/// One cell of the plan's longest-context table.
#[derive(Debug, Serialize)]
pub struct LongestCtx {
    pub slots: usize,
    pub kv_type: String,
    pub ctx: usize,
}

/// The slot counts the longest-context table shows.
const TABLE_SLOTS: [usize; 4] = [1, 2, 4, 8];

/// The context the KV cache is planned for, and why: `--ctx` (refused as
/// the engine refuses it: beyond the model's limit, or more than fits),
/// else the model's own positions as far as the budget holds them.
pub fn planned_context(choice: &ContextChoice, requested: Option<usize>) -> (usize, String) {
    let why = match (requested, &choice.capped) {
        (Some(_), _) => "--ctx".to_string(),
        (None, Some(note)) => note.clone(),
        (None, None) => "the model's own context (max_position_embeddings), as `coli serve`, `coli chat` \
                         and `coli run` take it by default"
            .to_string(),
    };
    (choice.ctx, why)
}

/// The KV cache types the longest-context table compares: f32, f16, q8,
/// and the chosen pair when it mixes two.
fn table_types(chosen: KvTypes) -> Vec<KvTypes> {
    let mut types: Vec<KvTypes> = [KvType::F32, KvType::F16, KvType::Q8]
        .into_iter()
        .map(KvTypes::both)
        .collect();
    if chosen.k != chosen.v {
        types.push(chosen);
    }
    types
}

/// Bytes per second at which this machine multiplies decoded experts for
/// one token (every routed expert of a decode step does exactly this).
fn compute_probe(shape: &ModelShape, ck: &Checkpoint, count: usize) -> anyhow::Result<f64> {
    let (map, codec) = shape.expert_map(ck, LoadOptions::default())?;
    let per_layer = map.experts_per_layer;
    let keys: Vec<ExpertKey> = (0..map.layers * per_layer)
        .filter(|&i| map.extents.get(i).is_some_and(|e| e.bytes() > 0))
        .take(count.max(1))
        .map(|i| ExpertKey::new((i / per_layer) as u32, (i % per_layer) as u32))
        .collect();
    let bytes_each: Vec<u64> = keys
        .iter()
        .map(|k| map.extents[k.layer as usize * per_layer + k.expert as usize].bytes())
        .collect();
    let source = BlockingSource::open(map, Box::new(codec)).context("opening the experts")?;
    let mut experts: Vec<Arc<ExpertWeights>> = Vec::with_capacity(keys.len());
    source.fetch(Tag::default(), &keys, &mut |_, e| {
        experts.push(e);
        Ok(())
    })?;
    let hidden = shape.hidden_size;
    let x: Vec<f32> = (0..hidden)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    // As a decode step runs them: a layer's top-k experts side by side on
    // the compute threads, layer after layer.
    let group = shape.num_experts_per_tok.max(1);
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t0 = Instant::now();
        for layer in experts.chunks(group) {
            let sums: Vec<f32> = layer
                .par_iter()
                .map(|e| {
                    let mut y = vec![0f32; hidden];
                    e.forward(&x, 1, &mut y);
                    y[0]
                })
                .collect();
            std::hint::black_box(sums);
        }
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let total: u64 = bytes_each.iter().sum();
    Ok(total as f64 / best.max(1e-9))
}

fn make_plan(dir: &Path, args: &PlanArgs) -> anyhow::Result<Plan> {
    let ck = crate::engine::ModelFiles::resolve(dir)?
        .weights()
        .with_context(|| format!("opening {}", dir.display()))?;
    let shape = ModelShape::load(dir).with_context(|| format!("reading {}", dir.display()))?;
    let (map, _) = shape.expert_map(&ck, LoadOptions::default())?;
    let (budget_bytes, budget_source) = match args.ram_gb {
        Some(g) if !(g.is_finite() && g > 0.0) => {
            return Err(super::usage(format!(
                "--ram-gb must be a positive number, got {g}"
            )));
        }
        Some(g) => ((g * (1u64 << 30) as f64) as u64, format!("--ram-gb {g}")),
        None => match colibri_actors::cache::memory_headroom() {
            Some(h) => (h.bytes / 10 * 9, format!("90% of {h}")),
            None => anyhow::bail!("no readable memory limit here: pass --ram-gb"),
        },
    };
    let kv_types = args.kv.types();
    let slots = args.kv_slots.max(1);
    let choice = super::fit::context_for(&ck, &shape, budget_bytes, args.ctx, slots, kv_types)?;
    let (ctx, ctx_source) = planned_context(&choice, args.ctx);
    let mut longest_ctx = Vec::new();
    for s in TABLE_SLOTS {
        for t in table_types(kv_types) {
            longest_ctx.push(LongestCtx {
                slots: s,
                kv_type: t.to_string(),
                ctx: super::fit::longest_context(&ck, &shape, budget_bytes, s, t)?,
            });
        }
    }
    let f = fit(&ck, &shape, budget_bytes, ctx, args.kv_slots, kv_types)?;
    let (dense_bytes, expert_bytes, experts, kv_bytes, cache_bytes) = (
        f.dense_bytes,
        f.expert_bytes,
        f.experts,
        f.kv_bytes,
        f.cache_bytes,
    );
    let bytes_per_expert = expert_bytes as f64 / experts.max(1) as f64;
    let embed = f.embed_bytes;
    let mapped = f.placement == Placement::Mapped;
    let hit = f.cached_share;

    let disk = probe(
        &map,
        &ProbeOptions {
            bytes: args.probe_mb.max(1) << 20,
            queue_depth: crate::engine::EngineOptions::default().io_workers,
            ..ProbeOptions::default()
        },
    )?;
    let compute = compute_probe(&shape, &ck, args.probe_experts)?;
    let memory = memory_bandwidth(256 << 20);

    let sparse_layers = (0..map.layers)
        .filter(|l| {
            map.extents[l * map.experts_per_layer..(l + 1) * map.experts_per_layer]
                .iter()
                .any(|e| e.bytes() > 0)
        })
        .count();
    let routed = (shape.num_experts_per_tok * sparse_layers) as f64 * bytes_per_expert;
    let bytes_per_token = dense_bytes.saturating_sub(embed) as f64 + routed;
    // Compute lies between the expert kernels' measured pace (every weight
    // multiplied as the probe did) and the memory roofline (every weight
    // merely read): decode can beat neither.
    let t_compute = bytes_per_token / compute;
    let t_roofline = bytes_per_token / memory.max(compute);
    let miss = (1.0 - hit) * routed;
    let t_io = miss / disk.median().max(1.0);
    let high = 1.0 / t_roofline.max(t_io);
    let low = 1.0 / (t_compute + t_io);

    let mut flags = vec![format!(
        "--placement {}",
        if mapped { "mapped" } else { "streamed" }
    )];
    if args.ram_gb.is_some() {
        flags.push(format!("--ram-gb {}", args.ram_gb.unwrap_or_default()));
    }
    if args.ctx.is_some() || args.kv_slots != 1 {
        flags.push(format!("--ctx {ctx} --kv-slots {}", args.kv_slots));
    }
    if kv_types.k == kv_types.v && kv_types != crate::engine::DEFAULT_KV_TYPES {
        flags.push(format!("--kv-type {}", kv_types.k));
    } else if kv_types != crate::engine::DEFAULT_KV_TYPES {
        flags.push(format!("--kv-type-k {} --kv-type-v {}", kv_types.k, kv_types.v));
    }
    if cache_bytes == 0 {
        flags.push(
            "(too little memory: the dense weights, KV cache and working set alone exceed the budget)".into(),
        );
    }
    Ok(Plan {
        model: dir.display().to_string(),
        model_type: shape.model_type.clone(),
        dense_bytes,
        expert_bytes,
        experts,
        bytes_per_expert,
        ctx,
        ctx_source,
        kv_bytes,
        budget_bytes,
        budget_source,
        cache_bytes,
        placement: if mapped { "mapped" } else { "streamed" },
        expected_hit_rate: hit,
        disk_bytes_per_sec: disk.median(),
        compute_bytes_per_sec: compute,
        memory_bytes_per_sec: memory,
        bytes_per_token,
        miss_bytes_per_token: miss,
        compute_tok_per_s: 1.0 / t_compute,
        io_tok_per_s: (t_io > 0.0).then(|| 1.0 / t_io),
        tok_per_s_low: low,
        tok_per_s_high: high,
        flags,
        longest_ctx,
        position_limit: shape.position_limit(),
    })
}

pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let dir = args.model.resolve()?;
    let p = make_plan(&dir, &args)?;
    let mut out = super::output::stdout();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&p)?)?;
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    writeln!(out, "model        {} ({})", p.model, p.model_type)?;
    writeln!(
        out,
        "resident     {:.2} GiB dense weights + {:.2} GiB KV cache ({} slot(s) x {} positions) + {:.2} GiB working set",
        gib(p.dense_bytes),
        gib(p.kv_bytes),
        args.kv_slots.max(1),
        p.ctx,
        gib(WORKING_SET_BYTES)
    )?;
    writeln!(out, "context      {} positions per slot: {}", p.ctx, p.ctx_source)?;
    writeln!(
        out,
        "experts      {:.2} GiB in {} experts ({:.1} MB each)",
        gib(p.expert_bytes),
        p.experts,
        p.bytes_per_expert / 1e6
    )?;
    writeln!(
        out,
        "budget       {:.2} GiB from {}",
        gib(p.budget_bytes),
        p.budget_source
    )?;
    writeln!(
        out,
        "cache        {:.2} GiB for experts: placement {} (expected hit rate {:.0}%{})",
        gib(p.cache_bytes),
        p.placement,
        p.expected_hit_rate * 100.0,
        if p.placement == "mapped" {
            ", all resident"
        } else {
            ", uniform routing assumed"
        }
    )?;
    writeln!(
        out,
        "disk         {:.0} MB/s (median of 3 probes of {} MB: random expert reads, their cached pages dropped first)",
        p.disk_bytes_per_sec / 1e6,
        args.probe_mb
    )?;
    writeln!(
        out,
        "compute      {:.0} MB/s of expert weights multiplied for one token; memory reads {:.0} MB/s",
        p.compute_bytes_per_sec / 1e6,
        p.memory_bytes_per_sec / 1e6
    )?;
    writeln!(
        out,
        "per token    {:.0} MB of weights read, {:.0} MB of them from disk",
        p.bytes_per_token / 1e6,
        p.miss_bytes_per_token / 1e6
    )?;
    writeln!(
        out,
        "bounds       compute {:.2} tok/s (memory roofline {:.2}), I/O {}",
        p.compute_tok_per_s,
        p.bytes_per_token.recip() * p.memory_bytes_per_sec.max(p.compute_bytes_per_sec),
        p.io_tok_per_s
            .map_or("none (no reads)".into(), |t| format!("{t:.2} tok/s"))
    )?;
    writeln!(
        out,
        "expected     {:.2} .. {:.2} tok/s decode (kernel pace, no overlap .. memory roofline, full overlap)",
        p.tok_per_s_low, p.tok_per_s_high
    )?;
    write_longest(&mut out, &p, args.kv.types())?;
    writeln!(out, "flags        {}", p.flags.join(" "))?;
    Ok(())
}

/// The longest-context table: one row per slot count, one column per KV
/// cache type, the chosen type starred.
fn write_longest(out: &mut dyn Write, p: &Plan, chosen: KvTypes) -> std::io::Result<()> {
    writeln!(
        out,
        "longest      context per slot the budget holds, by slots and KV cache type (* = the chosen; at most {} positions):",
        p.position_limit
    )?;
    let types = table_types(chosen);
    let header: Vec<String> = types
        .iter()
        .map(|t| {
            let star = if *t == chosen { "*" } else { "" };
            format!("{:>12}", format!("{t}{star}"))
        })
        .collect();
    writeln!(out, "             {:>7}{}", "slots", header.concat())?;
    for s in TABLE_SLOTS {
        let cells: Vec<String> = p
            .longest_ctx
            .iter()
            .filter(|c| c.slots == s)
            .map(|c| format!("{:>12}", c.ctx))
            .collect();
        writeln!(out, "             {s:>7}{}", cells.concat())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_planned_context_says_where_it_came_from() {
        let own = ContextChoice {
            ctx: 1024,
            capped: None,
        };
        let (ctx, why) = planned_context(&own, None);
        assert_eq!(ctx, 1024);
        assert!(why.contains("the model's own context"), "{why}");
        assert_eq!(planned_context(&own, Some(1024)), (1024, "--ctx".to_string()));
        let capped = ContextChoice {
            ctx: 300,
            capped: Some("context 300 of the model's 1024 positions".into()),
        };
        assert_eq!(
            planned_context(&capped, None).1,
            "context 300 of the model's 1024 positions"
        );
    }

    #[test]
    fn the_table_compares_the_three_types_and_a_mixed_choice() {
        assert_eq!(table_types(KvTypes::both(KvType::F16)).len(), 3);
        let mixed = KvTypes {
            k: KvType::F16,
            v: KvType::Q8,
        };
        assert_eq!(table_types(mixed).last(), Some(&mixed));
    }
}
