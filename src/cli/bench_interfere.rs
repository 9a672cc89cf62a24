//! `coli bench --interfere N`: what a long prompt does to a stream that is
//! already decoding. One slot decodes a short prompt; once it is producing
//! tokens, a second slot submits an N-token prompt. The decode loop splits
//! that prompt into `--prefill-chunk` pieces, one per step, so the running
//! stream keeps getting a token every step while the long prompt is read;
//! this measures the gaps between its tokens before and during that
//! prefill, and the long prompt's own prefill speed.

use std::time::Instant;

use anyhow::Context;

use super::bench::BenchArgs;
use super::output::diag;
use crate::engine::{Engine, EngineOptions};
use crate::runtime::{DecodeLoop, Event, GenRequest, LoopConfig, RequestStream};
use crate::synth::{ModelShape, synthetic_prompt};

/// A greedy request (the same builder as the `--streams` runs).
fn request(prompt: Vec<u32>, max_tokens: usize) -> GenRequest {
    super::bench_streams::request(&prompt, max_tokens, 0.0, 0)
}

/// Reads a stream to its end, giving the arrival time of each token (and
/// telling `on_token` of each as it comes).
fn token_times(mut s: RequestStream, mut on_token: impl FnMut(Instant)) -> anyhow::Result<Vec<Instant>> {
    let mut times = Vec::new();
    loop {
        match s.recv() {
            Some(Event::Text { tokens, .. }) => {
                let now = Instant::now();
                for _ in &tokens {
                    times.push(now);
                    on_token(now);
                }
            }
            Some(Event::Started { .. }) => {}
            Some(Event::Done(_)) => return Ok(times),
            Some(Event::Failed(e)) => anyhow::bail!("a bench request failed: {e}"),
            None => anyhow::bail!("the decode loop stopped"),
        }
    }
}

/// Milliseconds between consecutive instants.
fn gaps_ms(times: &[Instant]) -> Vec<f64> {
    times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

pub fn run(args: &BenchArgs, long: usize) -> anyhow::Result<bool> {
    let chunk = args.prefill_chunk;
    if long == 0 || chunk == 0 {
        return Err(super::usage("--interfere and --prefill-chunk must be at least 1"));
    }
    let dir = args.model.resolve()?;
    let shape = ModelShape::load(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let short_ctx = args.prompt_len + args.tokens + 8;
    let ctx = long.max(short_ctx) + 8;
    let opts = EngineOptions {
        kv_slots: 2,
        max_ctx: Some(ctx),
        ..args.engine.options()
    };
    let limit = crate::engine::ModelFiles::resolve(&dir)?
        .config()
        .with_context(|| format!("reading {}", dir.display()))?
        .max_positions();
    if ctx > limit {
        return Err(super::usage(format!(
            "--interfere {long} needs {ctx} positions; the model has {limit}"
        )));
    }
    let engine = Engine::load_with_progress(&dir, &opts, crate::progress::load_progress())
        .with_context(|| format!("loading {}", dir.display()))?;
    let placement = engine.memory.to_string();
    let cfg = LoopConfig {
        slots: 2,
        max_ctx: ctx,
        queue_cap: 2,
        prefill_chunk: chunk,
        threads: args.engine.threads.map(|t| t as usize),
        ..LoopConfig::default()
    };
    let lp = DecodeLoop::spawn(engine, &cfg, Box::new(std::io::sink()))?;
    let h = lp.handle();
    let short = synthetic_prompt(shape.vocab_size, args.prompt_len, args.prompt_seed);
    // Three different long prompts, so that none reuses another's prefix
    // (from the other slot or the prompt cache).
    let long_prompt = |k: u64| synthetic_prompt(shape.vocab_size, long, args.prompt_seed + 1 + k);

    // A long prompt alone, once unmeasured (first touches) and once
    // measured: its prefill speed without a stream beside it.
    diag!("bench: the {long}-token prompt alone ...");
    token_times(h.submit(request(long_prompt(0), 1))?, |_| {})?;
    let t0 = Instant::now();
    token_times(h.submit(request(long_prompt(1), 1))?, |_| {})?;
    let alone = t0.elapsed().as_secs_f64();

    diag!("bench: a decoding stream, then the {long}-token prompt beside it ...");
    let warm = args.warmup.max(2);
    let stream = h.submit(request(short, warm + args.tokens))?;
    let (tx, rx) = std::sync::mpsc::channel::<Instant>();
    let reader = std::thread::spawn(move || {
        // The receiver stops listening once the stream is warm.
        token_times(stream, |t| {
            let _ = tx.send(t);
        })
    });
    for _ in 0..warm {
        rx.recv()
            .context("the decoding stream ended before it was warm")?;
    }
    let submitted = Instant::now();
    let steps0 = h.metrics().steps;
    let long_first = token_times(h.submit(request(long_prompt(2), 1))?, |_| {})?;
    let prefilled = long_first.first().copied().unwrap_or_else(Instant::now);
    let steps = h.metrics().steps - steps0;
    let times = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the stream reader panicked"))??;
    lp.shutdown()?;

    let before: Vec<Instant> = times.iter().copied().filter(|t| *t <= submitted).collect();
    let during: Vec<Instant> = times
        .iter()
        .copied()
        .filter(|t| *t > submitted && *t <= prefilled)
        .collect();
    let after: Vec<Instant> = times.iter().copied().filter(|t| *t > prefilled).collect();
    // A gap belongs to the window its later token falls in.
    let gaps = gaps_ms(&times);
    let window = |lo: Option<Instant>, hi: Option<Instant>| -> Vec<f64> {
        times
            .windows(2)
            .zip(&gaps)
            .filter(|(w, _)| lo.is_none_or(|lo| w[1] > lo) && hi.is_none_or(|hi| w[1] <= hi))
            .map(|(_, g)| *g)
            .collect()
    };
    let g_before = window(None, Some(submitted));
    let g_during = window(Some(submitted), Some(prefilled));
    let g_after = window(Some(prefilled), None);
    let beside = (prefilled - submitted).as_secs_f64();

    println!("model       {}", dir.display());
    println!("placement   {placement}");
    println!(
        "long prompt {long} tokens in chunks of {chunk}: {} chunks; alone {alone:.2}s ({:.1} tok/s), \
         beside a decoding stream {beside:.2}s ({:.1} tok/s) over {steps} steps",
        long.div_ceil(chunk),
        long as f64 / alone.max(1e-9),
        long as f64 / beside.max(1e-9),
    );
    println!(
        "stream      tokens before / during / after the prefill: {} / {} / {}",
        before.len(),
        during.len(),
        after.len()
    );
    println!(
        "stream gap  before: median {:.1} ms; during: median {:.1} ms, max {:.1} ms; after: median {:.1} ms",
        median(g_before),
        median(g_during.clone()),
        max(&g_during),
        median(g_after),
    );
    Ok(true)
}
