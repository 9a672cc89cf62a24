//! `coli serve` on a GLM (glm_moe_dsa) model: the GLM chat template, prefix
//! reuse and restart-and-resume with the compressed MLA + indexer state.

mod support;

use std::path::{Path, PathBuf};

use support::{Server, olmoe_fixture, repo, state_dir};

const GREEDY: &str = "0 1";

/// glm-tiny (vocab 256) with the 256-token byte-level tokenizer of the OLMoE
/// fixture and no tokenizer_config.json, so the built-in GLM template is used.
fn glm_with_tokenizer(tmp: &Path) -> PathBuf {
    let dir = tmp.join("glm-tiny-tok");
    std::fs::create_dir_all(&dir).unwrap();
    let src = repo().join("fixtures/glm-tiny");
    for f in ["config.json", "model.safetensors", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    std::fs::copy(olmoe_fixture().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    dir
}

#[test]
fn glm_turns_prefix_reuse_and_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let model = glm_with_tokenizer(tmp.path());
    let flags = ["--temperature", "0", "--max-tokens", "8", "--kv-slots", "2"];

    let dir_a = state_dir();
    let mut a = Server::start(
        &model,
        &[&flags[..], &["--state-dir", dir_a.path().to_str().unwrap()]].concat(),
    );
    let a1 = a.line("hello there");
    assert_eq!(a1.stat.len(), 6, "{a1:?}");
    assert!(a1.field(4) > 0);
    let a2 = a.line("and again");
    let raw1 = b"the quick brown fox".to_vec();
    let ar1 = a.prompt(&raw1, &format!("6 {GREEDY} 1"));
    let mut raw2 = raw1.clone();
    raw2.extend_from_slice(&ar1.text);
    raw2.extend_from_slice(b" jumps");
    let ar2 = a.prompt(&raw2, &format!("6 {GREEDY} 1"));
    assert!(
        ar2.field(4) < raw2.len(),
        "the second prompt reuses the first one's prefix: {ar2:?}"
    );
    let (st, err) = a.finish();
    assert!(st.success(), "{err}");

    // Same first turn and prompt, stop, restart on the saved state, continue.
    let dir_b = state_dir();
    let dir_flag = ["--state-dir", dir_b.path().to_str().unwrap()];
    let mut b = Server::start(&model, &[&flags[..], &dir_flag[..]].concat());
    assert_eq!(b.line("hello there").text, a1.text);
    assert_eq!(b.prompt(&raw1, &format!("6 {GREEDY} 1")).text, ar1.text);
    let (st, err) = b.finish();
    assert!(st.success(), "{err}");

    let mut b2 = Server::start(&model, &[&flags[..], &dir_flag[..]].concat());
    let b2_2 = b2.line("and again");
    assert_eq!(
        b2_2.text, a2.text,
        "resumed GLM conversation continues identically"
    );
    assert_eq!(b2_2.field(4), a2.field(4));
    let br2 = b2.prompt(&raw2, &format!("6 {GREEDY} 1"));
    assert_eq!(br2.text, ar2.text);
    assert_eq!(br2.field(4), ar2.field(4), "slot 1 reuses its prefix from disk");
    let (st, err) = b2.finish();
    assert!(st.success());
    assert!(err.contains("resumed"), "{err}");
}
