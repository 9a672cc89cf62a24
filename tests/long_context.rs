//! The context the front ends run at (`--ctx`): by default the model's
//! `max_position_embeddings` as far as the memory budget holds the KV
//! cache, said on stderr when the budget caps it; an explicit one beyond
//! the model's positions (or the RoPE scaling's extension of them), or
//! beyond what fits, is refused as a usage error naming the numbers.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `coli run` on `model` with `extra` flags, every state file under `home`.
fn run(model: &Path, home: &Path, extra: &[&str]) -> Output {
    support::coli_command()
        .args(["run", "--model"])
        .arg(model)
        .args([
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "2",
            "--ids",
            "--no-usage",
        ])
        .args(extra)
        .env("HOME", home)
        .env("XDG_STATE_HOME", home.join("state"))
        .stdin(Stdio::null())
        .output()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_default_context_is_the_models_capped_by_the_budget_and_said() {
    let tmp = tempfile::tempdir().expect("tmp");
    let tiny = repo().join("models/colibri-tiny");
    // Unconstrained: the model's 1024 positions, nothing to say.
    let o = run(&tiny, tmp.path(), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("of the model's 1024 positions"),
        "{}",
        stderr(&o)
    );
    // 256 MiB of working set leave the KV cache a few MiB of this budget.
    let o = run(&tiny, tmp.path(), &["--ram-gb", "0.256"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    let line = e
        .lines()
        .find(|l| l.starts_with("coli run: context "))
        .unwrap_or_else(|| panic!("no context line: {e}"));
    assert!(
        line.contains("of the model's 1024 positions: the KV cache of 1 slot(s) at f16 fits"),
        "{line}"
    );
    let ctx: usize = line["coli run: context ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!((256..1024).contains(&ctx), "{line}");
    // A smaller KV cache type holds more of it (within the half of the
    // room the default leaves the KV cache).
    let o = run(&tiny, tmp.path(), &["--ram-gb", "0.256", "--kv-type", "q8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let q8: usize = stderr(&o)
        .lines()
        .find_map(|l| l.strip_prefix("coli run: context "))
        .map_or(Some(1024), |rest| {
            rest.split(' ').next().and_then(|n| n.parse().ok())
        })
        .unwrap_or_else(|| panic!("{}", stderr(&o)));
    assert!(q8 > ctx, "q8 {q8} vs f16 {ctx}: {}", stderr(&o));
}

#[test]
fn an_explicit_context_beyond_the_model_or_the_budget_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let tiny = repo().join("models/colibri-tiny");
    let o = run(&tiny, tmp.path(), &["--ctx", "5000"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("--ctx 5000") && e.contains("1024 positions"), "{e}");
    let o = run(&tiny, tmp.path(), &["--ctx", "1000", "--ram-gb", "0.256"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("--ctx 1000 does not fit the memory budget"), "{e}");
    // `coli plan` refuses the same way.
    let o = support::coli_command()
        .args([
            "plan",
            "--probe-mb",
            "1",
            "--probe-experts",
            "2",
            "--ctx",
            "5000",
            "--model",
        ])
        .arg(&tiny)
        .env("HOME", tmp.path())
        .stdin(Stdio::null())
        .output();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("1024"), "{}", stderr(&o));
}

#[test]
fn a_declared_yarn_scaling_extends_what_ctx_may_ask_for() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = repo().join("fixtures/qwen3-moe-tiny");
    let dir = tmp.path().join("qwen3-yarn");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for f in std::fs::read_dir(&src).expect("fixture") {
        let f = f.expect("entry").path();
        std::fs::copy(&f, dir.join(f.file_name().expect("name"))).expect("copy");
    }
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("json");
    let max = cfg["max_position_embeddings"]
        .as_u64()
        .expect("max_position_embeddings");
    cfg["rope_scaling"] = serde_json::json!({
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": max
    });
    std::fs::write(&path, cfg.to_string()).expect("write");
    let four = (4 * max).to_string();
    let o = run(&dir, tmp.path(), &["--ctx", &four]);
    assert!(o.status.success(), "{}", stderr(&o));
    let more = (4 * max + 1).to_string();
    let o = run(&dir, tmp.path(), &["--ctx", &more]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains(&format!("exceeds the model's {four} positions"))
            && e.contains(&format!("max_position_embeddings {max}")),
        "{e}"
    );
    // The plan reports the scaled limit and sizes its table up to it.
    let o = support::coli_command()
        .args([
            "plan",
            "--json",
            "--probe-mb",
            "1",
            "--probe-experts",
            "2",
            "--model",
        ])
        .arg(&dir)
        .env("HOME", tmp.path())
        .stdin(Stdio::null())
        .output();
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).expect("plan json");
    assert_eq!(p["position_limit"].as_u64(), Some(4 * max), "{p}");
    assert_eq!(
        p["ctx"].as_u64(),
        Some(max),
        "the default stays max_position_embeddings: {p}"
    );
    let cells = p["longest_ctx"].as_array().expect("longest_ctx");
    assert_eq!(cells.len(), 12, "{p}");
    assert!(cells.iter().all(|c| c["ctx"].as_u64() == Some(4 * max)), "{p}");
}

/// `Session::feed` runs a prompt longer than `PREFILL_CHUNK` in pieces (so
/// a long prompt does not hold every row's activations at once); the
/// pieces give the logits and cache of one pass over the whole prompt, bit
/// for bit.
#[test]
fn a_prompt_fed_in_pieces_equals_one_pass() {
    use colibri::engine::{Engine, EngineOptions, PREFILL_CHUNK, Session};
    use colibri::model::lm::Logits;

    let tiny = repo().join("models/colibri-tiny");
    let mut engine = Engine::load(&tiny, &EngineOptions::default()).expect("bundled model");
    let n = PREFILL_CHUNK + PREFILL_CHUNK / 2 + 7;
    assert!(n < engine.model.max_positions(), "the prompt fits the model");
    let vocab = engine.model.vocab_size() as u32;
    let prompt: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 13) % vocab).collect();

    let mut pieces = Session::new(engine.model.new_state());
    let a = pieces.feed(&mut engine, &prompt).expect("feed");
    assert_eq!(pieces.tokens, prompt);
    assert_eq!(pieces.kv.len(), n);

    let mut whole = engine.model.new_state();
    let tag = engine.next_tag();
    let b = engine
        .model
        .forward(&prompt, whole.as_mut(), tag, Logits::Last)
        .expect("one pass");
    assert_eq!(a.len(), b.len());
    let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same, "logits differ between pieces and one pass");

    // And the cache the pieces left continues exactly like the other.
    let tag = engine.next_tag();
    let next = [prompt[0]];
    let c = engine
        .model
        .forward(&next, pieces.kv.as_mut(), tag, Logits::Last)
        .expect("continue pieces");
    let tag = engine.next_tag();
    let d = engine
        .model
        .forward(&next, whole.as_mut(), tag, Logits::Last)
        .expect("continue one pass");
    assert!(c.iter().zip(&d).all(|(x, y)| x.to_bits() == y.to_bits()));
}

/// A prompt too long for one command-line argument comes from a file:
/// `--prompt-ids-file` (ids separated by commas, spaces or newlines) gives
/// what `--prompt-ids` gives for the same ids, and a missing file is a
/// usage error naming the flag and the path.
#[test]
fn prompt_ids_from_a_file_equal_ids_on_the_command_line() {
    let tmp = tempfile::tempdir().expect("tmp");
    let tiny = repo().join("models/colibri-tiny");
    let ids: Vec<String> = (0..40u32).map(|i| ((i * 97 + 5) % 500 + 1).to_string()).collect();
    let file = tmp.path().join("ids.txt");
    std::fs::write(
        &file,
        format!("{}\n{}\n", ids[..20].join(","), ids[20..].join(" ")),
    )
    .expect("write ids");
    let run_with = |flag: &str, value: &str| {
        support::coli_command()
            .args(["run", "--model"])
            .arg(&tiny)
            .args([flag, value, "--max-tokens", "6", "--ids", "--no-usage"])
            .env("HOME", tmp.path())
            .env("XDG_STATE_HOME", tmp.path().join("state"))
            .stdin(Stdio::null())
            .output()
    };
    let a = run_with("--prompt-ids", &ids.join(","));
    assert!(a.status.success(), "{}", stderr(&a));
    let b = run_with("--prompt-ids-file", file.to_str().expect("utf-8 path"));
    assert!(b.status.success(), "{}", stderr(&b));
    assert_eq!(a.stdout, b.stdout);
    assert!(!a.stdout.is_empty());

    let missing = tmp.path().join("nope.txt");
    let c = run_with("--prompt-ids-file", missing.to_str().expect("utf-8 path"));
    assert!(!c.status.success());
    let e = stderr(&c);
    assert!(e.contains("--prompt-ids-file") && e.contains("nope.txt"), "{e}");
}
