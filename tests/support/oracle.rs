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

/// [`exact`] with the experts mapped in place and streamed through a
/// two-expert cache with the pilot.
pub fn exact_mapped_and_streamed(model: &Path, r: &Reference, opts: EngineOptions) {
    exact(model, r, &opts);
    exact(model, r, &streamed(opts));
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

/// Teacher-forced mismatches of the int8-activation path against the
/// fixture's int8 oracle, and the positions compared.
pub fn int8_acts_tf_mismatches(dir: &Path) -> (usize, usize) {
    let int8 = int8_oracle(dir);
    let (_, tf) = mismatches(dir, &int8, &int8_acts());
    (tf, int8.full_ids.len())
}

/// How far the last-position logits are from the oracle's: f32 weights
/// and KV cache, int8 weights (against the int8 oracle), and the default
/// f16 KV cache; each bounded (1e-3, 1e-3, 1e-2) and printed.
pub fn assert_last_logits_close(name: &str, dir: &Path) {
    let (f32_ref, int8_ref) = (
        ref_logits(dir, "logits_last"),
        ref_logits(dir, "int8_logits_last"),
    );
    let mut e = Engine::load(dir, &exact_kv()).unwrap();
    let d = max_diff(&last_logits(&mut e, &reference(dir).full_ids), &f32_ref);
    let mut e = Engine::load(dir, &int8_path()).unwrap();
    let d8 = max_diff(&last_logits(&mut e, &int8_oracle(dir).full_ids), &int8_ref);
    let mut e = Engine::load(dir, &EngineOptions::default()).unwrap();
    let d16 = max_diff(&last_logits(&mut e, &reference(dir).full_ids), &f32_ref);
    eprintln!("{name}: |f32 - oracle| {d:.2e}, |int8 - int8 oracle| {d8:.2e}, |f16 KV - oracle| {d16:.2e}");
    assert!(d < 1e-3, "{name}: f32 logits {d} from the oracle");
    assert!(d8 < 1e-3, "{name}: int8 logits {d8} from the int8 oracle");
    assert!(d16 < 1e-2, "{name}: f16-KV logits {d16} from the oracle");
}
