//! A newcomer's first hour: no panics on bad paths and configs, exit codes
//! that tell usage errors (2) from runtime errors (1), the chat template on
//! `run --prompt`, private state outside the model directory (and nothing
//! anywhere else in HOME), `:reset` confirmed, plain stderr when it is not a
//! terminal, one set of limits on every front end, and a reader that closes
//! stdout ending the command quietly.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Output, Stdio};

use support::{Server, coli_command, olmoe_fixture, tiny_chat_model};

fn run(args: &[&str], envs: &[(&str, &Path)]) -> Output {
    let mut c = coli_command();
    c.args(args);
    for (k, v) in envs {
        c.env(k, v);
    }
    c.stdin(Stdio::null()).output()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn no_panic(o: &Output) {
    let e = stderr(o);
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn a_trace_file_that_cannot_be_created_is_an_error_not_a_panic() {
    // A directory that certainly does not exist (not a fixed path someone
    // may have created).
    let tmp = tempfile::tempdir().expect("tmp");
    let missing = tmp.path().join("missing").join("dir").join("t.json");
    let missing = missing.to_str().expect("utf8");
    let o = run(
        &[
            "run",
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "1",
            "--trace",
            missing,
        ],
        &[],
    );
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("--trace {missing}")),
        "{}",
        stderr(&o)
    );
    // A device that refuses every write: an error at exit, not a panic.
    if Path::new("/dev/full").exists() {
        let o = run(
            &[
                "run",
                "--prompt-ids",
                "1,2",
                "--max-tokens",
                "1",
                "--trace",
                "/dev/full",
            ],
            &[],
        );
        no_panic(&o);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains("writing the trace failed"), "{}", stderr(&o));
    }
}

#[test]
fn usage_errors_exit_2_and_runtime_errors_exit_1() {
    let o = run(&["run", "--prompt-ids", "1", "--cache-cap", "-1"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("must be a whole number >= 0, got -1"),
        "{}",
        stderr(&o)
    );
    let o = run(&["run", "--prompt-ids", "1", "--max-tokens", "-5"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("whole number"), "{}", stderr(&o));
    // A reply of no tokens is not a reply: refused by name and range.
    let o = run(&["run", "--prompt-ids", "1", "--max-tokens", "0"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--max-tokens") && stderr(&o).contains("must be a whole number >= 1, got 0"),
        "{}",
        stderr(&o)
    );
    assert!(o.stdout.is_empty());
    let o = run(
        &["run", "--model", "/nonexistent/model", "--prompt-ids", "1"],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    // Values clap parses but the command refuses are usage errors too.
    let o = run(&["run", "--prompt-ids", "1", "--ram-gb", "-1"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--ram-gb"), "{}", stderr(&o));
    let o = run(&["run", "--prompt-ids", "1", "--temperature", "-1"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--temperature"), "{}", stderr(&o));
}

#[test]
fn a_negative_clip_qkv_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tmp");
    let src = olmoe_fixture();
    for entry in std::fs::read_dir(&src).expect("fixture") {
        let p = entry.expect("entry").path();
        std::fs::copy(&p, dir.path().join(p.file_name().expect("name"))).expect("copy");
    }
    let cfg = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).expect("config")).expect("json");
    v["clip_qkv"] = (-1.0).into();
    std::fs::write(&cfg, v.to_string()).expect("write");
    let o = run(
        &[
            "run",
            "--model",
            dir.path().to_str().expect("utf8"),
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "2",
        ],
        &[],
    );
    no_panic(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("clip_qkv"), "{}", stderr(&o));
}

/// The prompt length printed on stderr.
fn prompt_tokens(err: &str) -> usize {
    err.split("prompt ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prompt length in {err}"))
}

#[test]
fn run_prompt_applies_the_chat_template_and_raw_skips_it() {
    let q = "What does river mean?";
    let chat = run(&["run", "--prompt", q, "--max-tokens", "12", "--ids"], &[]);
    assert!(chat.status.success(), "{}", stderr(&chat));
    let raw = run(
        &["run", "--prompt", q, "--max-tokens", "12", "--ids", "--raw"],
        &[],
    );
    assert!(raw.status.success(), "{}", stderr(&raw));
    // The template adds the user and assistant markers around the question.
    assert!(prompt_tokens(&stderr(&chat)) > prompt_tokens(&stderr(&raw)));
    // Wrapped, the bundled chat model answers instead of ending at once.
    let ids = String::from_utf8_lossy(&chat.stdout);
    assert!(ids.split_whitespace().count() > 3, "{ids:?}");
}

#[test]
fn serve_keeps_private_state_outside_the_model_dir() {
    let model_state = || {
        std::fs::metadata(tiny_chat_model().join(".coli_kv"))
            .ok()
            .and_then(|m| m.modified().ok())
    };
    let before = model_state();
    let home = tempfile::tempdir().expect("tmp");
    let xdg = home.path().join("state");
    let mut c = coli_command();
    c.args(["serve", "--temperature", "0", "--max-tokens", "3"])
        .env("XDG_STATE_HOME", &xdg)
        .env("HOME", home.path());
    let mut s = Server::from_command(c);
    s.expect_ready();
    let r = s.line("hello");
    assert!(r.field(0) >= 1);
    let (st, err) = s.finish();
    assert!(st.success(), "{err}");
    let base = xdg.join("colibri");
    let dirs: Vec<_> = std::fs::read_dir(&base).expect("state base").collect();
    assert_eq!(dirs.len(), 1, "one directory per model fingerprint");
    let dir = dirs.into_iter().next().expect("one").expect("entry").path();
    let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(".coli_kv")), 0o600);
    assert!(err.contains(&format!("saving to {}", dir.display())), "{err}");
    // The model directory is untouched (a file left there by an older
    // version may exist; it must not have been written by this run).
    assert_eq!(model_state(), before, "serve wrote into the model directory");
}

#[test]
fn a_state_dir_others_can_write_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let o = run(&["serve", "--state-dir", open.to_str().expect("utf8")], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("writable by other users"), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "no READY for a refused start");
}

#[test]
fn chat_reset_confirms_and_stderr_is_plain_text() {
    let mut child = coli_command()
        .args(["chat", "--temperature", "0", "--max-tokens", "3"])
        .env("RUST_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"hi\n:reset\n:q\n").expect("write");
    }
    let o = child.wait_with_output();
    assert!(o.status.success());
    let err = stderr(&o);
    assert!(err.contains("conversation cleared"), "{err}");
    assert!(
        !err.contains('\x1b'),
        "ANSI escapes on a non-terminal stderr: {err:?}"
    );
}

#[test]
fn doctor_describes_the_machine_and_the_bundled_model() {
    let home = tempfile::tempdir().expect("tmp");
    let o = run(
        &["doctor", "--probe-mb", "1"],
        &[("HOME", home.path()), ("XDG_STATE_HOME", home.path())],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    for key in [
        "cpu ",
        "kernels ",
        "budget ",
        "disk ",
        "model ",
        "formats ",
        "experts ",
        "placement ",
        "O_DIRECT ",
        "state ",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(key)),
            "no {key:?} line in:\n{out}"
        );
    }
    assert!(out.contains("colibri-tiny"), "{out}");
}

#[test]
fn doctor_names_a_broken_model_directory() {
    let tmp = tempfile::tempdir().expect("tmp");
    std::fs::write(tmp.path().join("config.json"), "{\"model_type\": \"olmoe\"}").expect("write");
    std::fs::write(
        tmp.path().join("model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json",
    )
    .expect("write");
    let dir = tmp.path().to_str().expect("utf8");
    let o = run(&["doctor", "--model", dir, "--probe-mb", "0"], &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let problem = out
        .lines()
        .find(|l| l.starts_with("PROBLEM"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(problem.contains("model.safetensors"), "{problem}");
}

#[test]
fn plan_predicts_a_consistent_range_and_refuses_bad_budgets() {
    let o = run(
        &["plan", "--json", "--probe-mb", "1", "--probe-experts", "4"],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).expect("plan --json is JSON");
    let f = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("{k} missing in {p}"));
    assert!(
        f("tok_per_s_low") > 0.0 && f("tok_per_s_low") <= f("tok_per_s_high"),
        "{p}"
    );
    assert_eq!(p["placement"], "mapped", "the bundled model fits anywhere: {p}");
    assert_eq!(f("expected_hit_rate"), 1.0);
    assert!(f("bytes_per_token") > 0.0 && f("expert_bytes") > 0.0);
    // The KV cache is planned for the model's own context (the bundled
    // model's config says 1024), as `coli serve` sizes it, and says so.
    assert_eq!(p["ctx"], 1024, "{p}");
    let why = p["ctx_source"].as_str().unwrap_or_default();
    assert!(why.contains("the model's own context"), "{p}");
    let text = run(&["plan", "--probe-mb", "1", "--probe-experts", "4"], &[]);
    assert!(text.status.success(), "{}", stderr(&text));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("1 slot(s) x 1024 positions"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("context      1024 positions per slot: the model's own context")),
        "{text}"
    );

    // A budget smaller than the experts streams them, with a lower hit rate.
    let small = run(
        &[
            "plan",
            "--json",
            "--probe-mb",
            "1",
            "--probe-experts",
            "4",
            "--ram-gb",
            "0.253",
            "--ctx",
            "64",
        ],
        &[],
    );
    assert!(small.status.success(), "{}", stderr(&small));
    let s: serde_json::Value = serde_json::from_slice(&small.stdout).expect("json");
    assert_eq!(s["placement"], "streamed", "{s}");
    assert_eq!(
        (s["ctx"].as_u64(), s["ctx_source"].as_str()),
        (Some(64), Some("--ctx")),
        "{s}"
    );
    let kv = |v: &serde_json::Value| {
        v["kv_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("kv_bytes in {v}"))
    };
    assert_eq!(kv(&s) * 1024, kv(&p) * 64, "{s} {p}");
    assert!(s["expected_hit_rate"].as_f64().unwrap_or(1.0) < 1.0, "{s}");

    let bad = run(&["plan", "--ram-gb", "-1"], &[]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("--ram-gb"), "{}", stderr(&bad));
}

// ---- where the first commands write ------------------------------------------

/// Every file under `root`, as paths relative to it.
fn files_under(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).expect("readable dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p.strip_prefix(root).expect("under root").to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// The commands a newcomer runs first (`run`, `serve` with two turns then
/// EOF, `chat` from stdin, `bench` with tiny counts, `doctor`) with `HOME`
/// at `home` and the XDG variables as `xdg` says (`None`: unset).
fn first_commands(home: &Path, xdg: Option<&Path>) {
    let command = || {
        let mut c = coli_command();
        c.env("HOME", home);
        for var in [
            "XDG_STATE_HOME",
            "XDG_DATA_HOME",
            "XDG_CACHE_HOME",
            "XDG_CONFIG_HOME",
            "COLI_MODELS",
        ] {
            c.env_remove(var);
        }
        if let Some(x) = xdg {
            c.env("XDG_STATE_HOME", x.join("state"))
                .env("XDG_DATA_HOME", x.join("data"));
        }
        c
    };
    let ok = |o: &Output, what: &str| {
        assert!(o.status.success(), "{what}: {}", stderr(o));
        no_panic(o);
    };
    let o = command()
        .args(["run", "--prompt", "hello", "--max-tokens", "4"])
        .stdin(Stdio::null())
        .output();
    ok(&o, "run");
    let mut c = command();
    c.args(["serve", "--temperature", "0", "--max-tokens", "3"]);
    let mut s = Server::from_command(c);
    s.expect_ready();
    assert!(s.line("hello").field(0) >= 1);
    assert!(s.line("and then?").field(0) >= 1);
    let (st, err) = s.finish();
    assert!(st.success() && !err.contains("panicked"), "serve: {err}");
    let mut chat = command()
        .args(["chat", "--temperature", "0", "--max-tokens", "3"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    {
        use std::io::Write;
        let mut stdin = chat.stdin.take().expect("stdin");
        stdin.write_all(b"hi\nmore please\n:q\n").expect("write");
    }
    ok(&chat.wait_with_output(), "chat");
    let o = command()
        .args([
            "bench",
            "--tokens",
            "2",
            "--warmup",
            "1",
            "--prompt-len",
            "4",
            "--probe-mb",
            "1",
            "--no-compute-bound",
        ])
        .stdin(Stdio::null())
        .output();
    ok(&o, "bench");
    let o = command()
        .args(["doctor", "--probe-mb", "1"])
        .stdin(Stdio::null())
        .output();
    ok(&o, "doctor");
}

#[test]
fn the_first_commands_write_only_where_the_docs_say() {
    // XDG unset: conversations and usage histories under ~/.local/state/colibri
    // (docs/state-files.md), models under ~/.local/share/colibri; nothing else.
    let home = tempfile::tempdir().expect("tmp");
    first_commands(home.path(), None);
    let files = files_under(home.path());
    let state = Path::new(".local/state/colibri");
    let data = Path::new(".local/share/colibri");
    let stray: Vec<_> = files
        .iter()
        .filter(|f| !f.starts_with(state) && !f.starts_with(data))
        .collect();
    assert!(stray.is_empty(), "written outside the documented dirs: {stray:?}");
    // The check has teeth: serve saved its conversation, run its usage history.
    assert!(
        files
            .iter()
            .any(|f| f.starts_with(state) && f.ends_with(".coli_kv")),
        "{files:?}"
    );
    assert!(
        files
            .iter()
            .any(|f| f.starts_with(state) && f.ends_with(colibri::engine::usage::HISTORY_FILE)),
        "{files:?}"
    );

    // XDG set: HOME stays empty, the state goes where XDG_STATE_HOME says.
    let home = tempfile::tempdir().expect("tmp");
    let xdg = tempfile::tempdir().expect("tmp");
    first_commands(home.path(), Some(xdg.path()));
    let in_home = files_under(home.path());
    assert!(in_home.is_empty(), "written into HOME: {in_home:?}");
    let mut entries = std::fs::read_dir(home.path()).expect("HOME");
    assert!(entries.next().is_none(), "a directory was made in HOME");
    assert!(
        files_under(&xdg.path().join("state").join("colibri"))
            .iter()
            .any(|f| f.ends_with(".coli_kv")),
        "no conversation under XDG_STATE_HOME"
    );
}

// ---- a reader that closes stdout -----------------------------------------------

/// Reads from `r` on a thread until `enough` says the bytes so far suffice
/// (or the pipe ends), bounded by the reply timeout; gives the reader back
/// so the caller decides when it closes.
fn read_until(
    mut r: std::io::PipeReader,
    enough: impl Fn(&[u8]) -> bool + Send + 'static,
) -> (std::io::PipeReader, Vec<u8>) {
    use std::io::Read;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while !enough(&got) {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let _ = tx.send((r, got));
    });
    rx.recv_timeout(support::REPLY_TIMEOUT)
        .expect("coli wrote nothing in time")
}

/// A generation slow enough (every expert read waits on a simulated disk)
/// that most of it comes after the test closed the pipe.
const SLOW: &[&str] = &["--disk-sim", "lat=2ms", "--cache-cap", "1", "--pilot", "off"];

fn run_into(stdout: Stdio, stderr: Stdio) -> support::ColiChild {
    coli_command()
        .args([
            "run",
            "--prompt",
            "Tell me a long story about a river.",
            "--max-tokens",
            "64",
        ])
        .args(SLOW)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
}

#[test]
fn a_closed_stdout_ends_run_quietly() {
    // stdout closed after a few bytes, stderr read to the end: exit 0 (README,
    // "Exit codes"), no panic, no broken-pipe message, the summary still there.
    let (r, w) = std::io::pipe().expect("pipe");
    let mut child = run_into(w.into(), Stdio::piped());
    let err = child.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let (r, got) = read_until(r, |b| b.len() >= 3);
    assert!(!got.is_empty(), "no output before the close");
    drop(r);
    let status = support::wait_bounded(&mut child, support::REPLY_TIMEOUT);
    let err = err.join().expect("stderr reader");
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.to_lowercase().contains("broken pipe"), "{err}");
    assert!(err.contains("generated"), "{err}");

    // stdout and stderr on one pipe (`2>&1 | head -c 10`), closed after a few
    // bytes: every later write fails, on both streams.
    let (r, w) = std::io::pipe().expect("pipe");
    let mut child = run_into(w.try_clone().expect("dup").into(), w.into());
    let (r, _) = read_until(r, |b| b.len() >= 10);
    drop(r);
    let status = support::wait_bounded(&mut child, support::REPLY_TIMEOUT);
    assert_eq!(status.code(), Some(0), "a panic exits 101");

    // Both closed before the first byte: every write of the run fails.
    let (r, w) = std::io::pipe().expect("pipe");
    drop(r);
    let mut child = run_into(w.try_clone().expect("dup").into(), w.into());
    let status = support::wait_bounded(&mut child, support::REPLY_TIMEOUT);
    assert_eq!(status.code(), Some(0), "a panic exits 101");
}

/// Tokens slot 0's state file in `dir` holds, read as the engine reads it.
fn saved_tokens(dir: &Path) -> usize {
    use colibri::engine::{Engine, EngineOptions, state_layout};
    use colibri_actors::kv::{KvFile, slot_path};
    let engine = Engine::load(&tiny_chat_model(), &EngineOptions::default()).expect("model");
    let layout = state_layout(engine.state_fingerprint(), engine.model.new_state().as_ref());
    // Read a copy: opening may rewrite headers.
    let copy = tempfile::tempdir().expect("tmp");
    let path = slot_path(copy.path(), 0);
    std::fs::copy(slot_path(dir, 0), &path).expect("a state file for slot 0");
    let mut n = 0;
    KvFile::open(&path, layout, &mut |_, _| n += 1).expect("a readable state file");
    n
}

#[test]
fn serve_saves_the_conversation_when_stdout_closes() {
    use std::io::Write;
    let state = tempfile::tempdir().expect("tmp");
    let (r, w) = std::io::pipe().expect("pipe");
    let mut child = coli_command()
        .args(["serve", "--temperature", "0", "--max-tokens", "8", "--state-dir"])
        .arg(state.path())
        .stdin(Stdio::piped())
        .stdout(w.into())
        .stderr(Stdio::piped())
        .spawn();
    let err = child.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"hello\n").expect("first turn");
    stdin.flush().expect("flush");
    // READY, then the first reply up to the end of its STAT line.
    let end = support::END;
    let after_end = move |b: &[u8]| {
        b.windows(end.len())
            .position(|w| w == end)
            .map(|i| b[i + end.len()..].to_vec())
    };
    let (r, got) = read_until(r, move |b| after_end(b).is_some_and(|rest| rest.contains(&b'\n')));
    let stat = after_end(&got).expect("a reply");
    let stat = String::from_utf8_lossy(&stat);
    let f: Vec<usize> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // STAT <emitted> <tok/s> <hit%> <rss> <prompt_tokens> <length_limited>.
    let (emitted, prompt) = (f[0], f[f.len() - 2]);
    // The client stops reading, sends one more turn and ends its input.
    drop(r);
    stdin
        .write_all(b"tell me more about that\n")
        .expect("second turn");
    drop(stdin);
    let status = support::wait_bounded(&mut child, support::REPLY_TIMEOUT);
    let err = err.join().expect("stderr reader");
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.to_lowercase().contains("broken pipe"), "{err}");
    // The first turn (its prompt, its reply and perhaps a stop token) and
    // the second turn's prompt, whose reply nobody read, are saved.
    let held = saved_tokens(state.path());
    assert!(
        held > prompt + emitted + 1,
        "{held} tokens saved after {prompt} + {emitted}"
    );
}
