//! Qwen3-MoE and Mixtral against transformers oracles
//! (fixtures/{qwen3-moe-tiny,mixtral-tiny}/REF.json, written by
//! tools/make_qwen_mixtral_fixtures.py): token-exact in f32, through the
//! streamed pipeline with the pilot, with int8 weights (quantized at load or
//! by `coli convert`) and f32 activations against transformers run on the
//! same int8 round-trip weights (`int8_full_ids` / `int8_tf_pred`), with a
//! tied head, through `coli serve` with the chat template, and clear errors
//! on hostile configs.

mod support;

use std::path::{Path, PathBuf};

use colibri::chat_template::{ChatMessage, ChatTemplate};
use colibri::cli::validate::{Reference, greedy, teacher_forcing};
use colibri::convert::convert;
use colibri::engine::{Engine, EngineOptions, Placement, template_family};
use colibri::model::kv_cache::{KvType, KvTypes};
use colibri::model::lm::Logits;
use colibri::quant::QFormat;
use colibri::st::{Checkpoint, Dtype};
use colibri_actors::Tag;
use safetensors::tensor::TensorView;

const FIXTURES: [&str; 2] = ["fixtures/qwen3-moe-tiny", "fixtures/mixtral-tiny"];

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn check(model: &Path, reference: &Path, opts: &EngineOptions, max_greedy_miss: usize, max_tf_miss: usize) {
    let r = Reference::load(&reference.join("REF.json")).unwrap();
    let mut engine = Engine::load(model, opts).unwrap();
    let (ok, total) = greedy(&mut engine, &r).unwrap();
    assert!(
        total - ok <= max_greedy_miss,
        "{}: greedy {ok}/{total} with {opts:?}",
        model.display()
    );
    let (ok, total) = teacher_forcing(&mut engine, &r).unwrap();
    assert!(
        total - ok <= max_tf_miss,
        "{}: teacher forcing {ok}/{total} with {opts:?}",
        model.display()
    );
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

/// The fixture's int8 round-trip oracle.
fn int8_oracle(dir: &Path) -> Reference {
    Reference::load(&dir.join("REF.json"))
        .unwrap()
        .int8()
        .expect("REF.json has an int8 oracle")
}

/// The token-exact path: f32 weights, activations and KV cache (the
/// default KV cache is f16, whose rounding moves logits by up to a few
/// 1e-3 on these fixtures, beyond the 1e-3 bounds below).
fn exact_kv() -> EngineOptions {
    EngineOptions {
        kv_types: KvTypes::both(KvType::F32),
        ..EngineOptions::default()
    }
}

/// Int8 weights through f32 activations: the path the int8 oracle checks.
fn int8_exact_path() -> EngineOptions {
    EngineOptions {
        expert_bits: 8,
        dense_bits: 8,
        int8_acts: false,
        ..exact_kv()
    }
}

#[test]
fn f32_is_token_exact() {
    for rel in FIXTURES {
        let dir = fixture(rel);
        check(&dir, &dir, &EngineOptions::default(), 0, 0);
    }
}

#[test]
fn streamed_with_the_pilot_is_token_exact() {
    let opts = EngineOptions {
        placement: Placement::Streamed,
        pilot: true,
        cache_cap: Some(2),
        ..EngineOptions::default()
    };
    for rel in FIXTURES {
        let dir = fixture(rel);
        check(&dir, &dir, &opts, 0, 0);
    }
}

/// Quantized at load (`--expert-bits 8 --dense-bits 8 --f32-acts`), mapped
/// and streamed with the pilot: token for token what transformers gives on
/// the same int8 round-trip weights.
#[test]
fn int8_is_token_exact_against_the_int8_oracle() {
    let streamed = EngineOptions {
        placement: Placement::Streamed,
        pilot: true,
        cache_cap: Some(2),
        ..int8_exact_path()
    };
    for rel in FIXTURES {
        let dir = fixture(rel);
        let int8 = int8_oracle(&dir);
        exact(&dir, &int8, &int8_exact_path());
        exact(&dir, &int8, &streamed);
    }
}

/// The logits at the last position of `ids`.
fn last_logits(model: &Path, opts: &EngineOptions, ids: &[u32]) -> Vec<f32> {
    let mut engine = Engine::load(model, opts).unwrap();
    let mut st = engine.model.new_state();
    engine
        .model
        .forward(ids, st.as_mut(), Tag::new(0, 1, 0), Logits::Last)
        .unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// `logits_last` / `int8_logits_last` of a REF.json.
fn ref_logits(dir: &Path) -> (Vec<f32>, Vec<f32>) {
    let text = std::fs::read_to_string(dir.join("REF.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let get = |k: &str| -> Vec<f32> {
        serde_json::from_value(v[k].clone()).unwrap_or_else(|e| panic!("{}: {k}: {e}", dir.display()))
    };
    (get("logits_last"), get("int8_logits_last"))
}

/// These fixtures' int8 tokens equal their f32 tokens, so the logits tell
/// the two apart: with int8 weights the engine's last-position logits are
/// within 1e-3 of transformers' on the int8 round-trip weights, which lie
/// more than 0.1 from the f32 ones (and the f32 engine within 1e-3 of those).
#[test]
fn int8_logits_match_the_int8_oracle_not_the_f32_one() {
    for rel in FIXTURES {
        let dir = fixture(rel);
        let (f32_ref, int8_ref) = ref_logits(&dir);
        let ids = int8_oracle(&dir).full_ids;
        assert!(
            max_diff(&f32_ref, &int8_ref) > 0.1,
            "{rel}: int8 barely moves the logits"
        );
        let int8 = last_logits(&dir, &int8_exact_path(), &ids);
        let d8 = max_diff(&int8, &int8_ref);
        assert!(d8 < 1e-3, "{rel}: int8 logits {d8} from the int8 oracle");
        let f32 = last_logits(&dir, &exact_kv(), &ids);
        let d = max_diff(&f32, &f32_ref);
        assert!(d < 1e-3, "{rel}: f32 logits {d} from the f32 oracle");
        // The default f16 KV cache: within 1e-2 (f16 keeps 11 bits, so each
        // cached value moves by up to 2^-12 of itself).
        let f16 = last_logits(&dir, &EngineOptions::default(), &ids);
        let d16 = max_diff(&f16, &f32_ref);
        assert!(d16 < 1e-2, "{rel}: f16-KV logits {d16} from the f32 oracle");
        eprintln!(
            "{rel}: |int8 - int8 oracle| {d8:.2e}, |f32 - f32 oracle| {d:.2e}, |f16 KV - f32 oracle| {d16:.2e}"
        );
    }
}

/// `coli convert` to int8 experts and dense matrices keeps each family's
/// names (Mixtral's `block_sparse_moe.experts.E.w1`), writes no experts for
/// Qwen3's dense MLP layer; with f32 activations the container matches the
/// int8 oracle exactly, and with int8 activations (the default) it stays
/// within one mismatch of the f32 oracle (the fixtures were chosen to have
/// none).
#[test]
fn int8_container_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    for rel in FIXTURES {
        let dir = fixture(rel);
        let out = tmp.path().join(dir.file_name().unwrap());
        convert(&dir, &out, QFormat::Int8, QFormat::Int8, None).unwrap();
        let ck = Checkpoint::open(&out).unwrap();
        if rel.contains("qwen3") {
            assert!(ck.has("model.layers.0.mlp.experts.5.down_proj.weight"));
            assert!(!ck.has("model.layers.1.mlp.experts.0.gate_proj.weight"));
            assert!(ck.has("model.layers.1.mlp.gate_proj.weight"));
        } else {
            assert!(ck.has("model.layers.2.block_sparse_moe.experts.4.w2.weight"));
            assert!(ck.has("model.layers.2.block_sparse_moe.experts.4.w2.weight.qs"));
            assert!(!ck.has("model.layers.2.block_sparse_moe.gate.weight.qs"));
        }
        drop(ck);
        let f32_acts = EngineOptions {
            int8_acts: false,
            ..EngineOptions::default()
        };
        exact(&out, &int8_oracle(&dir), &f32_acts);
        check(&out, &dir, &EngineOptions::default(), 1, 1);
        let streamed = EngineOptions {
            placement: Placement::Streamed,
            ..EngineOptions::default()
        };
        check(&out, &dir, &streamed, 1, 1);
    }
}

fn write_variant(src: &Path, dst: &Path, tie: bool) {
    std::fs::create_dir_all(dst).unwrap();
    let (_, mut cfg) = colibri::config::read_json(src).unwrap();
    cfg["tie_word_embeddings"] = tie.into();
    std::fs::write(dst.join("config.json"), cfg.to_string()).unwrap();
    let ck = Checkpoint::open(src).unwrap();
    let head = ck.bytes("lm_head.weight").unwrap().to_vec();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for name in ck.names() {
        let info = ck.info(name).unwrap();
        let bytes = match name {
            "lm_head.weight" if tie => continue,
            "model.embed_tokens.weight" => head.clone(),
            _ => ck.bytes(name).unwrap().to_vec(),
        };
        tensors.push((name.to_string(), info.shape.clone(), bytes));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();
}

/// A tied checkpoint (no `lm_head.weight`) gives the same logits, bit for
/// bit, as an untied one whose head and embedding are equal.
#[test]
fn tied_head_equals_an_untied_copy() {
    let tmp = tempfile::tempdir().unwrap();
    for rel in FIXTURES {
        let src = fixture(rel);
        let (tied, untied) = (tmp.path().join("tied"), tmp.path().join("untied"));
        let _ = std::fs::remove_dir_all(&tied);
        let _ = std::fs::remove_dir_all(&untied);
        write_variant(&src, &tied, true);
        write_variant(&src, &untied, false);
        let r = Reference::load(&src.join("REF.json")).unwrap();
        let mut logits = Vec::new();
        for dir in [&tied, &untied] {
            let mut engine = Engine::load(dir, &EngineOptions::default()).unwrap();
            let mut st = engine.model.new_state();
            logits.push(
                engine
                    .model
                    .forward(&r.full_ids, st.as_mut(), Tag::new(0, 1, 0), Logits::All)
                    .unwrap(),
            );
        }
        assert!(logits[0] == logits[1], "{rel}: tied and untied heads differ");
    }
}

/// Missing, negative, huge and unsupported fields are refused with an error
/// naming the field, before any weight is read.
#[test]
fn hostile_configs_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, Option<serde_json::Value>)] = &[
        ("qwen3-moe-tiny", "num_experts", None),
        ("qwen3-moe-tiny", "moe_intermediate_size", Some((-4).into())),
        ("qwen3-moe-tiny", "head_dim", Some((1u64 << 40).into())),
        ("qwen3-moe-tiny", "num_key_value_heads", Some(4.into())),
        ("qwen3-moe-tiny", "decoder_sparse_step", Some(0.into())),
        (
            "qwen3-moe-tiny",
            "mlp_only_layers",
            Some(serde_json::json!([0, 1, 2, 3])),
        ),
        ("qwen3-moe-tiny", "use_sliding_window", Some(true.into())),
        (
            "qwen3-moe-tiny",
            "rope_scaling",
            Some(serde_json::json!({"rope_type": "dynamic", "factor": 4.0})),
        ),
        ("qwen3-moe-tiny", "rms_norm_eps", Some(serde_json::json!(-1e-6))),
        ("mixtral-tiny", "num_local_experts", None),
        ("mixtral-tiny", "num_experts_per_tok", Some(6.into())),
        ("mixtral-tiny", "sliding_window", Some(0.into())),
        ("mixtral-tiny", "vocab_size", Some((1u64 << 40).into())),
        ("mixtral-tiny", "rope_theta", Some(serde_json::json!(1e300))),
        ("mixtral-tiny", "hidden_act", Some("gelu".into())),
    ];
    for (i, (rel, field, value)) in cases.iter().enumerate() {
        let src = fixture(&format!("fixtures/{rel}"));
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
            Ok(_) => panic!("{rel}: {field}={value:?} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(field), "{rel}: {field}={value:?}: {err}");
    }
}

/// Qwen3's fixture ships a ChatML template in tokenizer_config.json;
/// Mixtral's ships none, so the built-in Mistral format applies.
#[test]
fn chat_templates_come_from_the_model_or_the_family() {
    let want = [
        (
            "fixtures/qwen3-moe-tiny",
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        ),
        ("fixtures/mixtral-tiny", "<s>[INST] Hi [/INST]"),
    ];
    for (rel, text) in want {
        let dir = fixture(rel);
        let t =
            ChatTemplate::from_tokenizer_config(&dir.join("tokenizer_config.json"), template_family(&dir))
                .unwrap();
        assert_eq!(t.render(&[ChatMessage::user("Hi")], true).unwrap(), text, "{rel}");
    }
}

/// `coli serve` answers chat turns on both families and exits cleanly.
#[test]
fn serve_answers_turns() {
    for rel in FIXTURES {
        let mut server = support::Server::start(
            &fixture(rel),
            &["--temperature", "0", "--max-tokens", "6", "--kv-slots", "2"],
        );
        let first = server.line("hello there");
        assert_eq!(first.stat.len(), 6, "{rel}: {first:?}");
        assert!(first.field(4) > 0, "{rel}: {first:?}");
        let second = server.line("and again");
        assert_eq!(second.stat.len(), 6, "{rel}: {second:?}");
        let (status, err) = server.finish();
        assert!(status.success(), "{rel}: {err}");
    }
}

/// A bf16 checkpoint (as published) converts to an int4-expert container
/// that loads and generates: bf16 widened to f32 for the kept tensors,
/// experts int4. bf16 and int4 rounding change the numbers (16/24 greedy
/// tokens on both fixtures), so only the run and the formats are checked.
#[test]
fn bf16_input_converts_to_int4_experts_and_runs() {
    let tmp = tempfile::tempdir().unwrap();
    for rel in FIXTURES {
        let src = fixture(rel);
        let bf16 = tmp
            .path()
            .join(format!("{}-bf16", src.file_name().unwrap().to_string_lossy()));
        std::fs::create_dir_all(&bf16).unwrap();
        for f in [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            std::fs::copy(src.join(f), bf16.join(f)).unwrap();
        }
        let ck = Checkpoint::open(&src).unwrap();
        let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = ck
            .names()
            .map(|name| {
                let bytes: Vec<u8> = ck
                    .bytes(name)
                    .unwrap()
                    .chunks_exact(4)
                    .flat_map(|c| {
                        let b = f32::from_le_bytes([c[0], c[1], c[2], c[3]]).to_bits();
                        // round to nearest even
                        let r = ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16;
                        r.to_le_bytes()
                    })
                    .collect();
                (name.to_string(), ck.info(name).unwrap().shape.clone(), bytes)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::BF16, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &bf16.join("model.safetensors")).unwrap();
        let out = tmp
            .path()
            .join(format!("{}-int4", src.file_name().unwrap().to_string_lossy()));
        convert(&bf16, &out, QFormat::Int4, QFormat::F32, None).unwrap();
        let ck = Checkpoint::open(&out).unwrap();
        assert_eq!(ck.info("model.norm.weight").unwrap().dtype, Dtype::F32);
        assert_eq!(ck.info("model.embed_tokens.weight").unwrap().dtype, Dtype::F32);
        drop(ck);
        let r = Reference::load(&src.join("REF.json")).unwrap();
        let mut engine = Engine::load(&out, &EngineOptions::default()).unwrap();
        let (ok, total) = greedy(&mut engine, &r).unwrap();
        assert_eq!(total, r.full_ids.len() - r.prompt_ids.len());
        eprintln!("{rel}: bf16 -> int4 experts: greedy {ok}/{total}");
    }
}
