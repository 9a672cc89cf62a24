//! Checkpoints as transformers 5 writes them (fixtures/tf5/*, written by
//! tools/make_tf5_fixtures.py from the transformers 4.57 fixtures with
//! transformers 5.23's save_pretrained, REF.json from transformers 5 running
//! the written checkpoint): `num_local_experts` for Qwen3-MoE,
//! `rope_parameters` with `partial_rotary_factor` inside, `dtype`. Each loads
//! as it is and is token-exact in f32 (mapped, and streamed with the pilot),
//! at int8 against transformers 5 on the int8 round-trip weights, and after
//! `coli convert`; its config reads as the same model as its transformers 4
//! original.

use std::path::{Path, PathBuf};

use colibri::cli::validate::{Reference, greedy, teacher_forcing};
use colibri::convert::convert;
use colibri::engine::{Engine, EngineOptions, Placement};
use colibri::model::family::ModelConfig;
use colibri::quant::QFormat;

/// fixtures/tf5/<name> and the transformers 4 fixture it was made from.
const FIXTURES: [(&str, &str); 4] = [
    ("qwen3-moe", "qwen3-moe-tiny"),
    ("mixtral", "mixtral-tiny"),
    ("glm4-moe", "glm4-moe-tiny"),
    ("deepseek-v3", "deepseek-v3-tiny"),
];

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(rel)
}

fn mismatches(model: &Path, r: &Reference, opts: &EngineOptions) -> (usize, usize) {
    let mut engine = Engine::load(model, opts).unwrap_or_else(|e| panic!("{}: {e:#}", model.display()));
    let (ok, total) = greedy(&mut engine, r).unwrap();
    let (tok, ttotal) = teacher_forcing(&mut engine, r).unwrap();
    assert!(total > 0 && ttotal > 0);
    (total - ok, ttotal - tok)
}

fn exact(model: &Path, r: &Reference, opts: &EngineOptions) {
    assert_eq!(
        mismatches(model, r, opts),
        (0, 0),
        "{} with {opts:?}",
        model.display()
    );
}

fn reference(dir: &Path) -> Reference {
    Reference::load(&dir.join("REF.json")).unwrap()
}

fn int8_path() -> EngineOptions {
    EngineOptions {
        expert_bits: 8,
        dense_bits: 8,
        int8_acts: false,
        ..EngineOptions::default()
    }
}

#[test]
fn the_fixtures_are_spelled_the_transformers_5_way() {
    for (name, _) in FIXTURES {
        let text = std::fs::read_to_string(fixture(&format!("tf5/{name}/config.json"))).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(
            v["transformers_version"].as_str().unwrap().starts_with("5."),
            "{name}"
        );
        assert!(
            v.get("rope_parameters").is_some() && v.get("rope_theta").is_none(),
            "{name}"
        );
        assert!(
            v.get("dtype").is_some() && v.get("torch_dtype").is_none(),
            "{name}"
        );
    }
    let qwen: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tf5/qwen3-moe/config.json")).unwrap())
            .unwrap();
    assert!(qwen.get("num_local_experts").is_some() && qwen.get("num_experts").is_none());
}

#[test]
fn a_transformers_5_config_reads_as_its_transformers_4_original() {
    let read = |p: PathBuf| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p.join("config.json")).unwrap()).unwrap()
    };
    for (name, v4) in FIXTURES {
        let a = ModelConfig::load(&fixture(&format!("tf5/{name}"))).unwrap();
        // transformers 5 writes the defaults the 4.57 files left out; the
        // one the engine reads is the next-token layer count.
        let mut old = read(fixture(v4));
        if let Some(n) = read(fixture(&format!("tf5/{name}"))).get("num_nextn_predict_layers") {
            old.as_object_mut()
                .unwrap()
                .entry("num_nextn_predict_layers")
                .or_insert(n.clone());
        }
        let b = ModelConfig::from_json(Path::new("config.json"), old).unwrap();
        assert_eq!(a.shape(), b.shape(), "{name}");
        let kv = colibri::model::kv_cache::KvTypes::default();
        assert_eq!(a.kv_bytes_per_position(kv), b.kv_bytes_per_position(kv), "{name}");
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "{name}");
    }
}

#[test]
fn f32_is_token_exact_mapped_and_streamed() {
    let streamed = EngineOptions {
        placement: Placement::Streamed,
        pilot: true,
        cache_cap: Some(2),
        ..EngineOptions::default()
    };
    for (name, _) in FIXTURES {
        let dir = fixture(&format!("tf5/{name}"));
        let r = reference(&dir);
        exact(&dir, &r, &EngineOptions::default());
        exact(&dir, &r, &streamed);
    }
}

#[test]
fn int8_is_token_exact_against_transformers_5_on_the_same_weights() {
    for (name, _) in FIXTURES {
        let dir = fixture(&format!("tf5/{name}"));
        let int8 = reference(&dir).int8().expect("an int8 oracle");
        exact(&dir, &int8, &int8_path());
    }
}

#[test]
fn coli_convert_reads_them_as_they_are() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, _) in FIXTURES {
        let dir = fixture(&format!("tf5/{name}"));
        let out = tmp.path().join(name);
        convert(&dir, &out, QFormat::Int8, QFormat::Int8, None).unwrap();
        let f32_acts = EngineOptions {
            int8_acts: false,
            ..EngineOptions::default()
        };
        exact(&out, &reference(&dir).int8().expect("an int8 oracle"), &f32_acts);
        let f32_out = tmp.path().join(format!("{name}-f32"));
        convert(&dir, &f32_out, QFormat::F32, QFormat::F32, None).unwrap();
        exact(&f32_out, &reference(&dir), &EngineOptions::default());
    }
}

/// A copy of `src` whose routed experts are the stacked tensors transformers
/// 5 holds in memory (`mlp.experts.gate_up_proj [E, 2I, H]`, `down_proj
/// [E, H, I]`), as a checkpoint written from its state dict has them.
fn write_stacked(src: &Path, dst: &Path) {
    use colibri::st::Checkpoint;
    use safetensors::Dtype;
    use safetensors::tensor::TensorView;
    use std::collections::BTreeMap;
    std::fs::create_dir_all(dst).unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        if src.join(f).is_file() {
            std::fs::copy(src.join(f), dst.join(f)).unwrap();
        }
    }
    let ck = Checkpoint::open(src).unwrap();
    // A tensor's shape and bytes.
    type Tensor = (Vec<usize>, Vec<u8>);
    let mut tensors: BTreeMap<String, Tensor> = BTreeMap::new();
    // (layer, projection) -> expert -> tensor
    let mut experts: BTreeMap<(String, String), BTreeMap<usize, Tensor>> = BTreeMap::new();
    for name in ck.names() {
        let info = ck.info(name).unwrap();
        let bytes = ck.bytes(name).unwrap().to_vec();
        let parts: Vec<&str> = name.split('.').collect();
        // model.layers.L.mlp.experts.E.PROJ.weight
        if parts.len() == 8 && parts[3] == "mlp" && parts[4] == "experts" && parts[7] == "weight" {
            let e: usize = parts[5].parse().unwrap();
            experts
                .entry((parts[2].to_string(), parts[6].to_string()))
                .or_default()
                .insert(e, (info.shape.clone(), bytes));
        } else {
            tensors.insert(name.to_string(), (info.shape.clone(), bytes));
        }
    }
    assert!(!experts.is_empty(), "{}: no per-expert tensors", src.display());
    let layers: std::collections::BTreeSet<String> = experts.keys().map(|(l, _)| l.clone()).collect();
    for l in layers {
        let take = |proj: &str| {
            experts[&(l.clone(), proj.to_string())]
                .values()
                .cloned()
                .collect::<Vec<_>>()
        };
        let (gate, up, down) = (take("gate_proj"), take("up_proj"), take("down_proj"));
        let n = gate.len();
        let (i, h) = (gate[0].0[0], gate[0].0[1]);
        let mut gate_up = Vec::new();
        for e in 0..n {
            gate_up.extend_from_slice(&gate[e].1);
            gate_up.extend_from_slice(&up[e].1);
        }
        let down_all: Vec<u8> = down.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        tensors.insert(
            format!("model.layers.{l}.mlp.experts.gate_up_proj"),
            (vec![n, 2 * i, h], gate_up),
        );
        tensors.insert(
            format!("model.layers.{l}.mlp.experts.down_proj"),
            (vec![n, h, i], down_all),
        );
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (s, b))| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();
}

#[test]
fn stacked_experts_stream_straight_from_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let streamed = EngineOptions {
        placement: Placement::Streamed,
        pilot: true,
        cache_cap: Some(2),
        ..EngineOptions::default()
    };
    for name in ["qwen3-moe", "glm4-moe", "deepseek-v3"] {
        let src = fixture(&format!("tf5/{name}"));
        let dir = tmp.path().join(name);
        write_stacked(&src, &dir);
        let ck = colibri::st::Checkpoint::open(&dir).unwrap();
        assert!(
            ck.names().all(|n| !n.contains(".experts.0.")),
            "{name}: still per expert"
        );
        drop(ck);
        let r = reference(&src);
        exact(&dir, &r, &EngineOptions::default());
        exact(&dir, &r, &streamed);
        exact(&dir, &r.int8().expect("an int8 oracle"), &int8_path());
        let out = tmp.path().join(format!("{name}-int8"));
        convert(&dir, &out, QFormat::Int8, QFormat::Int8, None).unwrap();
        let f32_acts = EngineOptions {
            int8_acts: false,
            ..EngineOptions::default()
        };
        exact(&out, &r.int8().expect("an int8 oracle"), &f32_acts);
    }
}
