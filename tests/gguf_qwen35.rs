//! colibri on GGUF files of llama.cpp's `qwen3next` (Qwen3-Next) and
//! `qwen35moe` (Qwen3.5 / 3.6 MoE) architectures against llama.cpp on the
//! same files (fixtures/gguf/families/{qwen3next,qwen35moe}/REF.json,
//! written by tools/make_gguf_qwen35_fixtures.py through llama.cpp's own
//! converter, quantizer and API: one thread, F32 KV cache, no flash
//! attention).
//!
//! The files are a random Qwen3NextForCausalLM and a random
//! Qwen3_5MoeForCausalLM converted by llama.cpp's converter, which
//! rewrites the linear-attention tensors (`A_log` as `-exp(A_log)`, the
//! squeezed convolution, Qwen3-Next's `in_proj_qkvz` split into `attn_qkv`
//! and `attn_gate`; for Qwen3.5 every value head reordered from grouped
//! to tiled order) and stores every zero-centred norm as `1 + w`: reading
//! any of them the Hugging Face way changes the tokens.
//!
//! colibri's Gated DeltaNet is not llama.cpp's operation for operation
//! (ggml's L2 norm is an RMS norm scaled by `1/sqrt(n)`, its softplus,
//! exp and sigmoid are vectorised, its delta rule sums in its own order),
//! yet the two agree to the last bit on the Q8_0 and Q4_0 files and to
//! 1.5e-5 (Qwen3-Next) and 1.6e-5 (Qwen3.5) on the F32 files (whose f32
//! matmuls sum in another order). The fixtures' seeds were chosen for
//! clear margins (llama.cpp's smallest top-2 margin is 0.028, on the
//! Qwen3-Next Q4_0 file), so every token is required to agree: no near-tie
//! is exempted.

#[path = "support/gguf_ref.rs"]
mod gguf_ref;

use std::path::{Path, PathBuf};

use colibri::convert::convert;
use colibri::engine::Engine;
use colibri::gguf::build::GgufImage;
use colibri::gguf::{GgufModel, Value as V};
use colibri::quant::QFormat;
use gguf_ref::*;
use serde_json::Value;

/// Largest |colibri − llama.cpp| of a logit at position 0 and at the last
/// position of the teacher-forced sequence, on every file: the measured
/// maximum (1.6e-5, the Qwen3.5 F32 file; 0 on Q8_0 and Q4_0) rounded up to a power
/// of ten, as in tests/gguf_llama_cpp.rs.
const LOGIT_BOUND: f32 = 1e-4;

/// The two architectures, each with its fixtures in its own directory.
const ARCHS: [&str; 2] = ["qwen3next", "qwen35moe"];

fn dir(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/gguf/families")
        .join(arch)
}

struct Ref {
    prompt: Vec<u32>,
    full: Vec<u32>,
    files: Vec<(String, Value)>,
}

fn reference(arch: &str) -> Ref {
    let path = dir(arch).join("REF.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).expect("REF.json is JSON");
    let files: Vec<(String, Value)> = v["files"]
        .as_object()
        .expect("files")
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(files.len(), 3, "the F32, Q8_0 and Q4_0 files");
    Ref {
        prompt: ids(&v["prompt_ids"]),
        full: ids(&v["full_ids"]),
        files,
    }
}

#[test]
fn teacher_forcing_matches_llama_cpp() {
    for arch in ARCHS {
        teacher_forcing_matches(arch);
    }
}

fn teacher_forcing_matches(arch: &str) {
    let r = reference(arch);
    for (name, f) in &r.files {
        let mut engine = load(&dir(arch).join(name), &exact());
        let vocab = engine.model.vocab_size();
        let n = r.full.len();
        let logits = all_logits(&mut engine, &r.full);
        let d_first = max_abs_diff(&logits[..vocab], &floats(&f["logits_first"]));
        assert!(
            d_first <= LOGIT_BOUND,
            "{name}: position 0 differs by {d_first:e}"
        );
        let d_last = max_abs_diff(&logits[(n - 1) * vocab..], &floats(&f["logits_last_seq"]));
        assert!(
            d_last <= LOGIT_BOUND,
            "{name}: last position differs by {d_last:e}"
        );
        let want = ids(&f["tf_seq_argmax"]);
        let got: Vec<u32> = (0..n)
            .map(|p| argmax(&logits[p * vocab..(p + 1) * vocab]))
            .collect();
        assert_eq!(got, want, "{name}: teacher-forced argmax");
    }
}

#[test]
fn greedy_decoding_matches_llama_cpp() {
    for arch in ARCHS {
        let r = reference(arch);
        for (name, f) in &r.files {
            let mut engine = load(&dir(arch).join(name), &exact());
            let want = ids(&f["greedy"]);
            let got = greedy(&mut engine, &r.prompt, want.len());
            assert_eq!(got, want, "{name}");
        }
    }
}

/// Streaming the experts from the file (a one-expert cache, O_DIRECT, the
/// pilot) gives the mapped run's tokens, and so does the container `coli
/// convert` makes, which must carry the architecture so the rewritten
/// tensors are read as the converter left them.
#[test]
fn streamed_and_converted_files_give_the_mapped_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    for (arch, q) in ARCHS.into_iter().flat_map(|a| [(a, "q8_0"), (a, "f32")]) {
        let r = reference(arch);
        let name = format!("{arch}-tiny-{q}.gguf");
        let path = dir(arch).join(&name);
        assert_streamed_equals_mapped(&path, &r.prompt, 12);

        let out = tmp.path().join(name.trim_end_matches(".gguf"));
        let name = &name;
        convert(&path, &out, QFormat::F32, QFormat::F32, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        let a = all_logits(&mut load(&out, &exact()), &r.full);
        let b = all_logits(&mut load(&path, &exact()), &r.full);
        assert_eq!(a, b, "{name}: the container's logits");
    }
}

/// `src` rewritten with its metadata edited (`edit` returns the value a
/// key gets, `None` drops it; `extra` keys are added).
fn with_metadata(
    src: &Path,
    dir: &Path,
    edit: &dyn Fn(&str, &V) -> Option<V>,
    extra: &[(&str, V)],
) -> PathBuf {
    let model = GgufModel::open(src).unwrap();
    let mut img = GgufImage::new();
    for (k, v) in model.metadata().iter() {
        if let Some(v) = edit(k, v) {
            img.kv(k, v);
        }
    }
    for (k, v) in extra {
        img.kv(k, v.clone());
    }
    for loc in model.tensors() {
        let bytes = model.tensor_bytes(&loc.info.name).unwrap().to_vec();
        img.tensor(&loc.info.name, &loc.info.dims, loc.info.ggml_type, &bytes);
    }
    let path = dir.join("edited.gguf");
    std::fs::write(&path, img.to_bytes()).unwrap();
    path
}

/// Metadata the mapping cannot honour is refused naming the key; the
/// layer pattern falls back to `full_attention_interval` as llama.cpp's
/// does when `attention.recurrent_layers` is absent.
#[test]
fn hostile_metadata_is_refused_naming_the_key() {
    for arch in ARCHS {
        hostile_metadata_is_refused(arch);
    }
}

fn hostile_metadata_is_refused(arch: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let src = dir(arch).join(format!("{arch}-tiny-q8_0.gguf"));
    let key = |name: &str| format!("{arch}.{name}");
    let same = |_: &str, v: &V| Some(v.clone());
    let refused = |edit: &dyn Fn(&str, &V) -> Option<V>, extra: &[(&str, V)]| -> String {
        let path = with_metadata(&src, tmp.path(), edit, extra);
        Engine::load(&path, &exact()).err().expect("refused").to_string()
    };
    let set = |name: &str, value: V| {
        let key = key(name);
        move |k: &str, v: &V| Some(if k == key { value.clone() } else { v.clone() })
    };

    let e = refused(&set("ssm.inner_size", V::U32(63)), &[]);
    assert!(e.contains(&key("ssm.inner_size")) && e.contains("63"), "{e}");
    let scale = key("expert_weights_scale");
    let e = refused(&same, &[(&scale, V::F32(2.5))]);
    assert!(e.contains(&scale) && e.contains("2.5"), "{e}");
    let e = refused(&set("attention.recurrent_layers", V::U32(1)), &[]);
    assert!(e.contains(&key("attention.recurrent_layers")), "{e}");
    let nextn = key("nextn_predict_layers");
    let e = refused(&same, &[(&nextn, V::U32(4))]);
    assert!(e.contains(&nextn) && e.contains('4'), "{e}");
    let e = refused(&set("ssm.time_step_rank", V::U32(0)), &[]);
    assert!(e.contains(&key("ssm")), "{e}");
    let conv = key("ssm.conv_kernel");
    let e = refused(&|k: &str, v: &V| (k != conv).then(|| v.clone()), &[]);
    assert!(e.contains(&conv), "{e}");

    // Without recurrent_layers the interval decides: 2 (the fixtures'
    // pattern) gives the same model; 4 a layer pattern whose tensors the
    // file does not have.
    let r = reference(arch);
    let want = greedy(&mut load(&src, &exact()), &r.prompt, 6);
    let (flags, interval) = (key("attention.recurrent_layers"), key("full_attention_interval"));
    // The converter always writes an interval (4 when the checkpoint's
    // config has none, as Qwen3.5's), so the edit replaces it.
    let without = |k: &str, v: &V| (k != flags && k != interval).then(|| v.clone());
    let path = with_metadata(&src, tmp.path(), &without, &[(&interval, V::U32(2))]);
    assert_eq!(greedy(&mut load(&path, &exact()), &r.prompt, 6), want, "{arch}");
    let e = refused(&without, &[(&interval, V::U32(4))]);
    assert!(e.contains("model.layers.1.linear_attn"), "{e}");
}

/// The file as the converter writes it from a real Qwen3-Next checkpoint,
/// whose `mtp.*` tensors become one more block after the model's
/// (`nextn_predict_layers` 1, `recurrent_layers` one entry longer): that
/// block (here the last layer's tensors with the next-token ones beside
/// them) is not run, so the tokens are the file's; a file holding only
/// that block is refused, saying so.
#[test]
fn a_next_token_block_is_kept_out_of_the_model() {
    for arch in ARCHS {
        next_token_block_is_kept_out(arch);
    }
}

fn next_token_block_is_kept_out(arch: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let src = dir(arch).join(format!("{arch}-tiny-q8_0.gguf"));
    let model = GgufModel::open(&src).unwrap();
    let key = |name: &str| format!("{arch}.{name}");
    let blocks = model.metadata().get_count(&key("block_count")).unwrap();
    let h = model.metadata().get_count(&key("embedding_length")).unwrap() as u64;
    let with_mtp = |keep: &dyn Fn(&str) -> bool| -> PathBuf {
        let mut img = GgufImage::new();
        for (k, v) in model.metadata().iter() {
            let v = match v {
                _ if k == key("block_count") => V::U32(blocks as u32 + 1),
                V::Array(colibri::gguf::Array::Bool(f)) if k == key("attention.recurrent_layers") => {
                    let mut f = f.clone();
                    f.push(false);
                    V::Array(colibri::gguf::Array::Bool(f))
                }
                _ => v.clone(),
            };
            img.kv(k, v);
        }
        img.kv(&key("nextn_predict_layers"), V::U32(1));
        let last = format!("blk.{}.", blocks - 1);
        let next = format!("blk.{blocks}.");
        let mut add = |name: &str, dims: &[u64], ty, bytes: &[u8]| {
            if keep(name) {
                img.tensor(name, dims, ty, bytes);
            }
        };
        for loc in model.tensors() {
            let bytes = model.tensor_bytes(&loc.info.name).unwrap();
            add(&loc.info.name, &loc.info.dims, loc.info.ggml_type, bytes);
        }
        for loc in model.tensors().filter(|t| t.info.name.starts_with(&last)) {
            let bytes = model.tensor_bytes(&loc.info.name).unwrap();
            let name = loc.info.name.replacen(&last, &next, 1);
            add(&name, &loc.info.dims, loc.info.ggml_type, bytes);
        }
        let ones: Vec<u8> = (0..h).flat_map(|_| 1f32.to_le_bytes()).collect();
        for norm in ["enorm", "hnorm", "shared_head_norm"] {
            add(
                &format!("{next}nextn.{norm}.weight"),
                &[h],
                colibri::gguf::GgmlType::F32,
                &ones,
            );
        }
        let eh: Vec<u8> = (0..2 * h * h)
            .flat_map(|i| ((i % 7) as f32 * 0.01).to_le_bytes())
            .collect();
        add(
            &format!("{next}nextn.eh_proj.weight"),
            &[2 * h, h],
            colibri::gguf::GgmlType::F32,
            &eh,
        );
        let path = tmp.path().join("mtp.gguf");
        std::fs::write(&path, img.to_bytes()).unwrap();
        path
    };
    let r = reference(arch);
    let want = greedy(&mut load(&src, &exact()), &r.prompt, 8);
    let path = with_mtp(&|_| true);
    assert_eq!(greedy(&mut load(&path, &exact()), &r.prompt, 8), want);
    let path = with_mtp(&|n: &str| !n.starts_with("blk.0."));
    let e = Engine::load(&path, &exact()).err().expect("refused").to_string();
    assert!(e.contains("next-token"), "{e}");
}
