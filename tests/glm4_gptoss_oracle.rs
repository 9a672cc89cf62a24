//! GLM-4.x MoE and gpt-oss against transformers oracles
//! (fixtures/{glm4-moe-tiny,gpt-oss-tiny,gpt-oss-mxfp4}/REF.json, written by
//! tools/make_glm4_gptoss_fixtures.py): token-exact in f32 and, against
//! transformers run on the same int8 round-trip weights, in int8; gpt-oss
//! through `coli convert` from its fused BF16-release layout and from MXFP4;
//! streamed with the pilot; served with the model's chat template; hostile
//! configs and checkpoints refused by name.

mod support;

use std::path::{Path, PathBuf};

use colibri::chat_template::{ChatMessage, ChatTemplate};
use colibri::cli::validate::{Reference, greedy, teacher_forcing};
use colibri::convert::convert;
use colibri::engine::{Engine, EngineOptions, Placement, template_family};
use colibri::quant::QFormat;
use colibri::st::Checkpoint;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

/// Greedy and teacher-forced mismatches of `model` against `r`.
fn mismatches(model: &Path, r: &Reference, opts: &EngineOptions) -> (usize, usize) {
    let mut engine = Engine::load(model, opts).unwrap();
    let (ok, total) = greedy(&mut engine, r).unwrap();
    let (tok, ttotal) = teacher_forcing(&mut engine, r).unwrap();
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

/// Int8 weights through f32 activations: the path the int8 oracle checks.
fn int8_exact_path() -> EngineOptions {
    EngineOptions {
        expert_bits: 8,
        dense_bits: 8,
        int8_acts: false,
        ..EngineOptions::default()
    }
}

/// Streamed through a two-expert cache with the pilot: every layer misses.
fn streamed() -> EngineOptions {
    EngineOptions {
        placement: Placement::Streamed,
        pilot: true,
        cache_cap: Some(2),
        ..EngineOptions::default()
    }
}

/// A gpt-oss fixture converted (fused experts split, MXFP4 decoded) into a
/// container with the given formats.
fn converted(tmp: &Path, name: &str, experts: QFormat, dense: QFormat) -> PathBuf {
    let out = tmp.join(format!("{name}-{experts}-{dense}"));
    convert(&fixture(name), &out, experts, dense, None).unwrap();
    out
}

#[test]
fn glm4_is_token_exact_in_f32_and_against_the_int8_oracle() {
    let dir = fixture("glm4-moe-tiny");
    let r = reference(&dir);
    exact(&dir, &r, &EngineOptions::default());
    let int8 = r.int8().expect("REF.json has an int8 oracle");
    exact(&dir, &int8, &int8_exact_path());
    exact(&dir, &r, &streamed());
}

/// `coli convert` keeps GLM-4's names and formats: routed experts int8, the
/// shared expert and dense layer as dense matrices, router, correction bias
/// and attention biases f32; the container is exact against the int8 oracle.
#[test]
fn glm4_int8_container_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture("glm4-moe-tiny");
    let out = tmp.path().join("glm4-int8");
    convert(&dir, &out, QFormat::Int8, QFormat::Int8, None).unwrap();
    let ck = Checkpoint::open(&out).unwrap();
    assert!(ck.has("model.layers.1.mlp.experts.7.down_proj.weight.qs"));
    assert!(!ck.has("model.layers.0.mlp.experts.0.gate_proj.weight"));
    assert!(ck.has("model.layers.2.mlp.shared_experts.up_proj.weight.qs"));
    assert!(!ck.has("model.layers.1.mlp.gate.weight.qs"));
    assert!(ck.has("model.layers.1.mlp.gate.e_score_correction_bias"));
    assert!(!ck.has("model.layers.0.self_attn.q_proj.bias.qs"));
    drop(ck);
    let int8 = reference(&dir).int8().unwrap();
    let opts = EngineOptions {
        int8_acts: false,
        ..EngineOptions::default()
    };
    exact(&out, &int8, &opts);
}

/// gpt-oss's BF16-release layout (fused, interleaved, input-major experts
/// with biases) and its MXFP4 layout both convert to containers that match
/// transformers exactly: in f32, and in int8 against the int8 oracle, mapped
/// and streamed.
#[test]
fn gpt_oss_converts_from_fused_and_mxfp4_and_is_token_exact() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["gpt-oss-tiny", "gpt-oss-mxfp4"] {
        let r = reference(&fixture(name));
        let f32 = converted(tmp.path(), name, QFormat::F32, QFormat::F32);
        let ck = Checkpoint::open(&f32).unwrap();
        assert!(ck.has("model.layers.2.mlp.experts.4.gate_proj.weight"), "{name}");
        assert!(ck.has("model.layers.2.mlp.experts.4.down_proj.bias"), "{name}");
        assert!(!ck.has("model.layers.0.mlp.experts.gate_up_proj"), "{name}");
        drop(ck);
        exact(&f32, &r, &EngineOptions::default());
        exact(&f32, &r, &streamed());
        let q = converted(tmp.path(), name, QFormat::Int8, QFormat::Int8);
        let int8 = r.int8().expect("REF.json has an int8 oracle");
        let opts = EngineOptions {
            int8_acts: false,
            ..EngineOptions::default()
        };
        exact(&q, &int8, &opts);
    }
}

/// Int8 activations (integer dot products, the default) approximate the
/// int8 oracle rather than reproduce it: teacher forcing stays within one
/// position in eight (these fixtures' margins are narrower than that
/// path's error; greedy decoding diverges after the first flip).
#[test]
fn int8_activations_stay_close() {
    let tmp = tempfile::tempdir().unwrap();
    let int8_acts = EngineOptions {
        expert_bits: 8,
        dense_bits: 8,
        ..EngineOptions::default()
    };
    let glm4 = fixture("glm4-moe-tiny");
    let mut runs = vec![(glm4.clone(), reference(&glm4).int8().unwrap())];
    for name in ["gpt-oss-tiny", "gpt-oss-mxfp4"] {
        let q = converted(tmp.path(), name, QFormat::Int8, QFormat::Int8);
        runs.push((q, reference(&fixture(name)).int8().unwrap()));
    }
    for (model, int8) in runs {
        let (_, tf) = mismatches(&model, &int8, &int8_acts);
        let total = int8.full_ids.len();
        assert!(
            tf * 8 <= total,
            "{}: {tf}/{total} teacher-forced mismatches",
            model.display()
        );
    }
}

/// gpt-oss loads as released (fused BF16-layout experts, or MXFP4 blocks),
/// each expert streamed as its slices of the fused tensors: exact against
/// transformers in f32 mapped and streamed, and against the int8 oracle;
/// the same tokens as the converted container.
#[test]
fn gpt_oss_runs_as_released_without_convert() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["gpt-oss-tiny", "gpt-oss-mxfp4"] {
        let dir = fixture(name);
        let r = reference(&dir);
        exact(&dir, &r, &EngineOptions::default());
        exact(&dir, &r, &streamed());
        exact(
            &dir,
            &r.int8().expect("REF.json has an int8 oracle"),
            &int8_exact_path(),
        );
        let q = converted(tmp.path(), name, QFormat::Int8, QFormat::Int8);
        let int8_acts = EngineOptions {
            expert_bits: 8,
            dense_bits: 8,
            ..EngineOptions::default()
        };
        assert_eq!(
            mismatches(&dir, &r, &int8_acts),
            mismatches(&q, &r, &int8_acts),
            "{name}: the release and its int8 container disagree"
        );
    }
}

/// A fused gpt-oss tensor of the wrong shape is refused at load, naming it.
#[test]
fn damaged_fused_gpt_oss_experts_are_refused_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("gpt-oss-tiny");
    let dst = tmp.path().join("bad");
    std::fs::create_dir(&dst).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dst.join(f.file_name().unwrap())).unwrap();
    }
    let st = dst.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    // Same byte count, other shape: the header stays valid.
    let bad = header.replace(
        r#""model.layers.1.mlp.experts.down_proj_bias":{"dtype":"F32","shape":[5,40]"#,
        r#""model.layers.1.mlp.experts.down_proj_bias":{"dtype":"F32","shape":[40,5]"#,
    );
    assert_ne!(bad, header, "fixture header changed; update the test");
    let mut out = bytes[..8].to_vec();
    out.extend_from_slice(bad.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&st, out).unwrap();
    let err = match Engine::load(&dst, &EngineOptions::default()) {
        Ok(_) => panic!("a damaged fused expert tensor loaded"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("model.layers.1.mlp.experts.down_proj_bias"), "{err}");
}

/// Damaged gpt-oss tensors are refused by `coli convert` naming the tensor.
#[test]
fn hostile_gpt_oss_checkpoints_are_refused_by_name() {
    use safetensors::tensor::TensorView;
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("gpt-oss-mxfp4");
    let ck = Checkpoint::open(&src).unwrap();
    let cases: [(&str, &str); 3] = [
        // scales of the wrong shape
        ("model.layers.1.mlp.experts.down_proj_scales", "reshape"),
        // blocks without scales
        ("model.layers.0.mlp.experts.gate_up_proj_scales", "drop"),
        // a bias of the wrong size
        ("model.layers.2.mlp.experts.down_proj_bias", "reshape"),
    ];
    for (i, (victim, how)) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("case{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
        let mut tensors = Vec::new();
        for name in ck.names() {
            let info = ck.info(name).unwrap();
            let bytes = ck.bytes(name).unwrap().to_vec();
            let mut shape = info.shape.clone();
            if name == *victim {
                if *how == "drop" {
                    continue;
                }
                let n: usize = shape.iter().product();
                shape = vec![n];
            }
            tensors.push((name.to_string(), info.dtype, shape, bytes));
        }
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
        let err = convert(
            &dir,
            &tmp.path().join(format!("out{i}")),
            QFormat::Int8,
            QFormat::F32,
            None,
        )
        .expect_err(victim)
        .to_string();
        let named = victim.trim_end_matches("_scales");
        assert!(err.contains(named), "{victim} ({how}): {err}");
    }
}

/// Missing, negative and unsupported fields are refused naming the field.
#[test]
fn hostile_configs_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, Option<serde_json::Value>)] = &[
        ("glm4-moe-tiny", "n_routed_experts", None),
        ("glm4-moe-tiny", "n_group", Some(3.into())),
        ("glm4-moe-tiny", "topk_group", Some(5.into())),
        (
            "glm4-moe-tiny",
            "partial_rotary_factor",
            Some(serde_json::json!(1.5)),
        ),
        ("glm4-moe-tiny", "first_k_dense_replace", Some(99.into())),
        (
            "glm4-moe-tiny",
            "routed_scaling_factor",
            Some(serde_json::json!(-1.0)),
        ),
        ("glm4-moe-tiny", "moe_intermediate_size", Some((-4).into())),
        (
            "gpt-oss-tiny",
            "layer_types",
            Some(serde_json::json!(["full_attention"])),
        ),
        ("gpt-oss-tiny", "sliding_window", Some(0.into())),
        ("gpt-oss-tiny", "num_local_experts", None),
        (
            "gpt-oss-tiny",
            "rope_scaling",
            Some(serde_json::json!({"rope_type": "yarn", "factor": "big"})),
        ),
        ("gpt-oss-tiny", "swiglu_limit", Some(serde_json::json!(-7.0))),
        ("gpt-oss-tiny", "head_dim", Some((1u64 << 40).into())),
    ];
    for (i, (name, field, value)) in cases.iter().enumerate() {
        let src = fixture(name);
        let dir = tmp.path().join(format!("case{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let (_, mut cfg) = colibri::config::read_json(&src).unwrap();
        match value {
            Some(v) => cfg[*field] = v.clone(),
            None => {
                cfg.as_object_mut().unwrap().remove(*field);
            }
        }
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
        let err = match Engine::load(&dir, &EngineOptions::default()) {
            Ok(_) => panic!("{name}: {field}={value:?} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(field), "{name}: {field}={value:?}: {err}");
    }
}

/// GLM-4's fixture ships its template in tokenizer_config.json, gpt-oss's
/// as chat_template.jinja; the built-in formats stand in when neither does.
#[test]
fn chat_templates_come_from_the_model_or_the_family() {
    let glm4 = fixture("glm4-moe-tiny");
    let t = ChatTemplate::of_model(&glm4, template_family(&glm4))
        .unwrap()
        .unwrap();
    assert_eq!(
        t.render(&[ChatMessage::user("Hi")], true).unwrap(),
        "[gMASK]<sop><|user|>\nHi<|assistant|>\n<think></think>\n"
    );
    let oss = fixture("gpt-oss-tiny");
    let t = ChatTemplate::of_model(&oss, template_family(&oss))
        .unwrap()
        .unwrap();
    assert_eq!(
        t.render(&[ChatMessage::user("Hi")], true).unwrap(),
        "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    );
    let t = ChatTemplate::builtin(template_family(&fixture("gpt-oss-mxfp4")));
    assert_eq!(
        t.render(&[ChatMessage::user("Hi")], true).unwrap(),
        "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    );
}

/// `coli serve` answers chat turns on both families (gpt-oss converted).
#[test]
fn serve_answers_turns() {
    let tmp = tempfile::tempdir().unwrap();
    let oss = converted(tmp.path(), "gpt-oss-tiny", QFormat::Int8, QFormat::F32);
    for dir in [fixture("glm4-moe-tiny"), oss] {
        assert!(dir.join("tokenizer.json").is_file(), "{}", dir.display());
        let mut server = support::Server::start(
            &dir,
            &["--temperature", "0", "--max-tokens", "6", "--kv-slots", "2"],
        );
        let first = server.line("hello there");
        assert_eq!(first.stat.len(), 6, "{}: {first:?}", dir.display());
        assert!(first.field(4) > 0, "{}: {first:?}", dir.display());
        let second = server.line("and again");
        assert_eq!(second.stat.len(), 6, "{}: {second:?}", dir.display());
        let (status, err) = server.finish();
        assert!(status.success(), "{}: {err}", dir.display());
    }
}
