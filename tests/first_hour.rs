//! A newcomer's first hour: no panics on bad paths and configs, exit codes
//! that tell usage errors (2) from runtime errors (1), the chat template on
//! `run --prompt`, private state outside the model directory, `:reset`
//! confirmed, plain stderr when it is not a terminal.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::{Server, coli, olmoe_fixture, tiny_chat_model};

fn run(args: &[&str], envs: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(coli());
    c.args(args).env_remove("COLI_MODEL").env_remove("RUST_LOG");
    for (k, v) in envs {
        c.env(k, v);
    }
    c.stdin(Stdio::null()).output().expect("running coli")
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
    let mut c = Command::new(coli());
    c.args(["serve", "--temperature", "0", "--max-tokens", "3"])
        .env_remove("COLI_MODEL")
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
    let mut child = Command::new(coli())
        .args(["chat", "--temperature", "0", "--max-tokens", "3"])
        .env_remove("COLI_MODEL")
        .env("RUST_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"hi\n:reset\n:q\n").expect("write");
    }
    let o = child.wait_with_output().expect("wait");
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
