//! `coli synth --preset qwen3-tiny / mixtral-tiny / glm4-tiny /
//! gpt-oss-tiny`: Qwen3-MoE-, Mixtral-, GLM-4.x-MoE- and gpt-oss-shaped
//! containers (grouped-query attention with a head size that is not
//! hidden / heads, each family's own expert and router names, biases,
//! sinks, dense and shared MLPs) that the engine loads and decodes, with
//! the same tokens mapped and streamed, the same bytes from the same seed,
//! and `coli bench` running on them.

mod support;

use support::synth::{SHORT_BENCH, coli_on, container_files, decode_twice, mapped_and_streamed};

use std::path::Path;

use colibri::convert::ALIGN;
use colibri::engine::EngineOptions;
use colibri::model::expert::ExpertNaming;
use colibri::model::olmoe::LoadOptions;
use colibri::quant::QFormat;
use colibri::st::Checkpoint;
use colibri::synth::{ModelShape, SynthSpec, synth};

fn decode(dir: &Path, spec: &SynthSpec, opts: &EngineOptions) -> Vec<u32> {
    decode_twice(dir, spec, opts, 5, 4)
}

/// Writes `preset` (seeded), checks its layout, decodes it mapped and
/// streamed, and writes it again byte for byte.
fn synth_load_decode(preset: &str, model_type: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        seed: 7,
        ..SynthSpec::preset(preset).unwrap()
    };
    assert_eq!(spec.family.model_type(), model_type);
    let attn = spec.family.decoder().unwrap().clone();
    assert!(spec.heads > attn.kv_heads, "grouped-query attention");
    assert_ne!(attn.head_dim, spec.hidden / spec.heads);
    let qwen = model_type == "qwen3_moe";
    let naming = if model_type == "mixtral" {
        ExpertNaming::BLOCK_SPARSE
    } else {
        ExpertNaming::MLP
    };
    let router = |l: usize| match model_type {
        "gpt_oss" => format!("model.layers.{l}.mlp.router.weight"),
        _ => naming.router(l),
    };
    // Layer 1 is sparse in every preset (GLM-4's layer 0 is dense).
    let sparse = spec.layers - spec.sparse_layers();
    assert!(sparse <= 1);

    let dir = tmp.path().join("m");
    let report = synth(&spec, &dir, None).unwrap();
    assert_eq!(report.experts, spec.sparse_layers() * spec.experts);
    assert!(report.bytes < 1_000_000, "a few hundred KB: {}", report.bytes);

    let ck = Checkpoint::open(&dir).unwrap();
    let up = ck.info(&naming.tensor(1, spec.experts - 1, 1)).unwrap();
    assert_eq!(up.shape, vec![spec.intermediate, spec.hidden]);
    let gate = ck.info(&naming.tensor(1, 3, 0)).unwrap();
    assert_eq!(gate.offset % ALIGN, 0, "each expert starts aligned");
    assert!(ck.has(&format!("{}.qs", naming.tensor(1, 3, 2))), "int8 experts");
    assert!(ck.has(&router(1)));
    assert!(!ck.has(&format!("{}.qs", router(1))), "router stays f32");
    assert!(ck.has("model.layers.0.self_attn.k_proj.weight.qs"), "dense int8");
    let k = ck.info("model.layers.0.self_attn.k_proj.weight").unwrap();
    assert_eq!(k.shape, vec![attn.kv_heads * attn.head_dim, spec.hidden]);
    assert_eq!(ck.has("model.layers.0.self_attn.q_norm.weight"), qwen);
    if qwen {
        let q_norm = ck.info("model.layers.0.self_attn.q_norm.weight").unwrap();
        assert_eq!(q_norm.shape, vec![attn.head_dim]);
    }
    match model_type {
        "glm4_moe" => {
            let b = ck.info("model.layers.0.self_attn.k_proj.bias").unwrap();
            assert_eq!(b.shape, vec![attn.kv_heads * attn.head_dim]);
            assert!(
                ck.has("model.layers.0.mlp.down_proj.weight.qs"),
                "the dense layer"
            );
            assert!(!ck.has(&naming.tensor(0, 0, 0)), "no experts in the dense layer");
            assert!(ck.has("model.layers.1.mlp.shared_experts.up_proj.weight.qs"));
            assert!(ck.has("model.layers.1.mlp.gate.e_score_correction_bias"));
        }
        "gpt_oss" => {
            assert_eq!(
                ck.info("model.layers.1.self_attn.sinks").unwrap().shape,
                vec![spec.heads]
            );
            assert!(ck.has("model.layers.1.self_attn.o_proj.bias"));
            assert!(ck.has("model.layers.1.mlp.router.bias"));
            // Each expert's biases come right after its three matrices.
            let down = ck.info(&format!("{}.qs", naming.tensor(1, 3, 2))).unwrap();
            let bias = ck.info(&naming.bias(1, 3, 0)).unwrap();
            assert_eq!(bias.shape, vec![spec.intermediate]);
            assert_eq!(bias.offset, down.offset + down.len);
            assert_eq!(ck.info(&naming.bias(1, 3, 2)).unwrap().shape, vec![spec.hidden]);
        }
        _ => {}
    }

    // What `coli bench` reads: the family's config and its expert extents.
    let shape = ModelShape::load(&dir).unwrap();
    assert_eq!(shape.model_type, model_type);
    assert_eq!(
        (shape.vocab_size, shape.hidden_size, shape.num_hidden_layers),
        (spec.vocab, spec.hidden, spec.layers)
    );
    assert_eq!(
        (shape.num_experts, shape.num_experts_per_tok),
        (spec.experts, spec.top_k)
    );
    let (map, _) = shape.expert_map(&ck, LoadOptions::default()).unwrap();
    assert_eq!(map.experts_per_layer, spec.experts);
    assert_eq!(
        shape.kv_bytes_per_position(colibri::model::kv_cache::KvTypes::default()),
        (spec.layers * 2 * attn.kv_heads * attn.head_dim * 4) as u64
    );
    drop(ck);

    let [mapped, streamed] = mapped_and_streamed().map(|opts| decode(&dir, &spec, &opts));
    assert_eq!(mapped, streamed, "placement changes speed, never tokens");
    assert!(
        mapped.iter().any(|&t| t != mapped[0]),
        "the synthetic weights should not collapse to one token: {mapped:?}"
    );

    // Same seed, same bytes; another seed, other weights.
    let again = tmp.path().join("again");
    synth(&spec, &again, None).unwrap();
    assert!(
        container_files(&dir) == container_files(&again),
        "{preset}: two runs, identical files"
    );
    let other = tmp.path().join("other");
    synth(
        &SynthSpec {
            seed: 8,
            ..spec.clone()
        },
        &other,
        None,
    )
    .unwrap();
    assert_ne!(container_files(&dir).0, container_files(&other).0);
}

#[test]
fn qwen3_tiny_loads_decodes_and_is_reproducible() {
    synth_load_decode("qwen3-tiny", "qwen3_moe");
}

#[test]
fn mixtral_tiny_loads_decodes_and_is_reproducible() {
    synth_load_decode("mixtral-tiny", "mixtral");
}

#[test]
fn glm4_tiny_loads_decodes_and_is_reproducible() {
    synth_load_decode("glm4-tiny", "glm4_moe");
}

#[test]
fn gpt_oss_tiny_loads_decodes_and_is_reproducible() {
    synth_load_decode("gpt-oss-tiny", "gpt_oss");
}

/// int4-gN experts (N dividing hidden and the expert intermediate size)
/// decode too, on both families.
#[test]
fn grouped_int4_experts_decode() {
    for preset in ["qwen3-tiny", "mixtral-tiny", "glm4-tiny", "gpt-oss-tiny"] {
        let tmp = tempfile::tempdir().unwrap();
        let spec = SynthSpec {
            expert_format: QFormat::Int4Grouped { group: 16 },
            ..SynthSpec::preset(preset).unwrap()
        };
        let dir = tmp.path().join("m");
        synth(&spec, &dir, None).unwrap();
        let tokens = decode(&dir, &spec, &EngineOptions::default());
        assert_eq!(tokens.len(), 5, "{preset}");
    }
}

/// The CLI: `coli synth --preset` writes what the library writes (with
/// `--layers`, `--experts` and `--scale` applied), and `coli bench` runs
/// on it deterministically.
#[test]
fn coli_synth_and_bench_on_the_new_presets() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    for (preset, model_type) in [
        ("qwen3-tiny", "qwen3_moe"),
        ("mixtral-tiny", "mixtral"),
        ("glm4-tiny", "glm4_moe"),
        ("gpt-oss-tiny", "gpt_oss"),
    ] {
        let dir = tmp.path().join(preset);
        let (ok, _, err) = coli_on(
            &["synth", "--preset", preset, "--seed", "3", "--output"],
            &dir,
            &state,
        );
        assert!(ok, "{err}");
        let lib = tmp.path().join(format!("{preset}-lib"));
        let spec = SynthSpec {
            seed: 3,
            ..SynthSpec::preset(preset).unwrap()
        };
        synth(&spec, &lib, None).unwrap();
        assert!(
            container_files(&dir) == container_files(&lib),
            "{preset}: the CLI writes the library's bytes"
        );

        let (ok, stdout, err) = coli_on(&SHORT_BENCH, &dir, &state);
        assert!(ok, "{preset}: {stdout}\n{err}");
        assert!(
            stdout.contains("deterministic: tokens identical across"),
            "{stdout}"
        );
        assert!(stdout.contains("memory budget"), "{stdout}");

        // The flags apply to the new families as to the others (GLM-4
        // keeps a sparse layer after its dense one).
        let layers = if model_type == "glm4_moe" { 2 } else { 1 };
        let small = tmp.path().join(format!("{preset}-flags"));
        let (ok, _, err) = coli_on(
            &[
                "synth",
                "--preset",
                preset,
                "--layers",
                &layers.to_string(),
                "--experts",
                "4",
                "--top-k",
                "1",
                "--scale",
                "0.5",
                "--output",
            ],
            &small,
            &state,
        );
        assert!(ok, "{err}");
        let shape = ModelShape::load(&small).unwrap();
        assert_eq!(shape.model_type, model_type);
        assert_eq!(
            (
                shape.num_hidden_layers,
                shape.num_experts,
                shape.num_experts_per_tok
            ),
            (layers, 4, 1)
        );
        assert_eq!((shape.hidden_size, shape.vocab_size), (64, 128));
    }
    let (ok, _, err) = coli_on(
        &["synth", "--preset", "nope", "--output"],
        &tmp.path().join("nope"),
        &state,
    );
    assert!(!ok);
    assert!(
        ["qwen3-30b-a3b", "mixtral-tiny", "glm-4.5-air", "gpt-oss-tiny"]
            .iter()
            .all(|p| err.contains(p)),
        "{err}"
    );
}
