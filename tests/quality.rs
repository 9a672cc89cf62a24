//! `coli quality`: a model against itself on the exact path is identical,
//! a quantized one measurably is not, and bad input is named.

mod support;

use std::path::{Path, PathBuf};

fn bundled() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny")
}

fn text() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/quality/wordnet-heldout.txt")
}

/// `coli quality` on the bundled model against itself, then `extra`.
fn against_itself(extra: &[&str]) -> std::process::Output {
    let m = bundled();
    let m = m.to_str().unwrap();
    support::coli_command()
        .args(["quality", "--model", m, "--reference", m])
        .args(extra)
        .output()
}

fn quality(extra: &[&str]) -> std::process::Output {
    let t = text();
    let mut args = vec![
        "--text",
        t.to_str().unwrap(),
        "--max-positions",
        "300",
        "--window",
        "128",
        "--json",
    ];
    args.extend_from_slice(extra);
    against_itself(&args)
}

fn json(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("--json prints JSON")
}

#[test]
fn the_exact_path_against_itself_is_identical_and_int4_is_not() {
    let same = json(&quality(&["--kv-type", "f32", "--f32-acts"]));
    assert_eq!(same["positions"], 300);
    assert_eq!(same["top1_agree"], 300);
    assert_eq!(same["mean_kl"].as_f64(), Some(0.0));
    assert_eq!(same["ppl_model"], same["ppl_reference"]);
    let int4 = json(&quality(&["--expert-bits", "4"]));
    let kl = int4["mean_kl"].as_f64().unwrap();
    assert!(kl > 1e-4 && kl < 0.5, "int4 experts: mean KL {kl}");
    assert!(int4["top1_agree"].as_u64().unwrap() < 300);
    assert!(int4["max_kl"].as_f64().unwrap() >= kl);
}

#[test]
fn the_window_and_chunk_change_speed_not_results_within_a_window() {
    // One window read in chunks of 7 or of 128: the same numbers.
    let a = json(&quality(&["--chunk", "7"]));
    let b = json(&quality(&["--chunk", "128"]));
    assert_eq!(a, b);
}

#[test]
fn bad_input_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let ids = tmp.path().join("ids.txt");
    std::fs::write(&ids, "1, 2, x3").unwrap();
    let m = bundled();
    let run = against_itself;
    let o = run(&["--ids", ids.to_str().unwrap()]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("entry 3") && e.contains("x3"), "{e}");
    std::fs::write(&ids, "1, 2, 999999").unwrap();
    let e = String::from_utf8_lossy(&run(&["--ids", ids.to_str().unwrap()]).stderr).into_owned();
    assert!(e.contains("999999") && e.contains("vocabulary"), "{e}");
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--text FILE or --ids FILE"));
    let missing = tmp.path().join("nope");
    let o = support::coli_command()
        .args([
            "quality",
            "--model",
            m.to_str().unwrap(),
            "--reference",
            missing.to_str().unwrap(),
        ])
        .args(["--ids", ids.to_str().unwrap()])
        .output();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("loading the reference") && e.contains("nope"),
        "{e}"
    );
}
