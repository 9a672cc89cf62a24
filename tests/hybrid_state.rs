//! Conversations on a model whose sequence state is partly recurrent
//! (Qwen3-Next / Qwen3.5: linear-attention layers keep a fixed-size state,
//! full-attention layers a KV cache) persist like any other: a
//! continuation after a clean stop equals one that never stopped and does
//! not prefill the saved prefix again, a killed server restarts on a state
//! saved for exactly the records it loads, a reopened state continues bit
//! for bit, and a file of another recurrent size is refused, not misread.

mod support;

use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use colibri::engine::{Engine, EngineOptions, state_layout};
use colibri_actors::kv::{HEADER_LEN, KvFile, KvLoad, slot_path};
use support::{Reply, Server, repo, state_dir};

const FIELDS: &str = "10 0 1";

fn fixtures() -> Vec<PathBuf> {
    ["qwen3-next-tiny", "qwen3-5-moe-tiny"]
        .iter()
        .map(|n| repo().join("fixtures").join(n))
        .collect()
}

/// Two turns of one conversation: the second prompt extends the first
/// prompt and its reply.
fn turns(model: &Path) -> (Vec<u8>, Vec<u8>, Reply) {
    let p0 = b"the harbor was quiet that morning and the boats".to_vec();
    let mut s = Server::start(model, &["--no-kv-save"]);
    let r0 = s.prompt(&p0, FIELDS);
    assert!(s.finish().0.success());
    let mut p1 = p0.clone();
    p1.extend_from_slice(&r0.text);
    p1.extend_from_slice(b" then the tide came in");
    (p0, p1, r0)
}

/// Tokens and the saved recurrent part's position of slot 0's file in
/// `dir`, read from a copy as the engine reads it.
fn saved(dir: &Path, model: &Path) -> (Vec<u32>, Option<u64>) {
    let engine = Engine::load(model, &EngineOptions::default()).expect("model");
    let layout = state_layout(engine.state_fingerprint(), engine.model.new_state().as_ref());
    assert!(layout.state_bytes > 0, "a hybrid state saves a recurrent part");
    let copy = state_dir();
    let path = slot_path(copy.path(), 0);
    if std::fs::copy(slot_path(dir, 0), &path).is_err() {
        return (Vec::new(), None);
    }
    let mut tokens = Vec::new();
    let (mut f, load) = KvFile::open(&path, layout, &mut |t, _| tokens.push(t)).expect("open a copy");
    assert!(
        matches!(load, KvLoad::Loaded { .. } | KvLoad::Missing),
        "{load:?}"
    );
    let state = f.take_state().map(|(at, bytes)| {
        assert_eq!(bytes.len(), layout.state_bytes);
        at
    });
    (tokens, state)
}

#[test]
fn a_continuation_after_a_clean_stop_equals_one_that_never_stopped() {
    for model in fixtures() {
        let name = model.display().to_string();
        let (p0, p1, r0) = turns(&model);
        let mut a = Server::start(&model, &["--no-kv-save"]);
        a.prompt(&p0, FIELDS);
        let a1 = a.prompt(&p1, FIELDS);
        assert!(a.finish().0.success());

        let dir = state_dir();
        let flag = ["--state-dir", dir.path().to_str().unwrap()];
        let mut b = Server::start(&model, &flag);
        assert_eq!(b.prompt(&p0, FIELDS).text, r0.text, "{name}");
        assert!(b.finish().0.success());
        let (tokens, at) = saved(dir.path(), &model);
        assert_eq!(
            at,
            Some(tokens.len() as u64),
            "{name}: the state is saved where the records end"
        );
        assert!(!tokens.is_empty(), "{name}");

        let mut b = Server::start(&model, &flag);
        let b1 = b.prompt(&p1, FIELDS);
        let (status, stderr) = b.finish();
        assert!(status.success(), "{name}: {stderr}");
        assert!(stderr.contains("resumed"), "{name}: {stderr}");
        assert_eq!(b1.text, a1.text, "{name}: the resumed continuation differs");
        // How far back the resumed state went when the prompt departs
        // from the saved reply is checked through the library below (the
        // STAT line counts the tokens sent past the common prefix).
        assert_eq!(b1.field(4), a1.field(4), "{name}");
    }
}

/// A server killed at any moment restarts on a state file whose records
/// end exactly where its recurrent part was saved, and what it then
/// answers equals a fresh run.
#[test]
fn killed_servers_restart_on_a_saved_state() {
    for model in fixtures() {
        let name = model.display().to_string();
        let (p0, p1, r0) = turns(&model);
        let mut fresh = Server::start(&model, &["--no-kv-save"]);
        let r1 = fresh.prompt(&p1, FIELDS);
        assert!(fresh.finish().0.success());
        let dir = state_dir();
        let flag = ["--state-dir", dir.path().to_str().unwrap()];
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..8u64 {
            let mut s = Server::start(&model, &flag);
            let (p, r) = if i % 2 == 0 { (&p0, &r0) } else { (&p1, &r1) };
            assert_eq!(
                s.prompt(p, FIELDS).text,
                r.text,
                "{name}: iteration {i} after a kill"
            );
            // Another turn, killed part-way (or, the first time, after its
            // reply was persisted: SYNC answers once END's state is saved).
            let mut frame = format!("\x02PROMPT {} {FIELDS}\n", p1.len()).into_bytes();
            frame.extend_from_slice(&p1);
            frame.push(b'\n');
            s.send(&frame);
            if i == 0 {
                let _ = s.reply();
                s.send(b"\x02SYNC\n");
                assert!(s.reply().is_malformed());
            } else {
                thread::sleep(Duration::from_micros(i * 3_000));
            }
            s.kill();
            let (tokens, at) = saved(dir.path(), &model);
            assert_eq!(
                at.unwrap_or(0),
                tokens.len() as u64,
                "{name}: records past the saved state were loaded"
            );
            seen.insert(tokens.len());
        }
        assert!(
            seen.iter().any(|&n| n > 0),
            "{name}: nothing was ever saved: {seen:?}"
        );
    }
}

/// A state file whose header declares another recurrent size (another
/// model revision, a damaged header) is ignored with a message naming the
/// field, and the conversation starts afresh.
#[test]
fn a_file_with_another_recurrent_size_is_ignored_with_a_message() {
    let model = &fixtures()[0];
    let dir = state_dir();
    let flag = ["--state-dir", dir.path().to_str().unwrap()];
    let mut s = Server::start(model, &flag);
    s.prompt(b"the boats", FIELDS);
    assert!(s.finish().0.success());
    let path = slot_path(dir.path(), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() as u64 > HEADER_LEN);
    bytes[40] ^= 0x10; // the recurrent size field
    std::fs::write(&path, &bytes).unwrap();
    let mut s = Server::start(model, &flag);
    let r = s.prompt(b"the boats", FIELDS);
    let (status, stderr) = s.finish();
    assert!(status.success());
    assert!(stderr.contains("recurrent state of"), "{stderr}");
    assert!(r.field(4) > 1, "prefilled afresh");
}

/// Through the library: a session saved after a prompt and a decoded token
/// and reopened holds every position, its recurrent part equals the one
/// that never left memory, and the next tokens' logits are bit for bit
/// those of the uninterrupted session; a regenerated reply (back to the
/// prompt minus its last token) starts from the checkpoint saved with it.
#[test]
fn a_reopened_state_continues_bit_for_bit() {
    use colibri::engine::SlotStore;
    for model in fixtures() {
        let name = model.display().to_string();
        let mut engine = Engine::load(&model, &EngineOptions::default()).expect("model");
        let prompt: Vec<u32> = (0..70u32).map(|i| (i * 37 + 11) % 250).collect();
        let more = [17u32, 99, 3, 140];
        let mut live = engine.new_session();
        live.feed(&mut engine, &prompt).unwrap();
        live.feed(&mut engine, &more[..1]).unwrap();
        let dir = state_dir();
        let mut diag = Vec::new();
        let mut slots = vec![engine.new_session()];
        let mut store = SlotStore::open(dir.path(), &mut slots, engine.state_fingerprint(), 512, &mut diag)
            .unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(&diag)));
        store.persist(0, &live).unwrap();
        store.close().unwrap();

        let mut back = vec![engine.new_session()];
        let store =
            SlotStore::open(dir.path(), &mut back, engine.state_fingerprint(), 512, &mut diag).unwrap();
        store.close().unwrap();
        let mut back = back.remove(0);
        assert_eq!(back.tokens, live.tokens, "{name}");
        assert_eq!(back.kv.len(), live.kv.len(), "{name}: every position restored");
        assert_eq!(back.kv.save_recurrent(), live.kv.save_recurrent(), "{name}");
        for &t in &more[1..] {
            let a = live.feed(&mut engine, &[t]).unwrap();
            let b = back.feed(&mut engine, &[t]).unwrap();
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name}: logits after the restore differ"
            );
        }
        // Regenerating the first reply: back to the prompt minus its last
        // token, which the saved checkpoint covers.
        let mut regen = vec![engine.new_session()];
        let store =
            SlotStore::open(dir.path(), &mut regen, engine.state_fingerprint(), 512, &mut diag).unwrap();
        store.close().unwrap();
        let mut regen = regen.remove(0);
        assert_eq!(regen.kv.truncate(prompt.len() - 1), prompt.len() - 1, "{name}");
        regen.tokens.truncate(prompt.len() - 1);
        let mut fresh = engine.new_session();
        let a = fresh.feed(&mut engine, &prompt).unwrap();
        let b = regen.feed(&mut engine, &prompt[prompt.len() - 1..]).unwrap();
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name}: the prompt's logits from the saved checkpoint differ"
        );
    }
}
