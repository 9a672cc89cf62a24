//! The usage history through the real binary: `coli run` twice into one
//! state directory merges the counts; a torn file is ignored with a message;
//! `--no-usage` writes nothing; a bad `--pin FILE` is an error.

mod support;

use std::path::Path;
use std::process::{Output, Stdio};

use colibri::engine::usage::{DECAY_PER_RUN, HISTORY_FILE, UsageHistory};
use support::coli_command;

fn run(state: &Path, extra: &[&str]) -> Output {
    coli_command()
        .args([
            "run",
            "--prompt-ids",
            "1,200,300,17",
            "--ids",
            "--max-tokens",
            "12",
            "--placement",
            "streamed",
            "--cache-cap",
            "4",
            "--state-dir",
        ])
        .arg(state)
        .args(extra)
        .stdin(Stdio::null())
        .output()
}

fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn two_runs_merge_into_one_decayed_history() {
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    let file = state.join(HISTORY_FILE);
    let first_tokens = ok(&run(&state, &[]));
    let first = UsageHistory::load(&file).expect("readable").expect("written");
    assert_eq!(first.runs, 1);
    assert_eq!((first.layers, first.experts), (4, 8), "the bundled model's shape");
    assert!(first.total() > 0.0);
    // The same run again (pins on by default now): the same tokens, and the
    // history holds the first run decayed plus the second.
    let second_tokens = ok(&run(&state, &[]));
    assert_eq!(first_tokens, second_tokens, "pins never change tokens");
    let second = UsageHistory::load(&file).expect("readable").expect("written");
    assert_eq!(second.runs, 2);
    assert_eq!(second.fingerprint, first.fingerprint);
    for (a, b) in first.counts.iter().zip(&second.counts) {
        // Both runs fetched the same experts (same tokens).
        assert!((b - (a * DECAY_PER_RUN + a)).abs() < 1e-3, "{a} -> {b}");
    }
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).expect("meta").permissions());
    assert_eq!(mode & 0o777, 0o600);

    // --no-usage: nothing read or written.
    ok(&run(&state, &["--no-usage"]));
    assert_eq!(UsageHistory::load(&file).expect("readable"), Some(second));

    // A torn file is ignored with a message and replaced.
    let bytes = std::fs::read(&file).expect("read");
    std::fs::write(&file, &bytes[..bytes.len() - 5]).expect("truncate");
    let o = run(&state, &[]);
    ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ignoring the usage history"), "{err}");
    let fresh = UsageHistory::load(&file).expect("readable").expect("written");
    assert_eq!(fresh.runs, 1);

    // --pin FILE: a usable history pins; garbage is an error (exit 1).
    ok(&run(
        &state,
        &["--no-usage", "--pin", file.to_str().expect("utf8")],
    ));
    let junk = tmp.path().join("junk");
    std::fs::write(&junk, b"not a history").expect("write");
    let o = run(&state, &["--pin", junk.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--pin") && !err.contains("panicked"), "{err}");
}

/// `coli serve` and `coli chat` run the model inside the decode loop: the
/// history is written after the loop stops.
#[test]
fn serve_and_chat_write_the_history_when_they_stop() {
    use std::io::Write;
    let tmp = tempfile::tempdir().expect("tmp");
    for (cmd, input) in [("serve", &b"hello\n"[..]), ("chat", &b"hi\n:q\n"[..])] {
        let state = tmp.path().join(cmd);
        let mut child = coli_command()
            .args([cmd, "--temperature", "0", "--max-tokens", "4", "--state-dir"])
            .arg(&state)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .expect("write");
        ok(&child.wait_with_output());
        let h = UsageHistory::load(&state.join(HISTORY_FILE))
            .expect("readable")
            .expect("written");
        assert_eq!(h.runs, 1, "{cmd}");
        assert!(h.total() > 0.0, "{cmd}");
    }
}
