//! Crash safety of the conversation state files: `coli serve` killed with
//! SIGKILL at random moments always restarts on a consistent prefix, and a
//! continuation after a clean stop equals one that never stopped.

mod support;

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use colibri::engine::{Engine, EngineOptions, state_layout};
use colibri::tokenizer::Tokenizer;
use colibri_actors::kv::{KvFile, KvLoad, slot_path};
use support::{Reply, Server, state_dir, tiny_chat_model};

/// Total time the crash loop may take (iterations stop past it).
const CRASH_BUDGET: Duration = Duration::from_secs(15);
const MAX_ITERATIONS: usize = 60;

/// Deterministic "random" numbers (SplitMix64), so a failure replays.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const MAX_TOKENS: usize = 24;

fn fields() -> String {
    format!("{MAX_TOKENS} 0 1")
}

/// The prompts the test alternates between: two conversations, one of which
/// grows from the other (so reloaded prefixes get reused).
fn prompts(model: &Path) -> (Vec<Vec<u8>>, Vec<Reply>) {
    let p0 = b"<|user|>\nWhat does the word \"harbor\" mean?\n<|assistant|>\n".to_vec();
    let p2 = b"<|user|>\nGive me a word for happy.\n<|assistant|>\n".to_vec();
    let fresh = |p: &[u8]| {
        let mut s = Server::start(model, &["--no-kv-save"]);
        let r = s.prompt(p, &fields());
        assert!(s.finish().0.success());
        r
    };
    let r0 = fresh(&p0);
    let mut p1 = p0.clone();
    p1.extend_from_slice(&r0.text);
    p1.extend_from_slice(b"<|end|>\n<|user|>\nUse it in a sentence.\n<|assistant|>\n");
    let r1 = fresh(&p1);
    let r2 = fresh(&p2);
    (vec![p0, p1, p2], vec![r0, r1, r2])
}

/// Reads slot 0's file as the engine would and checks it is a prefix of one
/// of the conversations (prompt tokens first, then generated ones).
fn assert_consistent_prefix(dir: &Path, model: &Path, prompt_ids: &[Vec<u32>]) -> usize {
    let engine = Engine::load(model, &EngineOptions::default()).expect("loading the model");
    let layout = state_layout(engine.state_fingerprint(), engine.model.new_state().as_ref());
    let copy = state_dir();
    let path = slot_path(copy.path(), 0);
    // Read a copy: opening creates and may rewrite headers.
    if std::fs::copy(slot_path(dir, 0), &path).is_err() {
        return 0;
    }
    let mut tokens = Vec::new();
    let (_f, load) = KvFile::open(&path, layout, &mut |t, p| {
        assert_eq!(p.len(), layout.payload_bytes);
        tokens.push(t);
    })
    .expect("opening a copy of the state file");
    assert!(
        matches!(load, KvLoad::Loaded { .. } | KvLoad::Missing),
        "{load:?}"
    );
    let ok = prompt_ids.iter().any(|ids| {
        let n = tokens.len().min(ids.len());
        tokens[..n] == ids[..n]
    });
    assert!(
        ok,
        "the state file holds {} tokens that start no known conversation",
        tokens.len()
    );
    tokens.len()
}

#[test]
fn killed_at_random_moments_the_state_reloads_to_a_consistent_prefix() {
    let model = tiny_chat_model();
    let tok = Tokenizer::load(&model).expect("tokenizer");
    let (prompts, refs) = prompts(&model);
    let prompt_ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| tok.encode(std::str::from_utf8(p).unwrap()).unwrap())
        .collect();
    let dir = state_dir();
    let flag = ["--state-dir", dir.path().to_str().unwrap()];
    let mut rng = Rng(0x0C01_1B41);
    let start = Instant::now();
    let mut iterations = 0;
    let mut checked = 0;
    let mut sizes = std::collections::BTreeSet::new();
    while iterations < MAX_ITERATIONS && (iterations < 5 || start.elapsed() < CRASH_BUDGET) {
        iterations += 1;
        // The process must come up on whatever the last kill left.
        let mut s = Server::start(&model, &flag);
        if rng.below(2) == 0 {
            let q = rng.below(prompts.len() as u64) as usize;
            let r = s.prompt(&prompts[q], &fields());
            assert_eq!(
                r.text_str(),
                refs[q].text_str(),
                "iteration {iterations}: prompt {q} after a reload differs from a fresh run"
            );
            assert!(r.field(4) >= 1 && r.field(4) <= prompt_ids[q].len());
            checked += 1;
        }
        // Start a reply and kill the process somewhere in or after it. The
        // first two kills wait for events instead: the reply, then the reply
        // to a frame sent after it (the state is persisted right after END,
        // before the next frame is read), so two known, different states are
        // always among those checked, however slow the machine.
        let q = if iterations <= 2 {
            iterations - 1
        } else {
            rng.below(prompts.len() as u64) as usize
        };
        let mut frame = format!("\x02PROMPT {} {}\n", prompts[q].len(), fields()).into_bytes();
        frame.extend_from_slice(&prompts[q]);
        frame.push(b'\n');
        s.send(&frame);
        if iterations <= 2 {
            let _ = s.reply();
            s.send(b"\x02SYNC\n");
            assert!(s.reply().is_malformed());
        } else {
            thread::sleep(Duration::from_micros(rng.below(40_000)));
        }
        s.kill();
        sizes.insert(assert_consistent_prefix(dir.path(), &model, &prompt_ids));
    }
    assert!(checked >= 1, "no reply was compared in {iterations} iterations");
    eprintln!("{iterations} kills; state sizes seen after a kill: {sizes:?}");
    assert!(sizes.len() >= 2, "kills always left the same state: {sizes:?}");

    // Finally a clean round: the slot works and equals a fresh run.
    let mut s = Server::start(&model, &flag);
    let r = s.prompt(&prompts[2], &fields());
    assert_eq!(r.text, refs[2].text);
    assert!(s.finish().0.success());
}

#[test]
fn a_continuation_after_a_clean_stop_equals_one_that_never_stopped() {
    let model = tiny_chat_model();
    let tok = Tokenizer::load(&model).expect("tokenizer");
    let (prompts, refs) = prompts(&model);
    let dir = state_dir();
    let flag = ["--state-dir", dir.path().to_str().unwrap()];

    // Never stopped: both prompts in one process.
    let mut a = Server::start(&model, &["--no-kv-save"]);
    a.prompt(&prompts[0], &fields());
    let a1 = a.prompt(&prompts[1], &fields());
    assert!(a.finish().0.success());

    let mut b = Server::start(&model, &flag);
    assert_eq!(b.prompt(&prompts[0], &fields()).text, refs[0].text);
    assert!(b.finish().0.success());
    let mut b = Server::start(&model, &flag);
    let b1 = b.prompt(&prompts[1], &fields());
    assert!(b.finish().0.success());
    assert_eq!(b1.text, a1.text);
    assert_eq!(
        b1.field(4),
        a1.field(4),
        "the prefix came from disk, not a re-prefill"
    );
    let full = tok
        .encode(std::str::from_utf8(&prompts[1]).unwrap())
        .unwrap()
        .len();
    assert!(b1.field(4) < full, "{} of {full} prefilled", b1.field(4));
}
