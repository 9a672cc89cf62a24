//! `coli convert --input FILE.gguf`: every GGUF fixture repacked into a
//! container gives the GGUF's logits bit for bit, its ggml blocks copied
//! byte for byte with each expert one aligned contiguous range, and the
//! tokenizer, stop ids and chat template the GGUF's metadata held.

use std::path::{Path, PathBuf};

use colibri::convert::{ALIGN, convert};
use colibri::engine::{Engine, EngineOptions, ModelFiles};
use colibri::gguf::GgufModel;
use colibri::model::kv_cache::{KvType, KvTypes};
use colibri::model::lm::Logits;
use colibri::quant::QFormat;
use colibri::st::Checkpoint;
use colibri::st::ggml_blocks::GGML_TYPES_KEY;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf")
}

/// Every single-file GGUF fixture of every family, and the first shard of
/// the split one.
fn gguf_fixtures() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in [fixtures(), fixtures().join("families")] {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".gguf") && (!name.contains("-of-") || name.contains("00001-of-")) {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(
        out.len() >= 14,
        "expected the committed GGUF fixtures, found {out:?}"
    );
    out
}

fn exact() -> EngineOptions {
    EngineOptions {
        kv_types: KvTypes::both(KvType::F32),
        ..EngineOptions::default()
    }
}

const IDS: [u32; 12] = [238, 177, 181, 209, 63, 89, 53, 13, 114, 147, 5, 200];

fn logits(path: &Path) -> Vec<f32> {
    let mut engine = Engine::load(path, &exact()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut state = engine.model.new_state();
    let tag = engine.next_tag();
    engine
        .model
        .forward(&IDS, state.as_mut(), tag, Logits::All)
        .expect("forward")
}

fn converted(src: &Path, out: &Path, experts: QFormat) -> colibri::convert::ConvertReport {
    convert(src, out, experts, QFormat::F32, None).unwrap_or_else(|e| panic!("{}: {e}", src.display()))
}

#[test]
fn every_gguf_converts_to_a_container_with_its_exact_logits() {
    let tmp = tempfile::tempdir().unwrap();
    for src in gguf_fixtures() {
        let name = src.file_stem().unwrap().to_string_lossy().into_owned();
        let out = tmp.path().join(&name);
        let report = converted(&src, &out, QFormat::F32);
        assert!(report.experts > 0, "{name}");
        assert!(
            !ModelFiles::resolve(&out).unwrap().is_gguf(),
            "{name}: the container is a checkpoint directory"
        );
        assert_eq!(logits(&out), logits(&src), "{name}");
    }
}

/// The container's ggml tensors are the GGUF's bytes, and each expert's
/// tensors are adjacent, the first one aligned: one read per expert.
#[test]
fn blocks_are_copied_as_stored_and_each_expert_is_one_aligned_range() {
    let tmp = tempfile::tempdir().unwrap();
    for src in [
        fixtures().join("olmoe-tiny256-q4_k_m.gguf"),
        fixtures().join("families/glm4moe-tiny-q4_0.gguf"),
        fixtures().join("families/qwen3moe-tiny-q8_0.gguf"),
    ] {
        let out = tmp.path().join(src.file_stem().unwrap());
        converted(&src, &out, QFormat::F32);
        let gguf = ModelFiles::resolve(&src).unwrap().weights().unwrap();
        let ck = Checkpoint::open(&out).unwrap();
        assert!(ck.metadata().contains_key(GGML_TYPES_KEY));
        let mut blocks = 0;
        for name in gguf.names() {
            let a = gguf.info(name).unwrap();
            let Some(ty) = a.block else { continue };
            let b = ck.info(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!((b.block, &b.shape), (Some(ty), &a.shape), "{name}");
            assert_eq!(ck.bytes(name).unwrap(), gguf.bytes(name).unwrap(), "{name}");
            blocks += 1;
        }
        assert!(blocks > 0);
        let model = GgufModel::open(&src).unwrap();
        let arch = model.architecture().unwrap();
        let layers = model
            .metadata()
            .get_count(&format!("{arch}.block_count"))
            .unwrap();
        let experts = model
            .metadata()
            .get_count(&format!("{arch}.expert_count"))
            .unwrap();
        let mut checked = 0;
        for l in 0..layers {
            for e in 0..experts {
                let part = |p: &str| {
                    ck.info(&format!("model.layers.{l}.mlp.experts.{e}.{p}.weight"))
                        .ok()
                };
                let (Some(g), Some(u), Some(d)) = (part("gate_proj"), part("up_proj"), part("down_proj"))
                else {
                    continue;
                };
                assert_eq!(g.offset % ALIGN, 0, "layer {l} expert {e}");
                assert_eq!(g.offset + g.len, u.offset, "layer {l} expert {e}");
                assert_eq!(u.offset + u.len, d.offset, "layer {l} expert {e}");
                checked += 1;
            }
        }
        assert!(checked >= experts, "{}: {checked} experts", src.display());
    }
}

/// What the GGUF's metadata held comes with the container: the same
/// token ids, stop ids and rendered chat template.
#[test]
fn tokenizer_stops_and_template_come_along() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("olmoe-tiny-q8_0.gguf");
    let out = tmp.path().join("c");
    converted(&src, &out, QFormat::F32);
    let (a, b) = (
        ModelFiles::resolve(&src).unwrap(),
        ModelFiles::resolve(&out).unwrap(),
    );
    let text = "Hello, world! <|endoftext|> The quick brown fox.";
    let enc = |f: &ModelFiles| f.tokenizer().unwrap().expect("a tokenizer").encode(text).unwrap();
    assert_eq!(enc(&a), enc(&b));
    let eos = Engine::load(&src, &exact()).unwrap().stop_ids;
    assert!(!eos.is_empty());
    assert_eq!(Engine::load(&out, &exact()).unwrap().stop_ids, eos);
    let msgs = [colibri::chat_template::ChatMessage::user("hi")];
    let render = |f: &ModelFiles| f.chat_template(&mut |_| {}).unwrap().render(&msgs, true).unwrap();
    assert_eq!(render(&a), render(&b));
}

/// A split GGUF converts to the container of the single file; an F32 GGUF
/// asked for int8 experts gets them (float tensors follow `--experts`).
#[test]
fn split_and_float_ggufs() {
    let tmp = tempfile::tempdir().unwrap();
    let single = tmp.path().join("single");
    let split = tmp.path().join("split");
    converted(&fixtures().join("olmoe-tiny-q8_0.gguf"), &single, QFormat::F32);
    converted(
        &fixtures().join("olmoe-tiny-q8_0-split-00001-of-00003.gguf"),
        &split,
        QFormat::F32,
    );
    assert_eq!(
        std::fs::read(single.join("model.safetensors")).unwrap(),
        std::fs::read(split.join("model.safetensors")).unwrap()
    );
    let int8 = tmp.path().join("int8");
    let report = converted(&fixtures().join("olmoe-tiny-f32.gguf"), &int8, QFormat::Int8);
    assert_eq!(report.experts_format, QFormat::Int8);
    let ck = Checkpoint::open(&int8).unwrap();
    let e = ck.info("model.layers.0.mlp.experts.0.up_proj.weight").unwrap();
    assert_eq!((e.dtype, e.block), (colibri::st::Dtype::U8, None));
    // The same quantizer on the same values: the int8 container of the
    // checkpoint the F32 GGUF was converted from.
    let from_ck = tmp.path().join("from-ck");
    converted(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/olmoe-tiny"),
        &from_ck,
        QFormat::Int8,
    );
    assert_eq!(logits(&int8), logits(&from_ck));
    assert_ne!(logits(&int8), logits(&fixtures().join("olmoe-tiny-f32.gguf")));
}

/// A container whose ggml type list disagrees with its tensors is refused
/// at open, naming the tensor.
#[test]
fn a_tampered_type_list_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    converted(&fixtures().join("olmoe-tiny-q4_0.gguf"), &out, QFormat::F32);
    let path = out.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    // Q4_0 (id 2) claimed as Q8_0 (id 8): the stored row length no longer fits.
    let needle = "[2,[";
    assert!(header.contains(needle), "{header}");
    let tampered = header.replacen(needle, "[8,[", 1);
    assert_eq!(tampered.len(), header.len());
    bytes[8..8 + n].copy_from_slice(tampered.as_bytes());
    std::fs::write(&path, bytes).unwrap();
    let e = Engine::load(&out, &exact()).err().expect("refused").to_string();
    assert!(e.contains("Q8_0") && e.contains("stored as U8"), "{e}");
}

/// The command: `coli convert --input FILE.gguf --output DIR`, then `coli
/// run` on both prints the same text.
#[test]
fn the_cli_converts_a_gguf_and_both_run_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("families/qwen3moe-tiny-q4_0.gguf");
    let out = tmp.path().join("qwen3");
    let coli = |args: &[&std::ffi::OsStr]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_coli"))
            .args(args)
            .env("HOME", tmp.path())
            .env_remove("XDG_STATE_HOME")
            .env_remove("XDG_DATA_HOME")
            .env_remove("COLI_MODELS")
            .output()
            .expect("coli runs");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "coli {args:?}: {err}");
        (String::from_utf8_lossy(&o.stdout).into_owned(), err)
    };
    let os = |s: &str| std::ffi::OsString::from(s);
    let (_, err) = coli(&[
        &os("convert"),
        &os("--input"),
        src.as_os_str(),
        &os("--output"),
        out.as_os_str(),
    ]);
    assert!(err.contains("experts Q4_0"), "{err}");
    let run = |model: &Path| {
        coli(&[
            &os("run"),
            &os("--model"),
            model.as_os_str(),
            &os("--prompt"),
            &os("Hello there"),
            &os("--max-tokens"),
            &os("12"),
        ])
        .0
    };
    let text = run(&src);
    assert!(!text.trim().is_empty());
    assert_eq!(run(&out), text);
}
