//! What the GGUF-against-llama.cpp tests share: reading a fixture's
//! REF.json values, loading a file with llama.cpp's reference settings, and
//! the greedy, logits and comparison helpers. Included by `#[path]` so each
//! test file takes what it uses.
#![allow(dead_code)]

use std::path::Path;

use colibri::engine::{Engine, EngineOptions, Placement};
use colibri::model::kv_cache::{KvType, KvTypes};
use colibri::model::lm::Logits;
use colibri::sampling::{Sampler, SamplingParams};
use serde_json::Value;

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("a number list")
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

/// llama.cpp's reference setting: F32 KV cache.
pub fn exact() -> EngineOptions {
    EngineOptions {
        kv_types: KvTypes::both(KvType::F32),
        ..EngineOptions::default()
    }
}

pub fn load(path: &Path, opts: &EngineOptions) -> Engine {
    Engine::load(path, opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn greedy(engine: &mut Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut session = engine.new_session();
    let mut sampler = Sampler::new(SamplingParams::default());
    let stops = std::mem::take(&mut engine.stop_ids);
    let out = session
        .generate(engine, prompt, n, &mut sampler, &mut |_| true)
        .expect("generation");
    engine.stop_ids = stops;
    out.generated
}

/// Greedy tokens with the experts streamed from the file (one cached
/// expert per layer, O_DIRECT reads, the pilot on) equal those of the
/// mapped file, and the streamed run did read experts on demand.
pub fn assert_streamed_equals_mapped(path: &Path, prompt: &[u32], n: usize) {
    let name = path.display();
    let mapped = EngineOptions {
        placement: Placement::Mapped,
        ..exact()
    };
    let want = greedy(&mut load(path, &mapped), prompt, n);
    let streamed = EngineOptions {
        placement: Placement::Streamed,
        cache_cap: Some(1),
        direct: true,
        pilot: true,
        ..exact()
    };
    let mut engine = load(path, &streamed);
    assert_eq!(greedy(&mut engine, prompt, n), want, "{name} streamed");
    assert!(engine.stats().misses > 0, "{name}: the experts were streamed");
}

pub fn all_logits(engine: &mut Engine, ids: &[u32]) -> Vec<f32> {
    let mut state = engine.model.new_state();
    let tag = engine.next_tag();
    engine
        .model
        .forward(ids, state.as_mut(), tag, Logits::All)
        .expect("forward")
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
