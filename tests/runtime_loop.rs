//! The decode-loop actor with its compute actor, in process: continuous
//! batching keeps every stream's tokens, cancellation frees slots, and the
//! admission rules refuse what they must. Nothing here waits on time: every
//! wait is on an event the loop sends.

use std::path::{Path, PathBuf};

use colibri::engine::{Engine, EngineOptions};
use colibri::runtime::{
    DecodeLoop, Event, Finish, FinishReason, GenRequest, LoopConfig, PromptMode, RequestError, RequestStream,
    SlotChoice,
};
use colibri::sampling::SamplingParams;

fn model(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn start(rel: &str, slots: usize, queue_cap: usize) -> DecodeLoop {
    let engine = Engine::load(&model(rel), &EngineOptions::default()).unwrap();
    let max_ctx = engine.model.max_positions().min(1024);
    let cfg = LoopConfig {
        slots,
        max_ctx,
        queue_cap,
        threads: Some(2),
        ..LoopConfig::default()
    };
    DecodeLoop::spawn(engine, &cfg, Box::new(std::io::sink())).unwrap()
}

fn req(prompt: Vec<u32>, max_tokens: usize) -> GenRequest {
    GenRequest {
        slot: SlotChoice::Any,
        mode: PromptMode::Replace,
        prompt,
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        constraint: None,
        special_tokens: false,
    }
}

/// Reads a stream to its end: generated tokens, text, and how it ended.
fn drain(s: &mut RequestStream) -> (Vec<u32>, String, Result<Finish, RequestError>) {
    let (mut toks, mut text) = (Vec::new(), String::new());
    loop {
        match s.recv() {
            Some(Event::Started { .. }) => {}
            Some(Event::Text { text: t, tokens }) => {
                toks.extend(tokens);
                text.push_str(&t);
            }
            Some(Event::Done(f)) => return (toks, text, Ok(f)),
            Some(Event::Failed(e)) => return (toks, text, Err(e)),
            None => return (toks, text, Err(RequestError::Shutdown)),
        }
    }
}

/// Waits until the stream has produced its first token.
fn first_token(s: &mut RequestStream) {
    loop {
        match s.recv() {
            Some(Event::Text { tokens, .. }) if !tokens.is_empty() => return,
            Some(Event::Started { .. } | Event::Text { .. }) => {}
            other => panic!("stream ended before its first token: {other:?}"),
        }
    }
}

fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    (0..4u32)
        .map(|i| (0..5 + 3 * i).map(|t| (t * 31 + i * 17 + 3) % vocab).collect())
        .collect()
}

#[test]
fn concurrent_greedy_streams_equal_each_stream_alone() {
    for rel in ["models/colibri-tiny", "fixtures/olmoe-tiny", "fixtures/glm-tiny"] {
        if !model(rel).join("tokenizer.json").is_file() {
            continue;
        }
        let lp = start(rel, 4, 8);
        let h = lp.handle();
        let vocab = h.info().vocab as u32;
        let ps = prompts(vocab.min(200));
        let mut streams: Vec<RequestStream> =
            ps.iter().map(|p| h.submit(req(p.clone(), 24)).unwrap()).collect();
        let together: Vec<_> = streams.iter_mut().map(drain).collect();
        let m = h.metrics();
        lp.shutdown().unwrap();

        let lp = start(rel, 1, 8);
        let h = lp.handle();
        for (p, (toks, text, fin)) in ps.iter().zip(&together) {
            let mut s = h.submit(req(p.clone(), 24)).unwrap();
            let (alone, alone_text, alone_fin) = drain(&mut s);
            assert_eq!(&alone, toks, "{rel}: batched tokens differ from the stream alone");
            assert_eq!(&alone_text, text);
            assert_eq!(
                alone_fin.as_ref().map(|f| f.reason).ok(),
                fin.as_ref().map(|f| f.reason).ok()
            );
        }
        lp.shutdown().unwrap();
        assert_eq!(m.completed, 4, "{rel}: {m:?}");
    }
}

#[test]
fn a_dropped_stream_frees_its_slot() {
    let lp = start("fixtures/olmoe-tiny", 1, 4);
    let h = lp.handle();
    let mut a = h.submit(req(vec![5, 6, 7], 400)).unwrap();
    first_token(&mut a);
    drop(a);
    let mut b = h.submit(req(vec![8, 9], 3)).unwrap();
    let (toks, _, fin) = drain(&mut b);
    assert_eq!(fin.unwrap().reason, FinishReason::Length);
    assert_eq!(toks.len(), 3);
    let m = h.metrics();
    assert_eq!((m.cancelled, m.completed, m.active), (1, 1, 0), "{m:?}");
    lp.shutdown().unwrap();
}

#[test]
fn explicit_cancel_ends_with_cancelled() {
    let lp = start("fixtures/olmoe-tiny", 1, 4);
    let h = lp.handle();
    let mut a = h.submit(req(vec![5, 6, 7], 400)).unwrap();
    first_token(&mut a);
    a.cancel();
    let (_, _, fin) = drain(&mut a);
    let f = fin.unwrap();
    assert_eq!(f.reason, FinishReason::Cancelled);
    assert!(f.usage.completion_tokens < 400);
    lp.shutdown().unwrap();
}

#[test]
fn admission_refuses_what_it_must() {
    let lp = start("fixtures/olmoe-tiny", 1, 1);
    let h = lp.handle();
    let mut a = h
        .submit(GenRequest {
            slot: SlotChoice::Exact(0),
            ..req(vec![5, 6, 7], 400)
        })
        .unwrap();
    first_token(&mut a);
    let expect_fail = |r: GenRequest| {
        let mut s = h.submit(r).unwrap();
        match s.recv() {
            Some(Event::Failed(e)) => e,
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    assert_eq!(
        expect_fail(GenRequest {
            slot: SlotChoice::Exact(0),
            ..req(vec![1], 1)
        }),
        RequestError::SlotBusy(0)
    );
    assert_eq!(
        expect_fail(GenRequest {
            slot: SlotChoice::Exact(3),
            ..req(vec![1], 1)
        }),
        RequestError::BadSlot { slot: 3, slots: 1 }
    );
    assert_eq!(expect_fail(req(vec![], 1)), RequestError::EmptyPrompt);
    assert!(matches!(
        expect_fail(req(vec![1; 2000], 1)),
        RequestError::ContextExceeded { used: 2000, .. }
    ));
    assert!(matches!(
        expect_fail(req(vec![999_999], 1)),
        RequestError::BadToken { id: 999_999, .. }
    ));
    // One request may wait; the next is refused.
    let mut queued = h.submit(req(vec![1, 2], 2)).unwrap();
    assert_eq!(expect_fail(req(vec![3, 4], 2)), RequestError::QueueFull(1));
    drop(a);
    let (toks, _, fin) = drain(&mut queued);
    assert_eq!((toks.len(), fin.unwrap().reason), (2, FinishReason::Length));
    assert_eq!(h.metrics().rejected, 1);
    lp.shutdown().unwrap();
}

#[test]
fn stop_strings_cut_the_reply_before_them() {
    let lp = start("fixtures/olmoe-tiny", 1, 4);
    let h = lp.handle();
    let p = vec![11, 12, 13, 14];
    let (_, full, _) = drain(&mut h.submit(req(p.clone(), 40)).unwrap());
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 8, "{full:?}");
    let stop: String = chars[5..7].iter().collect();
    let at = full.find(&stop).unwrap();
    let mut s = h
        .submit(GenRequest {
            stop: vec![stop.clone()],
            ..req(p, 40)
        })
        .unwrap();
    let (_, cut, fin) = drain(&mut s);
    assert_eq!(cut, full[..at], "stop {stop:?}");
    assert_eq!(fin.unwrap().reason, FinishReason::Stop);
    lp.shutdown().unwrap();
}

#[test]
fn prefix_reuse_computes_only_the_new_tail() {
    let lp = start("fixtures/olmoe-tiny", 1, 4);
    let h = lp.handle();
    let p1: Vec<u32> = (1..30).collect();
    let (gen1, _, _) = drain(&mut h.submit(req(p1.clone(), 5)).unwrap());
    let mut p2 = p1.clone();
    p2.extend(&gen1);
    p2.extend([40, 41]);
    let mut s = h.submit(req(p2.clone(), 3)).unwrap();
    match s.recv() {
        Some(Event::Started {
            prefill,
            context_tokens,
            ..
        }) => {
            assert_eq!(context_tokens, p2.len());
            assert!(prefill <= 3, "only the tail is computed, got {prefill}");
        }
        other => panic!("{other:?}"),
    }
    let (_, _, fin) = drain(&mut s);
    assert_eq!(fin.unwrap().usage.prompt_tokens, p2.len());
    lp.shutdown().unwrap();
}

/// A request cancelled while its step waits on a slow disk ends as
/// cancelled, and the slot it used is left clean: the next request on it
/// produces exactly what it produces on a fresh loop. (Whether the cancel
/// lands before or during the step depends on scheduling; both paths must
/// satisfy the same checks.)
#[test]
fn a_cancel_during_slow_loads_leaves_the_slot_clean() {
    let slow = |sim: Option<&str>| {
        let opts = EngineOptions {
            disk_sim: sim.map(str::to_string),
            cache_cap: Some(2),
            ..EngineOptions::default()
        };
        let engine = Engine::load(&model("fixtures/olmoe-tiny"), &opts).unwrap();
        let cfg = LoopConfig {
            slots: 1,
            max_ctx: 512,
            queue_cap: 4,
            threads: Some(2),
            ..LoopConfig::default()
        };
        DecodeLoop::spawn(engine, &cfg, Box::new(std::io::sink())).unwrap()
    };
    let lp = slow(Some("bw=200KB/s,lat=20ms"));
    let h = lp.handle();
    let mut a = h.submit(req((1..60).collect(), 50)).unwrap();
    match a.recv() {
        Some(Event::Started { .. }) => {}
        other => panic!("{other:?}"),
    }
    a.cancel();
    let (_, _, fin) = drain(&mut a);
    assert_eq!(fin.unwrap().reason, FinishReason::Cancelled);
    // It extends the cancelled prompt, so whatever the slot kept is reused.
    let follow = (1..70).collect::<Vec<u32>>();
    let (after, _, _) = drain(&mut h.submit(req(follow.clone(), 6)).unwrap());
    lp.shutdown().unwrap();

    let fresh = slow(None);
    let (expect, _, _) = drain(&mut fresh.handle().submit(req(follow, 6)).unwrap());
    fresh.shutdown().unwrap();
    assert_eq!(after, expect);
}
