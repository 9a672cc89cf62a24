//! What the transformers-oracle tests share: fixtures, references, the
//! engine options of the exact paths, and comparisons.

use std::path::{Path, PathBuf};

use colibri::cli::validate::{Reference, greedy, teacher_forcing};
use colibri::engine::{Engine, EngineOptions, Placement};
use colibri::model::kv_cache::{KvType, KvTypes};
use colibri::model::lm::Logits;
use colibri_actors::Tag;

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

pub fn reference(dir: &Path) -> Reference {
    Reference::load(&dir.join("REF.json")).unwrap()
}

pub fn int8_oracle(dir: &Path) -> Reference {
    reference(dir).int8().expect("REF.json has an int8 oracle")
}

/// Greedy and teacher-forced mismatches of `model` against `r`.
pub fn mismatches(model: &Path, r: &Reference, opts: &EngineOptions) -> (usize, usize) {
    let mut engine = Engine::load(model, opts).unwrap_or_else(|e| panic!("{}: {e:#}", model.display()));
    let (ok, total) = greedy(&mut engine, r).unwrap();
    let (tok, ttotal) = teacher_forcing(&mut engine, r).unwrap();
    assert!(total > 0 && ttotal > 0);
    (total - ok, ttotal - tok)
}

pub fn exact(model: &Path, r: &Reference, opts: &EngineOptions) {
    assert_eq!(
        mismatches(model, r, opts),
        (0, 0),
        "{} with {opts:?}",
        model.display()
    );
}

/// f32 weights, activations and KV cache.
pub fn exact_kv() -> EngineOptions {
    EngineOptions {
        kv_types: KvTypes::both(KvType::F32),
        ..EngineOptions::default()
    }
}

/// Int8 weights through f32 activations: the path the int8 oracle checks.
pub fn int8_path() -> EngineOptions {
    EngineOptions {
        expert_bits: 8,
        dense_bits: 8,
        int8_acts: false,
        ..exact_kv()
    }
}

/// Int8 weights through int8 activations (the default integer path).
pub fn int8_acts() -> EngineOptions {
    EngineOptions {
        int8_acts: true,
        ..int8_path()
    }
}

/// Experts streamed through a two-expert cache with the pilot.
pub fn streamed(base: EngineOptions) -> EngineOptions {
    EngineOptions {
        placement: Placement::Streamed,
        pilot: true,
        cache_cap: Some(2),
        ..base
    }
}

/// The logits after one forward over `ids`.
pub fn last_logits(engine: &mut Engine, ids: &[u32]) -> Vec<f32> {
    let mut st = engine.model.new_state();
    engine
        .model
        .forward(ids, st.as_mut(), Tag::new(0, 1, 0), Logits::Last)
        .unwrap()
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// A list of logits REF.json keeps under `key`.
pub fn ref_logits(dir: &Path, key: &str) -> Vec<f32> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("REF.json")).unwrap()).unwrap();
    serde_json::from_value(v[key].clone()).unwrap()
}
