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
use crate::engine::{Engine, EngineOptions};
use crate::engine::{MemoryPlan, peak_rss_bytes};
use crate::model::olmoe::LoadOptions;
use crate::st::Checkpoint;
use crate::synth::{
    ModelShape, PassResult, decode_pass, memory_bandwidth, parse_replay_ids, read_bandwidth, replay_pass,
    sim_bandwidth, synthetic_prompt,
};
use crate::tokenizer::Tokenizer;

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

struct Pass {
    name: &'static str,
    result: PassResult,
    load_secs: f64,
    memory: MemoryPlan,
    /// Peak RSS of the process when the pass ended (passes run in turn, so
    /// the first pass's figure is its own).
    peak_rss: Option<u64>,
    /// The usage history and pins of the pass (the measured pass only).
    usage: Option<crate::engine::usage::UsageStart>,
    /// Resident bytes a decode step reads besides the routed experts.
    step_dense: u64,
}

/// The memory roofline of the run: what a token must read from RAM with
/// every expert resident, against the read bandwidth measured in the same
/// run on as many threads as the compute pool.
struct MemoryBound {
    read_bw: f64,
    threads: usize,
    bytes_per_token: f64,
    experts_per_token: f64,
    expert_bytes: f64,
}

impl MemoryBound {
    fn tok_per_s(&self) -> f64 {
        if self.bytes_per_token > 0.0 {
            self.read_bw / self.bytes_per_token
        } else {
            f64::INFINITY
        }
    }
}

/// What each pass decodes: a prompt, then greedy or forced tokens.
struct Workload {
    prompt: Vec<u32>,
    forced: Option<Vec<u32>>,
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
    let mut pass = |engine: &mut Engine| match &work.forced {
        Some(f) => replay_pass(engine, &mut session, &work.prompt, f, args.warmup, args.tokens),
        None => decode_pass(engine, &mut session, &work.prompt, args.warmup, args.tokens),
    };
    if warm_first {
        // The same sequence once more: every expert the measured pass routes
        // to has then been fetched once and (cap = all) stays resident.
        pass(&mut engine)?;
    }
    let result = pass(&mut engine)?;
    super::finish_usage(recorder);
    Ok(Pass {
        name,
        result,
        load_secs,
        memory: engine.memory.clone(),
        peak_rss: peak_rss_bytes(),
        usage,
        step_dense: engine.model.step_dense_bytes() as u64,
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
            None => Tokenizer::load(dir)
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

    let ck = Checkpoint::open(&dir)?;
    let (map, _) = cfg.expert_map(&ck, LoadOptions::default())?;
    drop(ck);
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
            let expert_bytes =
                map.extents.iter().map(|e| e.bytes()).sum::<u64>() as f64 / map.extents.len().max(1) as f64;
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

    // The disk: simulated bandwidth, or a sequential read of the model's own
    // expert extents with the same O_DIRECT setting.
    let sim = opts.disk_sim.as_deref().map(sim_bandwidth).transpose()?.flatten();
    let (disk_bw, disk_how) = match sim {
        Some(bw) => (bw, "simulated (--disk-sim bw)".to_string()),
        None => {
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

    let mut out = super::output::stdout();
    print_report(
        &mut out, &dir, &cfg, &opts, &args, &work, &passes, disk_bw, &disk_how,
    )?;
    if let Some(m) = &memory_bound {
        let mb = |b: f64| b / 1e6;
        writeln!(
            out,
            "memory read         {:>10.1} MB/s  (same run, {} threads, best of 5 passes over 512 MB)",
            mb(m.read_bw),
            m.threads
        )?;
        writeln!(
            out,
            "memory bound        {:>10.3} tok/s  (memory read / {:.2} MB a token reads with every expert resident: dense step + {:.2} experts x {:.2} MB)",
            m.tok_per_s(),
            mb(m.bytes_per_token),
            m.experts_per_token,
            mb(m.expert_bytes)
        )?;
        if let Some(c) = passes.iter().find(|p| p.name == "all resident") {
            writeln!(
                out,
                "resident / memory   {:>10.3}       (all-resident decode tok/s / memory bound: the share of RAM bandwidth decode uses)",
                c.result.tok_per_s() / m.tok_per_s()
            )?;
        }
    }

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

#[allow(clippy::too_many_arguments)]
fn print_report(
    out: &mut dyn Write,
    dir: &Path,
    cfg: &ModelShape,
    opts: &EngineOptions,
    args: &BenchArgs,
    work: &Workload,
    passes: &[Pass],
    disk_bw: f64,
    disk_how: &str,
) -> std::io::Result<()> {
    let mb = |b: f64| b / 1e6;
    writeln!(
        out,
        "model {}: {} layers, {} experts top-{}, hidden {}",
        dir.display(),
        cfg.num_hidden_layers,
        cfg.num_experts,
        cfg.num_experts_per_tok,
        cfg.hidden_size
    )?;
    writeln!(
        out,
        "options: cache-cap {} | ram-gb {} | disk-sim {} | pilot {} | io-workers {} | direct {} | overlap {}",
        opts.cache_cap.map_or("default".into(), |c| c.to_string()),
        opts.ram_gb.map_or("default".into(), |g| g.to_string()),
        opts.disk_sim.as_deref().unwrap_or("off"),
        if opts.pilot { "on" } else { "off" },
        opts.io_workers,
        opts.direct,
        opts.overlap
    )?;
    if let Some(u) = passes.first().and_then(|p| p.usage.as_ref()) {
        writeln!(
            out,
            "usage history: {} run(s) before this one, {} expert(s) pinned at start-up (--pin {})",
            u.history_runs,
            u.pinned,
            match &args.usage.pin {
                crate::engine::usage::PinMode::Off => "off".to_string(),
                crate::engine::usage::PinMode::Auto => "auto".to_string(),
                crate::engine::usage::PinMode::File(p) => p.display().to_string(),
            }
        )?;
    }
    writeln!(
        out,
        "prompt {} tok, warm-up {} tok, measured {} tok, {}",
        work.prompt.len(),
        args.warmup,
        args.tokens,
        match &args.replay {
            Some(p) => format!("forced from --replay {}", p.display()),
            None => "greedy".into(),
        }
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<14} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>9} {:>10} {:>9}",
        "pass",
        "tok/s",
        "hit rate",
        "read MB/t",
        "need MB/t",
        "waste MB/t",
        "recall",
        "precision",
        "prefill s",
        "load s"
    )?;
    let pct = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{:.1}%", v * 100.0));
    for p in passes {
        let r = &p.result;
        let prof = r.profile.as_ref();
        writeln!(
            out,
            "{:<14} {:>9.3} {:>8.1}% {:>10.2} {:>10.2} {:>10.2} {:>8} {:>9} {:>10.2} {:>9.2}",
            p.name,
            r.tok_per_s(),
            r.window.hit_rate() * 100.0,
            mb(r.missed_bytes_per_token()),
            mb(r.needed_bytes_per_token()),
            mb(r.wasted_bytes_per_token()),
            pct(prof.and_then(|p| p.pilot_recall())),
            pct(prof.and_then(|p| p.pilot_precision())),
            r.prefill_secs,
            p.load_secs
        )?;
    }
    writeln!(out)?;
    let measured = &passes[0].result;
    let needed = measured.needed_bytes_per_token();
    let io_bound = if needed > 0.0 {
        disk_bw / needed
    } else {
        f64::INFINITY
    };
    let compute = passes.iter().find(|p| p.name == "all resident");
    writeln!(out, "disk bandwidth      {:>10.1} MB/s  {disk_how}", mb(disk_bw))?;
    writeln!(
        out,
        "I/O bound           {io_bound:>10.3} tok/s  (disk bandwidth / needed bytes per token: demand reads + prefetches used; wasted prefetch {:.2} MB/tok not counted)",
        mb(measured.wasted_bytes_per_token())
    )?;
    if let Some(p) = &measured.profile
        && p.reads > 0
        && measured.decode_secs > 0.0
    {
        let per_tok = |n: u64| n as f64 / measured.measured.max(1) as f64;
        writeln!(
            out,
            "I/O activity        reads busy {:.1}% of the window per worker ({} workers); per token {:.2} demand loads, {:.2} prefetch loads, {:.2} prefetches dropped unread when their layer's routing skipped them, {:.2} cancelled by the next step",
            p.read_ns as f64 / 1e9 / measured.decode_secs / opts.io_workers.max(1) as f64 * 100.0,
            opts.io_workers,
            per_tok(p.demand_loads),
            per_tok(p.prefetch_loads),
            per_tok(p.prefetch_dropped_unread),
            per_tok(p.loads_cancelled)
        )?;
    }
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
        writeln!(out, "compute bound       {cb:>10.3} tok/s  ({resident})")?;
        bound = bound.min(cb);
    }
    if bound.is_finite() && bound > 0.0 {
        writeln!(
            out,
            "measured / bound    {:>10.3}       (measured tok/s / min(I/O bound, compute bound))",
            measured.tok_per_s() / bound
        )?;
    }
    if let Some(strict) = passes.iter().find(|p| p.name == "no-overlap") {
        let s = strict.result.tok_per_s();
        if s > 0.0 {
            writeln!(
                out,
                "overlap / strict   {:>10.3}       (measured tok/s / no-overlap tok/s)",
                measured.tok_per_s() / s
            )?;
        }
    }
    if let Some(p) = &measured.profile
        && p.pilot_routed > 0
    {
        writeln!(
            out,
            "pilot               recall {} precision {}; recall of the predictions that arrived, late ones too: {}  ({} routings unpredicted, {} predictions late, {} residuals dropped, {} stale; dropped, stale and late count as misses)",
            pct(p.pilot_recall()),
            pct(p.pilot_precision()),
            pct(p.pilot_recall_untimed()),
            p.pilot_unpredicted,
            p.pilot_late,
            p.pilot_dropped,
            p.pilot_stale
        )?;
    }
    let first = &passes[0];
    writeln!(out, "{}", first.memory)?;
    if let (Some(rss), Some(total)) = (first.peak_rss, first.memory.engine_total()) {
        writeln!(
            out,
            "peak RSS            {:>10.2} GiB = {:.3} x the budget (after the measured pass)",
            rss as f64 / (1u64 << 30) as f64,
            rss as f64 / total as f64
        )?;
    }
    Ok(())
}
