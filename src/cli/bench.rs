//! `coli bench`: decode speed against the two bounds it can't beat.
//!
//! A streaming engine is either waiting for the disk (I/O bound: disk
//! bandwidth over the expert bytes a token misses) or computing (compute
//! bound: the speed with every expert resident). The run measures both in
//! the same process and prints how close the measured speed comes to the
//! smaller one; tokens must be identical in every pass, since placement may
//! change speed, never numbers.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use colibri_actors::StorageOptions;

use super::output::diag;
use super::{EngineArgs, ModelArg};
use crate::bounds::{
    ComputeBound, DiskFigure, IoBound, MemoryBound, ProbeOptions, mean_routed_expert_bytes, memory_bandwidth,
    probe, sim_bandwidth,
};
use crate::engine::{Engine, EngineOptions};
use crate::engine::{MemoryPlan, peak_rss_bytes};
use crate::model::olmoe::LoadOptions;
use crate::routing::{Capacity, Outcome, RoutingTrace, replay};
use crate::synth::{ModelShape, PassResult, decode_pass, parse_replay_ids, replay_pass, synthetic_prompt};

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
    /// MB of expert extents each repeat of the disk probe reads.
    #[arg(long, default_value_t = 256)]
    pub probe_mb: u64,
    /// Repeats of the disk probe (fresh random samples; the spread is
    /// printed).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub probe_repeats: u64,
    /// Leave the page cache as it is before each probe repeat (by default
    /// the cached pages of the repeat's sample are dropped first; reading
    /// the sample brings them back, so the passes see the page cache as it
    /// was).
    #[arg(long)]
    pub probe_keep_cache: bool,
    /// Write the measured pass's routing trace (every step of the pass,
    /// the window marked) to FILE, for `coli policy`.
    #[arg(long, value_name = "FILE")]
    pub trace_out: Option<std::path::PathBuf>,
    /// Force this token sequence instead of greedy decoding: the first
    /// `--prompt-len` tokens are the prompt, the next `--warmup + --tokens`
    /// are fed one at a time. FILE holds token ids (separated by whitespace
    /// and/or commas) or, when it is not such a list, text that the model's
    /// tokenizer encodes.
    #[arg(long, value_name = "FILE", conflicts_with = "prompt_ids")]
    pub replay: Option<std::path::PathBuf>,
    /// The prompt as comma-separated ids (instead of seeded random ids).
    #[arg(long)]
    pub prompt_ids: Option<String>,
    /// Serving throughput instead: N concurrent streams through the decode
    /// loop against one (see docs/benchmarks.md, "Serving").
    #[arg(long, value_name = "N")]
    pub streams: Option<usize>,
    /// Sampling temperature of the `--streams` runs (seeded per stream), so
    /// streams route like different conversations.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true,
          value_parser = crate::runtime::limits::temperature)]
    pub stream_temperature: f32,
    /// Directory of the usage history the measured pass reads and adds to
    /// (default: $XDG_STATE_HOME/colibri/<model fingerprint>).
    #[arg(long)]
    pub state_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub usage: super::UsageArgs,
    /// Agents instead: N conversations taking turns through the decode
    /// loop, each resending its whole history, with the prompt cache off and
    /// on (see docs/benchmarks.md, "Prompt cache").
    #[arg(long, value_name = "N", conflicts_with = "streams")]
    pub conversations: Option<usize>,
    /// A long prompt beside a decoding stream instead: a second slot
    /// submits N prompt tokens while the first decodes, and the gaps
    /// between the first one's tokens are measured before and during that
    /// prefill (docs/benchmarks.md, "Long prompts beside a stream").
    #[arg(long, value_name = "N", conflicts_with_all = ["streams", "conversations"])]
    pub interfere: Option<usize>,
    /// With --interfere: the most prompt tokens one step computes (the
    /// decode loop's chunk; `coli serve` uses 512).
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub prefill_chunk: usize,
    /// With --conversations: the slots they share.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub kv_slots: usize,
    /// With --conversations: turns per conversation (the first is its
    /// --prompt-len prompt).
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub turns: usize,
    /// With --conversations: new tokens each later turn adds.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub turn_len: usize,
    /// With --conversations: the prompt cache's MiB in the run with it on
    /// (default as for `coli serve`).
    #[arg(long, value_name = "MIB", allow_negative_numbers = true, value_parser = super::parse_count)]
    pub prompt_cache_mb: Option<usize>,
    /// Interleaved rounds of the `--streams` runs (medians are printed).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Also measure what constrained decoding's token mask costs per token,
    /// against the measured decode step (docs/benchmarks.md, "Constrained
    /// decoding"): `json` for any JSON object, `schema` for a JSON schema.
    #[arg(long, value_name = "KIND")]
    pub grammar_bench: Option<crate::grammar::measure::BenchGrammar>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

pub(super) struct Pass {
    pub(super) name: &'static str,
    pub(super) result: PassResult,
    pub(super) load_secs: f64,
    pub(super) memory: MemoryPlan,
    /// Peak RSS of the process when the pass ended (passes run in turn, so
    /// the first pass's figure is its own).
    pub(super) peak_rss: Option<u64>,
    /// The usage history and pins of the pass (the measured pass only).
    pub(super) usage: Option<crate::engine::usage::UsageStart>,
    /// Resident bytes a decode step reads besides the routed experts.
    pub(super) step_dense: u64,
    /// The pass's routing (the last repeat when warmed first) and the
    /// window's steps in it.
    pub(super) trace: RoutingTrace,
    pub(super) window: (usize, usize),
    /// Steps of the pass the recorder had dropped for room.
    pub(super) trace_dropped: u64,
    /// The cache's capacity in experts (`None`: everything resident).
    pub(super) capacity: Option<Capacity>,
}

/// The optimal policy's replay of the measured window.
pub(super) struct Optimal {
    pub(super) outcome: Outcome,
    pub(super) capacity: Capacity,
}

/// What each pass decodes: a prompt, then greedy or forced tokens.
pub(super) struct Workload {
    pub(super) prompt: Vec<u32>,
    pub(super) forced: Option<Vec<u32>>,
}

fn run_pass(
    dir: &Path,
    opts: &EngineOptions,
    work: &Workload,
    args: &BenchArgs,
    name: &'static str,
    warm_first: bool,
    with_usage: bool,
) -> anyhow::Result<Pass> {
    diag!("bench: pass {name:?} ...");
    let t0 = Instant::now();
    let mut engine = Engine::load_with_progress(dir, opts, crate::progress::load_progress())
        .with_context(|| format!("loading {}", dir.display()))?;
    let load_secs = t0.elapsed().as_secs_f64();
    let (recorder, usage) = if with_usage {
        let (r, u) = super::start_usage(&engine, args.state_dir.as_deref(), &args.usage)?;
        (r, Some(u))
    } else {
        (None, None)
    };
    let mut session = engine.new_session();
    let mut pass_start = engine.usage().trace().mark();
    let mut pass = |engine: &mut Engine| match &work.forced {
        Some(f) => replay_pass(engine, &mut session, &work.prompt, f, args.warmup, args.tokens),
        None => decode_pass(engine, &mut session, &work.prompt, args.warmup, args.tokens),
    };
    if warm_first {
        // The same sequence once more: every expert the measured pass routes
        // to has then been fetched once and (cap = all) stays resident.
        pass(&mut engine)?;
        pass_start = engine.usage().trace().mark();
    }
    let result = pass(&mut engine)?;
    super::finish_usage(recorder);
    let (trace, trace_dropped) = engine.usage().trace().since(pass_start);
    let at = |mark: u64| (mark.saturating_sub(pass_start) as usize).min(trace.steps());
    let window = (at(result.window_marks.0), at(result.window_marks.1));
    Ok(Pass {
        name,
        result,
        load_secs,
        memory: engine.memory.clone(),
        peak_rss: peak_rss_bytes(),
        usage,
        step_dense: engine.model.step_dense_bytes() as u64,
        trace,
        window,
        trace_dropped,
        capacity: engine.usage().capacity(),
    })
}

/// The prompt and forced tokens of the run (see `--replay`, `--prompt-ids`).
fn workload(dir: &Path, cfg: &ModelShape, args: &BenchArgs) -> anyhow::Result<Workload> {
    let check = |ids: &[u32], what: &str| match ids.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        Some(t) => anyhow::bail!(
            "{what}: token id {t} is outside the vocabulary ({})",
            cfg.vocab_size
        ),
        None => Ok(()),
    };
    if let Some(path) = &args.replay {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading --replay {}", path.display()))?;
        let ids = match parse_replay_ids(&text) {
            Some(ids) => ids,
            None => crate::engine::ModelFiles::resolve(dir)?
                .tokenizer()?
                .with_context(|| format!("--replay {} is text: the model needs a tokenizer", path.display()))?
                .encode(&text)
                .with_context(|| format!("tokenizing --replay {}", path.display()))?,
        };
        check(&ids, "--replay")?;
        let need = args.prompt_len + args.warmup + args.tokens;
        if ids.len() < need {
            anyhow::bail!(
                "--replay {}: {} tokens, need {need} (--prompt-len {} + --warmup {} + --tokens {})",
                path.display(),
                ids.len(),
                args.prompt_len,
                args.warmup,
                args.tokens
            );
        }
        let (prompt, rest) = ids.split_at(args.prompt_len);
        return Ok(Workload {
            prompt: prompt.to_vec(),
            forced: Some(rest.to_vec()),
        });
    }
    let prompt = match &args.prompt_ids {
        Some(s) => super::parse_ids(s).context("--prompt-ids")?,
        None => synthetic_prompt(cfg.vocab_size, args.prompt_len, args.prompt_seed),
    };
    if prompt.is_empty() {
        anyhow::bail!("--prompt-ids: empty prompt");
    }
    check(&prompt, "--prompt-ids")?;
    Ok(Workload { prompt, forced: None })
}

pub fn run(args: BenchArgs) -> anyhow::Result<bool> {
    if args.tokens == 0 || args.prompt_len == 0 {
        return Err(super::usage("--tokens and --prompt-len must be at least 1"));
    }
    if let Some(n) = args.streams {
        return super::bench_streams::run(&args, n);
    }
    if let Some(n) = args.conversations {
        return super::bench_conversations::run(&args, n);
    }
    if let Some(n) = args.interfere {
        return super::bench_interfere::run(&args, n);
    }
    let dir = args.model.resolve()?;
    let cfg = ModelShape::load(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let opts = args.engine.options();
    let work = workload(&dir, &cfg, &args)?;
    let prompt = &work;
    let ck = crate::engine::ModelFiles::resolve(&dir)?.weights()?;
    let (map, _) = cfg.expert_map(&ck, LoadOptions::default())?;
    drop(ck);

    // The disk first, before any pass has warmed the page cache: random
    // expert reads as the I/O workers issue them (src/bounds/disk.rs).
    let sim = opts.disk_sim.as_deref().map(sim_bandwidth).transpose()?.flatten();
    let disk_probe = match sim {
        Some(_) => None,
        None => {
            diag!("bench: probing the disk ...");
            Some(probe(
                &map,
                &ProbeOptions {
                    bytes: args.probe_mb.max(1).saturating_mul(1 << 20),
                    repeats: args.probe_repeats as usize,
                    queue_depth: opts.io_workers.max(1),
                    storage: StorageOptions {
                        direct: opts.direct,
                        mmap: opts.mmap,
                        ..StorageOptions::default()
                    },
                    drop_cache: !args.probe_keep_cache,
                    ..ProbeOptions::default()
                },
            )?)
        }
    };

    let mut passes = vec![run_pass(&dir, &opts, prompt, &args, "measured", false, true)?];
    if args.compare_no_overlap {
        let strict = EngineOptions {
            overlap: false,
            ..opts.clone()
        };
        passes.push(run_pass(
            &dir,
            &strict,
            prompt,
            &args,
            "no-overlap",
            false,
            false,
        )?);
    }
    if !args.no_compute_bound {
        let resident = EngineOptions {
            cache_cap: Some(cfg.num_experts),
            ram_gb: None,
            disk_sim: None,
            ..opts.clone()
        };
        passes.push(run_pass(
            &dir,
            &resident,
            prompt,
            &args,
            "all resident",
            true,
            false,
        )?);
    }

    // The memory roofline, from the all-resident pass: its bytes a token
    // reads, over RAM read bandwidth on the same number of threads.
    let memory_bound = match passes.iter().find(|p| p.name == "all resident") {
        Some(c) if c.result.measured > 0 => {
            let threads = args
                .engine
                .threads
                .map(|t| t as usize)
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
                .max(1);
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
            let read_bw = pool.install(|| memory_bandwidth(512 << 20));
            let expert_bytes = mean_routed_expert_bytes(&map);
            let w = &c.result.window;
            let experts_per_token = (w.hits + w.misses) as f64 / c.result.measured as f64;
            Some(MemoryBound {
                read_bw,
                threads,
                bytes_per_token: c.step_dense as f64 + experts_per_token * expert_bytes,
                experts_per_token,
                expert_bytes,
            })
        }
        _ => None,
    };

    let measured = &passes[0];
    if let Some(path) = &args.trace_out {
        crate::routing::file::save(path, &measured.trace, Some(measured.window))
            .with_context(|| format!("--trace-out {}", path.display()))?;
        diag!(
            "bench: wrote the measured pass's routing ({} steps, window {}..{}) to {}",
            measured.trace.steps(),
            measured.window.0,
            measured.window.1,
            path.display()
        );
    }
    let optimal = measured.capacity.map(|cap| {
        // In-flight buffers hold experts too: counting them as cache room
        // keeps the replay a bound whatever they end up serving.
        let in_flight =
            colibri_actors::pipeline::transient_expert_buffers(opts.io_workers, cfg.num_experts_per_tok);
        let capacity = Capacity {
            per_layer: cap.per_layer,
            total: cap.total.map(|t| t + in_flight),
        };
        let window = measured.trace.slice(measured.window.0..measured.window.1);
        Optimal {
            outcome: replay::optimal(&window, capacity, 0),
            capacity,
        }
    });
    let disk = DiskFigure {
        probe: disk_probe,
        simulated: sim,
        passes: passes
            .iter()
            .filter(|p| p.result.window.bytes_read > 0 && p.result.decode_secs > 0.0)
            .map(|p| {
                (
                    p.name.to_string(),
                    p.result.window.bytes_read as f64 / p.result.decode_secs,
                )
            })
            .collect(),
    };
    let io_bound = IoBound {
        disk: disk.bandwidth(),
        optimal_bytes: optimal.as_ref().map_or(0, |o| o.outcome.bytes),
        read_bytes: measured.result.window.bytes_read,
        tokens: measured.result.measured,
    };
    let streamed = measured
        .result
        .profile
        .as_ref()
        .is_some_and(|p| p.placement == "streamed");
    let compute = ComputeBound {
        resident: passes
            .iter()
            .find(|p| p.name == "all resident")
            .map(|p| p.result.tok_per_s()),
        measured_compute: measured
            .result
            .profile
            .as_ref()
            .filter(|_| streamed)
            .and_then(|p| {
                ComputeBound::from_waits(
                    measured.result.measured,
                    measured.result.decode_secs,
                    p.wait_ns as f64 / 1e9,
                )
            }),
    };

    let mut out = super::output::stdout();
    let report = super::bench_report::Report {
        dir: &dir,
        cfg: &cfg,
        opts: &opts,
        args: &args,
        work: &work,
        passes: &passes,
        disk: &disk,
        optimal: optimal.as_ref(),
        io_bound: &io_bound,
        compute: &compute,
        memory_bound: memory_bound.as_ref(),
    };
    report.print(&mut out)?;

    if let Some(kind) = args.grammar_bench {
        grammar_report(&mut out, &dir, &cfg, kind, &passes[0].result)?;
    }

    let first = &passes[0].result.tokens;
    let same = passes.iter().all(|p| &p.result.tokens == first);
    if same {
        writeln!(
            out,
            "deterministic: tokens identical across {} passes",
            passes.len()
        )?;
    } else {
        writeln!(out, "DETERMINISM FAILURE: passes produced different tokens")?;
        for p in &passes {
            writeln!(out, "  {:<14} {:?}", p.name, p.result.tokens)?;
        }
    }
    Ok(same)
}

/// Passes of the mask measurement (each compiles the constraint afresh).
const GRAMMAR_PASSES: usize = 5;

/// The mask cost of `kind` over the model's vocabulary (its tokenizer.json,
/// or a stand-in of the same size for synthetic models), and its share of
/// the measured decode step.
fn grammar_report(
    out: &mut dyn Write,
    dir: &Path,
    cfg: &ModelShape,
    kind: crate::grammar::measure::BenchGrammar,
    measured: &PassResult,
) -> anyhow::Result<()> {
    use crate::grammar::{Grammars, tokens};
    let vocab = cfg.vocab_size;
    let stops = crate::engine::stop_ids(dir, Vec::new());
    let (grammars, which) = if dir.join("tokenizer.json").is_file() {
        let stops = if stops.is_empty() { vec![0] } else { stops };
        (
            Grammars::for_model(dir, vocab, &stops),
            "the model's tokenizer.json",
        )
    } else {
        let words = tokens::synthetic_vocabulary(vocab, 1);
        let end = vocab.saturating_sub(1) as u32;
        (
            Grammars::from_words(words, vocab, &[end]),
            "a synthetic byte-level vocabulary of the same size",
        )
    };
    let cost = crate::grammar::measure::mask_cost(&grammars, kind, GRAMMAR_PASSES)
        .context("measuring the grammar mask")?;
    writeln!(
        out,
        "grammar mask        {:>10.1} us/token  ({kind:?}: mean over {} tokens x {} passes, max {:.1} us; vocab {vocab}, {which}; compile {:.2} ms, vocabulary setup {:.0} ms)",
        cost.mean_us,
        cost.tokens,
        cost.passes,
        cost.max_us,
        cost.compile_us / 1e3,
        cost.setup_us / 1e3,
    )?;
    let tps = measured.tok_per_s();
    if tps > 0.0 {
        let step_us = 1e6 / tps;
        writeln!(
            out,
            "mask / decode step  {:>10.2} %        (mean mask / the measured pass's {:.0} us a token; computed while the step runs, so an upper bound)",
            100.0 * cost.mean_us / step_us,
            step_us
        )?;
    }
    Ok(())
}
