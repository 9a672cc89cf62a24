//! Speculative decoding in the decode loop (`coli serve --draft`): with
//! several slots decoding at once, greedy replies are token for token those
//! of the loop without drafts (n-gram lookup on every family, the MTP head
//! on GLM), also across a second turn that continues the state a verified
//! step truncated; drafts are actually accepted on prompts that repeat
//! text; stop strings and token limits cut where they cut without drafts;
//! and seeded sampling with drafts is reproducible and independent of what
//! runs beside it; a constrained request beside a drafting one decodes
//! without drafts, as it would with drafting off. Nothing here waits on time.

use std::path::{Path, PathBuf};

use colibri::engine::speculative::{DraftMode, SpecOptions};
use colibri::engine::{Engine, EngineOptions};
use colibri::runtime::constraint::ConstraintSpec;
use colibri::runtime::{
    DecodeLoop, Event, Finish, GenRequest, LoopConfig, MetricsSnapshot, PromptMode, RequestError,
    RequestStream, SlotChoice,
};
use colibri::sampling::SamplingParams;

fn model(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Drafts on every step (no acceptance-based switch-off), `k` at a time.
fn always(mode: DraftMode, k: usize) -> SpecOptions {
    SpecOptions {
        mode,
        max_draft: k,
        min_acceptance: 0.0,
        ..SpecOptions::default()
    }
}

fn start(rel: &str, slots: usize, draft: Option<SpecOptions>) -> DecodeLoop {
    let engine = Engine::load(&model(rel), &EngineOptions::default()).unwrap();
    let max_ctx = engine.model.max_positions().min(1024);
    let cfg = LoopConfig {
        slots,
        max_ctx,
        queue_cap: 16,
        threads: Some(2),
        draft,
        ..LoopConfig::default()
    };
    DecodeLoop::spawn(engine, &cfg, Box::new(std::io::sink())).unwrap()
}

fn req(prompt: Vec<u32>, max_tokens: usize, sampling: SamplingParams) -> GenRequest {
    GenRequest {
        slot: SlotChoice::Any,
        mode: PromptMode::Replace,
        prompt,
        max_tokens,
        sampling,
        stop: Vec::new(),
        constraint: None,
        special_tokens: false,
    }
}

type Reply = (Vec<u32>, String, Result<Finish, RequestError>);

fn drain(s: &mut RequestStream) -> Reply {
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

/// Prompts that repeat a phrase, so the reply's n-grams occur earlier and
/// lookup has something to propose; one per stream, all different.
fn repeating_prompts(vocab: u32, streams: usize) -> Vec<Vec<u32>> {
    (0..streams as u32)
        .map(|i| {
            let phrase: Vec<u32> = (0..7 + i).map(|t| 3 + (t * 37 + i * 11) % (vocab - 3)).collect();
            let mut p = Vec::new();
            for _ in 0..4 {
                p.extend(&phrase);
            }
            p
        })
        .collect()
}

/// Two turns per stream, all streams at once: the first turn replaces the
/// slot's history with the prompt, the second appends the phrase again to
/// what the first turn left in the slot (named by index, so each stream
/// keeps its slot).
fn two_turns(
    lp: &DecodeLoop,
    prompts: &[Vec<u32>],
    n: usize,
    sampling: &[SamplingParams],
) -> Vec<[Reply; 2]> {
    let h = lp.handle();
    let turn = |mode: PromptMode, ps: Vec<Vec<u32>>| -> Vec<Reply> {
        let mut streams: Vec<RequestStream> = ps
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                h.submit(GenRequest {
                    slot: SlotChoice::Exact(i),
                    mode,
                    ..req(p, n, sampling[i])
                })
                .unwrap()
            })
            .collect();
        streams.iter_mut().map(drain).collect()
    };
    let first = turn(PromptMode::Replace, prompts.to_vec());
    let again: Vec<Vec<u32>> = prompts.iter().map(|p| p[..p.len() / 2].to_vec()).collect();
    let second = turn(PromptMode::Append, again);
    first.into_iter().zip(second).map(|(a, b)| [a, b]).collect()
}

fn greedy(n: usize) -> Vec<SamplingParams> {
    vec![SamplingParams::default(); n]
}

/// The replies and the loop's counters of one run.
fn run(
    rel: &str,
    draft: Option<SpecOptions>,
    prompts: &[Vec<u32>],
    n: usize,
    s: &[SamplingParams],
) -> (Vec<[Reply; 2]>, MetricsSnapshot) {
    let lp = start(rel, prompts.len(), draft);
    let out = two_turns(&lp, prompts, n, s);
    let m = lp.handle().metrics();
    lp.shutdown().unwrap();
    (out, m)
}

fn tokens_of(r: &[[Reply; 2]]) -> Vec<[Vec<u32>; 2]> {
    r.iter().map(|[a, b]| [a.0.clone(), b.0.clone()]).collect()
}

fn assert_same(rel: &str, plain: &[[Reply; 2]], spec: &[[Reply; 2]]) {
    for (i, (p, s)) in plain.iter().zip(spec).enumerate() {
        for t in 0..2 {
            assert_eq!(
                p[t].0, s[t].0,
                "{rel}: stream {i} turn {t}: tokens differ with drafts"
            );
            assert_eq!(
                p[t].1, s[t].1,
                "{rel}: stream {i} turn {t}: text differs with drafts"
            );
            let (pf, sf) = (p[t].2.as_ref().unwrap(), s[t].2.as_ref().unwrap());
            assert_eq!(
                (pf.reason, pf.usage),
                (sf.reason, sf.usage),
                "{rel}: stream {i} turn {t}"
            );
        }
    }
}

#[test]
fn greedy_ngram_drafts_change_no_token_and_are_accepted() {
    for rel in [
        "models/colibri-tiny",
        "fixtures/olmoe-tiny",
        "fixtures/qwen3-moe-tiny",
        "fixtures/glm-tiny",
    ] {
        if !model(rel).join("config.json").is_file() {
            continue;
        }
        let vocab = Engine::load(&model(rel), &EngineOptions::default())
            .unwrap()
            .model
            .vocab_size() as u32;
        let prompts = repeating_prompts(vocab.min(300), 4);
        let (plain, m0) = run(rel, None, &prompts, 40, &greedy(4));
        for k in [1, 4] {
            let (spec, m) = run(rel, Some(always(DraftMode::Ngram, k)), &prompts, 40, &greedy(4));
            assert_same(rel, &plain, &spec);
            eprintln!(
                "{rel} k={k}: {}/{} drafts accepted in {} verifications; {} sequence-steps (without drafts {}), {} tokens",
                m.draft_accepted,
                m.draft_proposed,
                m.draft_verifies,
                m.step_rows,
                m0.step_rows,
                m.generated_tokens
            );
            assert!(m.draft_accepted > 0, "{rel} k={k}: no draft accepted: {m:?}");
            assert_eq!(m.generated_tokens, m0.generated_tokens, "{rel}");
            // Each stream's accepted drafts save it steps (the batch's step
            // count is the longest stream's, so count sequences per step).
            assert!(
                m.step_rows < m0.step_rows,
                "{rel} k={k}: accepted drafts save steps: {m:?}"
            );
        }
        assert_eq!(m0.draft_proposed, 0);
    }
}

#[test]
fn greedy_mtp_drafts_change_no_token() {
    let rel = "fixtures/glm-mtp";
    let prompts = repeating_prompts(200, 3);
    let (plain, _) = run(rel, None, &prompts, 30, &greedy(3));
    for k in [1, 3] {
        let (spec, m) = run(rel, Some(always(DraftMode::Mtp, k)), &prompts, 30, &greedy(3));
        assert_same(rel, &plain, &spec);
        eprintln!(
            "{rel} MTP k={k}: {}/{} drafts accepted in {} verifications",
            m.draft_accepted, m.draft_proposed, m.draft_verifies
        );
        assert!(m.draft_verifies > 0, "{rel}: the MTP head drafted nothing: {m:?}");
    }
    // Auto picks the head when the model has one.
    let (auto, m) = run(rel, Some(always(DraftMode::Auto, 2)), &prompts, 30, &greedy(3));
    assert_same(rel, &plain, &auto);
    assert!(m.draft_verifies > 0);
}

#[test]
fn stop_strings_and_limits_cut_where_they_cut_without_drafts() {
    let rel = "models/colibri-tiny";
    let prompts = repeating_prompts(300, 1);
    let (plain, _) = run(rel, None, &prompts, 60, &greedy(1));
    let text = &plain[0][0].1;
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 12, "{text:?}");
    let stop: String = chars[8..10].iter().collect();
    for draft in [None, Some(always(DraftMode::Ngram, 4))] {
        let lp = start(rel, 1, draft.clone());
        let h = lp.handle();
        let cut = drain(
            &mut h
                .submit(GenRequest {
                    stop: vec![stop.clone()],
                    ..req(prompts[0].clone(), 60, SamplingParams::default())
                })
                .unwrap(),
        );
        assert_eq!(
            cut.1,
            text[..text.find(&stop).unwrap()],
            "stop {stop:?}, drafts {draft:?}"
        );
        // Every budget from 1 up stops exactly there.
        for n in [1, 2, 3, 5, 8] {
            let r = drain(
                &mut h
                    .submit(req(prompts[0].clone(), n, SamplingParams::default()))
                    .unwrap(),
            );
            let want = &plain[0][0].0[..n.min(plain[0][0].0.len())];
            assert_eq!(r.0, want, "max_tokens {n}, drafts {draft:?}");
        }
        lp.shutdown().unwrap();
    }
}

#[test]
fn sampled_drafts_are_seeded_and_do_not_depend_on_the_batch() {
    let rel = "models/colibri-tiny";
    let prompts = repeating_prompts(300, 3);
    let s: Vec<SamplingParams> = (0..3)
        .map(|i| SamplingParams {
            temperature: 0.7,
            top_p: 0.95,
            top_k: 40,
            seed: 5 + i,
        })
        .collect();
    let d = Some(always(DraftMode::Ngram, 3));
    let (a, m) = run(rel, d.clone(), &prompts, 40, &s);
    let (b, _) = run(rel, d.clone(), &prompts, 40, &s);
    assert_eq!(tokens_of(&a), tokens_of(&b), "same seeds, same tokens");
    assert!(m.draft_proposed > 0, "{m:?}");
    // Each stream alone gives what it gave beside the others.
    for i in 0..3 {
        let (alone, _) = run(rel, d.clone(), &prompts[i..=i], 40, &s[i..=i]);
        assert_eq!(tokens_of(&alone)[0], tokens_of(&a)[i], "stream {i}");
    }
}

#[test]
fn a_constrained_request_decodes_without_drafts_beside_a_drafting_one() {
    let rel = "models/colibri-tiny";
    let prompts = repeating_prompts(300, 1);
    let sampled = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        seed: 3,
    };
    let json = || GenRequest {
        constraint: Some(ConstraintSpec::JsonObject),
        ..req(vec![2, 40, 3], 48, sampled)
    };
    let both = |draft: Option<SpecOptions>| {
        let lp = start(rel, 2, draft);
        let h = lp.handle();
        // Alone first: nothing drafts.
        let alone = drain(&mut h.submit(json()).unwrap());
        assert_eq!(h.metrics().draft_verifies, 0, "a constrained request drafted");
        let mut j = h.submit(json()).unwrap();
        let mut free = h
            .submit(req(prompts[0].clone(), 40, SamplingParams::default()))
            .unwrap();
        let out = (alone, drain(&mut j), drain(&mut free));
        lp.shutdown().unwrap();
        out
    };
    let plain = both(None);
    let spec = both(Some(always(DraftMode::Ngram, 4)));
    assert!(plain.0.2.is_ok() && spec.0.2.is_ok() && spec.1.2.is_ok());
    assert_eq!(
        spec.0.0, plain.0.0,
        "the constrained reply changed with drafting on"
    );
    assert_eq!(
        spec.1.0, plain.1.0,
        "the constrained reply changed beside a drafting one"
    );
    assert_eq!(spec.2.0, plain.2.0);
}
