//! docs/real-models.md promises that every `coli` command in it works as
//! written. This runs each one, with the paths under `~/models/` replaced
//! by the fixtures of the same layout (HF checkpoints) or by temporary
//! directories (the containers the convert commands write).

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `coli` command lines of the doc's `sh` blocks, in order.
fn doc_commands() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("docs/real-models.md")).expect("docs/real-models.md");
    let mut in_sh = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = line.trim() == "```sh";
            continue;
        }
        if in_sh && line.starts_with("coli ") {
            out.push(line.to_string());
        }
    }
    out
}

fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

#[test]
fn every_coli_command_in_real_models_md_runs() {
    let tmp = tempfile::tempdir().expect("tmp");
    let swap = |w: &str, tmp: &Path| -> String {
        let map = [
            (
                "~/models/OLMoE-1B-7B-0924-Instruct",
                repo().join("fixtures/olmoe-tiny"),
            ),
            ("~/models/GLM-5", repo().join("fixtures/glm-tiny")),
            (
                "~/models/Qwen3-30B-A3B-Instruct-2507",
                repo().join("fixtures/qwen3-moe-tiny"),
            ),
            ("~/models/qwen3-30b-int4", tmp.join("qwen3-30b-int4")),
            ("~/models/GLM-4.5-Air", repo().join("fixtures/glm4-moe-tiny")),
            ("~/models/glm45-air-int4", tmp.join("glm45-air-int4")),
            ("~/models/gpt-oss-20b", repo().join("fixtures/gpt-oss-mxfp4")),
            ("~/models/gpt-oss-20b-int4", tmp.join("gpt-oss-20b-int4")),
            ("~/models/olmoe-int8", tmp.join("olmoe-int8")),
            ("~/models/glm5-int4", tmp.join("glm5-int4")),
            (
                "~/models/Qwen3.6-35B-A3B",
                repo().join("fixtures/qwen3-5-moe-tiny"),
            ),
            ("~/models/qwen36-int4", tmp.join("qwen36-int4")),
            ("~/models/MiniMax-M2", repo().join("fixtures/minimax-m2-tiny")),
            ("~/models/minimax-m2-int4", tmp.join("minimax-m2-int4")),
            (
                "~/models/GLM-4.7-Flash",
                repo().join("fixtures/glm4-moe-lite-tiny"),
            ),
            ("~/models/glm47-flash-int4", tmp.join("glm47-flash-int4")),
        ];
        for (from, to) in &map {
            if w == *from {
                return to.display().to_string();
            }
        }
        assert!(
            !w.starts_with("~/"),
            "the test does not know the path {w}: add it to the map"
        );
        w.to_string()
    };
    let cmds = doc_commands();
    assert!(cmds.len() >= 10, "the doc lost its commands: {cmds:?}");
    for line in &cmds {
        let words: Vec<String> = shell_words(line)
            .iter()
            .skip(1)
            .map(|w| swap(w, tmp.path()))
            .collect();
        let out = support::coli_command()
            .args(&words)
            .env("HOME", tmp.path())
            .env("XDG_STATE_HOME", tmp.path().join("state"))
            .stdin(Stdio::null())
            .output();
        assert!(
            out.status.success(),
            "`{line}` failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
