//! `coli bench --streams N`: serving throughput through the decode loop.
//!
//! Three measurements in one process, on the same prompts:
//! 1. one stream decoded directly (`Session::generate`, the pre-runtime path)
//!    and the same request through the decode loop: the loop's overhead;
//! 2. one sampled stream through the loop, then N at once (continuous
//!    batching): the aggregate speed-up;
//! 3. the bound each run's own bytes set: dense weights per step plus every
//!    unique expert a step fetched, over the memory bandwidth measured here
//!    (and the bytes read from disk over the disk bandwidth, when streamed).

use std::io::Write;
use std::time::Instant;

use anyhow::Context;

use super::bench::BenchArgs;
use super::output::diag;
use crate::bounds::{ProbeOptions, mean_routed_expert_bytes, memory_bandwidth, probe};
use crate::engine::{Engine, EngineOptions};
use crate::model::olmoe::LoadOptions;
use crate::runtime::{DecodeLoop, Event, GenRequest, LoopConfig, PromptMode, SlotChoice};
use crate::sampling::{Sampler, SamplingParams};
use crate::synth::{ModelShape, synthetic_prompt};
use colibri_actors::StorageOptions;

/// What one loop run did.
struct Run {
    tokens: Vec<Vec<u32>>,
    secs: f64,
    steps: u64,
    step_rows: u64,
    fetches: u64,
    bytes_read: u64,
}

impl Run {
    fn generated(&self) -> usize {
        self.tokens.iter().map(Vec::len).sum()
    }
    fn tok_per_s(&self) -> f64 {
        self.generated() as f64 / self.secs.max(1e-9)
    }
}

pub(super) fn request(prompt: &[u32], tokens: usize, temperature: f32, seed: u64) -> GenRequest {
    GenRequest {
        slot: SlotChoice::Any,
        mode: PromptMode::Replace,
        prompt: prompt.to_vec(),
        max_tokens: tokens,
        sampling: SamplingParams {
            temperature,
            top_p: 1.0,
            top_k: 0,
            seed,
        },
        stop: Vec::new(),
        constraint: None,
        special_tokens: false,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The run with the median speed.
fn median_run(mut v: Vec<Run>) -> Run {
    v.sort_by(|a, b| a.tok_per_s().total_cmp(&b.tok_per_s()));
    let mid = v.len() / 2;
    v.swap_remove(mid)
}

/// Submits every request at once and reads all streams to their end.
fn run_streams(lp: &DecodeLoop, reqs: Vec<GenRequest>) -> anyhow::Result<Run> {
    let h = lp.handle();
    let (m0, s0) = (h.metrics(), h.source_stats());
    let t0 = Instant::now();
    let mut streams = reqs
        .into_iter()
        .map(|r| h.submit(r))
        .collect::<Result<Vec<_>, _>>()?;
    let mut tokens = Vec::with_capacity(streams.len());
    for s in &mut streams {
        let mut got = Vec::new();
        loop {
            match s.recv() {
                Some(Event::Text { tokens: t, .. }) => got.extend(t),
                Some(Event::Started { .. }) => {}
                Some(Event::Done(_)) => break,
                Some(Event::Failed(e)) => anyhow::bail!("a bench request failed: {e}"),
                None => anyhow::bail!("the decode loop stopped"),
            }
        }
        tokens.push(got);
    }
    let secs = t0.elapsed().as_secs_f64();
    let (m1, s1) = (h.metrics(), h.source_stats());
    Ok(Run {
        tokens,
        secs,
        steps: m1.steps - m0.steps,
        step_rows: m1.step_rows - m0.step_rows,
        fetches: (s1.hits + s1.misses) - (s0.hits + s0.misses),
        bytes_read: s1.bytes_read - s0.bytes_read,
    })
}

pub fn run(args: &BenchArgs, streams: usize) -> anyhow::Result<bool> {
    if streams == 0 || streams > crate::runtime::MAX_SLOTS {
        return Err(super::usage(format!(
            "--streams must be between 1 and {}",
            crate::runtime::MAX_SLOTS
        )));
    }
    let dir = args.model.resolve()?;
    let shape = ModelShape::load(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let opts = EngineOptions {
        kv_slots: streams,
        max_ctx: Some(args.prompt_len + args.tokens + 64),
        ..args.engine.options()
    };
    let prompts: Vec<Vec<u32>> = (0..streams as u64)
        .map(|i| synthetic_prompt(shape.vocab_size, args.prompt_len, args.prompt_seed + i))
        .collect();
    let n = args.tokens;
    let temp = args.stream_temperature;

    let greedy_req = || vec![request(&prompts[0], n, 0.0, 0)];
    // Stream 0 of the concurrent set is the single stream.
    let multi_req = || {
        (0..streams)
            .map(|i| request(&prompts[i], n, temp, 1 + i as u64))
            .collect::<Vec<_>>()
    };
    let rounds = args.rounds.max(1);
    let (mut direct, mut greedy, mut single, mut multi) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut direct_tokens = Vec::new();
    let mut mem_bw = 0f64;
    let mut step_dense = 0f64;
    let mut placement = String::new();
    for round in 1..=rounds {
        // Direct, one greedy stream (the path before the runtime). Every
        // pass runs once unmeasured first, so each measured pass finds the
        // experts it routes to already touched (page cache, decoded slots).
        diag!("bench: round {round}/{rounds}: direct single stream ...");
        let mut engine = Engine::load_with_progress(&dir, &opts, crate::progress::load_progress())
            .with_context(|| format!("loading {}", dir.display()))?;
        step_dense = engine.model.step_dense_bytes() as f64;
        let mut session = engine.new_session();
        let mut sampler = Sampler::new(SamplingParams::default());
        session.generate(&mut engine, &prompts[0], n, &mut sampler, &mut |_| true)?;
        session.reset();
        let t0 = Instant::now();
        let mut toks = Vec::new();
        session.generate(&mut engine, &prompts[0], n, &mut sampler, &mut |t| {
            toks.push(t);
            true
        })?;
        direct.push(toks.len() as f64 / t0.elapsed().as_secs_f64().max(1e-9));
        direct_tokens = toks;
        drop(session);
        drop(engine);

        diag!("bench: round {round}/{rounds}: decode loop, 1 and {streams} streams ...");
        let engine = Engine::load_with_progress(&dir, &opts, crate::progress::load_progress())
            .with_context(|| format!("loading {}", dir.display()))?;
        placement = engine.memory.to_string();
        let max_ctx = engine.model.max_positions().min(args.prompt_len + n + 64);
        let cfg = LoopConfig {
            slots: streams,
            max_ctx,
            queue_cap: streams,
            threads: args.engine.threads.map(|t| t as usize),
            ..LoopConfig::default()
        };
        let lp = DecodeLoop::spawn(engine, &cfg, Box::new(std::io::sink()))?;
        run_streams(&lp, greedy_req())?;
        greedy.push(run_streams(&lp, greedy_req())?);
        run_streams(&lp, multi_req())?;
        single.push(run_streams(&lp, multi_req().into_iter().take(1).collect())?);
        multi.push(run_streams(&lp, multi_req())?);
        lp.shutdown()?;
        // The roofline is the best read speed seen in any round.
        mem_bw = mem_bw.max(memory_bandwidth(256 << 20));
    }
    let direct_tps = median(direct.clone());
    let (greedy, single, multi) = (median_run(greedy), median_run(single), median_run(multi));

    // 3. The bounds.
    let ck = crate::engine::ModelFiles::resolve(&dir)?.weights()?;
    let (map, _) = shape.expert_map(&ck, LoadOptions::default())?;
    drop(ck);
    let expert_bytes = mean_routed_expert_bytes(&map);
    // Runs that read experts from disk are also bound by the disk: the
    // same probe as `coli bench` (random reads of the model's own expert
    // extents at the I/O workers' queue depth).
    let read_any = [&greedy, &single, &multi].iter().any(|r| r.bytes_read > 0);
    let disk_bw = if read_any {
        let storage = StorageOptions {
            direct: opts.direct,
            mmap: opts.mmap,
            ..StorageOptions::default()
        };
        let p = probe(
            &map,
            &ProbeOptions {
                bytes: args.probe_mb.saturating_mul(1 << 20),
                queue_depth: opts.io_workers,
                storage,
                ..ProbeOptions::default()
            },
        )?;
        Some((p.max(), p.describe()))
    } else {
        None
    };
    // Reads and compute overlap, so the bound is the slower of the two.
    // The disk figure is never below what the run itself read a second,
    // so a probe that undersells the disk cannot put the bound under the
    // run.
    let bound = |r: &Run| {
        let touched = r.steps as f64 * step_dense + r.fetches as f64 * expert_bytes;
        let mem_secs = touched / mem_bw;
        let disk_secs = disk_bw.as_ref().map_or(0.0, |(bw, _)| {
            let bw = bw.max(r.bytes_read as f64 / r.secs.max(1e-9));
            r.bytes_read as f64 / bw
        });
        r.generated() as f64 / mem_secs.max(disk_secs)
    };

    let mb = |b: f64| b / 1e6;
    let mut out = super::output::stdout();
    writeln!(
        out,
        "model {}: {} layers, {} experts top-{}",
        dir.display(),
        shape.num_hidden_layers,
        shape.num_experts,
        shape.num_experts_per_tok
    )?;
    writeln!(out, "{placement}")?;
    writeln!(
        out,
        "prompt {} tok, {n} tokens per stream, sampled streams at temperature {temp} (seeded)",
        args.prompt_len
    )?;
    writeln!(
        out,
        "memory bandwidth    {:>10.1} MB/s  (SIMD read of 256 MiB on the bench threads, best of 5 per round, best round)",
        mb(mem_bw)
    )?;
    if let Some((bw, desc)) = &disk_bw {
        writeln!(
            out,
            "disk probe          {:>10.1} MB/s  (best repeat; each run's bound uses the larger of this and its own read rate) {desc}",
            mb(*bw),
        )?;
    }
    writeln!(
        out,
        "rounds              {rounds:>10}       (interleaved; each row is the median round)"
    )?;
    writeln!(
        out,
        "direct rounds       {:?}",
        direct
            .iter()
            .map(|t| (t * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<22} {:>8} {:>9} {:>10} {:>8} {:>12} {:>11} {:>10} {:>9}",
        "run", "streams", "tok/s", "steps", "seq/step", "experts/step", "MB/step", "bound t/s", "/ bound"
    )?;
    let row = |out: &mut dyn Write, name: &str, r: &Run| -> std::io::Result<()> {
        let steps = r.steps.max(1) as f64;
        let per_step = (step_dense + r.fetches as f64 * expert_bytes / steps) / 1e6;
        let b = bound(r);
        writeln!(
            out,
            "{:<22} {:>8} {:>9.3} {:>10} {:>8.2} {:>12.1} {:>11.1} {:>10.3} {:>9.3}",
            name,
            r.tokens.len(),
            r.tok_per_s(),
            r.steps,
            r.step_rows as f64 / steps,
            r.fetches as f64 / steps,
            per_step,
            b,
            r.tok_per_s() / b
        )?;
        if r.bytes_read > 0 {
            writeln!(
                out,
                "{:<22} read from disk {:.1} MB/step",
                "",
                mb(r.bytes_read as f64 / steps)
            )?;
        }
        Ok(())
    };
    writeln!(out, "{:<22} {:>8} {:>9.3}", "direct (greedy)", 1, direct_tps)?;
    row(&mut out, "loop, greedy", &greedy)?;
    row(&mut out, "loop, sampled", &single)?;
    row(&mut out, "loop, sampled", &multi)?;
    writeln!(out)?;
    writeln!(
        out,
        "loop / direct       {:>10.3}       (single greedy stream through the decode loop vs Session::generate)",
        greedy.tok_per_s() / direct_tps
    )?;
    writeln!(
        out,
        "aggregate speed-up  {:>10.3}       ({streams} streams' tok/s / one stream's, same sampling)",
        multi.tok_per_s() / single.tok_per_s()
    )?;
    let same = greedy.tokens.first() == Some(&direct_tokens);
    if same {
        writeln!(
            out,
            "deterministic: the loop's greedy stream equals the direct one"
        )?;
    } else {
        writeln!(
            out,
            "DETERMINISM FAILURE: the loop's greedy stream differs from the direct one"
        )?;
    }
    Ok(same)
}
