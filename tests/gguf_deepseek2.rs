//! colibri on llama.cpp `deepseek2` GGUF files (DeepSeek-V2/V3-shaped MLA
//! models) against llama.cpp on the same files
//! (fixtures/gguf/families/deepseek2/REF.json, written by
//! tools/make_gguf_deepseek2_fixtures.py through tools/gguf_ref.c: one
//! thread, F32 KV cache, no flash attention).
//!
//! The fixtures are one random DeepseekV3ForCausalLM (q_lora_rank, a dense
//! first layer, a shared expert, a sigmoid router with a correction bias
//! and two expert groups, renormalised and scaled top-k, YaRN with
//! `mscale_all_dim`) in F32, Q8_0 and Q4_0, twice: as the converter writes
//! it now (MLA's `attn_k_b` / `attn_v_b`, run absorbed by both engines),
//! and with the joint `attn_kv_b` of older converters (`-kvb-`), which
//! llama.cpp runs expanded (keys and values from the latent) and colibri
//! absorbed for short calls: the same model, summed in another order.
//! colibri is held to llama.cpp's one-token-per-call pass, the path it
//! generates with.

#[path = "support/gguf_ref.rs"]
mod gguf_ref;

use std::path::{Path, PathBuf};

use colibri::engine::{Engine, EngineOptions};
use colibri::gguf::build::GgufImage;
use colibri::gguf::{GgufModel, Value as GValue};
use colibri::model::kv_cache::{KvType, KvTypes};
use colibri::model::lm::Logits;
use colibri::quant::QFormat;
use gguf_ref::*;
use serde_json::Value;

/// Largest |colibri − llama.cpp| of a logit at position 0 (no history:
/// the kernels, the MLA products and the router alone) on every file, and
/// at every position of the files both engines run alike (all but the
/// quantized joint-layout ones): measured 0 on the quantized split-layout
/// files (bit for bit) and at most 1.6e-5 on the F32 ones, rounded up to
/// a power of ten.
const LOGIT_BOUND: f32 = 1e-4;

/// The quantized joint-layout files: llama.cpp expands keys and values
/// from the latent (each latent quantized to Q8_0 for `attn_kv_b`), colibri
/// folds the query through `kv_b_proj`'s K rows in f32 instead (expanding
/// every cached latent on every decoded token would cost as much per step
/// as the whole prompt). Both are the file's model; their quantization
/// noise lands in different places, and logits differ by up to 0.56 after
/// a few positions. A pick of llama.cpp's by a top-2 margin below this is
/// a near-tie colibri may break the other way (measured: the three
/// teacher-forced picks that differ have margins 0.04 to 0.115).
const JOINT_NEAR_TIE: f32 = 0.2;

/// Greedy tokens of the quantized joint-layout files that agree with
/// llama.cpp's from the start, whatever its margins: measured all 24 on
/// Q8_0 (whose first step has a margin of 0.13) and the first 8 on Q4_0
/// (its 9th pick has a margin of 0.088).
const JOINT_GREEDY_AGREE: usize = 8;

/// A file with the older converters' joint `attn_kv_b`.
fn joint(name: &str) -> bool {
    name.contains("-kvb-")
}

/// A file whose logits colibri must match everywhere within
/// [`LOGIT_BOUND`], and so every token: all but the quantized joint ones.
fn alike(name: &str) -> bool {
    !joint(name) || name.ends_with("-f32.gguf")
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf/families/deepseek2")
}

struct Ref {
    prompt: Vec<u32>,
    full: Vec<u32>,
    files: Vec<(String, Value)>,
}

fn reference() -> Ref {
    let path = dir().join("REF.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).expect("REF.json is JSON");
    let files: Vec<(String, Value)> = v["files"]
        .as_object()
        .expect("files")
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(files.len(), 6, "the six committed deepseek2 fixtures");
    Ref {
        prompt: ids(&v["prompt_ids"]),
        full: ids(&v["full_ids"]),
        files,
    }
}

fn exact() -> EngineOptions {
    EngineOptions {
        kv_types: KvTypes::both(KvType::F32),
        ..EngineOptions::default()
    }
}

fn load(path: &Path) -> Engine {
    Engine::load(path, &exact()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Logits of every position, one token per forward call (llama.cpp's
/// one-token pass; colibri's values do not depend on the split anyway).
fn logits_one_by_one(engine: &mut Engine, ids: &[u32]) -> Vec<f32> {
    let mut state = engine.model.new_state();
    let mut out = Vec::new();
    for &id in ids {
        let tag = engine.next_tag();
        out.extend(
            engine
                .model
                .forward(&[id], state.as_mut(), tag, Logits::All)
                .expect("forward"),
        );
    }
    out
}

#[test]
fn teacher_forcing_matches_llama_cpp() {
    let r = reference();
    for (name, f) in &r.files {
        let mut engine = load(&dir().join(name));
        let vocab = engine.model.vocab_size();
        let n = r.full.len();
        let logits = logits_one_by_one(&mut engine, &r.full);
        let d_first = max_abs_diff(&logits[..vocab], &floats(&f["logits_first"]));
        assert!(
            d_first <= LOGIT_BOUND,
            "{name}: position 0 differs by {d_first:e}"
        );
        let want = ids(&f["tf_seq_argmax"]);
        let margin = floats(&f["tf_seq_margin"]);
        if alike(name) {
            let d_last = max_abs_diff(&logits[(n - 1) * vocab..], &floats(&f["logits_last_seq"]));
            assert!(
                d_last <= LOGIT_BOUND,
                "{name}: last position differs by {d_last:e}"
            );
            for (p, &w) in want.iter().enumerate() {
                let got = argmax(&logits[p * vocab..(p + 1) * vocab]);
                assert_eq!(got, w, "{name}: position {p} (llama.cpp's margin {})", margin[p]);
            }
            continue;
        }
        let mut ties = 0;
        for p in 0..n {
            let got = argmax(&logits[p * vocab..(p + 1) * vocab]);
            let near = margin[p] < JOINT_NEAR_TIE;
            ties += usize::from(near);
            assert!(
                got == want[p] || near,
                "{name}: position {p}: argmax {got}, llama.cpp {} by a margin of {}",
                want[p],
                margin[p],
            );
        }
        assert!(ties * 3 < n, "{name}: {ties} of {n} positions are near-ties");
    }
}

#[test]
fn greedy_decoding_matches_llama_cpp() {
    let r = reference();
    for (name, f) in &r.files {
        let mut engine = load(&dir().join(name));
        let want = ids(&f["greedy"]);
        let margin = floats(&f["greedy_margin"]);
        let got = greedy(&mut engine, &r.prompt, want.len());
        if alike(name) {
            assert_eq!(got, want, "{name}");
            continue;
        }
        // Up to llama.cpp's first near-tie: after a different pick the
        // two continuations are no longer comparable.
        let upto = margin
            .iter()
            .position(|&m| m < JOINT_NEAR_TIE)
            .unwrap_or(want.len());
        assert_eq!(got[..upto], want[..upto], "{name}");
        let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        assert!(agree >= JOINT_GREEDY_AGREE, "{name}: {got:?} against {want:?}");
    }
}

/// The split layout runs absorbed whatever the call's length, so one call
/// over the whole sequence gives the logits of one token per call, bit for
/// bit.
#[test]
fn one_call_and_one_token_per_call_agree_on_the_split_layout() {
    let r = reference();
    for name in ["deepseek2-tiny-q8_0.gguf", "deepseek2-tiny-q4_0.gguf"] {
        let mut engine = load(&dir().join(name));
        let one_by_one = logits_one_by_one(&mut engine, &r.full);
        let mut state = engine.model.new_state();
        let tag = engine.next_tag();
        let batched = engine
            .model
            .forward(&r.full, state.as_mut(), tag, Logits::All)
            .expect("forward");
        assert!(r.full.len() > 16, "longer than the absorbed form's calls");
        assert_eq!(max_abs_diff(&batched, &one_by_one), 0.0, "{name}");
    }
}

/// The config rebuilt from the metadata is the checkpoint's, with
/// llama.cpp's readings where they differ from transformers' defaults.
#[test]
fn the_config_is_the_checkpoints() {
    let model = GgufModel::open(&dir().join("deepseek2-tiny-q8_0.gguf")).unwrap();
    let c = colibri::gguf::config::config_json(&model).unwrap();
    for (field, want) in [
        ("model_type", serde_json::json!("deepseek_v3")),
        ("hidden_size", serde_json::json!(64)),
        ("num_hidden_layers", serde_json::json!(3)),
        ("q_lora_rank", serde_json::json!(32)),
        ("kv_lora_rank", serde_json::json!(64)),
        ("qk_rope_head_dim", serde_json::json!(16)),
        ("qk_nope_head_dim", serde_json::json!(32)),
        ("v_head_dim", serde_json::json!(32)),
        ("first_k_dense_replace", serde_json::json!(1)),
        ("n_shared_experts", serde_json::json!(1)),
        ("n_group", serde_json::json!(2)),
        ("topk_group", serde_json::json!(1)),
        ("norm_topk_prob", serde_json::json!(true)),
        ("routed_scaling_factor", serde_json::json!(2.5)),
        ("latent_norm_eps", serde_json::json!(1e-6)),
    ] {
        assert_eq!(c[field], want, "{field} in {c}");
    }
    let y = &c["rope_scaling"];
    assert_eq!(y["rope_type"], "yarn", "{c}");
    assert_eq!(y["factor"], 4.0, "{c}");
    assert_eq!(y["original_max_position_embeddings"], 128, "{c}");
    assert_eq!(y["mscale_all_dim"], 1.0, "{c}");
}

/// The F32 file with its metadata edited as `edit` says.
fn edited(tmp: &Path, edit: impl Fn(&mut GgufImage), skip: &[&str]) -> PathBuf {
    let model = GgufModel::open(&dir().join("deepseek2-tiny-f32.gguf")).unwrap();
    let mut img = GgufImage::new();
    for (k, v) in model.metadata().iter() {
        if !skip.contains(&k) {
            img.kv(k, v.clone());
        }
    }
    for loc in model.tensors() {
        let bytes = model.tensor_bytes(&loc.info.name).unwrap().to_vec();
        img.tensor(&loc.info.name, &loc.info.dims, loc.info.ggml_type, &bytes);
    }
    edit(&mut img);
    let path = tmp.join("edited.gguf");
    std::fs::write(&path, img.to_bytes()).unwrap();
    path
}

#[test]
fn metadata_colibri_cannot_honour_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let r = reference();
    // The rewrite itself changes nothing.
    let same = edited(tmp.path(), |_| {}, &[]);
    let want = greedy(&mut load(&dir().join("deepseek2-tiny-f32.gguf")), &r.prompt, 4);
    assert_eq!(greedy(&mut load(&same), &r.prompt, 4), want);

    let refused = |path: PathBuf, key: &str, why: &str| {
        let e = Engine::load(&path, &exact()).err().expect("refused").to_string();
        assert!(e.contains(key) && e.contains(why), "{key}: {e}");
    };
    // DeepSeek-V2's softmax router, stored or implied.
    refused(
        edited(
            tmp.path(),
            |i| {
                i.kv("deepseek2.expert_gating_func", GValue::U32(1));
            },
            &["deepseek2.expert_gating_func"],
        ),
        "deepseek2.expert_gating_func",
        "softmax",
    );
    refused(
        edited(tmp.path(), |_| {}, &["deepseek2.expert_gating_func"]),
        "deepseek2.expert_gating_func",
        "softmax",
    );
    // YaRN without the log multiplier llama.cpp derives its scales from.
    refused(
        edited(
            tmp.path(),
            |_| {},
            &["deepseek2.rope.scaling.yarn_log_multiplier"],
        ),
        "deepseek2.rope.scaling.yarn_log_multiplier",
        "YaRN",
    );
    // An unknown RoPE scaling.
    refused(
        edited(
            tmp.path(),
            |i| {
                i.kv("deepseek2.rope.scaling.type", GValue::String("longrope".into()));
            },
            &["deepseek2.rope.scaling.type"],
        ),
        "deepseek2.rope.scaling.type",
        "longrope",
    );
    // DeepSeek-V3.2's sparse-attention indexer.
    refused(
        edited(
            tmp.path(),
            |i| {
                i.kv("deepseek2.attention.indexer.top_k", GValue::U32(2048));
            },
            &[],
        ),
        "deepseek2.attention.indexer.top_k",
        "indexer",
    );
    refused(
        edited(
            tmp.path(),
            |i| {
                i.tensor(
                    "blk.1.indexer.proj.weight",
                    &[64, 4],
                    colibri::gguf::GgmlType::F32,
                    &[0u8; 64 * 4 * 4],
                );
            },
            &[],
        ),
        "blk.1.indexer.proj.weight",
        "indexer",
    );
    // Head sizes that leave no room for the no-rope part.
    refused(
        edited(
            tmp.path(),
            |i| {
                i.kv("deepseek2.rope.dimension_count", GValue::U32(48));
            },
            &["deepseek2.rope.dimension_count"],
        ),
        "deepseek2.rope.dimension_count",
        "48",
    );
}

/// `coli convert --input FILE.gguf` repacks either layout into a container
/// that gives the file's logits bit for bit (the split projections are
/// 3-D tensors copied as stored).
#[test]
fn every_deepseek2_file_converts_to_a_container_with_its_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let r = reference();
    let run = |path: &Path| {
        let mut engine = load(path);
        let mut state = engine.model.new_state();
        let tag = engine.next_tag();
        engine
            .model
            .forward(&r.prompt, state.as_mut(), tag, Logits::All)
            .expect("forward")
    };
    for (name, _) in &r.files {
        let src = dir().join(name);
        let out = tmp.path().join(name.trim_end_matches(".gguf"));
        let report = colibri::convert::convert(&src, &out, QFormat::F32, QFormat::F32, None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(report.experts > 0, "{name}");
        assert_eq!(run(&out), run(&src), "{name}");
    }
}

/// Streaming the experts from their slices of the file (a one-expert
/// cache, O_DIRECT reads, the pilot guessing ahead) gives the tokens of the
/// mapped run, in both layouts.
#[test]
fn streamed_experts_give_the_mapped_tokens() {
    let r = reference();
    for name in ["deepseek2-tiny-q4_0.gguf", "deepseek2-tiny-kvb-q8_0.gguf"] {
        let path = dir().join(name);
        assert_streamed_equals_mapped(&path, &r.prompt, 16);
    }
}

/// llama.cpp normalises the MLA latents with the model's epsilon
/// (GLM-4.7-Flash's is 1e-5), and so does colibri on a GGUF.
#[test]
fn the_latent_norms_take_the_models_epsilon() {
    let tmp = tempfile::tempdir().unwrap();
    let path = edited(
        tmp.path(),
        |i| {
            i.kv("deepseek2.attention.layer_norm_rms_epsilon", GValue::F32(1e-5));
        },
        &["deepseek2.attention.layer_norm_rms_epsilon"],
    );
    let c = colibri::gguf::config::config_json(&GgufModel::open(&path).unwrap()).unwrap();
    assert_eq!(c["latent_norm_eps"], serde_json::json!(1e-5), "{c}");
    assert_eq!(c["rms_norm_eps"], serde_json::json!(1e-5), "{c}");
    let r = reference();
    let first = |p: &Path| {
        let mut engine = load(p);
        let mut state = engine.model.new_state();
        let tag = engine.next_tag();
        engine
            .model
            .forward(&r.prompt[..1], state.as_mut(), tag, Logits::All)
            .expect("forward")
    };
    let d = max_abs_diff(&first(&path), &first(&dir().join("deepseek2-tiny-f32.gguf")));
    assert!(d > 0.0 && d < 0.1, "another epsilon, nearly the same logits: {d}");
}
