//! Progress of the long jobs: `coli synth` and `coli convert` print a
//! bounded number of plain lines on a stderr that is not a terminal (and
//! nothing on stdout), a small model loads without a progress line, and a
//! load reports every dense byte it reads against the total it announced.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use colibri::engine::{Engine, EngineOptions};
use colibri::progress::{MAX_LINES_PER_JOB, Progress};
use support::{coli, olmoe_fixture, tiny_chat_model};

/// `coli ARGS` with stdout and stderr piped and every state or data
/// directory inside `home`.
fn run(args: &[&str], home: &Path) -> Output {
    Command::new(coli())
        .args(args)
        .env_remove("COLI_MODEL")
        .env_remove("RUST_LOG")
        .env("HOME", home)
        .env("XDG_STATE_HOME", home.join("state"))
        .env("XDG_DATA_HOME", home.join("data"))
        .stdin(Stdio::null())
        .output()
        .expect("running coli")
}

/// The progress lines of `phase` in `o`'s stderr, checked to be plain
/// (no terminal control) and bounded.
fn progress_lines(o: &Output, phase: &str) -> Vec<String> {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    assert!(
        !err.contains('\x1b') && !err.contains('\r'),
        "terminal control in {err:?}"
    );
    let prefix = format!("coli: {phase}: ");
    let lines: Vec<String> = err
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(str::to_string)
        .collect();
    assert!(
        lines.len() >= 2 && lines.len() <= MAX_LINES_PER_JOB,
        "{} progress lines: {err}",
        lines.len()
    );
    assert!(lines[0].contains("0% of "), "{lines:?}");
    assert!(lines[lines.len() - 1].contains(": done, "), "{lines:?}");
    lines
}

#[test]
fn synth_prints_bounded_plain_progress_lines_on_stderr() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("tiny");
    let o = run(
        &[
            "synth",
            "--preset",
            "tiny",
            "--output",
            out.to_str().expect("utf8"),
        ],
        tmp.path(),
    );
    progress_lines(&o, "generating");
    assert!(
        o.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(out.join("model.safetensors").is_file());
}

#[test]
fn convert_prints_bounded_plain_progress_lines_on_stderr() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("container");
    let input = olmoe_fixture();
    let o = run(
        &[
            "convert",
            "--input",
            input.to_str().expect("utf8"),
            "--output",
            out.to_str().expect("utf8"),
        ],
        tmp.path(),
    );
    let lines = progress_lines(&o, "converting");
    // Every line after the first names done and total bytes.
    for l in &lines[1..lines.len() - 1] {
        assert!(l.contains('%') && l.contains(" of "), "{l}");
    }
    assert!(
        o.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(out.join("model.safetensors").is_file());
}

#[test]
fn a_small_model_loads_without_a_progress_line() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tiny_chat_model();
    let o = run(
        &[
            "run",
            "--model",
            model.to_str().expect("utf8"),
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "1",
            "--ids",
        ],
        tmp.path(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("loading dense weights"), "{err}");
    assert!(!o.stdout.is_empty());
}

/// What a load told its progress.
#[derive(Default)]
struct Recorded {
    starts: Vec<(String, u64)>,
    done: Vec<u64>,
    finished: usize,
}

#[derive(Default)]
struct Recorder(Mutex<Recorded>);

impl Progress for Recorder {
    fn start(&self, phase: &str, total: u64) {
        self.0.lock().unwrap().starts.push((phase.to_string(), total));
    }
    fn advance(&self, done: u64) {
        self.0.lock().unwrap().done.push(done);
    }
    fn finish(&self) {
        self.0.lock().unwrap().finished += 1;
    }
}

/// Loads `dir` with a recorder and checks that the dense bytes read add up
/// to the announced total: every tensor but the routed experts.
fn load_reports_every_dense_byte(dir: &Path) {
    let rec = Arc::new(Recorder::default());
    let progress: Arc<dyn Progress> = rec.clone();
    let engine = Engine::load_with_progress(dir, &EngineOptions::default(), Some(progress))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    drop(engine);
    let r = rec.0.lock().unwrap();
    assert_eq!(r.starts.len(), 1, "{:?}", r.starts);
    let (phase, total) = &r.starts[0];
    assert_eq!(phase, "loading dense weights");
    assert!(*total > 0);
    assert!(r.done.windows(2).all(|w| w[0] < w[1]), "{:?}", r.done);
    assert_eq!(r.done.last(), Some(total), "{}", dir.display());
    assert_eq!(r.finished, 1);
}

#[test]
fn a_load_reports_its_dense_bytes_against_the_total() {
    // A Hugging Face checkpoint (quantized at load) and a container.
    load_reports_every_dense_byte(&olmoe_fixture());
    load_reports_every_dense_byte(&tiny_chat_model());
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("c");
    colibri::convert::convert(
        &olmoe_fixture(),
        &out,
        colibri::quant::QFormat::Int8,
        colibri::quant::QFormat::Int8,
        None,
    )
    .expect("convert");
    load_reports_every_dense_byte(&out);
}
