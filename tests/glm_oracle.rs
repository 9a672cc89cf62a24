//! Token-exactness of the GLM-5 (glm_moe_dsa) engine against transformers
//! oracles (fixtures/glm-*/REF.json, written by tools/make_glm_fixtures.py),
//! and of its DeepSeek-V3 arm (fixtures/deepseek-v3-tiny, written by
//! tools/make_deepseek_v3_fixture.py with transformers 4.57.1).

use std::path::{Path, PathBuf};

use colibri::cli::validate::{Reference, greedy, teacher_forcing};
use colibri::engine::{Engine, EngineOptions};

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut dirs: Vec<PathBuf> = ["glm-tiny", "glm-mtp"].iter().map(|d| root.join(d)).collect();
    dirs.retain(|p| p.join("REF.json").is_file());
    dirs.sort();
    assert_eq!(
        dirs.len(),
        2,
        "expected the committed GLM fixtures in {}",
        root.display()
    );
    dirs
}

fn check(dir: &Path, opts: &EngineOptions, max_miss: usize) {
    let r = Reference::load(&dir.join("REF.json")).unwrap();
    let mut engine = Engine::load(dir, opts).unwrap();
    let (ok, total) = greedy(&mut engine, &r).unwrap();
    eprintln!("{}: greedy {ok}/{total} ({opts:?})", dir.display());
    assert!(total - ok <= max_miss, "{}: greedy {ok}/{total}", dir.display());
    let (ok, total) = teacher_forcing(&mut engine, &r).unwrap();
    eprintln!("{}: teacher forcing {ok}/{total}", dir.display());
    assert!(
        total - ok <= max_miss,
        "{}: teacher forcing {ok}/{total}",
        dir.display()
    );
}

#[test]
fn f32_is_token_exact() {
    for dir in fixtures() {
        check(&dir, &EngineOptions::default(), 0);
    }
}

#[test]
fn deepseek_v3_f32_is_token_exact() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/deepseek-v3-tiny");
    check(&dir, &EngineOptions::default(), 0);
}

#[test]
fn int8_experts_and_dense_within_one_mismatch() {
    // f32 activations: the exact path over int8 weights.
    let opts = EngineOptions {
        expert_bits: 8,
        dense_bits: 8,
        int8_acts: false,
        ..EngineOptions::default()
    };
    for dir in fixtures() {
        check(&dir, &opts, 1);
    }
}
