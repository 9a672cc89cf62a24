//! `coli synth --preset glm-tiny`: a GLM-5-shaped container (MLA, DSA
//! indexer, dense leading layer, shared expert, grouped sigmoid router,
//! int4-g64 experts) that the engine loads and decodes, with the same
//! tokens whether experts are mapped in place or streamed through a
//! two-expert cache.

use colibri::engine::{Engine, EngineOptions, Placement};
use colibri::model::olmoe::LoadOptions;
use colibri::quant::QFormat;
use colibri::st::Checkpoint;
use colibri::synth::{ModelShape, SynthSpec, decode_pass, synth, synthetic_prompt};

fn decode(dir: &std::path::Path, spec: &SynthSpec, opts: &EngineOptions) -> Vec<u32> {
    let mut engine = Engine::load(dir, opts).unwrap_or_else(|e| panic!("{opts:?}: {e}"));
    let prompt = synthetic_prompt(spec.vocab, 5, 1);
    let mut session = engine.new_session();
    let r = decode_pass(&mut engine, &mut session, &prompt, 1, 4).unwrap();
    let again = decode_pass(&mut engine, &mut session, &prompt, 1, 4).unwrap();
    assert_eq!(r.tokens, again.tokens, "{opts:?}: a warm cache, the same tokens");
    let w = r.window;
    assert_eq!(
        (w.hits + w.misses) as usize,
        4 * spec.sparse_layers() * spec.top_k,
        "{opts:?}: every routed expert of every sparse layer delivered: {w:?}"
    );
    r.tokens
}

#[test]
fn glm_tiny_decodes_identically_mapped_and_streamed() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        seed: 5,
        ..SynthSpec::glm_tiny()
    };
    assert_eq!(spec.expert_format, QFormat::Int4Grouped { group: 64 });
    let dir = tmp.path().join("m");
    let report = synth(&spec, &dir, None).unwrap();
    assert_eq!(report.experts, spec.sparse_layers() * spec.experts);

    let ck = Checkpoint::open(&dir).unwrap();
    let up = ck.info("model.layers.2.mlp.experts.7.up_proj.weight").unwrap();
    assert_eq!(
        up.shape,
        vec![spec.intermediate, spec.hidden / 2],
        "two weights a byte"
    );
    assert!(
        ck.has("model.layers.2.mlp.experts.7.up_proj.weight.qs"),
        "group scales"
    );
    assert!(
        !ck.has("model.layers.0.mlp.experts.0.up_proj.weight"),
        "layer 0 is dense"
    );
    assert!(ck.has("model.layers.0.mlp.up_proj.weight.qs"), "dense int8");
    assert!(!ck.has("model.layers.1.mlp.gate.weight.qs"), "router stays f32");
    assert!(ck.has("model.layers.1.self_attn.indexer.wq_b.weight"));

    // What `coli bench` reads: the GLM config and its expert extents.
    let shape = ModelShape::load(&dir).unwrap();
    assert_eq!(shape.model_type, "glm_moe_dsa");
    assert_eq!((shape.vocab_size, shape.num_experts), (spec.vocab, spec.experts));
    let (map, _) = shape.expert_map(&ck, LoadOptions::default()).unwrap();
    assert_eq!(map.experts_per_layer, spec.experts);
    drop(ck);

    let mapped = decode(
        &dir,
        &spec,
        &EngineOptions {
            placement: Placement::Mapped,
            ..EngineOptions::default()
        },
    );
    let streamed = decode(
        &dir,
        &spec,
        &EngineOptions {
            placement: Placement::Streamed,
            cache_cap: Some(2),
            ..EngineOptions::default()
        },
    );
    assert_eq!(mapped, streamed, "placement changes speed, never tokens");
    assert!(
        mapped.iter().any(|&t| t != mapped[0]),
        "the synthetic weights should not collapse to one token: {mapped:?}"
    );

    // Same seed, same bytes.
    let again = tmp.path().join("again");
    synth(&spec, &again, None).unwrap();
    let bytes = |d: &std::path::Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert_eq!(bytes(&dir), bytes(&again));
}
