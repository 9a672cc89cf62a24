//! The prompt cache through the decode loop, on the bundled model: which
//! slot a conversation's next turn finds, how many of its tokens are
//! computed again when conversations outnumber the slots, and that copied
//! positions give the same tokens as computed ones. Every check is a count
//! the loop reports (`Started.prefill`), never a time.

use std::path::{Path, PathBuf};

use colibri::chat_template::ChatMessage;
use colibri::convert::convert;
use colibri::engine::{Engine, EngineOptions, PromptCacheSize};
use colibri::quant::QFormat;
use colibri::runtime::{
    DecodeLoop, Event, GenRequest, LoopConfig, LoopHandle, PromptMode, RequestError, SlotChoice,
};
use colibri::sampling::SamplingParams;

const CTX: usize = 1024;

fn model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny")
}

fn start(slots: usize, cache: PromptCacheSize) -> DecodeLoop {
    start_on(&model(), CTX, slots, cache)
}

fn start_on(model: &Path, ctx: usize, slots: usize, cache: PromptCacheSize) -> DecodeLoop {
    let opts = EngineOptions {
        kv_slots: slots,
        max_ctx: Some(ctx),
        prompt_cache: cache,
        ..EngineOptions::default()
    };
    let engine = Engine::load(model, &opts).unwrap();
    let cfg = LoopConfig {
        slots,
        max_ctx: ctx,
        queue_cap: 8,
        threads: Some(2),
        ..LoopConfig::default()
    };
    DecodeLoop::spawn(engine, &cfg, Box::new(std::io::sink())).unwrap()
}

const ON: PromptCacheSize = PromptCacheSize::Bytes(64 << 20);
const OFF: PromptCacheSize = PromptCacheSize::Bytes(0);

/// Tokens of `messages` rendered with the model's template.
fn render(h: &LoopHandle, messages: &[ChatMessage], generation_prompt: bool) -> Vec<u32> {
    let info = h.info();
    let text = info.template.render(messages, generation_prompt).unwrap();
    info.tokenizer().unwrap().encode(&text).unwrap()
}

/// A user message of `words` repeated until its turn has at least `min` tokens.
fn long_message(h: &LoopHandle, words: &str, min: usize) -> String {
    let mut text = String::new();
    while render(h, &[ChatMessage::user(&text)], true).len() < min {
        text.push_str(words);
    }
    text
}

/// One request, run alone to its end.
struct Turn {
    slot: usize,
    /// Prompt tokens the loop computed.
    prefill: usize,
    /// What the slot holds afterwards: the prompt and the reply.
    history: Vec<u32>,
    reply: Vec<u32>,
}

fn turn(h: &LoopHandle, prompt: Vec<u32>, max_tokens: usize) -> Turn {
    let req = GenRequest {
        slot: SlotChoice::Any,
        mode: PromptMode::Replace,
        prompt,
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        constraint: None,
        special_tokens: false,
    };
    let mut s = h.submit(req).unwrap();
    let (mut slot, mut prefill, mut reply) = (None, 0, Vec::new());
    loop {
        match s.recv() {
            Some(Event::Started {
                slot: sl, prefill: p, ..
            }) => {
                slot = Some(sl);
                prefill = p;
            }
            Some(Event::Text { tokens, .. }) => reply.extend(tokens),
            Some(Event::Done(_)) => break,
            Some(Event::Failed(e)) => panic!("request failed: {e}"),
            None => panic!("{}", RequestError::Shutdown),
        }
    }
    let slot = slot.expect("a Started event");
    Turn {
        slot,
        prefill,
        history: h.slot_tokens(slot).unwrap(),
        reply,
    }
}

/// The next turn of a conversation: its history and a new user message.
/// Returns the prompt and how many of its tokens are new: the user turn,
/// plus the reply's last token, which is never computed before the next
/// turn.
fn next_prompt(h: &LoopHandle, history: &[u32], text: &str) -> (Vec<u32>, usize) {
    let mut p = history.to_vec();
    p.extend(render(h, &[ChatMessage::user(text)], true));
    let new = p.len() - history.len() + 1;
    (p, new)
}

/// An 864-token conversation, someone else's one-line "hello", then the
/// conversation's next turn.
fn long_conversation_and_a_hello(slots: usize, cache: PromptCacheSize) -> (Turn, Turn, Turn, usize) {
    let lp = start(slots, cache);
    let h = lp.handle();
    let text = long_message(&h, "the river runs bright under stone ", 864);
    let first = turn(&h, render(&h, &[ChatMessage::user(&text)], true), 12);
    let hello = turn(&h, render(&h, &[ChatMessage::user("hello")], true), 8);
    let (p, new) = next_prompt(&h, &first.history, "and what does stone mean?");
    let next = turn(&h, p, 8);
    lp.shutdown().unwrap();
    (first, hello, next, new)
}

#[test]
fn a_hello_between_two_turns_of_a_long_conversation_costs_it_nothing() {
    // Empty slots: the hello shares only the template header with the long
    // history, so it takes an empty slot and the history stays (cache off).
    let (first, hello, next, new) = long_conversation_and_a_hello(4, OFF);
    assert!(first.prefill >= 864, "{}", first.prefill);
    assert_ne!(hello.slot, first.slot);
    assert_eq!(next.slot, first.slot);
    assert_eq!(next.prefill, new, "only the new tokens are computed");

    // One slot: the hello must evict the history; the prompt cache keeps it.
    let (_, hello1, cached, new1) = long_conversation_and_a_hello(1, ON);
    assert_eq!(hello1.slot, 0);
    assert_eq!(new1, new);
    assert_eq!(cached.prefill, new, "restored from the prompt cache");

    // Without the cache, one slot recomputes the whole conversation.
    let (_, _, recomputed, _) = long_conversation_and_a_hello(1, OFF);
    assert!(recomputed.prefill > 850, "{}", recomputed.prefill);
    // Restored or recomputed, the reply is the same.
    assert_eq!(cached.reply, recomputed.reply);
    assert_eq!(next.reply, recomputed.reply);
}

/// One turn of a conversation, as [`eight_conversations`] saw it.
struct Record {
    prefill: usize,
    new: usize,
    reply: Vec<u32>,
    slot: usize,
}

/// Eight conversations with one system prompt taking turns on four slots:
/// every turn, by round, and the loop's count of restored positions.
fn eight_conversations(cache: PromptCacheSize, rounds: usize) -> (Vec<Vec<Record>>, u64) {
    eight_conversations_on(&model(), CTX, cache, rounds)
}

fn eight_conversations_on(
    model: &Path,
    ctx: usize,
    cache: PromptCacheSize,
    rounds: usize,
) -> (Vec<Vec<Record>>, u64) {
    let lp = start_on(model, ctx, 4, cache);
    let h = lp.handle();
    // A model of 512 positions (byte-level vocabulary) gets shorter turns.
    let small = ctx <= 512;
    let system =
        ChatMessage::system(&"You explain words in one short line. ".repeat(if small { 3 } else { 6 }));
    let words = [
        "apple ", "river ", "stone ", "cloud ", "bright ", "forest ", "window ", "silver ",
    ];
    let mut histories: Vec<Vec<u32>> = vec![Vec::new(); words.len()];
    let mut out = Vec::new();
    for round in 0..rounds {
        let mut this = Vec::new();
        for (c, w) in words.iter().enumerate() {
            let (prompt, new) = if round == 0 {
                let text = match small {
                    true => long_message(&h, w, 150 + 10 * c),
                    false => long_message(&h, w, 200 + 20 * c),
                };
                let p = render(&h, &[system.clone(), ChatMessage::user(&text)], true);
                let n = p.len();
                (p, n)
            } else {
                next_prompt(&h, &histories[c], &format!("and {w}again, round {round}?"))
            };
            let t = turn(&h, prompt, 6);
            histories[c] = t.history;
            this.push(Record {
                prefill: t.prefill,
                new,
                reply: t.reply,
                slot: t.slot,
            });
        }
        out.push(this);
    }
    let restored = h.metrics().restored_tokens;
    lp.shutdown().unwrap();
    (out, restored)
}

/// After the first round, the cache computes under a third of what no
/// cache computes, and every reply is the one computed positions give.
fn cache_pays_and_changes_no_token(on: &[Vec<Record>], off: &[Vec<Record>], name: &str) {
    let total = |r: &[Vec<Record>]| -> usize { r[1..].iter().flatten().map(|t| t.prefill).sum() };
    assert!(
        total(off) > 3 * total(on),
        "{name}: off {} on {}",
        total(off),
        total(on)
    );
    for (a, b) in on.iter().flatten().zip(off.iter().flatten()) {
        assert_eq!(
            a.reply, b.reply,
            "{name}: restored positions must give the tokens computed ones give"
        );
    }
}

#[test]
fn conversations_that_outnumber_the_slots_compute_only_their_new_tokens() {
    let (on, restored) = eight_conversations(ON, 3);
    assert!(restored > 0);
    for (round, turns) in on.iter().enumerate() {
        for (c, Record { prefill, new, .. }) in turns.iter().enumerate() {
            if round == 0 {
                // After the first, the shared system prompt is copied from
                // a slot holding it.
                assert!(
                    c == 0 || *prefill < *new,
                    "round 0, conversation {c}: {prefill} of {new}"
                );
            } else {
                assert!(
                    *prefill as f64 <= 1.1 * *new as f64,
                    "round {round}, conversation {c}: computed {prefill} for {new} new tokens"
                );
            }
        }
    }

    // Cache off: the first four conversations each find an empty slot (the
    // system prompt alone is not worth another's history); later turns find
    // their history evicted and compute it again; the replies are the same.
    let (off, restored_off) = eight_conversations(OFF, 3);
    assert_eq!(restored_off, 0);
    let mut first_slots: Vec<usize> = off[0][..4].iter().map(|t| t.slot).collect();
    first_slots.sort_unstable();
    assert_eq!(first_slots, [0, 1, 2, 3]);
    cache_pays_and_changes_no_token(&on, &off, "bundled model");
}

#[test]
fn a_cache_too_small_for_every_conversation_restores_what_it_has_exactly() {
    // Room for about two of the eight histories: restores are partial and
    // blocks are evicted, and the replies still equal computed ones.
    let (small, restored) = eight_conversations(PromptCacheSize::Bytes(2 << 20), 2);
    let (off, _) = eight_conversations(OFF, 2);
    assert!(restored > 0);
    for (a, b) in small.iter().flatten().zip(off.iter().flatten()) {
        assert_eq!(a.reply, b.reply);
        assert!(a.prefill <= b.prefill);
    }
}

/// A model whose linear-attention layers keep a recurrent state shares
/// prefixes too, at snapshot granularity: the first conversation to branch
/// off a shared system prompt takes a checkpoint at the block boundary
/// where it branches, later ones start from it (copied from that slot or
/// from the cache), and a conversation evicted from its slot comes back
/// from the snapshot at its end. Replies equal recomputed ones.
#[test]
fn a_recurrent_models_conversations_share_their_prefixes_through_slots_and_the_cache() {
    for name in ["qwen3-next-tiny", "qwen3-5-moe-tiny"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name);
        // (Their context is 512 positions.)
        let (on, restored) = eight_conversations_on(&dir, 512, ON, 3);
        let (off, restored_off) = eight_conversations_on(&dir, 512, OFF, 3);
        assert!(restored > 0, "{name}");
        assert_eq!(restored_off, 0, "{name}");
        for (round, turns) in on.iter().enumerate() {
            for (c, Record { prefill, new, .. }) in turns.iter().enumerate() {
                match (round, c) {
                    // The first holds the system prompt but no snapshot
                    // where the second branches off; the second takes one.
                    (0, 0 | 1) => assert_eq!(prefill, new, "{name}: conversation {c}"),
                    (0, _) => assert!(
                        prefill < new,
                        "{name}, round 0, conversation {c}: {prefill} of {new}"
                    ),
                    _ => assert!(
                        *prefill as f64 <= 1.1 * *new as f64,
                        "{name}, round {round}, conversation {c}: computed {prefill} for {new} new tokens"
                    ),
                }
            }
        }
        cache_pays_and_changes_no_token(&on, &off, name);
    }
}

/// Every family's sequence state round-trips through the prompt cache: one
/// slot, a conversation evicted by another and resumed gives the reply it
/// gives when recomputed, and computes only its new tokens.
#[test]
fn every_family_resumes_an_evicted_conversation_exactly() {
    let families = [
        "fixtures/olmoe-tiny",
        "fixtures/qwen3-moe-tiny",
        "fixtures/mixtral-tiny",
        "fixtures/glm-tiny",
        "fixtures/glm4-moe-tiny",
        "fixtures/deepseek-v3-tiny",
        "fixtures/glm4-moe-lite-tiny",
        "fixtures/deepseek-v32-tiny",
        "fixtures/minimax-m2-tiny",
        // Recurrent states: restored to the snapshot at the history's end.
        "fixtures/qwen3-next-tiny",
        "fixtures/qwen3-5-moe-tiny",
    ];
    // gpt-oss runs from a container (its checkpoint's experts are fused).
    let tmp = tempfile::tempdir().unwrap();
    let gpt_oss = tmp.path().join("gpt-oss-tiny");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    convert(
        &root.join("fixtures/gpt-oss-tiny"),
        &gpt_oss,
        QFormat::F32,
        QFormat::F32,
        None,
    )
    .unwrap();
    let dirs = families.iter().map(|r| root.join(r)).chain([gpt_oss]);
    for dir in dirs {
        let rel = dir.display().to_string();
        let run = |cache: PromptCacheSize| {
            let opts = EngineOptions {
                prompt_cache: cache,
                ..EngineOptions::default()
            };
            let engine = Engine::load(&dir, &opts).unwrap_or_else(|e| panic!("{rel}: {e}"));
            let cfg = LoopConfig {
                slots: 1,
                max_ctx: engine.model.max_positions().min(CTX),
                threads: Some(2),
                ..LoopConfig::default()
            };
            let lp = DecodeLoop::spawn(engine, &cfg, Box::new(std::io::sink())).unwrap();
            let h = lp.handle();
            let vocab = h.info().vocab as u32;
            let ids = |n: u32, salt: u32| -> Vec<u32> { (0..n).map(|t| (t * 37 + salt) % vocab).collect() };
            let a = turn(&h, ids(60, 11), 6);
            turn(&h, ids(20, 5), 4);
            let mut next = a.history.clone();
            next.extend(ids(8, 23));
            let new = next.len() - a.history.len() + 1;
            let resumed = turn(&h, next, 6);
            lp.shutdown().unwrap();
            (resumed, new)
        };
        let (cached, new) = run(PromptCacheSize::Bytes(16 << 20));
        let (recomputed, _) = run(OFF);
        assert_eq!(cached.prefill, new, "{rel}: only the new tokens are computed");
        assert!(recomputed.prefill > new, "{rel}");
        assert_eq!(
            cached.reply, recomputed.reply,
            "{rel}: restored state gives other tokens"
        );
    }
}

/// The cache's budget is part of the engine's memory plan: with `--ram-gb`
/// the expert cache gets what the rest, the prompt cache included, leaves.
#[test]
fn the_memory_plan_counts_the_prompt_cache() {
    let opts = EngineOptions {
        ram_gb: Some(1.0),
        kv_slots: 4,
        max_ctx: Some(CTX),
        prompt_cache: PromptCacheSize::Bytes(100 << 20),
        ..EngineOptions::default()
    };
    let engine = Engine::load(&model(), &opts).unwrap();
    let plan = engine.memory.clone();
    assert_eq!(plan.needs.prompt_cache_bytes, 100 << 20);
    assert_eq!(plan.engine_total(), Some(1 << 30), "{plan}");
    assert!(plan.to_string().contains("prompt cache 0.10"), "{plan}");
    let without = Engine::load(
        &model(),
        &EngineOptions {
            prompt_cache: OFF,
            ..opts
        },
    )
    .unwrap();
    assert_eq!(
        without
            .memory
            .cache_budget
            .zip(plan.cache_budget)
            .map(|(a, b)| a - b),
        Some(100 << 20)
    );
    let lp = DecodeLoop::spawn(engine, &LoopConfig::default(), Box::new(std::io::sink())).unwrap();
    assert_eq!(lp.handle().info().prompt_cache_bytes, 100 << 20);
    lp.shutdown().unwrap();
}
