//! Speculative decoding in the decode loop on a replayed code-editing
//! conversation: tok/s with `--draft ngram` (each `--draft-k`) against drafts off, one stream
//! and N at once (docs/benchmarks.md, "Speculative decoding in the decode
//! loop").
//!
//! The replies are teacher-forced: a wrapper around the real model runs
//! every forward in full (same weights, same expert reads, every logit row
//! the loop asks for), then rewrites the rows of the fixture's
//! conversations so that the reply's next token is their argmax. Random
//! and truncated weights do not repeat their prompt, and a trained model
//! that does is too large for this machine; forcing keeps the loop, the
//! drafts, their verification and the truncation of rejected positions
//! exactly as served, and makes the acceptance the conversation's own.
//! Greedy decoding, so every run must print the reply itself (checked).
//!
//! ```sh
//! cargo run --release --example replay_drafts -- --model DIR \
//!     [--fixture fixtures/replay/code-edit.json] [--tokens 128] [--streams 4] [--draft-k 3,7] [--rounds 2] [ENGINE FLAGS]
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;
use colibri::cli::EngineArgs;
use colibri::engine::Engine;
use colibri::engine::speculative::{DraftMode, SpecOptions};
use colibri::model::expert::ExpertWeights;
use colibri::model::kv_cache::KvTypes;
use colibri::model::lm::{BatchItem, ForwardError, LanguageModel, Logits, SequenceState, logit_rows};
use colibri::runtime::{DecodeLoop, Event, GenRequest, LoopConfig, PromptMode, SlotChoice};
use colibri::sampling::SamplingParams;
use colibri_actors::{ExpertSource, Tag};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    model: PathBuf,
    /// `{"conversations": [{"prompt": TEXT, "reply": TEXT}, ...]}`.
    #[arg(long, default_value = "fixtures/replay/code-edit.json")]
    fixture: PathBuf,
    /// Reply tokens decoded per stream (at most the reply's length).
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Streams of the concurrent run (conversations, reused in turn).
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// Draft lengths to measure, each against drafts off.
    #[arg(long, value_delimiter = ',', default_values_t = [3usize, 7])]
    draft_k: Vec<usize>,
    /// Interleaved rounds (off then on, per round); medians are printed.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    #[command(flatten)]
    engine: EngineArgs,
}

/// The real model, with the conversations' next tokens forced.
struct Replay {
    inner: Box<dyn LanguageModel>,
    convs: Arc<Vec<Vec<u32>>>,
    /// Which conversation a sequence state holds (by the state's address,
    /// stable while its session lives), learned from its prefill chunks.
    owner: HashMap<usize, usize>,
}

fn key(s: &dyn SequenceState) -> usize {
    s as *const dyn SequenceState as *const () as usize
}

impl Replay {
    fn learn(&mut self, key: usize, pos: usize, tokens: &[u32]) {
        if tokens.len() < 8 {
            return;
        }
        let m: Vec<usize> = (0..self.convs.len())
            .filter(|&c| self.convs[c].get(pos..pos + tokens.len()) == Some(tokens))
            .collect();
        if let [c] = m[..] {
            self.owner.insert(key, c);
        }
    }

    fn force(&self, key: usize, pos: usize, n: usize, want: Logits, logits: &mut [f32]) {
        let Some(&c) = self.owner.get(&key) else {
            return;
        };
        let vocab = self.inner.vocab_size();
        for (r, t) in logit_rows(want, n).enumerate() {
            if let Some(&next) = self.convs[c].get(pos + t + 1)
                && let Some(row) = logits.get_mut(r * vocab..(r + 1) * vocab)
            {
                row.fill(0.0);
                row[next as usize] = 1.0;
            }
        }
    }
}

impl LanguageModel for Replay {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn max_positions(&self) -> usize {
        self.inner.max_positions()
    }
    fn fingerprint(&self) -> u64 {
        self.inner.fingerprint()
    }
    fn new_state(&self) -> Box<dyn SequenceState> {
        self.inner.new_state()
    }
    fn set_kv_types(&mut self, kv: KvTypes) -> bool {
        self.inner.set_kv_types(kv)
    }
    fn forward(
        &mut self,
        tokens: &[u32],
        state: &mut dyn SequenceState,
        tag: Tag,
        logits: Logits,
    ) -> Result<Vec<f32>, ForwardError> {
        let (k, pos) = (key(state), state.len());
        self.learn(k, pos, tokens);
        let mut out = self.inner.forward(tokens, state, tag, logits)?;
        self.force(k, pos, tokens.len(), logits, &mut out);
        Ok(out)
    }
    fn forward_batch(
        &mut self,
        items: &mut [BatchItem<'_>],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let seen: Vec<(usize, usize, usize, Logits)> = items
            .iter()
            .map(|it| (key(&*it.state), it.state.len(), it.tokens.len(), it.logits))
            .collect();
        for (it, &(k, pos, _, _)) in items.iter().zip(&seen) {
            self.learn(k, pos, it.tokens);
        }
        let mut out = self.inner.forward_batch(items, tag)?;
        for (o, &(k, pos, n, want)) in out.iter_mut().zip(&seen) {
            self.force(k, pos, n, want, o);
        }
        Ok(out)
    }
    fn source(&self) -> &Arc<dyn ExpertSource<ExpertWeights>> {
        self.inner.source()
    }
    fn dense_bytes(&self) -> usize {
        self.inner.dense_bytes()
    }
    fn step_dense_bytes(&self) -> usize {
        self.inner.step_dense_bytes()
    }
    fn draft(
        &mut self,
        state: &mut dyn SequenceState,
        next: u32,
        k: usize,
        tag: Tag,
    ) -> Result<Vec<u32>, ForwardError> {
        self.inner.draft(state, next, k, tag)
    }
    fn draft_head(&self) -> Result<(), String> {
        self.inner.draft_head()
    }
}

/// CPU seconds this process has used (every thread; /proc/self/stat's
/// utime + stime at 100 ticks a second), 0 where unreadable.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which ends at the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    (tick(11) + tick(12)) / 100.0
}

/// What one measured run did.
struct Run {
    tok_per_s: f64,
    /// Tokens per CPU second of the process: what the run would do on
    /// cores of its own, when the machine is shared (as here).
    tok_per_cpu_s: f64,
    steps: u64,
    proposed: u64,
    accepted: u64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn request(slot: usize, prompt: &[u32], max_tokens: usize) -> GenRequest {
    GenRequest {
        slot: SlotChoice::Exact(slot),
        mode: PromptMode::Replace,
        prompt: prompt.to_vec(),
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        constraint: None,
        special_tokens: false,
    }
}

/// Runs conversations `0..streams` (stream i in slot i) at once; checks
/// every stream printed its reply's first `n` tokens.
fn run(
    lp: &DecodeLoop,
    prompts: &[Vec<u32>],
    replies: &[Vec<u32>],
    streams: usize,
    n: usize,
) -> anyhow::Result<Run> {
    let h = lp.handle();
    let m0 = h.metrics();
    let (t0, c0) = (Instant::now(), cpu_secs());
    let mut ss = (0..streams)
        .map(|i| h.submit(request(i, &prompts[i % prompts.len()], n)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut total = 0;
    for (i, s) in ss.iter_mut().enumerate() {
        let mut got = Vec::new();
        loop {
            match s.recv() {
                Some(Event::Text { tokens, .. }) => got.extend(tokens),
                Some(Event::Started { .. }) => {}
                Some(Event::Done(_)) => break,
                Some(Event::Failed(e)) => bail!("stream {i} failed: {e}"),
                None => bail!("the decode loop stopped"),
            }
        }
        let want = &replies[i % replies.len()];
        if got[..] != want[..n.min(want.len())] {
            bail!("stream {i} did not replay its reply: {got:?}");
        }
        total += got.len();
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs() - c0;
    let m1 = h.metrics();
    Ok(Run {
        tok_per_s: total as f64 / secs,
        tok_per_cpu_s: total as f64 / cpu.max(1e-9),
        steps: m1.steps - m0.steps,
        proposed: m1.draft_proposed - m0.draft_proposed,
        accepted: m1.draft_accepted - m0.draft_accepted,
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let fixture: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&args.fixture).with_context(|| format!("reading {}", args.fixture.display()))?,
    )?;
    let Some(list) = fixture["conversations"].as_array() else {
        bail!("{}: no conversations", args.fixture.display());
    };
    let streams = args.streams.max(1);
    let opts = colibri::engine::EngineOptions {
        kv_slots: streams,
        ..args.engine.options()
    };
    let mut placement = String::new();
    let (mut prompts, mut replies, mut convs) = (Vec::new(), Vec::new(), Vec::new());
    // 0: drafts off. One loop per setting, all alive at once, so that the
    // runs compared interleave closely (this machine is shared).
    let ks: Vec<usize> = std::iter::once(0).chain(args.draft_k.iter().copied()).collect();
    let mut loops = Vec::new();
    for &k in &ks {
        let mut engine =
            Engine::load(&args.model, &opts).with_context(|| format!("loading {}", args.model.display()))?;
        if convs.is_empty() {
            let tok = engine.tokenizer()?;
            for c in list {
                let p = tok.encode(c["prompt"].as_str().unwrap_or_default())?;
                let r = tok.encode(c["reply"].as_str().unwrap_or_default())?;
                let mut all = p.clone();
                all.extend(&r);
                prompts.push(p);
                replies.push(r);
                convs.push(all);
            }
            let lens: Vec<(usize, usize)> = prompts
                .iter()
                .zip(&replies)
                .map(|(p, r)| (p.len(), r.len()))
                .collect();
            eprintln!("conversations (prompt, reply tokens): {lens:?}");
        }
        placement = engine.memory.to_string();
        engine.stop_ids.clear();
        let inner = engine.model;
        engine.model = Box::new(Replay {
            inner,
            convs: Arc::new(convs.clone()),
            owner: HashMap::new(),
        });
        let longest = convs.iter().map(Vec::len).max().unwrap_or(0);
        let cfg = LoopConfig {
            slots: streams,
            max_ctx: engine.model.max_positions().min(longest + 64),
            queue_cap: streams,
            threads: args.engine.threads.map(|t| t as usize),
            draft: (k > 0).then(|| SpecOptions {
                mode: DraftMode::Ngram,
                max_draft: k,
                ..SpecOptions::default()
            }),
            ..LoopConfig::default()
        };
        let lp = DecodeLoop::spawn(engine, &cfg, Box::new(std::io::sink()))?;
        // Prompts in first (prefill only), then one unmeasured pass.
        let h = lp.handle();
        for i in 0..streams {
            let mut s = h.submit(request(i, &prompts[i % prompts.len()], 0))?;
            while !matches!(s.recv(), Some(Event::Done(_) | Event::Failed(_)) | None) {}
        }
        run(&lp, &prompts, &replies, streams, 16)?;
        loops.push((k, lp));
    }
    let mut results: HashMap<(usize, usize), Vec<Run>> = HashMap::new();
    for round in 1..=args.rounds.max(1) {
        for n in [1, streams] {
            for (k, lp) in &loops {
                let r = run(lp, &prompts, &replies, n, args.tokens)?;
                eprintln!(
                    "round {round}: drafts of {k}, {n} stream(s): {:.2} tok/s, {:.2} tok/cpu-s, {} steps, {}/{} drafts accepted",
                    r.tok_per_s, r.tok_per_cpu_s, r.steps, r.accepted, r.proposed
                );
                results.entry((*k, n)).or_default().push(r);
            }
        }
    }
    for (_, lp) in loops {
        lp.shutdown()?;
    }
    println!("model {}: {placement}", args.model.display());
    println!(
        "{} reply tokens per stream, teacher-forced, greedy; {} rounds, medians",
        args.tokens, args.rounds
    );
    println!(
        "{:<8} {:>8} {:>9} {:>9} {:>11} {:>9} {:>7} {:>10}",
        "streams", "drafts", "tok/s", "speed-up", "tok/cpu-s", "speed-up", "steps", "accepted"
    );
    for n in [1, streams] {
        let med = |k: usize, f: fn(&Run) -> f64| median(results[&(k, n)].iter().map(f).collect());
        let (off, off_cpu) = (med(0, |r| r.tok_per_s), med(0, |r| r.tok_per_cpu_s));
        for &k in &ks {
            let rs = &results[&(k, n)];
            let (tps, cps) = (med(k, |r| r.tok_per_s), med(k, |r| r.tok_per_cpu_s));
            let last = &rs[rs.len() - 1];
            println!(
                "{:<8} {:>8} {:>9.2} {:>9.2} {:>11.2} {:>9.2} {:>7} {:>10}",
                n,
                if k == 0 {
                    "off".to_string()
                } else {
                    format!("ngram {k}")
                },
                tps,
                tps / off,
                cps,
                cps / off_cpu,
                last.steps,
                format!("{}/{}", last.accepted, last.proposed)
            );
        }
    }
    Ok(())
}
