//! `coli bench`: decode speed against the two bounds it can't beat.
//!
//! A streaming engine is either waiting for the disk (I/O bound: disk
//! bandwidth over the expert bytes a token misses) or computing (compute
//! bound: the speed with every expert resident). The run measures both in
//! the same process and prints how close the measured speed comes to the
//! smaller one; tokens must be identical in every pass, since placement may
//! change speed, never numbers.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use colibri_actors::StorageOptions;

use super::{EngineArgs, ModelArg};
use crate::config::OlmoeConfig;
use crate::engine::{Engine, EngineOptions};
use crate::model::olmoe::{LoadOptions, expert_map};
use crate::st::Checkpoint;
use crate::synth::{PassResult, decode_pass, read_bandwidth, sim_bandwidth, synthetic_prompt};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Tokens decoded in the measured window.
    #[arg(long, default_value_t = 16)]
    pub tokens: usize,
    /// Prompt length (seeded random ids; synthetic models have no tokenizer).
    #[arg(long, default_value_t = 8)]
    pub prompt_len: usize,
    /// Tokens decoded before the window (fill the cache, start the pipeline).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Seed of the prompt ids.
    #[arg(long, default_value_t = 0)]
    pub prompt_seed: u64,
    /// Also run the strict no-overlap mode and print the speed ratio.
    #[arg(long)]
    pub compare_no_overlap: bool,
    /// Skip the all-resident pass (the compute bound), e.g. when RAM is short.
    #[arg(long)]
    pub no_compute_bound: bool,
    /// MB of expert extents the disk-bandwidth probe reads.
    #[arg(long, default_value_t = 1024)]
    pub probe_mb: u64,
    #[command(flatten)]
    pub engine: EngineArgs,
}

struct Pass {
    name: &'static str,
    result: PassResult,
    load_secs: f64,
}

fn run_pass(
    dir: &Path,
    opts: &EngineOptions,
    prompt: &[u32],
    args: &BenchArgs,
    name: &'static str,
    warm_first: bool,
) -> anyhow::Result<Pass> {
    eprintln!("bench: pass {name:?} ...");
    let t0 = Instant::now();
    let mut engine = Engine::load(dir, opts).with_context(|| format!("loading {}", dir.display()))?;
    let load_secs = t0.elapsed().as_secs_f64();
    let mut session = engine.new_session();
    if warm_first {
        // The same sequence once more: every expert the measured pass routes
        // to has then been fetched once and (cap = all) stays resident.
        decode_pass(&mut engine, &mut session, prompt, args.warmup, args.tokens)?;
    }
    let result = decode_pass(&mut engine, &mut session, prompt, args.warmup, args.tokens)?;
    Ok(Pass {
        name,
        result,
        load_secs,
    })
}

pub fn run(args: BenchArgs) -> anyhow::Result<bool> {
    if args.tokens == 0 || args.prompt_len == 0 {
        return Err(super::usage("--tokens and --prompt-len must be at least 1"));
    }
    let dir = args.model.resolve()?;
    let cfg = OlmoeConfig::load(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let opts = args.engine.options();
    let prompt = synthetic_prompt(cfg.vocab_size, args.prompt_len, args.prompt_seed);

    let mut passes = vec![run_pass(&dir, &opts, &prompt, &args, "measured", false)?];
    if args.compare_no_overlap {
        let strict = EngineOptions {
            overlap: false,
            ..opts.clone()
        };
        passes.push(run_pass(&dir, &strict, &prompt, &args, "no-overlap", false)?);
    }
    if !args.no_compute_bound {
        let resident = EngineOptions {
            cache_cap: Some(cfg.num_experts),
            ram_gb: None,
            disk_sim: None,
            ..opts.clone()
        };
        passes.push(run_pass(&dir, &resident, &prompt, &args, "all resident", true)?);
    }

    // The disk: simulated bandwidth, or a sequential read of the model's own
    // expert extents with the same O_DIRECT setting.
    let sim = opts.disk_sim.as_deref().map(sim_bandwidth).transpose()?.flatten();
    let (disk_bw, disk_how) = match sim {
        Some(bw) => (bw, "simulated (--disk-sim bw)".to_string()),
        None => {
            let ck = Checkpoint::open(&dir)?;
            let (map, _) = expert_map(&cfg, &ck, LoadOptions::default())?;
            drop(ck);
            let storage = StorageOptions {
                direct: opts.direct,
                mmap: opts.mmap,
                ..StorageOptions::default()
            };
            let bw = read_bandwidth(
                &map,
                &storage,
                args.probe_mb.saturating_mul(1 << 20),
                opts.io_workers,
            )?;
            let how = format!(
                "measured: {:.0} MB of expert extents in file order, {} readers via {}{}",
                bw.bytes as f64 / 1e6,
                bw.threads,
                bw.kind,
                if bw.kind == "direct" {
                    ""
                } else {
                    " (the page cache may serve it)"
                }
            );
            (bw.bytes_per_sec(), how)
        }
    };

    print_report(&dir, &cfg, &opts, &args, &passes, disk_bw, &disk_how);

    let first = &passes[0].result.tokens;
    let same = passes.iter().all(|p| &p.result.tokens == first);
    if same {
        println!("deterministic: tokens identical across {} passes", passes.len());
    } else {
        println!("DETERMINISM FAILURE: passes produced different tokens");
        for p in &passes {
            println!("  {:<14} {:?}", p.name, p.result.tokens);
        }
    }
    Ok(same)
}

fn print_report(
    dir: &Path,
    cfg: &OlmoeConfig,
    opts: &EngineOptions,
    args: &BenchArgs,
    passes: &[Pass],
    disk_bw: f64,
    disk_how: &str,
) {
    let mb = |b: f64| b / 1e6;
    println!(
        "model {}: {} layers, {} experts top-{}, hidden {}",
        dir.display(),
        cfg.num_hidden_layers,
        cfg.num_experts,
        cfg.num_experts_per_tok,
        cfg.hidden_size
    );
    println!(
        "options: cache-cap {} | ram-gb {} | disk-sim {} | pilot {} | io-workers {} | direct {} | overlap {}",
        opts.cache_cap.map_or("default".into(), |c| c.to_string()),
        opts.ram_gb.map_or("default".into(), |g| g.to_string()),
        opts.disk_sim.as_deref().unwrap_or("off"),
        if opts.pilot { "on" } else { "off" },
        opts.io_workers,
        opts.direct,
        opts.overlap
    );
    println!(
        "prompt {} tok, warm-up {} tok, measured {} tok",
        args.prompt_len, args.warmup, args.tokens
    );
    println!();
    println!(
        "{:<14} {:>9} {:>9} {:>14} {:>10} {:>9}",
        "pass", "tok/s", "hit rate", "missed MB/tok", "prefill s", "load s"
    );
    for p in passes {
        let r = &p.result;
        println!(
            "{:<14} {:>9.3} {:>8.1}% {:>14.2} {:>10.2} {:>9.2}",
            p.name,
            r.tok_per_s(),
            r.window.hit_rate() * 100.0,
            mb(r.missed_bytes_per_token()),
            r.prefill_secs,
            p.load_secs
        );
    }
    println!();
    let measured = &passes[0].result;
    let missed = measured.missed_bytes_per_token();
    let io_bound = if missed > 0.0 {
        disk_bw / missed
    } else {
        f64::INFINITY
    };
    let compute = passes.iter().find(|p| p.name == "all resident");
    println!("disk bandwidth      {:>10.1} MB/s  {disk_how}", mb(disk_bw));
    println!("I/O bound           {io_bound:>10.3} tok/s  (disk bandwidth / missed bytes per token)");
    let mut bound = io_bound;
    if let Some(c) = compute {
        let cb = c.result.tok_per_s();
        let resident = if c.result.window.misses == 0 {
            "every routed expert resident".to_string()
        } else {
            format!(
                "NOT fully resident: {} misses in the window",
                c.result.window.misses
            )
        };
        println!("compute bound       {cb:>10.3} tok/s  ({resident})");
        bound = bound.min(cb);
    }
    if bound.is_finite() && bound > 0.0 {
        println!(
            "measured / bound    {:>10.3}       (measured tok/s / min(I/O bound, compute bound))",
            measured.tok_per_s() / bound
        );
    }
    if let Some(strict) = passes.iter().find(|p| p.name == "no-overlap") {
        let s = strict.result.tok_per_s();
        if s > 0.0 {
            println!(
                "overlap / strict   {:>10.3}       (measured tok/s / no-overlap tok/s)",
                measured.tok_per_s() / s
            );
        }
    }
    if let Some(recall) = measured.window.pilot_recall() {
        println!("pilot recall        {:>10.1}%", recall * 100.0);
    }
}
