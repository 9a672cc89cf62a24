//! `coli bench --conversations N`: agents taking turns through the decode
//! loop, each resending its whole conversation, on fewer slots than there
//! are conversations (`--kv-slots`).
//!
//! Each turn's prompt is the conversation's history (what its slot held
//! after the last turn: prompt and reply) plus `--turn-len` new tokens. The
//! tokens that must be computed are those new ones and the last reply
//! token (never computed before the next turn); the run reports how many
//! the loop computed per turn over that, and the turn latency, once with
//! the prompt cache off and once on. Replies are greedy, so both runs must
//! produce the same tokens.

use std::time::Instant;

use anyhow::Context;

use super::bench::BenchArgs;
use crate::engine::{Engine, EngineOptions, PromptCacheSize};
use crate::runtime::{DecodeLoop, Event, GenRequest, LoopConfig, LoopHandle, PromptMode, SlotChoice};
use crate::sampling::SamplingParams;
use crate::synth::{ModelShape, synthetic_prompt};

/// One turn as the loop reported it.
struct Turn {
    computed: usize,
    new: usize,
    secs: f64,
    reply: Vec<u32>,
}

/// One run: every turn, by round, and the cache's figures.
struct Run {
    rounds: Vec<Vec<Turn>>,
    cache_bytes: u64,
    restored: u64,
}

impl Run {
    /// Computed over new tokens, summed over the rounds after the first.
    fn ratio(&self) -> f64 {
        let later = || self.rounds.iter().skip(1).flatten();
        let computed: usize = later().map(|t| t.computed).sum();
        let new: usize = later().map(|t| t.new).sum();
        computed as f64 / new.max(1) as f64
    }

    /// Median turn latency of the rounds after the first, in ms.
    fn median_ms(&self) -> f64 {
        let mut v: Vec<f64> = self.rounds.iter().skip(1).flatten().map(|t| t.secs).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0) * 1e3
    }

    fn replies(&self) -> Vec<&[u32]> {
        self.rounds.iter().flatten().map(|t| t.reply.as_slice()).collect()
    }
}

/// Runs `prompt` alone; returns what was computed, the reply, the slot's
/// history afterwards and the latency.
fn turn(h: &LoopHandle, prompt: Vec<u32>, tokens: usize) -> anyhow::Result<(usize, Vec<u32>, Vec<u32>, f64)> {
    let req = GenRequest {
        slot: SlotChoice::Any,
        mode: PromptMode::Replace,
        prompt,
        max_tokens: tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        constraint: None,
        special_tokens: false,
    };
    let t0 = Instant::now();
    let mut s = h.submit(req)?;
    let (mut slot, mut computed, mut reply) = (None, 0, Vec::new());
    loop {
        match s.recv() {
            Some(Event::Started {
                slot: sl, prefill, ..
            }) => {
                slot = Some(sl);
                computed = prefill;
            }
            Some(Event::Text { tokens, .. }) => reply.extend(tokens),
            Some(Event::Done(_)) => break,
            Some(Event::Failed(e)) => anyhow::bail!("a bench turn failed: {e}"),
            None => anyhow::bail!("the decode loop stopped"),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let slot = slot.context("the decode loop did not say which slot it used")?;
    Ok((computed, reply, h.slot_tokens(slot)?, secs))
}

fn run_once(
    dir: &std::path::Path,
    opts: &EngineOptions,
    args: &BenchArgs,
    (conversations, slots, turns): (usize, usize, usize),
    vocab: usize,
) -> anyhow::Result<Run> {
    let engine = Engine::load(dir, opts).with_context(|| format!("loading {}", dir.display()))?;
    let need = args.prompt_len + turns * (args.turn_len + args.tokens + 1) + 8;
    let max_ctx = engine.model.max_positions();
    if need > max_ctx {
        return Err(super::usage(format!(
            "--prompt-len {} + --turns {turns} x (--turn-len {} + --tokens {}) needs {need} positions; the model has {max_ctx}",
            args.prompt_len, args.turn_len, args.tokens
        )));
    }
    let cfg = LoopConfig {
        slots,
        max_ctx: need,
        queue_cap: 1,
        threads: args.engine.threads.map(|t| t as usize),
        ..LoopConfig::default()
    };
    let lp = DecodeLoop::spawn(engine, &cfg, Box::new(std::io::sink()))?;
    let h = lp.handle();
    let cache_bytes = h.info().prompt_cache_bytes;
    let mut histories: Vec<Vec<u32>> = vec![Vec::new(); conversations];
    let mut rounds = Vec::with_capacity(turns);
    for round in 0..turns {
        let mut this = Vec::with_capacity(conversations);
        for (c, history) in histories.iter_mut().enumerate() {
            let seed = args.prompt_seed + (c * turns + round) as u64;
            let (prompt, new) = if round == 0 {
                let p = synthetic_prompt(vocab, args.prompt_len, seed);
                let n = p.len();
                (p, n)
            } else {
                let mut p = history.clone();
                p.extend(synthetic_prompt(vocab, args.turn_len, seed));
                let n = p.len() - history.len() + 1;
                (p, n)
            };
            let (computed, reply, after, secs) = turn(&h, prompt, args.tokens)?;
            *history = after;
            this.push(Turn {
                computed,
                new,
                secs,
                reply,
            });
        }
        rounds.push(this);
    }
    let restored = h.metrics().restored_tokens;
    lp.shutdown()?;
    Ok(Run {
        rounds,
        cache_bytes,
        restored,
    })
}

pub fn run(args: &BenchArgs, conversations: usize) -> anyhow::Result<bool> {
    let slots = args.kv_slots;
    let turns = args.turns;
    if conversations == 0 || slots == 0 || slots > crate::runtime::MAX_SLOTS || turns < 2 {
        return Err(super::usage(format!(
            "--conversations must be at least 1, --kv-slots between 1 and {}, --turns at least 2",
            crate::runtime::MAX_SLOTS
        )));
    }
    if args.turn_len == 0 {
        return Err(super::usage("--turn-len must be at least 1"));
    }
    let dir = args.model.resolve()?;
    let shape = ModelShape::load(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let base = EngineOptions {
        kv_slots: slots,
        max_ctx: Some(args.prompt_len + turns * (args.turn_len + args.tokens + 1) + 8),
        ..args.engine.options()
    };
    let on_size = super::serve::prompt_cache_size(args.prompt_cache_mb);
    let shape3 = (conversations, slots, turns);
    eprintln!("bench: {conversations} conversations on {slots} slots, prompt cache off ...");
    let off = EngineOptions {
        prompt_cache: PromptCacheSize::Bytes(0),
        ..base.clone()
    };
    let off = run_once(&dir, &off, args, shape3, shape.vocab_size)?;
    eprintln!("bench: {conversations} conversations on {slots} slots, prompt cache on ...");
    let on = EngineOptions {
        prompt_cache: on_size,
        ..base
    };
    let on = run_once(&dir, &on, args, shape3, shape.vocab_size)?;

    println!(
        "model {}: {conversations} conversations on {slots} slots, {turns} turns each: first prompt {} tok, then {} new tok per turn, {} reply tok (greedy)",
        dir.display(),
        args.prompt_len,
        args.turn_len,
        args.tokens
    );
    println!();
    println!(
        "{:<26} {:>18} {:>18} {:>16}",
        "prompt cache", "computed / new", "turn ms (median)", "restored pos"
    );
    for (name, r) in [
        ("off".to_string(), &off),
        (format!("on ({:.1} MiB)", mib(on.cache_bytes)), &on),
    ] {
        println!(
            "{:<26} {:>18.2} {:>18.1} {:>16}",
            name,
            r.ratio(),
            r.median_ms(),
            r.restored
        );
    }
    println!();
    println!("(turns after the first round; new = the turn's new tokens + the last reply token)");
    let same = on.replies() == off.replies();
    if same {
        println!("exact: every reply with the prompt cache equals the reply without it");
    } else {
        println!("EXACTNESS FAILURE: replies differ with the prompt cache on");
    }
    Ok(same)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}
