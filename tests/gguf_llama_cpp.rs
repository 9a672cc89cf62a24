//! colibri on GGUF files against llama.cpp on the same files
//! (fixtures/gguf/REF.json, written by tools/make_gguf_ref.py through
//! llama.cpp's own API: one thread, F32 KV cache, no flash attention).
//!
//! Every GGUF runs as stored: its ggml blocks multiplied as llama.cpp
//! multiplies them, the experts streamed from their slices of the file.
//!
//! llama.cpp gives two answers for the same sequence: decoding one token
//! per call (`tf_seq_*`, the path it generates with) and one call for the
//! whole sequence (`tf_*`), whose batched matmuls sum in another order and
//! differ from the first by up to several tenths of a logit on the K-quant
//! files. colibri's results do not depend on batching (tests/
//! placement_determinism.rs), and they are held to llama.cpp's one-token
//! path: the bound below is the largest difference measured over the
//! fixtures, rounded up to a power of ten.

#[path = "support/gguf_ref.rs"]
mod gguf_ref;

use std::path::{Path, PathBuf};

use colibri::engine::{Engine, ModelFiles};
use colibri::gguf::build::GgufImage;
use colibri::gguf::{GgmlType, GgufModel};
use gguf_ref::*;
use serde_json::Value;

/// Largest |colibri − llama.cpp| of a logit at position 0 of every file,
/// and at every position of the files in F32, Q8_0 and Q4_0: the measured
/// maximum (3.5e-5, on the F32 file) rounded up to a power of ten.
const LOGIT_BOUND: f32 = 1e-4;

/// A top-2 margin of llama.cpp's below which its pick is a near-tie that
/// colibri may break the other way. On the K-quant files the two engines'
/// f32 rounding (ggml's vectorised `expf` in SiLU and softmax against
/// libm's, sums in other orders) differs in the last bits; the activations
/// are then quantized to Q8_K, where a last-bit difference can move a
/// value across a rounding boundary, and a router near-tie can flip an
/// expert. From such a position on, logits differ by up to 0.3 (11 at
/// the last position of the Q3_K_M file, where llama.cpp's own router gap
/// is 0.006), as llama.cpp's own one-call and one-token passes differ by
/// 0.19 on that file. Tokens agree wherever llama.cpp's margin exceeds
/// this.
const NEAR_TIE: f32 = 0.1;

/// A gap between the k-th and the next router logit (the smallest over the
/// layers, in llama.cpp's pass) below which the expert choice itself is a
/// near-tie.
const ROUTER_NEAR_TIE: f32 = 0.01;

/// Files with K-quant tensors (their later positions are held to
/// [`NEAR_TIE`], not [`LOGIT_BOUND`]).
fn is_k_quant(name: &str) -> bool {
    name.contains("_k")
}

fn gguf_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf")
}

struct Ref {
    /// The directory the files are in.
    dir: PathBuf,
    prompt: Vec<u32>,
    full: Vec<u32>,
    files: Vec<(String, Value)>,
}

fn read_ref(dir: PathBuf, at_least: usize) -> Ref {
    let path = dir.join("REF.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).expect("REF.json is JSON");
    let files = v["files"]
        .as_object()
        .expect("files")
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect::<Vec<_>>();
    assert!(
        files.len() >= at_least,
        "expected the committed GGUF fixtures in {}",
        dir.display()
    );
    Ref {
        dir,
        prompt: ids(&v["prompt_ids"]),
        full: ids(&v["full_ids"]),
        files,
    }
}

/// The OLMoE files (fixtures/gguf, tools/make_gguf_ref.py).
fn reference() -> Ref {
    read_ref(gguf_dir(), 6)
}

/// The other families' files (fixtures/gguf/families,
/// tools/make_gguf_family_fixtures.py): Qwen3-MoE and GLM-4.x MoE.
fn family_reference() -> Ref {
    read_ref(gguf_dir().join("families"), 6)
}

fn every_reference() -> [Ref; 2] {
    [reference(), family_reference()]
}

#[test]
fn teacher_forcing_matches_llama_cpp_on_every_gguf_fixture() {
    for r in every_reference() {
        teacher_forcing_matches(&r);
    }
}

fn teacher_forcing_matches(r: &Ref) {
    for (name, f) in &r.files {
        let mut engine = load(&r.dir.join(name), &exact());
        let vocab = engine.model.vocab_size();
        let n = r.full.len();
        let logits = all_logits(&mut engine, &r.full);
        // Position 0 has no history: the weights' kernels alone.
        let d_first = max_abs_diff(&logits[..vocab], &floats(&f["logits_first"]));
        assert!(
            d_first <= LOGIT_BOUND,
            "{name}: position 0 differs by {d_first:e}"
        );
        let d_last = max_abs_diff(&logits[(n - 1) * vocab..], &floats(&f["logits_last_seq"]));
        if !is_k_quant(name) {
            assert!(
                d_last <= LOGIT_BOUND,
                "{name}: last position differs by {d_last:e}"
            );
        }
        let want = ids(&f["tf_seq_argmax"]);
        let margin = floats(&f["tf_seq_margin"]);
        let router = floats(&f["tf_router_gap"]);
        for p in 0..n {
            let got = argmax(&logits[p * vocab..(p + 1) * vocab]);
            assert!(
                got == want[p] || margin[p] < NEAR_TIE || router[p] < ROUTER_NEAR_TIE,
                "{name}: position {p}: argmax {got}, llama.cpp {} by a margin of {} (router gap {})",
                want[p],
                margin[p],
                router[p]
            );
        }
    }
}

#[test]
fn greedy_decoding_matches_llama_cpp_on_every_gguf_fixture() {
    for r in every_reference() {
        greedy_matches(&r);
    }
}

fn greedy_matches(r: &Ref) {
    for (name, f) in &r.files {
        let mut engine = load(&r.dir.join(name), &exact());
        let want = ids(&f["greedy"]);
        let margin = floats(&f["greedy_margin"]);
        let got = greedy(&mut engine, &r.prompt, want.len());
        // Up to llama.cpp's first near-tie: after a different pick the
        // two continuations are no longer comparable.
        let upto = margin.iter().position(|&m| m < NEAR_TIE).unwrap_or(want.len());
        assert_eq!(got[..upto], want[..upto], "{name}");
        if !is_k_quant(name) {
            assert_eq!(got, want, "{name}");
        }
    }
}

/// The F32 GGUF holds exactly the safetensors checkpoint it was converted
/// from, so it is the same model to the last bit.
#[test]
fn the_f32_gguf_is_the_checkpoint_it_was_converted_from() {
    let r = reference();
    let ck = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/olmoe-tiny");
    let a = all_logits(&mut load(&ck, &exact()), &r.full);
    let b = all_logits(
        &mut load(&gguf_dir().join("olmoe-tiny-f32.gguf"), &exact()),
        &r.full,
    );
    assert_eq!(a, b);
}

/// Streaming from the file (a one-expert cache per layer, O_DIRECT reads
/// of ranges that are not block-aligned, the pilot on) gives the tokens of
/// the mapped run; a split model gives the tokens of the single file.
#[test]
fn streamed_and_split_ggufs_give_the_mapped_tokens() {
    let (r, f) = (reference(), family_reference());
    for (refs, name) in [
        (&r, "olmoe-tiny-q8_0.gguf"),
        (&r, "olmoe-tiny256-q4_k_m.gguf"),
        (&f, "qwen3moe-tiny-q4_0.gguf"),
        (&f, "glm4moe-tiny-q8_0.gguf"),
    ] {
        let path = refs.dir.join(name);
        assert_streamed_equals_mapped(&path, &refs.prompt, 16);
    }
    let single = greedy(
        &mut load(&gguf_dir().join("olmoe-tiny-q8_0.gguf"), &exact()),
        &r.prompt,
        16,
    );
    let split = gguf_dir().join("olmoe-tiny-q8_0-split-00001-of-00003.gguf");
    assert_eq!(greedy(&mut load(&split, &exact()), &r.prompt, 16), single);
}

/// What a GGUF's metadata brings besides the weights: the tokenizer (the
/// same ids as the checkpoint's tokenizer.json), the stop ids, the chat
/// template.
#[test]
fn tokenizer_stops_and_template_come_from_the_metadata() {
    let ck = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/olmoe-tiny");
    let from_ck = load(&ck, &exact());
    let from_gguf = load(&gguf_dir().join("olmoe-tiny-q8_0.gguf"), &exact());
    let text = "Hello, world! The quick brown fox.";
    let a = from_ck
        .tokenizer()
        .expect("checkpoint tokenizer")
        .encode(text)
        .unwrap();
    let b = from_gguf
        .tokenizer()
        .expect("GGUF tokenizer")
        .encode(text)
        .unwrap();
    assert_eq!(a, b);
    assert!(!from_gguf.stop_ids.is_empty());
    for id in &from_gguf.stop_ids {
        assert!(from_ck.stop_ids.contains(id), "stop id {id}");
    }
    let files = ModelFiles::resolve(&gguf_dir().join("olmoe-tiny-q8_0.gguf")).unwrap();
    assert!(files.is_gguf());
    let t = files.chat_template(&mut |_| {}).unwrap();
    let rendered = t
        .render(&[colibri::chat_template::ChatMessage::user("hi")], true)
        .unwrap();
    assert!(rendered.contains("hi"), "{rendered}");
}

/// `--model` may name the file, a directory holding one GGUF model, or a
/// file without the extension (an ollama blob); a directory holding
/// several is refused with their names.
#[test]
fn model_paths_resolve_to_the_gguf_inside() {
    let tmp = tempfile::tempdir().unwrap();
    let src = gguf_dir().join("olmoe-tiny-q4_0.gguf");
    let dir = tmp.path().join("one");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(&src, dir.join("model.gguf")).unwrap();
    assert_eq!(
        ModelFiles::resolve(&dir).unwrap(),
        ModelFiles::Gguf(dir.join("model.gguf"))
    );
    let blob = tmp.path().join("sha256-0123abcd");
    std::fs::copy(&src, &blob).unwrap();
    assert!(ModelFiles::resolve(&blob).unwrap().is_gguf());
    let r = reference();
    let want = greedy(&mut load(&src, &exact()), &r.prompt, 8);
    assert_eq!(greedy(&mut load(&dir, &exact()), &r.prompt, 8), want);
    assert_eq!(greedy(&mut load(&blob, &exact()), &r.prompt, 8), want);
    // The committed fixtures directory holds several models; a split model
    // counts once.
    let e = ModelFiles::resolve(&gguf_dir()).unwrap_err().to_string();
    assert!(
        e.contains("several GGUF models") && e.contains("olmoe-tiny-q4_0.gguf"),
        "{e}"
    );
    assert!(
        e.contains("olmoe-tiny-q8_0-split-00001-of-00003.gguf") && !e.contains("00002"),
        "{e}"
    );
}

/// The fixture rewritten with `edit` applied to each tensor (name, dims,
/// type, bytes), into `dir`.
fn rewritten(
    dir: &Path,
    edit: impl Fn(&str, Vec<u64>, GgmlType, Vec<u8>) -> (Vec<u64>, GgmlType, Vec<u8>),
) -> PathBuf {
    let model = GgufModel::open(&gguf_dir().join("olmoe-tiny-q8_0.gguf")).unwrap();
    let mut img = GgufImage::new();
    for (k, v) in model.metadata().iter() {
        img.kv(k, v.clone());
    }
    for loc in model.tensors() {
        let bytes = model.tensor_bytes(&loc.info.name).unwrap().to_vec();
        let (dims, ty, bytes) = edit(&loc.info.name, loc.info.dims.clone(), loc.info.ggml_type, bytes);
        img.tensor(&loc.info.name, &dims, ty, &bytes);
    }
    let path = dir.join("edited.gguf");
    std::fs::write(&path, img.to_bytes()).unwrap();
    path
}

#[test]
fn hostile_ggufs_are_refused_at_load_naming_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    // The rewrite itself changes nothing.
    let same = rewritten(tmp.path(), |_, d, t, b| (d, t, b));
    let r = reference();
    let want = greedy(
        &mut load(&gguf_dir().join("olmoe-tiny-q8_0.gguf"), &exact()),
        &r.prompt,
        4,
    );
    assert_eq!(greedy(&mut load(&same, &exact()), &r.prompt, 4), want);

    // Experts in a type that has no kernel (Q8_1 is an activation type).
    let q8_1 = rewritten(tmp.path(), |name, dims, ty, bytes| {
        if name == "blk.1.ffn_up_exps.weight" {
            let n: u64 = dims.iter().product();
            (dims, GgmlType::Q8_1, vec![0; (n / 32 * 36) as usize])
        } else {
            (dims, ty, bytes)
        }
    });
    let e = Engine::load(&q8_1, &exact()).err().expect("refused").to_string();
    assert!(
        e.contains("blk.1.ffn_up_exps.weight") && e.contains("Q8_1"),
        "{e}"
    );

    // An embedding of the wrong width.
    let wide = rewritten(tmp.path(), |name, mut dims, ty, bytes| {
        if name == "token_embd.weight" {
            dims[0] *= 2;
            dims[1] /= 2;
        }
        (dims, ty, bytes)
    });
    let e = Engine::load(&wide, &exact()).err().expect("refused").to_string();
    assert!(
        e.contains("model.embed_tokens.weight") || e.contains("token_embd"),
        "{e}"
    );

    // Stacked experts that are not 3-D.
    let flat = rewritten(tmp.path(), |name, dims, ty, bytes| {
        if name == "blk.0.ffn_gate_exps.weight" {
            (vec![dims[0], dims[1] * dims[2]], ty, bytes)
        } else {
            (dims, ty, bytes)
        }
    });
    let e = Engine::load(&flat, &exact()).err().expect("refused").to_string();
    assert!(
        e.contains("blk.0.ffn_gate_exps.weight") && e.contains("3 dims"),
        "{e}"
    );
}

/// The commands that inspect a model before running it read a GGUF too.
#[test]
fn plan_and_doctor_read_a_gguf() {
    let path = gguf_dir().join("olmoe-tiny-q8_0.gguf");
    let home = tempfile::tempdir().unwrap();
    for args in [
        vec!["plan", "--model"],
        vec!["doctor", "--probe-mb", "1", "--model"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_coli"))
            .args(&args)
            .arg(&path)
            .env("HOME", home.path())
            .env_remove("XDG_STATE_HOME")
            .output()
            .expect("coli runs");
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "coli {args:?}: {text}");
        assert!(!text.contains("PROBLEM"), "coli {args:?}: {text}");
    }
}

/// `src` rewritten with its metadata edited (`edit` returns the value a
/// key gets, `None` drops it; `extra` keys are set) and only the tensors
/// `keep` keeps.
fn with_metadata(
    src: &Path,
    dir: &Path,
    edit: impl Fn(&str, &colibri::gguf::Value) -> Option<colibri::gguf::Value>,
    extra: &[(&str, colibri::gguf::Value)],
    keep: impl Fn(&str) -> bool,
) -> PathBuf {
    let model = GgufModel::open(src).unwrap();
    let mut img = GgufImage::new();
    for (k, v) in model.metadata().iter() {
        if extra.iter().any(|(e, _)| *e == k) {
            continue;
        }
        if let Some(v) = edit(k, v) {
            img.kv(k, v);
        }
    }
    for (k, v) in extra {
        img.kv(k, v.clone());
    }
    for loc in model.tensors().filter(|t| keep(&t.info.name)) {
        let bytes = model.tensor_bytes(&loc.info.name).unwrap().to_vec();
        img.tensor(&loc.info.name, &loc.info.dims, loc.info.ggml_type, &bytes);
    }
    let path = dir.join("edited.gguf");
    std::fs::write(&path, img.to_bytes()).unwrap();
    path
}

/// Metadata a family's mapping cannot honour is refused naming the key,
/// and a next-token layer the file declares but does not hold is left out.
#[test]
fn family_metadata_colibri_cannot_honour_is_refused_by_key() {
    use colibri::gguf::Value as V;
    let tmp = tempfile::tempdir().unwrap();
    let f = family_reference();
    let same = |_: &str, v: &V| Some(v.clone());
    let all = |_: &str| true;
    let refuse = |src: &str, extra: &[(&str, V)], key: &str, what: &str| {
        let path = with_metadata(&f.dir.join(src), tmp.path(), same, extra, all);
        let e = Engine::load(&path, &exact()).err().expect("refused").to_string();
        assert!(e.contains(key) && e.contains(what), "{e}");
    };
    refuse(
        "qwen3moe-tiny-q8_0.gguf",
        &[("qwen3moe.expert_weights_scale", V::F32(2.5))],
        "qwen3moe.expert_weights_scale",
        "2.5",
    );
    refuse(
        "glm4moe-tiny-q8_0.gguf",
        &[("glm4moe.expert_gating_func", V::U32(1))],
        "glm4moe.expert_gating_func",
        "sigmoid",
    );
    refuse(
        "qwen3moe-tiny-q8_0.gguf",
        &[("qwen3moe.rope.scaling.type", V::String("longrope".into()))],
        "qwen3moe.rope.scaling.type",
        "longrope",
    );
    let glm = f.dir.join("glm4moe-tiny-q8_0.gguf");
    let nine = |k: &str, v: &V| {
        Some(if k == "glm4moe.nextn_predict_layers" {
            V::U32(9)
        } else {
            v.clone()
        })
    };
    let path = with_metadata(&glm, tmp.path(), nine, &[], all);
    let e = Engine::load(&path, &exact()).err().expect("refused").to_string();
    assert!(
        e.contains("glm4moe.nextn_predict_layers") && e.contains("9"),
        "{e}"
    );

    // Converted without its next-token layer, but still declaring it: the
    // main model, the same tokens.
    let want = greedy(&mut load(&glm, &exact()), &f.prompt, 8);
    let trunk = with_metadata(&glm, tmp.path(), same, &[], |n| !n.starts_with("blk.3."));
    assert_eq!(greedy(&mut load(&trunk, &exact()), &f.prompt, 8), want);
    // Only the next-token layer: refused, saying so.
    let mtp_only = with_metadata(&glm, tmp.path(), same, &[], |n| !n.starts_with("blk.0."));
    let e = Engine::load(&mtp_only, &exact())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("next-token"), "{e}");
}
