//! colibri on llama.cpp's `gpt-oss` and `minimax-m2` GGUF files against
//! llama.cpp on the same files (fixtures/gguf/families/{gpt-oss,minimax-m2},
//! written by tools/make_gguf_gptoss_minimax_fixtures.py through llama.cpp's
//! own converter, quantizer and API: one thread, F32 KV cache, no flash
//! attention, one token per call).
//!
//! gpt-oss: one random model (sinks, a sliding window shorter than the
//! prompt, YaRN, biased router, experts with biases past the SwiGLU clamp)
//! in F32, Q8_0, Q4_0 and MXFP4_MOE (MXFP4 experts quantized by llama.cpp),
//! and converted from the published checkpoints' MXFP4 layout (experts
//! repacked by the converter, F32 elsewhere). MiniMax-M2: one random
//! model (q/k norms over all heads, heads wider than hidden / heads, half
//! the head rotated, a sigmoid router with a correction bias) in F32, Q8_0
//! and Q4_0. On each F32 file llama.cpp itself agrees with transformers on
//! the checkpoint it was converted from (REF.json's cross_checks).

#[path = "support/gguf_ref.rs"]
mod gguf_ref;

use std::path::{Path, PathBuf};

use colibri::engine::Engine;
use colibri::gguf::build::GgufImage;
use colibri::gguf::{GgufModel, Value as V};
use gguf_ref::*;
use serde_json::Value;

/// Largest |colibri − llama.cpp| of a logit at the first and last positions
/// of every file: the measured maximum, rounded up to a power of ten.
const LOGIT_BOUND: f32 = 1e-4;

/// A top-2 margin of llama.cpp's below which its pick is a near-tie that
/// colibri may break the other way (as in tests/gguf_llama_cpp.rs).
const NEAR_TIE: f32 = 0.1;

/// A gap between the k-th and the next router logit (the smallest over the
/// layers, biased or not, in llama.cpp's pass) below which the expert
/// choice itself is a near-tie.
const ROUTER_NEAR_TIE: f32 = 0.01;

const GPT_OSS: &str = "gpt-oss";
const GPT_OSS_FILES: &[&str] = &[
    "gpt-oss-tiny-f32.gguf",
    "gpt-oss-tiny-q8_0.gguf",
    "gpt-oss-tiny-q4_0.gguf",
    "gpt-oss-tiny-mxfp4_moe.gguf",
    "gpt-oss-tiny-mxfp4-src.gguf",
];
const MINIMAX: &str = "minimax-m2";
const MINIMAX_FILES: &[&str] = &[
    "minimax-m2-tiny-f32.gguf",
    "minimax-m2-tiny-q8_0.gguf",
    "minimax-m2-tiny-q4_0.gguf",
];

fn family_dir(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/gguf/families")
        .join(arch)
}

fn dir() -> PathBuf {
    family_dir(GPT_OSS)
}

struct Ref {
    prompt: Vec<u32>,
    full: Vec<u32>,
    files: serde_json::Map<String, Value>,
}

fn reference() -> Ref {
    reference_of(GPT_OSS, GPT_OSS_FILES)
}

fn reference_of(arch: &str, names: &[&str]) -> Ref {
    let path = family_dir(arch).join("REF.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).expect("REF.json is JSON");
    let files = v["files"].as_object().expect("files").clone();
    for f in names {
        assert!(files.contains_key(*f), "REF.json has no entry for {f}");
    }
    Ref {
        prompt: ids(&v["prompt_ids"]),
        full: ids(&v["full_ids"]),
        files,
    }
}

#[test]
fn gpt_oss_teacher_forcing_matches_llama_cpp() {
    teacher_forcing_matches(GPT_OSS, GPT_OSS_FILES);
}

#[test]
fn minimax_m2_teacher_forcing_matches_llama_cpp() {
    teacher_forcing_matches(MINIMAX, MINIMAX_FILES);
}

fn teacher_forcing_matches(arch: &str, names: &[&str]) {
    let r = reference_of(arch, names);
    for &name in names {
        let f = &r.files[name];
        let mut engine = load(&family_dir(arch).join(name), &exact());
        let vocab = engine.model.vocab_size();
        let n = r.full.len();
        let logits = all_logits(&mut engine, &r.full);
        let d_first = max_abs_diff(&logits[..vocab], &floats(&f["logits_first"]));
        assert!(
            d_first <= LOGIT_BOUND,
            "{name}: position 0 differs by {d_first:e}"
        );
        // The last position has seen the whole sequence (for gpt-oss: past
        // the sliding window, through the sinks and YaRN's rotated positions).
        let d_last = max_abs_diff(&logits[(n - 1) * vocab..], &floats(&f["logits_last_seq"]));
        assert!(
            d_last <= LOGIT_BOUND,
            "{name}: last position differs by {d_last:e}"
        );
        let want = ids(&f["tf_seq_argmax"]);
        let margin = floats(&f["tf_seq_margin"]);
        let router = floats(&f["tf_router_gap"]);
        let mut excused = 0;
        for p in 0..n {
            let got = argmax(&logits[p * vocab..(p + 1) * vocab]);
            if got != want[p] {
                assert!(
                    margin[p] < NEAR_TIE || router[p] < ROUTER_NEAR_TIE,
                    "{name}: position {p}: argmax {got}, llama.cpp {} by a margin of {} (router gap {})",
                    want[p],
                    margin[p],
                    router[p]
                );
                excused += 1;
            }
        }
        assert_eq!(excused, 0, "{name}: every teacher-forced argmax is llama.cpp's");
    }
}

#[test]
fn gpt_oss_greedy_decoding_matches_llama_cpp() {
    greedy_matches(GPT_OSS, GPT_OSS_FILES);
}

#[test]
fn minimax_m2_greedy_decoding_matches_llama_cpp() {
    greedy_matches(MINIMAX, MINIMAX_FILES);
}

fn greedy_matches(arch: &str, names: &[&str]) {
    let r = reference_of(arch, names);
    for &name in names {
        let want = ids(&r.files[name]["greedy"]);
        let got = greedy(
            &mut load(&family_dir(arch).join(name), &exact()),
            &r.prompt,
            want.len(),
        );
        assert_eq!(got, want, "{name}");
    }
}

/// Streaming from the file (a one-expert cache, O_DIRECT reads of ranges
/// that are not block-aligned, the pilot on) gives the tokens of the mapped
/// run: the per-expert biases travel with their expert.
#[test]
fn streamed_gives_the_mapped_tokens() {
    for (arch, name) in [
        (GPT_OSS, "gpt-oss-tiny-q8_0.gguf"),
        (GPT_OSS, "gpt-oss-tiny-mxfp4_moe.gguf"),
        (MINIMAX, "minimax-m2-tiny-q4_0.gguf"),
    ] {
        let r = reference_of(arch, &[name]);
        let path = family_dir(arch).join(name);
        assert_streamed_equals_mapped(&path, &r.prompt, 16);
    }
}

/// `src` rewritten with `extra` keys set (replacing any of the same name)
/// and `drop` keys left out, tensors' dims edited by `edit`.
fn rewritten(
    tmp: &Path,
    src: &str,
    extra: &[(&str, V)],
    drop: &[&str],
    edit: impl Fn(&str, Vec<u64>) -> Vec<u64>,
) -> PathBuf {
    rewritten_in(&dir(), tmp, src, extra, drop, edit)
}

fn rewritten_in(
    dir: &Path,
    tmp: &Path,
    src: &str,
    extra: &[(&str, V)],
    drop: &[&str],
    edit: impl Fn(&str, Vec<u64>) -> Vec<u64>,
) -> PathBuf {
    let model = GgufModel::open(&dir.join(src)).unwrap();
    let mut img = GgufImage::new();
    for (k, v) in model.metadata().iter() {
        if !extra.iter().any(|(e, _)| *e == k) && !drop.contains(&k) {
            img.kv(k, v.clone());
        }
    }
    for (k, v) in extra {
        img.kv(k, v.clone());
    }
    for loc in model.tensors() {
        let bytes = model.tensor_bytes(&loc.info.name).unwrap().to_vec();
        let dims = edit(&loc.info.name, loc.info.dims.clone());
        img.tensor(&loc.info.name, &dims, loc.info.ggml_type, &bytes);
    }
    let path = tmp.join("edited.gguf");
    std::fs::write(&path, img.to_bytes()).unwrap();
    path
}

/// Metadata llama.cpp would apply and colibri cannot is refused naming the
/// key; the sliding-window pattern is honoured as llama.cpp reads it.
#[test]
fn gpt_oss_metadata_colibri_cannot_honour_is_refused_by_key() {
    let tmp = tempfile::tempdir().unwrap();
    let src = "gpt-oss-tiny-q8_0.gguf";
    let same = |_: &str, d: Vec<u64>| d;
    let refuse = |extra: &[(&str, V)], key: &str, what: &str| {
        let path = rewritten(tmp.path(), src, extra, &[], same);
        let e = Engine::load(&path, &exact()).err().expect("refused").to_string();
        assert!(e.contains(key) && e.contains(what), "{key}: {e}");
    };
    refuse(
        &[("gpt-oss.expert_weights_scale", V::F32(2.5))],
        "gpt-oss.expert_weights_scale",
        "2.5",
    );
    refuse(
        &[("gpt-oss.rope.freq_base_swa", V::F32(10000.0))],
        "gpt-oss.rope.freq_base_swa",
        "10000",
    );
    refuse(
        &[("gpt-oss.rope.scaling.attn_factor", V::F32(0.5))],
        "gpt-oss.rope.scaling.attn_factor",
        "0.5",
    );
    refuse(
        &[("gpt-oss.rope.dimension_count", V::U32(8))],
        "gpt-oss.rope.dimension_count",
        "8",
    );
    refuse(
        &[(
            "gpt-oss.attention.sliding_window_pattern",
            V::Array(colibri::gguf::Array::Bool(vec![true, false, true])),
        )],
        "gpt-oss.attention.sliding_window_pattern",
        "3 entries for 2 layers",
    );
    refuse(
        &[("gpt-oss.rope.scaling.type", V::String("longrope".into()))],
        "gpt-oss.rope.scaling.type",
        "longrope",
    );
    let e = Engine::load(
        &rewritten(tmp.path(), src, &[], &["gpt-oss.attention.sliding_window"], same),
        &exact(),
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(e.contains("gpt-oss.attention.sliding_window"), "{e}");

    // The pattern llama.cpp assumes, spelt out either way, changes nothing;
    // every layer attending fully changes the tokens.
    let r = reference();
    let want = greedy(&mut load(&dir().join(src), &exact()), &r.prompt, 16);
    for pattern in [V::U32(2), V::Array(colibri::gguf::Array::Bool(vec![true, false]))] {
        let path = rewritten(
            tmp.path(),
            src,
            &[("gpt-oss.attention.sliding_window_pattern", pattern.clone())],
            &[],
            same,
        );
        assert_eq!(
            greedy(&mut load(&path, &exact()), &r.prompt, 16),
            want,
            "{pattern:?}"
        );
    }
    let full = rewritten(
        tmp.path(),
        src,
        &[(
            "gpt-oss.attention.sliding_window_pattern",
            V::Array(colibri::gguf::Array::Bool(vec![false, false])),
        )],
        &[],
        same,
    );
    assert_ne!(greedy(&mut load(&full, &exact()), &r.prompt, 16), want);

    // Stacked expert biases that are not [experts, rows].
    let flat = rewritten(tmp.path(), src, &[], &[], |name, d| {
        if name == "blk.1.ffn_up_exps.bias" {
            vec![d[0] * d[1]]
        } else {
            d
        }
    });
    let e = Engine::load(&flat, &exact()).err().expect("refused").to_string();
    assert!(
        e.contains("blk.1.ffn_up_exps.bias") && e.contains("2 dims"),
        "{e}"
    );
}

/// MiniMax-M2 metadata llama.cpp would apply (or could not run) and colibri
/// cannot honour is refused naming the key.
#[test]
fn minimax_m2_metadata_colibri_cannot_honour_is_refused_by_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = family_dir(MINIMAX);
    let src = "minimax-m2-tiny-q8_0.gguf";
    let same = |_: &str, d: Vec<u64>| d;
    let refuse = |extra: &[(&str, V)], drop: &[&str], key: &str, what: &str| {
        let path = rewritten_in(&dir, tmp.path(), src, extra, drop, same);
        let e = Engine::load(&path, &exact()).err().expect("refused").to_string();
        assert!(e.contains(key) && e.contains(what), "{key}: {e}");
    };
    refuse(
        &[("minimax-m2.expert_gating_func", V::U32(1))],
        &[],
        "minimax-m2.expert_gating_func",
        "sigmoid",
    );
    refuse(
        &[],
        &["minimax-m2.expert_gating_func"],
        "minimax-m2.expert_gating_func",
        "missing",
    );
    refuse(
        &[("minimax-m2.expert_weights_scale", V::F32(2.5))],
        &[],
        "minimax-m2.expert_weights_scale",
        "2.5",
    );
    refuse(
        &[("minimax-m2.expert_group_count", V::U32(4))],
        &[],
        "minimax-m2.expert_group_count",
        "4",
    );
    refuse(
        &[("minimax-m2.rope.dimension_count", V::U32(64))],
        &[],
        "minimax-m2.rope.dimension_count",
        "64",
    );
    refuse(
        &[("minimax-m2.rope.scaling.type", V::String("longrope".into()))],
        &[],
        "minimax-m2.rope.scaling.type",
        "longrope",
    );
    // The rotated share is read from the file: rotating whole heads
    // changes the tokens.
    let r = reference_of(MINIMAX, &[src]);
    let want = greedy(&mut load(&dir.join(src), &exact()), &r.prompt, 16);
    let whole = rewritten_in(
        &dir,
        tmp.path(),
        src,
        &[("minimax-m2.rope.dimension_count", V::U32(32))],
        &[],
        same,
    );
    assert_ne!(greedy(&mut load(&whole, &exact()), &r.prompt, 16), want);
}

/// `coli convert --input FILE.gguf` repacks both architectures into a
/// container with the GGUF's logits bit for bit: gpt-oss's per-expert
/// biases go into the container with their expert.
#[test]
fn converted_containers_give_the_gguf_logits() {
    let tmp = tempfile::tempdir().unwrap();
    for (arch, name) in [
        (GPT_OSS, "gpt-oss-tiny-f32.gguf"),
        (GPT_OSS, "gpt-oss-tiny-mxfp4_moe.gguf"),
        (MINIMAX, "minimax-m2-tiny-q4_0.gguf"),
    ] {
        let r = reference_of(arch, &[name]);
        let src = family_dir(arch).join(name);
        let out = tmp.path().join(name.trim_end_matches(".gguf"));
        let report = colibri::convert::convert(
            &src,
            &out,
            colibri::quant::QFormat::F32,
            colibri::quant::QFormat::F32,
            None,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(report.experts > 0, "{name}");
        let want = all_logits(&mut load(&src, &exact()), &r.full);
        assert_eq!(all_logits(&mut load(&out, &exact()), &r.full), want, "{name}");
    }
}
