//! Token-exactness of the OLMoE engine against transformers oracles
//! (fixtures/*/REF.json, written by tools/make_olmoe_fixtures.py).

use std::path::{Path, PathBuf};

use colibri::cli::validate::{Reference, greedy, teacher_forcing};
use colibri::engine::{Engine, EngineOptions};
use colibri::model::kv_cache::{KvType, KvTypes};

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("fixtures/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("REF.json").is_file() && p.join("config.json").is_file())
        // gpt-oss checkpoints run only once converted (tests/glm4_gptoss_oracle.rs).
        .filter(|p| !std::fs::read_to_string(p.join("config.json")).is_ok_and(|c| c.contains("\"gpt_oss\"")))
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 3,
        "expected the committed oracle fixtures in {}",
        root.display()
    );
    dirs
}

fn check(dir: &Path, opts: &EngineOptions, max_greedy_miss: usize, max_tf_miss: usize) {
    let mut r = Reference::load(&dir.join("REF.json")).unwrap();
    // Int8 weights are measured against transformers on the same int8
    // round-tripped weights where the fixture carries that oracle: the tiny
    // random checkpoints of the newer families have margins narrower than
    // int8's rounding, so their f32 oracle says nothing about int8.
    if opts.expert_bits == 8
        && let Some(int8) = r.int8()
    {
        r = int8;
    }
    let mut engine = Engine::load(dir, opts).unwrap();
    let (ok, total) = greedy(&mut engine, &r).unwrap();
    assert!(
        total - ok <= max_greedy_miss,
        "{}: greedy {ok}/{total} with {opts:?}",
        dir.display()
    );
    let (ok, total) = teacher_forcing(&mut engine, &r).unwrap();
    assert!(
        total - ok <= max_tf_miss,
        "{}: teacher forcing {ok}/{total} with {opts:?}",
        dir.display()
    );
}

/// The token-exact path: f32 weights, activations and KV cache.
fn exact() -> EngineOptions {
    EngineOptions {
        kv_types: KvTypes::both(KvType::F32),
        ..EngineOptions::default()
    }
}

#[test]
fn f32_is_token_exact_on_every_fixture() {
    for dir in fixtures() {
        check(&dir, &exact(), 0, 0);
    }
}

/// The default f16 KV cache keeps every oracle token on these fixtures too.
#[test]
fn the_default_f16_kv_cache_keeps_every_token() {
    for dir in fixtures() {
        check(&dir, &EngineOptions::default(), 0, 0);
    }
}

#[test]
fn int8_experts_and_dense_within_one_mismatch() {
    // f32 activations: the exact path over int8 weights.
    let opts = EngineOptions {
        expert_bits: 8,
        dense_bits: 8,
        int8_acts: false,
        ..exact()
    };
    for dir in fixtures() {
        check(&dir, &opts, 1, 1);
    }
}

/// Int8 weights multiplied through int8 activations: the VNNI integer path
/// stays within two mismatches of transformers on every fixture (glm-tiny's
/// teacher forcing has the narrowest margins: 28/30 here, 29/30 with f32
/// activations), and matches the bundled trained model exactly.
#[test]
fn int8_activations_stay_close_to_the_oracle() {
    let opts = EngineOptions {
        expert_bits: 8,
        dense_bits: 8,
        int8_acts: true,
        ..exact()
    };
    // glm4-moe-tiny's margins are narrower than int8 activations' error: it
    // is held to its int8 round-trip oracle exactly on the f32-activation
    // path instead, and to one position in eight here
    // (tests/glm4_gptoss_oracle.rs).
    // The Qwen3-Next, GLM-4.7-Flash, DeepSeek-V3.2 and MiniMax-M2 fixtures
    // likewise (tests/qwen3_next_oracle.rs, tests/tf5_families_oracle.rs).
    let narrow = [
        "glm4-moe-tiny",
        "qwen3-next-tiny",
        "qwen3-5-moe-tiny",
        "glm4-moe-lite-tiny",
        "deepseek-v32-tiny",
        "minimax-m2-tiny",
    ];
    for dir in fixtures()
        .into_iter()
        .filter(|d| !narrow.iter().any(|n| d.ends_with(n)))
    {
        check(&dir, &opts, 1, 2);
    }
    let bundled = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny");
    check(&bundled, &opts, 0, 0);
}
