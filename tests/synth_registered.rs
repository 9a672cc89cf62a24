//! `coli synth` presets of the families whose synthetic shape lives in the
//! family's own folder (Qwen3.5/3.6, MiniMax-M2, DeepSeek-V3.2,
//! GLM-4.7-Flash): the tiny ones load and decode with the same tokens
//! mapped and streamed and the same bytes from the same seed; the real
//! ones have the releases' expert sizes; every preset is found through
//! the family registry; `coli synth` and `coli bench` run on them.

mod support;

use support::synth::{SHORT_BENCH, coli_on, container_files, decode_twice, mapped_and_streamed};

use std::path::Path;

use colibri::engine::EngineOptions;
use colibri::model::olmoe::LoadOptions;
use colibri::quant::QFormat;
use colibri::st::Checkpoint;
use colibri::synth::{ModelShape, SynthSpec, presets, synth};

/// (tiny preset, model_type, a routed expert's up projection in layer `l`).
const TINY: [(&str, &str, &str); 4] = [
    (
        "qwen35-tiny",
        "qwen3_5_moe_text",
        "model.layers.{l}.mlp.experts.{e}.up_proj.weight",
    ),
    (
        "minimax-tiny",
        "minimax_m2",
        "model.layers.{l}.block_sparse_moe.experts.{e}.w3.weight",
    ),
    (
        "deepseek-v32-tiny",
        "deepseek_v32",
        "model.layers.{l}.mlp.experts.{e}.up_proj.weight",
    ),
    (
        "glm47-flash-tiny",
        "glm4_moe_lite",
        "model.layers.{l}.mlp.experts.{e}.up_proj.weight",
    ),
];

fn expert_name(pattern: &str, l: usize, e: usize) -> String {
    pattern
        .replace("{l}", &l.to_string())
        .replace("{e}", &e.to_string())
}

fn decode(dir: &Path, spec: &SynthSpec, opts: &EngineOptions) -> Vec<u32> {
    decode_twice(dir, spec, opts, 9, 6)
}

#[test]
fn tiny_presets_load_decode_and_are_reproducible() {
    for (preset, model_type, up) in TINY {
        let tmp = tempfile::tempdir().unwrap();
        let spec = SynthSpec {
            seed: 5,
            ..SynthSpec::preset(preset).unwrap()
        };
        assert!(presets().any(|p| p.name == preset), "{preset}");
        assert_eq!(spec.family.model_type(), model_type);
        let dir = tmp.path().join("m");
        let report = synth(&spec, &dir, None).unwrap();
        assert_eq!(report.experts, spec.sparse_layers() * spec.experts, "{preset}");
        assert!(report.bytes < 2_000_000, "{preset}: {}", report.bytes);

        let ck = Checkpoint::open(&dir).unwrap();
        let last = spec.layers - 1;
        let info = ck.info(&expert_name(up, last, spec.experts - 1)).unwrap();
        assert_eq!(info.shape, vec![spec.intermediate, spec.hidden], "{preset}");
        let shape = ModelShape::load(&dir).unwrap();
        assert_eq!(shape.model_type, model_type);
        assert_eq!(
            (shape.vocab_size, shape.hidden_size, shape.num_hidden_layers),
            (spec.vocab, spec.hidden, spec.layers)
        );
        let (map, _) = shape.expert_map(&ck, LoadOptions::default()).unwrap();
        assert_eq!(map.experts_per_layer, spec.experts);
        drop(ck);

        let [mapped, streamed] = mapped_and_streamed().map(|opts| decode(&dir, &spec, &opts));
        assert_eq!(
            mapped, streamed,
            "{preset}: placement changes speed, never tokens"
        );
        assert!(
            mapped.iter().any(|&t| t != mapped[0]),
            "{preset}: the synthetic weights should not collapse to one token: {mapped:?}"
        );

        let again = tmp.path().join("again");
        synth(&spec, &again, None).unwrap();
        assert!(
            container_files(&dir) == container_files(&again),
            "{preset}: two runs, identical files"
        );
        let other = tmp.path().join("other");
        synth(
            &SynthSpec {
                seed: 6,
                ..spec.clone()
            },
            &other,
            None,
        )
        .unwrap();
        assert_ne!(container_files(&dir).0, container_files(&other).0, "{preset}");
    }
}

/// Grouped int4 experts decode on every registered family.
#[test]
fn grouped_int4_experts_decode() {
    for (preset, _, _) in TINY {
        let tmp = tempfile::tempdir().unwrap();
        let spec = SynthSpec {
            expert_format: QFormat::Int4Grouped { group: 16 },
            ..SynthSpec::preset(preset).unwrap()
        };
        let dir = tmp.path().join("m");
        synth(&spec, &dir, None).unwrap();
        let tokens = decode(&dir, &spec, &EngineOptions::default());
        assert_eq!(tokens.len(), 7, "{preset}");
    }
}

/// The real presets validate (the family's own config parser accepts what
/// they write) and carry the releases' sizes.
#[test]
fn real_presets_have_the_release_shapes() {
    // (preset, model_type, layers by default, hidden, experts, top-k,
    // expert intermediate, head size)
    let real = [
        ("qwen3.6-35b-a3b", "qwen3_5_moe_text", 40, 2048, 256, 8, 512, 256),
        (
            "qwen3.5-397b-a17b",
            "qwen3_5_moe_text",
            4,
            4096,
            512,
            10,
            1024,
            256,
        ),
        ("minimax-m2", "minimax_m2", 4, 3072, 256, 8, 1536, 128),
        ("deepseek-v3.2", "deepseek_v32", 4, 7168, 256, 8, 2048, 192),
        ("glm-4.7-flash", "glm4_moe_lite", 47, 2048, 64, 4, 1536, 256),
    ];
    for (preset, model_type, layers, hidden, experts, top_k, inter, head) in real {
        let s = SynthSpec::preset(preset).unwrap();
        s.validate().unwrap_or_else(|e| panic!("{preset}: {e}"));
        assert_eq!(s.family.model_type(), model_type);
        assert_eq!(
            (
                s.layers,
                s.hidden,
                s.experts,
                s.top_k,
                s.intermediate,
                s.head_dim()
            ),
            (layers, hidden, experts, top_k, inter, head),
            "{preset}"
        );
        assert!(
            s.eos_id() < s.vocab && s.eos_id() != s.vocab - 1,
            "{preset}: the real eos"
        );
        // --layers picks more, as the doc comments promise.
        let more = SynthSpec {
            layers: 8,
            ..s.clone()
        };
        more.validate().unwrap();
    }
    // Qwen3.6-35B-A3B's pattern: three linear layers, then a full one.
    let cfg = SynthSpec::preset("qwen3.6-35b-a3b").unwrap().config_json();
    let kinds = cfg["layer_types"].as_array().unwrap();
    assert_eq!(kinds.len(), 40);
    assert_eq!(kinds[3], "full_attention");
    assert_eq!(kinds[2], "linear_attention");
    assert_eq!(kinds.iter().filter(|k| *k == "full_attention").count(), 10);
    assert_eq!(
        cfg["rope_parameters"]["mrope_section"],
        serde_json::json!([11, 11, 10])
    );
}

#[test]
fn every_preset_is_listed_once_through_the_registry() {
    let names: Vec<&str> = presets().map(|p| p.name).collect();
    for want in [
        "olmoe-1b-7b",
        "tiny",
        "glm-5",
        "qwen3-30b-a3b",
        "gpt-oss-tiny",
        "qwen3.6-35b-a3b",
        "qwen3.5-397b-a17b",
        "minimax-m2",
        "deepseek-v3.2",
        "glm-4.7-flash",
    ] {
        assert_eq!(names.iter().filter(|n| **n == want).count(), 1, "{want}");
    }
    for p in presets() {
        let s = (p.build)();
        s.validate().unwrap_or_else(|e| panic!("{}: {e}", p.name));
    }
    let e = SynthSpec::preset("nope").unwrap_err().to_string();
    assert!(names.iter().all(|n| e.contains(n)), "{e}");
}

/// `coli synth --preset` writes what the library writes, `--scale` and
/// `--layers` apply, and `coli bench` runs deterministically on each.
#[test]
fn coli_synth_and_bench() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    for (preset, model_type, _) in TINY {
        let dir = tmp.path().join(preset);
        let (ok, _, err) = coli_on(
            &["synth", "--preset", preset, "--seed", "3", "--output"],
            &dir,
            &state,
        );
        assert!(ok, "{preset}: {err}");
        let lib = tmp.path().join(format!("{preset}-lib"));
        synth(
            &SynthSpec {
                seed: 3,
                ..SynthSpec::preset(preset).unwrap()
            },
            &lib,
            None,
        )
        .unwrap();
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

        let scaled = tmp.path().join(format!("{preset}-scaled"));
        let (ok, _, err) = coli_on(
            &[
                "synth", "--preset", preset, "--layers", "4", "--scale", "0.5", "--output",
            ],
            &scaled,
            &state,
        );
        let mla = matches!(model_type, "deepseek_v32" | "glm4_moe_lite");
        if mla {
            assert!(!ok && err.contains("--scale is not offered"), "{preset}: {err}");
        } else {
            assert!(ok, "{preset}: {err}");
            let shape = ModelShape::load(&scaled).unwrap();
            assert_eq!((shape.hidden_size, shape.num_hidden_layers), (64, 4), "{preset}");
        }
    }
}
