//! `coli convert` round trip: a tiny random OLMoE checkpoint is converted in
//! every format and read back through `st::Checkpoint`.

use std::collections::HashMap;
use std::path::Path;

use colibri::convert::{ConvertError, convert, parse_format};
use colibri::quant::{QFormat, quantize_matrix};
use colibri::st::{Checkpoint, Dtype};
use safetensors::tensor::TensorView;

const H: usize = 128;
const I: usize = 64;
const LAYERS: usize = 2;
const EXPERTS: usize = 4;
const VOCAB: usize = 96;

type Src = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Deterministic pseudo-random values (xorshift), roughly in [-1, 1].
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn config() -> serde_json::Value {
    serde_json::json!({
        "model_type": "olmoe", "vocab_size": VOCAB, "hidden_size": H, "intermediate_size": I,
        "num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_experts": EXPERTS, "num_experts_per_tok": 2, "rope_theta": 10000.0
    })
}

/// The source tensors by name, all F32.
fn source() -> Src {
    let mut t = Vec::new();
    let mut seed = 1;
    let mut add = |name: String, shape: Vec<usize>| {
        seed += 1;
        let n = shape.iter().product();
        t.push((name, shape, values(seed, n)));
    };
    add("model.embed_tokens.weight".into(), vec![VOCAB, H]);
    add("lm_head.weight".into(), vec![VOCAB, H]);
    add("model.norm.weight".into(), vec![H]);
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        for m in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            add(format!("{p}.self_attn.{m}.weight"), vec![H, H]);
        }
        add(format!("{p}.self_attn.q_norm.weight"), vec![H]);
        add(format!("{p}.self_attn.k_norm.weight"), vec![H]);
        add(format!("{p}.input_layernorm.weight"), vec![H]);
        add(format!("{p}.post_attention_layernorm.weight"), vec![H]);
        add(format!("{p}.mlp.gate.weight"), vec![EXPERTS, H]);
        for e in 0..EXPERTS {
            add(format!("{p}.mlp.experts.{e}.gate_proj.weight"), vec![I, H]);
            add(format!("{p}.mlp.experts.{e}.up_proj.weight"), vec![I, H]);
            add(format!("{p}.mlp.experts.{e}.down_proj.weight"), vec![H, I]);
        }
    }
    t
}

fn le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

type Raw = (String, Vec<usize>, Vec<u8>, Dtype);

fn write_st(path: &Path, tensors: &[Raw]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, b, d)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Writes the checkpoint as two shards plus an index (exercising the index
/// path of the reader at the same time).
fn write_checkpoint(dir: &Path, src: &Src) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config().to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    let mut shards: [Vec<Raw>; 2] = [Vec::new(), Vec::new()];
    let mut map = serde_json::Map::new();
    for (i, (n, s, v)) in src.iter().enumerate() {
        let k = i % 2;
        shards[k].push((n.clone(), s.clone(), le(v), Dtype::F32));
        let f = format!("model-0000{}-of-00002.safetensors", k + 1);
        map.insert(n.clone(), f.into());
    }
    for (k, s) in shards.iter().enumerate() {
        write_st(&dir.join(format!("model-0000{}-of-00002.safetensors", k + 1)), s);
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

/// The same weights in the transformers-5 fused expert layout.
fn write_fused(dir: &Path, src: &Src) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config().to_string()).unwrap();
    let by: HashMap<&str, &Vec<f32>> = src.iter().map(|(n, _, v)| (n.as_str(), v)).collect();
    let mut out: Vec<Raw> = src
        .iter()
        .filter(|(n, _, _)| !n.contains(".experts."))
        .map(|(n, s, v)| (n.clone(), s.clone(), le(v), Dtype::F32))
        .collect();
    for l in 0..LAYERS {
        let (mut gu, mut down) = (Vec::new(), Vec::new());
        for e in 0..EXPERTS {
            let p = format!("model.layers.{l}.mlp.experts.{e}");
            gu.extend_from_slice(by[format!("{p}.gate_proj.weight").as_str()]);
            gu.extend_from_slice(by[format!("{p}.up_proj.weight").as_str()]);
            down.extend_from_slice(by[format!("{p}.down_proj.weight").as_str()]);
        }
        let p = format!("model.layers.{l}.mlp.experts");
        out.push((
            format!("{p}.gate_up_proj"),
            vec![EXPERTS, 2 * I, H],
            le(&gu),
            Dtype::F32,
        ));
        out.push((
            format!("{p}.down_proj"),
            vec![EXPERTS, H, I],
            le(&down),
            Dtype::F32,
        ));
    }
    write_st(&dir.join("model.safetensors"), &out);
}

/// The format a source tensor should have in the container.
fn expected_format(name: &str, experts: QFormat, dense: QFormat) -> QFormat {
    if name.contains(".experts.") {
        experts
    } else if name.ends_with("_proj.weight")
        || name == "model.embed_tokens.weight"
        || name == "lm_head.weight"
    {
        dense
    } else {
        QFormat::F32
    }
}

fn check_container(out: &Path, src: &Src, experts: QFormat, dense: QFormat) {
    let ck = Checkpoint::open(out).unwrap();
    assert_eq!(ck.metadata()["format"], "colibri");
    assert_eq!(ck.metadata()["experts"], experts.to_string());
    assert_eq!(ck.metadata()["dense"], dense.to_string());
    assert!(out.join("config.json").is_file() && out.join("tokenizer.json").is_file());
    assert!(!ck.names().any(|n| n.starts_with("__pad__")));
    // Any safetensors reader accepts the container.
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    safetensors::SafeTensors::deserialize(&bytes).unwrap();

    for (name, shape, v) in src {
        if shape.len() == 1 || name.ends_with("mlp.gate.weight") {
            // Norms and router: bit-identical f32.
            let got = ck.f32_tensor(name, shape).unwrap();
            assert_eq!(le(&got), le(v), "{name}");
            assert_eq!(ck.info(name).unwrap().dtype, Dtype::F32);
            continue;
        }
        let (rows, cols) = (shape[0], shape[1]);
        let m = ck.matrix(name, rows, cols, QFormat::F32).unwrap();
        let want = expected_format(name, experts, dense);
        if want == QFormat::F32 {
            assert_eq!(le(m.f32_data().unwrap()), le(v), "{name}");
        } else {
            let (q, s) = quantize_matrix(rows, cols, v, want).unwrap();
            assert_eq!(m.packed().unwrap(), &q[..], "{name} bytes");
            assert_eq!(m.scales(), &s[..], "{name} scales");
        }
    }

    // Every expert: one contiguous, 4096-aligned span.
    for l in 0..LAYERS {
        for e in 0..EXPERTS {
            let mut pieces = Vec::new();
            for p in ["gate_proj", "up_proj", "down_proj"] {
                let name = format!("model.layers.{l}.mlp.experts.{e}.{p}.weight");
                pieces.extend(ck.matrix_parts(&name).unwrap().pieces());
            }
            let n = if experts == QFormat::F32 { 3 } else { 6 };
            assert_eq!(pieces.len(), n);
            assert_eq!(pieces[0].offset % 4096, 0, "L{l}E{e} aligned");
            for w in pieces.windows(2) {
                assert_eq!(w[0].file, w[1].file);
                assert_eq!(w[0].offset + w[0].len, w[1].offset, "L{l}E{e} adjacent");
            }
        }
    }
}

#[test]
fn every_format_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source();
    let input = tmp.path().join("in");
    write_checkpoint(&input, &src);
    for (ex, de) in [
        ("int8", "f32"),
        ("int4", "int8"),
        ("int4-g64", "int4"),
        ("int2", "f32"),
        ("f32", "f32"),
    ] {
        let (experts, dense) = (parse_format(ex).unwrap(), parse_format(de).unwrap());
        let out = tmp.path().join(format!("out-{ex}-{de}"));
        let rep = convert(&input, &out, experts, dense, None).unwrap();
        assert_eq!(rep.experts, LAYERS * EXPERTS);
        check_container(&out, &src, experts, dense);
    }
}

#[test]
fn fused_experts_give_the_same_container() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    write_checkpoint(&a, &src);
    write_fused(&b, &src);
    let fmt = QFormat::Int4Grouped { group: 64 };
    convert(&a, &tmp.path().join("oa"), fmt, QFormat::Int8, None).unwrap();
    convert(&b, &tmp.path().join("ob"), fmt, QFormat::Int8, None).unwrap();
    let fa = std::fs::read(tmp.path().join("oa/model.safetensors")).unwrap();
    let fb = std::fs::read(tmp.path().join("ob/model.safetensors")).unwrap();
    assert!(fa == fb, "fused and per-expert inputs must convert identically");
}

#[test]
fn bf16_input_is_widened() {
    let tmp = tempfile::tempdir().unwrap();
    let rounded: Src = source()
        .into_iter()
        .map(|(n, s, v)| {
            (
                n,
                s,
                v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect(),
            )
        })
        .collect();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("config.json"), config().to_string()).unwrap();
    std::fs::write(input.join("tokenizer.json"), "{}").unwrap();
    let tensors: Vec<Raw> = rounded
        .iter()
        .map(|(n, s, v)| {
            let b: Vec<u8> = v
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect();
            (n.clone(), s.clone(), b, Dtype::BF16)
        })
        .collect();
    write_st(&input.join("model.safetensors"), &tensors);
    let out = tmp.path().join("out");
    convert(&input, &out, QFormat::Int8, QFormat::F32, None).unwrap();
    check_container(&out, &rounded, QFormat::Int8, QFormat::F32);
}

fn no_leftovers(dir: &Path, out_name: &str) {
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.starts_with(out_name), "left behind: {name}");
    }
}

#[test]
fn failed_convert_leaves_nothing_loadable() {
    let tmp = tempfile::tempdir().unwrap();
    let mut src = source();
    // A NaN in the last expert's down_proj fails the conversion at the very end.
    let last = src
        .iter_mut()
        .rfind(|(n, _, _)| n.ends_with("down_proj.weight"))
        .unwrap();
    last.2[7] = f32::NAN;
    let input = tmp.path().join("in");
    write_checkpoint(&input, &src);
    let out = tmp.path().join("out");
    let e = convert(&input, &out, QFormat::Int8, QFormat::F32, None).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("down_proj") && msg.contains("NaN"), "{msg}");
    assert!(!out.exists());
    assert!(Checkpoint::open(&out).is_err());
    no_leftovers(tmp.path(), "out");
}

#[test]
fn stale_temporary_output_is_not_loadable_and_does_not_block() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    write_checkpoint(&input, &source());
    let out = tmp.path().join("out");
    // What a convert killed mid-write leaves: a temp dir with a partial file.
    let stale = tmp.path().join("out.tmp-999999");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("model.safetensors"), [8, 0, 0, 0, 0, 0, 0, 0, b'{']).unwrap();
    assert!(Checkpoint::open(&out).is_err());
    assert!(Checkpoint::open(&stale).is_err());
    convert(&input, &out, QFormat::Int8, QFormat::F32, None).unwrap();
    Checkpoint::open(&out).unwrap();
}

#[test]
fn refuses_existing_output_and_bad_formats() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    write_checkpoint(&input, &source());
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let e = convert(&input, &out, QFormat::Int8, QFormat::F32, None).unwrap_err();
    assert!(matches!(e, ConvertError::OutputExists(_)), "{e}");
    assert_eq!(std::fs::read_to_string(out.join("keep.txt")).unwrap(), "mine");
    for bad in ["int3", "int4-g8", "int4-gx", "F32", ""] {
        assert!(parse_format(bad).is_err(), "{bad}");
    }
    assert_eq!(
        parse_format("int4-g64").unwrap(),
        QFormat::Int4Grouped { group: 64 }
    );
}

#[test]
fn missing_expert_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let src: Src = source()
        .into_iter()
        .filter(|(n, _, _)| n != "model.layers.1.mlp.experts.2.up_proj.weight")
        .collect();
    let input = tmp.path().join("in");
    write_checkpoint(&input, &src);
    let e = convert(&input, &tmp.path().join("out"), QFormat::Int8, QFormat::F32, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.layers.1.mlp.experts.2.up_proj.weight"), "{e}");
}

/// The transformers-written fixtures (when the repository has them) convert
/// in every format, and the container holds every expert of the config.
#[test]
fn repository_fixtures_convert() {
    let root = std::env::var_os("COLI_FIXTURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures"));
    let Ok(entries) = std::fs::read_dir(&root) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    for entry in entries {
        let input = entry.unwrap().path();
        if !input.join("config.json").is_file() {
            continue;
        }
        // GLM fixtures are converted in tests/glm_convert.rs.
        let (_, json) = colibri::config::read_json(&input).unwrap();
        if json.get("model_type").and_then(|v| v.as_str()) != Some("olmoe") {
            continue;
        }
        let cfg = colibri::model::olmoe::OlmoeConfig::load(&input).unwrap();
        let src = Checkpoint::open(&input).unwrap();
        for fmt in ["int8", "int4", "int2", "f32"] {
            let name = input.file_name().unwrap().to_string_lossy().into_owned();
            let out = tmp.path().join(format!("{name}-{fmt}"));
            let f = parse_format(fmt).unwrap();
            convert(&input, &out, f, QFormat::F32, None).unwrap();
            let ck = Checkpoint::open(&out).unwrap();
            for l in 0..cfg.num_hidden_layers {
                for e in 0..cfg.num_experts {
                    let n = format!("model.layers.{l}.mlp.experts.{e}.down_proj.weight");
                    let m = ck.matrix(&n, cfg.hidden_size, cfg.intermediate_size, f).unwrap();
                    assert_eq!(m.format(), f, "{n}");
                }
            }
            for n in src.names().filter(|n| !n.contains(".experts.")) {
                assert_eq!(
                    ck.bytes(n).unwrap(),
                    src.bytes(n).unwrap(),
                    "{n} copied bit for bit"
                );
            }
        }
    }
}
