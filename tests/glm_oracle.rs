//! Token-exactness of the GLM-5 (glm_moe_dsa) engine against transformers
//! oracles (fixtures/glm-*/REF.json, written by tools/make_glm_fixtures.py),
//! and of its DeepSeek-V3 arm (fixtures/deepseek-v3-tiny, written by
//! tools/make_deepseek_v3_fixture.py with transformers 4.57.1): in f32, and
//! with int8 weights and f32 activations against transformers run on the
//! same int8 round-trip weights (`int8_full_ids` / `int8_tf_pred`).

use std::path::{Path, PathBuf};

use colibri::cli::validate::{Reference, greedy, teacher_forcing};
use colibri::convert::convert;
use colibri::engine::{Engine, EngineOptions, Placement};
use colibri::model::kv_cache::{KvType, KvTypes};
use colibri::model::lm::Logits;
use colibri::quant::QFormat;
use colibri::st::Checkpoint;
use colibri_actors::Tag;

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
    check(&dir, &exact_kv(), 0);
    // The default f16 latent cache keeps every token too.
    check(&dir, &EngineOptions::default(), 0);
}

/// MLA's latent in every cache type: f32 and f16 keep every token of the
/// GLM fixtures; q8 (llama.cpp's q8_0 blocks, about 0.4% error per value)
/// stays within two (on glm-tiny one greedy step flips a near tie and the
/// next follows from it).
#[test]
fn the_latent_cache_types_stay_close() {
    for dir in fixtures() {
        for (t, miss) in [(KvType::F32, 0), (KvType::F16, 0), (KvType::Q8, 2)] {
            let opts = EngineOptions {
                kv_types: KvTypes::both(t),
                ..EngineOptions::default()
            };
            check(&dir, &opts, miss);
        }
    }
}

/// The token-exact path: f32 KV state (the default f16 moves these
/// fixtures' logits past the 1e-3 bounds below).
fn exact_kv() -> EngineOptions {
    EngineOptions {
        kv_types: KvTypes::both(KvType::F32),
        ..EngineOptions::default()
    }
}

/// Greedy and teacher-forced mismatches of `model` against `r`.
fn mismatches(model: &Path, r: &Reference, opts: &EngineOptions) -> (usize, usize) {
    let mut engine = Engine::load(model, opts).unwrap();
    let (ok, total) = greedy(&mut engine, r).unwrap();
    let (tok, ttotal) = teacher_forcing(&mut engine, r).unwrap();
    (total - ok, ttotal - tok)
}

/// DeepSeek-V3 with int8 weights (every matrix but the router: embeddings,
/// MLA projections, dense and shared MLPs, experts, head) and f32
/// activations, quantized at load (mapped and streamed) or by `coli
/// convert`: token for token the int8 oracle.
#[test]
fn deepseek_v3_int8_is_token_exact_against_the_int8_oracle() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/deepseek-v3-tiny");
    let int8 = Reference::load(&dir.join("REF.json"))
        .unwrap()
        .int8()
        .expect("REF.json has an int8 oracle");
    let at_load = EngineOptions {
        expert_bits: 8,
        dense_bits: 8,
        int8_acts: false,
        ..exact_kv()
    };
    let streamed = EngineOptions {
        placement: Placement::Streamed,
        pilot: true,
        cache_cap: Some(2),
        ..at_load.clone()
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("deepseek-int8");
    convert(&dir, &out, QFormat::Int8, QFormat::Int8, None).unwrap();
    let ck = Checkpoint::open(&out).unwrap();
    assert!(ck.has("model.layers.0.self_attn.kv_b_proj.weight.qs"));
    assert!(ck.has("model.layers.1.mlp.shared_experts.down_proj.weight.qs"));
    assert!(ck.has("lm_head.weight.qs"));
    assert!(!ck.has("model.layers.1.mlp.gate.weight.qs"));
    drop(ck);
    let container = EngineOptions {
        int8_acts: false,
        ..exact_kv()
    };
    for (model, opts) in [(&dir, &at_load), (&dir, &streamed), (&out, &container)] {
        assert_eq!(
            mismatches(model, &int8, opts),
            (0, 0),
            "{} with {opts:?}",
            model.display()
        );
    }

    // The int8 tokens equal the f32 ones here; the last-position logits
    // tell int8 weights from f32 ones (more than 0.1 apart), and the engine
    // is within 1e-3 of the matching oracle in each precision.
    let text = std::fs::read_to_string(dir.join("REF.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let get = |k: &str| -> Vec<f32> { serde_json::from_value(v[k].clone()).unwrap() };
    let (f32_ref, int8_ref) = (get("logits_last"), get("int8_logits_last"));
    let max_diff = |a: &[f32], b: &[f32]| {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
    };
    assert!(max_diff(&f32_ref, &int8_ref) > 0.1);
    for (model, opts, want) in [
        (&dir, &exact_kv(), &f32_ref),
        (&dir, &at_load, &int8_ref),
        (&out, &container, &int8_ref),
    ] {
        let mut engine = Engine::load(model, opts).unwrap();
        let mut st = engine.model.new_state();
        let got = engine
            .model
            .forward(&int8.full_ids, st.as_mut(), Tag::new(0, 1, 0), Logits::Last)
            .unwrap();
        let d = max_diff(&got, want);
        assert!(
            d < 1e-3,
            "{} with {opts:?}: logits {d} from the oracle",
            model.display()
        );
    }
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
