//! The `coli` binary on GLM fixtures: `run --draft` gives the same tokens
//! as plain greedy and reports acceptance; `run` and `validate` give the
//! same tokens under pipeline options (tiny cache, simulated disk, …).

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;

use colibri::cli::validate::Reference;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

fn prompt_ids(name: &str) -> String {
    let r = Reference::load(&fixture(name).join("REF.json")).unwrap();
    let ids: Vec<String> = r.prompt_ids.iter().map(u32::to_string).collect();
    ids.join(",")
}

fn coli(args: &[&str]) -> Output {
    support::coli_command().args(args).output()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `coli run --ids` on fixture `name` with extra flags: (ids line, stderr).
fn run_ids(name: &str, extra: &[&str]) -> (String, String) {
    let dir = fixture(name);
    let prompt = prompt_ids(name);
    let mut args = vec![
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &prompt,
        "--max-tokens",
        "24",
        "--ids",
    ];
    args.extend_from_slice(extra);
    let o = coli(&args);
    assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
    let ids = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(!ids.is_empty(), "{extra:?}");
    (ids, stderr(&o))
}

/// "acceptance A% (x/y drafts), T tokens/forward" -> (A, T).
fn figures(err: &str) -> (f64, f64) {
    let line = err
        .lines()
        .find(|l| l.starts_with("speculative decoding"))
        .unwrap_or_else(|| panic!("no speculative report in {err}"));
    let num_before = |marker: &str| -> f64 {
        let head = &line[..line.find(marker).unwrap()];
        let tok = head.split_whitespace().last().unwrap();
        tok.trim_end_matches('%').parse().unwrap()
    };
    (num_before("% ("), num_before(" tokens/forward"))
}

#[test]
fn drafts_do_not_change_tokens_and_are_reported() {
    for (name, mode) in [("glm-mtp", "mtp"), ("glm-mtp", "ngram"), ("olmoe-tiny", "ngram")] {
        let (plain, plain_err) = run_ids(name, &[]);
        assert!(!plain_err.contains("speculative decoding"), "{plain_err}");
        for k in ["1", "3"] {
            let (spec, err) = run_ids(name, &["--draft", mode, "--draft-k", k]);
            assert_eq!(spec, plain, "{name} --draft {mode} --draft-k {k}");
            let (acc, tpf) = figures(&err);
            eprintln!("{name} --draft {mode} k={k}: acceptance {acc}%, {tpf} tokens/forward");
            assert!((0.0..=100.0).contains(&acc));
            assert!(tpf >= 1.0, "{err}");
            assert!(err.contains(&format!("({mode}, k={k})")), "{err}");
        }
    }
}

#[test]
fn mtp_without_a_head_falls_back_and_says_why() {
    let (plain, _) = run_ids("glm-tiny", &[]);
    let (spec, err) = run_ids("glm-tiny", &["--draft", "mtp"]);
    assert_eq!(spec, plain);
    assert!(err.contains("(ngram, k=3)"), "{err}");
    assert!(err.contains("no MTP drafts"), "{err}");
}

#[test]
fn drafts_refuse_sampling_and_bad_values() {
    let dir = fixture("glm-mtp");
    let d = dir.to_str().unwrap();
    let o = coli(&[
        "run",
        "--model",
        d,
        "--prompt-ids",
        "1,2,3",
        "--temperature",
        "0.7",
        "--draft",
        "mtp",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("greedy"), "{}", stderr(&o));
    let o = coli(&["run", "--model", d, "--prompt-ids", "1,2,3", "--draft", "eagle"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("off, auto, mtp or ngram"), "{}", stderr(&o));
    let o = coli(&[
        "run",
        "--model",
        d,
        "--prompt-ids",
        "1,2,3",
        "--draft",
        "mtp",
        "--draft-k",
        "0",
    ]);
    assert!(!o.status.success());
    // sampling without drafts still runs
    let o = coli(&[
        "run",
        "--model",
        d,
        "--prompt-ids",
        "1,2,3",
        "--temperature",
        "0.7",
        "--ids",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

const SIM: &str = "bw=40MB/s,lat=1ms,jitter=2ms,spike=0.05:5ms,seed=7";

#[test]
fn run_and_validate_under_pipeline_options() {
    let pipelines: [&[&str]; 4] = [
        &["--cache-cap", "1", "--disk-sim", SIM],
        &["--cache-cap", "0", "--io-workers", "1", "--pilot", "off"],
        &["--cache-cap", "2", "--mmap", "--no-overlap"],
        &[
            "--cache-cap",
            "1",
            "--direct",
            "--disk-sim",
            SIM,
            "--draft",
            "mtp",
        ],
    ];
    for name in ["glm-tiny", "glm-mtp"] {
        let (plain, _) = run_ids(name, &[]);
        for extra in pipelines {
            assert_eq!(run_ids(name, extra).0, plain, "{name} {extra:?}");
        }
        let dir = fixture(name);
        let reference = dir.join("REF.json");
        for tf in [false, true] {
            let mut args = vec![
                "validate",
                "--model",
                dir.to_str().unwrap(),
                "--ref",
                reference.to_str().unwrap(),
                "--cache-cap",
                "1",
                "--disk-sim",
                SIM,
            ];
            if tf {
                args.push("--teacher-forcing");
            }
            let o = coli(&args);
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "{name} tf={tf}: {out} {}", stderr(&o));
            let want = if tf {
                "Teacher-forcing: "
            } else {
                "Matching tokens: "
            };
            let line = out
                .lines()
                .find(|l| l.starts_with(want))
                .unwrap_or_else(|| panic!("{out}"));
            let (n, m) = line[want.len()..].split_once('/').unwrap();
            let m = m.split_whitespace().next().unwrap();
            assert_eq!(n, m, "{name}: {line}");
        }
    }
}
