//! The GGUF reader (colibri::gguf) against llama.cpp's own converter output
//! (fixtures/gguf/, from fixtures/olmoe-tiny by tools/make_gguf_fixtures.py)
//! and against hostile files: every refusal must name what was wrong, and
//! no input may panic.

use std::path::{Path, PathBuf};

use colibri::gguf::build::GgufImage;
use colibri::gguf::config::{chat_template, config_json, model_config};
use colibri::gguf::{
    Array, ExpertProj, GgmlType, GgufError, GgufFile, GgufModel, Value, expert_tensor_name, parse,
};
use colibri::model::olmoe::OlmoeConfig;
use colibri::st::Checkpoint;
use proptest::prelude::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> PathBuf {
    repo().join("fixtures/gguf").join(name)
}

fn hf_dir() -> PathBuf {
    repo().join("fixtures/olmoe-tiny")
}

const F32: &str = "olmoe-tiny-f32.gguf";
const Q8: &str = "olmoe-tiny-q8_0.gguf";
const SPLIT_2: &str = "olmoe-tiny-q8_0-split-00002-of-00003.gguf";

const LAYERS: usize = 3;
const EXPERTS: usize = 8;

/// The GGUF name of a (non-expert) Hugging Face OLMoE tensor.
fn gguf_name(hf: &str) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").expect("a layer tensor");
    let (layer, part) = rest.split_once('.').expect("layer.part");
    let g = match part {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        other => panic!("unmapped tensor {other}"),
    };
    format!("blk.{layer}.{g}")
}

/// `Some((layer, expert, proj))` for a per-expert Hugging Face tensor.
fn expert_of(hf: &str) -> Option<(usize, usize, ExpertProj)> {
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once(".mlp.experts.")?;
    let (expert, proj) = rest.split_once('.')?;
    let proj = match proj {
        "gate_proj.weight" => ExpertProj::Gate,
        "up_proj.weight" => ExpertProj::Up,
        "down_proj.weight" => ExpertProj::Down,
        _ => return None,
    };
    Some((layer.parse().ok()?, expert.parse().ok()?, proj))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Q8_0 blocks (f16 scale, 32 int8) as f32, with each value's scale.
fn dequant_q8_0(bytes: &[u8]) -> Vec<(f32, f32)> {
    assert_eq!(bytes.len() % 34, 0);
    bytes
        .chunks_exact(34)
        .flat_map(|b| {
            let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            b[2..].iter().map(move |&q| (d * q as i8 as f32, d))
        })
        .collect()
}

/// Each value of `gguf` (F32 or Q8_0 bytes) against the checkpoint's: equal
/// for F32, within the Q8_0 step for Q8_0.
fn assert_values(what: &str, ty: GgmlType, gguf: &[u8], want: &[f32]) {
    match ty {
        GgmlType::F32 => assert_eq!(f32s(gguf), want, "{what}"),
        GgmlType::Q8_0 => {
            let got = dequant_q8_0(gguf);
            assert_eq!(got.len(), want.len(), "{what}");
            for (i, ((v, d), w)) in got.iter().zip(want).enumerate() {
                // Half a step of rounding, plus the f16 rounding of the scale
                // times |q| <= 127 (2^-11 relative).
                assert!(
                    (v - w).abs() <= 0.57 * d + 1e-7,
                    "{what}[{i}]: {v} vs {w} (step {d})"
                );
            }
        }
        other => panic!("{what}: unexpected type {other}"),
    }
}

/// Every tensor of the checkpoint is in `model` with its shape (GGUF dims
/// reversed) and its values; per-expert tensors are slices of the stacked
/// `ffn_*_exps` tensors at [`GgufModel::expert_ranges`].
fn check_against_checkpoint(model: &GgufModel) {
    let ck = Checkpoint::open(&hf_dir()).unwrap();
    let mut experts_seen = 0;
    for hf in ck.names() {
        let meta = ck.info(hf).unwrap();
        let want = ck.f32_tensor(hf, &meta.shape).unwrap();
        if let Some((layer, expert, proj)) = expert_of(hf) {
            let loc = model.tensor(&expert_tensor_name(layer, proj)).unwrap();
            let mut stacked = vec![EXPERTS as u64];
            stacked.extend(meta.shape.iter().map(|&d| d as u64));
            assert_eq!(loc.info.shape(), stacked, "{hf}");
            let r = model.expert_ranges(layer, expert as u64).unwrap();
            let span = match proj {
                ExpertProj::Gate => r.gate,
                ExpertProj::Up => r.up,
                ExpertProj::Down => r.down,
            };
            assert_eq!(span.shard, loc.shard);
            let file = &model.shards()[span.shard];
            let bytes = &file.bytes()[span.offset as usize..(span.offset + span.len) as usize];
            assert_eq!(span.len * EXPERTS as u64, loc.info.n_bytes(), "{hf}");
            assert_values(hf, loc.info.ggml_type, bytes, &want);
            experts_seen += 1;
            continue;
        }
        let name = gguf_name(hf);
        let loc = model.tensor(&name).unwrap_or_else(|e| panic!("{hf}: {e}"));
        let shape: Vec<u64> = meta.shape.iter().map(|&d| d as u64).collect();
        assert_eq!(loc.info.shape(), shape, "{hf} -> {name}");
        assert_eq!(
            loc.info.dims[0],
            *shape.last().unwrap(),
            "ne[0] is the row length"
        );
        assert_values(hf, loc.info.ggml_type, model.tensor_bytes(&name).unwrap(), &want);
    }
    assert_eq!(experts_seen, LAYERS * EXPERTS * 3);
    // Nothing else: 9 tensors per layer plus 3 stacked expert tensors, and
    // embedding, final norm and head.
    assert_eq!(model.len(), LAYERS * 12 + 3);
}

#[test]
fn the_f32_fixture_is_olmoe_with_every_checkpoint_tensor_bit_for_bit() {
    let m = GgufModel::open(&fixture(F32)).unwrap();
    assert_eq!(m.shards().len(), 1);
    assert_eq!(m.architecture().unwrap(), "olmoe");
    let g = m.shards()[0].gguf();
    assert_eq!((g.version, g.alignment), (3, 32));
    assert!(g.data_start.is_multiple_of(32));
    assert!(m.tensors().all(|t| t.info.ggml_type == GgmlType::F32));
    assert_eq!(m.metadata().get_u32("olmoe.expert_count").unwrap(), 8);
    assert_eq!(m.metadata().get_u32("olmoe.expert_used_count").unwrap(), 2);
    assert_eq!(
        m.metadata().get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        256
    );
    let e = m
        .metadata()
        .get_str("olmoe.expert_count")
        .unwrap_err()
        .to_string();
    assert_eq!(e, "key \"olmoe.expert_count\" is u32, expected string");
    check_against_checkpoint(&m);
}

#[test]
fn the_q8_0_fixture_dequantizes_to_within_one_step() {
    let m = GgufModel::open(&fixture(Q8)).unwrap();
    assert_eq!(m.architecture().unwrap(), "olmoe");
    let types: Vec<GgmlType> = m.tensors().map(|t| t.info.ggml_type).collect();
    assert!(types.contains(&GgmlType::Q8_0) && types.contains(&GgmlType::F32));
    let gate = m.tensor("blk.0.ffn_gate_exps.weight").unwrap();
    assert_eq!(gate.info.ggml_type, GgmlType::Q8_0);
    assert_eq!(gate.info.dims, [64, 32, 8]);
    assert_eq!(gate.info.n_bytes(), 8 * 32 * (64 / 32) * 34);
    check_against_checkpoint(&m);
}

#[test]
fn the_split_fixture_resolves_every_tensor_to_its_shard() {
    // Opened from its middle shard: the siblings are found by name.
    let split = GgufModel::open(&fixture(SPLIT_2)).unwrap();
    let whole = GgufModel::open(&fixture(Q8)).unwrap();
    assert_eq!(split.shards().len(), 3);
    assert_eq!(split.len(), whole.len());
    assert_eq!(split.architecture().unwrap(), "olmoe");
    let mut per_shard = [0usize; 3];
    for t in whole.tensors() {
        let s = split.tensor(&t.info.name).unwrap();
        per_shard[s.shard] += 1;
        assert_eq!(s.path, split.shards()[s.shard].path());
        assert_eq!((&s.info.dims, s.info.ggml_type), (&t.info.dims, t.info.ggml_type));
        assert_eq!(
            split.tensor_bytes(&t.info.name).unwrap(),
            whole.tensor_bytes(&t.info.name).unwrap(),
            "{}",
            t.info.name
        );
    }
    assert_eq!(per_shard, [16, 16, 7]);
    check_against_checkpoint(&split);
}

#[test]
fn the_config_from_gguf_metadata_equals_config_json() {
    let want = OlmoeConfig::load(&hf_dir()).unwrap();
    let tokenizer_config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(hf_dir().join("tokenizer_config.json")).unwrap()).unwrap();
    for f in [F32, Q8, SPLIT_2] {
        let m = GgufModel::open(&fixture(f)).unwrap();
        let got = OlmoeConfig::from_json(Path::new(f), config_json(&m).unwrap()).unwrap();
        assert_eq!(got, want, "{f}");
        let c = model_config(&m).unwrap();
        assert_eq!(c.max_positions(), 512);
        assert_eq!(c.shape().num_experts, 8);
        assert_eq!(
            chat_template(&m).unwrap(),
            tokenizer_config["chat_template"].as_str(),
            "{f}"
        );
    }
}

// ---- hostile files ------------------------------------------------------------

/// A valid small image: metadata of several types, an F32 and a Q8_0 tensor.
fn image() -> GgufImage {
    let mut g = GgufImage::new();
    g.kv("general.architecture", Value::String("olmoe".into()))
        .kv("olmoe.expert_count", Value::U32(2))
        .kv("general.flag", Value::Bool(true))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(vec!["a".into(), "b".into()])),
        );
    let q8: Vec<u8> = (0..34).map(|i| if i == 1 { 0x3c } else { i as u8 }).collect();
    g.tensor("a.weight", &[4, 2], GgmlType::F32, &[0u8; 32])
        .tensor("b.weight", &[32], GgmlType::Q8_0, &q8);
    g
}

fn err(bytes: &[u8]) -> String {
    match parse(bytes) {
        Ok(g) => panic!("accepted: {g:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_err(g: &GgufImage, parts: &[&str]) {
    let e = err(&g.to_bytes());
    for p in parts {
        assert!(e.contains(p), "{p:?} not in {e:?}");
    }
}

#[test]
fn the_valid_image_parses() {
    let g = parse(&image().to_bytes()).unwrap();
    assert_eq!(g.tensors.len(), 2);
    assert_eq!(g.metadata.get_u32("olmoe.expert_count").unwrap(), 2);
    assert_eq!(g.tensor("b.weight").unwrap().n_bytes(), 34);
}

#[test]
fn bad_magic_and_versions_are_named() {
    let mut g = image();
    g.magic = *b"GGML";
    assert_err(&g, &["magic", "GGML"]);
    for (v, hint) in [
        (1, "version 1 was replaced"),
        (4, "version 4"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let mut g = image();
        g.version = v;
        assert_err(&g, &["GGUF version", hint]);
    }
    let mut g = image();
    g.version = 2;
    assert!(parse(&g.to_bytes()).is_ok(), "version 2 reads like 3");
}

/// Every prefix of a valid file is refused, each naming where it stopped
/// (in the header, metadata or tensor infos) or the tensor whose data is
/// cut off.
#[test]
fn truncation_at_every_byte_is_refused_by_name() {
    let img = image();
    let full = img.to_bytes();
    let infos = img.tensor_infos_start();
    for n in 0..full.len() {
        let e = err(&full[..n]);
        let cut = e.starts_with("truncated at offset") || e.contains("cannot fit");
        let ok = if n < infos {
            cut
        } else {
            (cut && e.contains("tensor"))
                || e.contains("outside the file")
                || e.contains("past the end of the file")
        };
        assert!(ok, "cut at {n}: {e}");
    }
}

#[test]
fn giant_counts_are_refused_before_allocating() {
    let mut g = image();
    g.tensor_count = Some(u64::MAX);
    assert_err(&g, &["tensor count 18446744073709551615", "cannot fit"]);
    let mut g = image();
    g.kv_count = Some(1 << 40);
    assert_err(&g, &["metadata entry count 1099511627776", "cannot fit"]);
    // An array claiming 2^60 u64 elements.
    let mut g = image();
    let mut v = 10u32.to_le_bytes().to_vec();
    v.extend((1u64 << 60).to_le_bytes());
    g.kvs.push((b"huge.array".to_vec(), 9, v));
    assert_err(&g, &["\"huge.array\"", "1152921504606846976", "cannot fit"]);
    // A string claiming u64::MAX bytes.
    let mut g = image();
    g.kvs
        .push((b"huge.string".to_vec(), 8, u64::MAX.to_le_bytes().to_vec()));
    assert_err(&g, &["truncated", "key \"huge.string\""]);
    // A key longer than the specification's 65,535 bytes.
    let mut g = image();
    g.kvs
        .insert(0, (vec![b'k'; 70_000], 4, 1u32.to_le_bytes().to_vec()));
    assert_err(&g, &["metadata key #0", "70000 bytes"]);
}

#[test]
fn misaligned_and_out_of_range_data_name_the_tensor() {
    let mut g = image();
    g.tensors[1].offset = 36;
    assert_err(&g, &["tensor \"b.weight\"", "offset 36", "alignment 32"]);
    let mut g = image();
    g.tensors[1].offset = 1 << 20;
    assert_err(&g, &["tensor \"b.weight\"", "outside the file"]);
    let mut g = image();
    g.tensors[1].offset = u64::MAX - 31;
    assert_err(&g, &["tensor \"b.weight\"", "outside the file"]);
    let mut g = image();
    g.tensors[1].offset = 0;
    assert_err(&g, &["\"a.weight\"", "\"b.weight\"", "overlap"]);
}

#[test]
fn alignment_must_be_a_u32_power_of_two() {
    let mut g = image();
    g.kv("general.alignment", Value::U32(48));
    assert_err(&g, &["general.alignment", "48 is not a power of two"]);
    let mut g = image();
    g.kv("general.alignment", Value::U32(0));
    assert_err(&g, &["general.alignment", "0 is not a power of two"]);
    let mut g = image();
    g.kv("general.alignment", Value::U64(64));
    assert_err(&g, &["general.alignment", "is u64, expected u32"]);
    let mut g = GgufImage::new();
    g.alignment = 64;
    g.kv("general.alignment", Value::U32(64));
    g.tensor("a", &[4], GgmlType::F32, &[0; 16])
        .tensor("b", &[4], GgmlType::F32, &[0; 16]);
    let p = parse(&g.to_bytes()).unwrap();
    assert_eq!(p.alignment, 64);
    assert_eq!(p.tensor("b").unwrap().offset, 64);
    assert!(p.data_start.is_multiple_of(64));
    // Under the default alignment of 32 the same offsets would be fine;
    // under 64 an offset of 32 is not.
    g.tensors[1].offset = 32;
    assert_err(&g, &["tensor \"b\"", "offset 32", "alignment 64"]);
}

#[test]
fn bad_dims_and_types_name_the_tensor() {
    let cases: Vec<(Vec<u64>, u32, &[&str])> = vec![
        (vec![u64::MAX, 1], 0, &["\"a.weight\"", "dimension 0", "2^63 - 1"]),
        (
            vec![1 << 32, 1 << 32],
            0,
            &["\"a.weight\"", "more than 2^63 - 1 elements"],
        ),
        (
            vec![1 << 61, 2],
            0,
            &["\"a.weight\"", "overflow a 64-bit byte count"],
        ),
        (
            vec![1 << 62, 2],
            0,
            &["\"a.weight\"", "more than 2^63 - 1 elements"],
        ),
        (vec![1; 5], 0, &["\"a.weight\"", "5 dimensions"]),
        (vec![], 0, &["\"a.weight\"", "0 dimensions"]),
        (vec![4, 2], 99, &["\"a.weight\"", "unknown ggml type id 99"]),
        (vec![4, 2], 4, &["\"a.weight\"", "unknown ggml type id 4"]),
        (
            vec![33, 2],
            GgmlType::Q8_0.id(),
            &["\"a.weight\"", "row length 33", "block size 32"],
        ),
    ];
    for (dims, ty, parts) in cases {
        let mut g = image();
        g.tensors[0].dims = dims;
        g.tensors[0].ggml_type = ty;
        assert_err(&g, parts);
    }
}

#[test]
fn duplicates_are_refused() {
    let mut g = image();
    g.tensors[1].name = b"a.weight".to_vec();
    assert_err(&g, &["duplicate tensor \"a.weight\"", "#0 and #1"]);
    let mut g = image();
    g.kv("olmoe.expert_count", Value::U32(3));
    assert_err(&g, &["duplicate key \"olmoe.expert_count\"", "#1 and #4"]);
}

/// Arrays of arrays to `depth` levels.
fn nested(depth: usize) -> Array {
    let mut a = Array::U8(vec![1]);
    for _ in 1..depth {
        a = Array::Array(vec![a]);
    }
    a
}

#[test]
fn arrays_nest_to_a_bounded_depth() {
    let mut g = image();
    g.kv("deep.ok", Value::Array(nested(colibri::gguf::MAX_ARRAY_DEPTH)));
    let p = parse(&g.to_bytes()).unwrap();
    assert_eq!(p.metadata.get_array("deep.ok").unwrap().depth(), 4);
    let mut g = image();
    g.kv(
        "deep.array",
        Value::Array(nested(colibri::gguf::MAX_ARRAY_DEPTH + 1)),
    );
    assert_err(&g, &["key \"deep.array\"", "nested deeper than 4"]);
    // A thousand levels do not reach the stack either.
    let mut g = image();
    g.kv("deep.array", Value::Array(nested(1000)));
    assert_err(&g, &["key \"deep.array\"", "nested deeper"]);
}

#[test]
fn bad_utf8_bad_types_and_bad_bools_are_named() {
    let mut g = image();
    g.kvs
        .push((b"bad\xffkey".to_vec(), 4, 1u32.to_le_bytes().to_vec()));
    assert_err(&g, &["metadata key #4", "not UTF-8", "byte at 3"]);
    let mut g = image();
    g.kvs.push((Vec::new(), 4, 1u32.to_le_bytes().to_vec()));
    assert_err(&g, &["metadata key #4", "empty"]);
    let mut g = image();
    g.tensors[1].name = b"b\xc3".to_vec();
    assert_err(&g, &["tensor #1", "not UTF-8"]);
    let mut g = image();
    g.tensors[1].name = vec![b'n'; 64];
    assert_err(&g, &["tensor #1", "64 bytes, more than 63"]);
    let mut g = image();
    let mut v = 2u64.to_le_bytes().to_vec();
    v.extend(b"\xfe\xff");
    g.kvs.push((b"general.name".to_vec(), 8, v));
    assert_err(&g, &["key \"general.name\"", "not UTF-8"]);
    let mut g = image();
    g.kvs.push((b"general.odd".to_vec(), 13, vec![0; 8]));
    assert_err(&g, &["key \"general.odd\"", "unknown value type id 13"]);
    let mut g = image();
    g.kvs.push((b"general.yes".to_vec(), 7, vec![2]));
    assert_err(&g, &["key \"general.yes\"", "bool byte 2"]);
    let mut g = image();
    let mut v = 8u32.to_le_bytes().to_vec();
    v.extend(2u64.to_le_bytes());
    v.extend(1u64.to_le_bytes());
    v.push(b'x');
    v.extend(1u64.to_le_bytes());
    v.push(0xff);
    g.kvs.push((b"tok.list".to_vec(), 9, v));
    assert_err(&g, &["key \"tok.list\"", "element 1", "not UTF-8"]);
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn file_errors_name_the_file() {
    let d = tempfile::tempdir().unwrap();
    let mut g = image();
    g.tensors[1].offset = 1 << 20;
    let p = write(d.path(), "bad.gguf", &g.to_bytes());
    let e = GgufFile::open(&p).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("bad.gguf") && s.contains("\"b.weight\""), "{s}");
    assert!(matches!(e.innermost(), GgufError::Tensor { .. }));
    let e = GgufModel::open(&d.path().join("absent.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("absent.gguf"), "{e}");
}

/// Shard `no` (0-based) of `count`, holding one tensor.
fn shard(no: u16, count: u16, total: i32, tensor: &str) -> GgufImage {
    let mut g = GgufImage::new();
    if no == 0 {
        g.kv("general.architecture", Value::String("olmoe".into()));
    }
    g.kv("split.no", Value::U16(no))
        .kv("split.count", Value::U16(count))
        .kv("split.tensors.count", Value::I32(total));
    g.tensor(tensor, &[8], GgmlType::F32, &[0u8; 32]);
    g
}

#[test]
fn split_shards_must_agree() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    write(dir, "m-00001-of-00002.gguf", &shard(0, 2, 2, "a").to_bytes());
    write(dir, "m-00002-of-00002.gguf", &shard(1, 2, 2, "b").to_bytes());
    let m = GgufModel::open(&dir.join("m-00001-of-00002.gguf")).unwrap();
    assert_eq!(m.shards().len(), 2);
    let b = m.tensor("b").unwrap();
    assert_eq!(b.shard, 1);
    assert_eq!(b.range(), b.info.data.clone());
    assert_eq!(m.architecture().unwrap(), "olmoe");

    // A missing shard is named.
    let e = GgufModel::open(&dir.join("m-00001-of-00003.gguf"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("m-00001-of-00003.gguf") || e.contains("m-00002-of-00003.gguf"),
        "{e}"
    );
    assert!(e.contains("missing"), "{e}");

    // split.no disagreeing with the name.
    write(dir, "n-00001-of-00002.gguf", &shard(0, 2, 2, "a").to_bytes());
    write(dir, "n-00002-of-00002.gguf", &shard(0, 2, 2, "b").to_bytes());
    let e = GgufModel::open(&dir.join("n-00001-of-00002.gguf"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("n-00002-of-00002.gguf") && e.contains("split.no 0"),
        "{e}"
    );

    // The same tensor in two shards.
    write(dir, "t-00001-of-00002.gguf", &shard(0, 2, 2, "a").to_bytes());
    write(dir, "t-00002-of-00002.gguf", &shard(1, 2, 2, "a").to_bytes());
    let e = GgufModel::open(&dir.join("t-00002-of-00002.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tensor \"a\" appears in both"), "{e}");

    // split.tensors.count disagreeing with the shards.
    write(dir, "c-00001-of-00002.gguf", &shard(0, 2, 5, "a").to_bytes());
    write(dir, "c-00002-of-00002.gguf", &shard(1, 2, 5, "b").to_bytes());
    let e = GgufModel::open(&dir.join("c-00001-of-00002.gguf"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("split.tensors.count is 5") && e.contains("2 tensors"),
        "{e}"
    );

    // A shard renamed to look whole.
    let p = write(dir, "renamed.gguf", &shard(0, 2, 2, "a").to_bytes());
    let e = GgufModel::open(&p).unwrap_err().to_string();
    assert!(
        e.contains("renamed.gguf") && e.contains("split.count is 2"),
        "{e}"
    );
}

#[test]
fn expert_ranges_are_checked() {
    let d = tempfile::tempdir().unwrap();
    let mut g = GgufImage::new();
    let data: Vec<u8> = (0..3 * 2 * 4 * 4).map(|i| i as u8).collect();
    g.tensor("blk.0.ffn_gate_exps.weight", &[4, 2, 3], GgmlType::F32, &data)
        .tensor("blk.0.ffn_up_exps.weight", &[4, 2, 3], GgmlType::F32, &data)
        .tensor("blk.0.ffn_down_exps.weight", &[2, 4, 3], GgmlType::F32, &data)
        .tensor("blk.1.ffn_gate_exps.weight", &[4, 2, 3], GgmlType::F32, &data)
        .tensor("blk.1.ffn_up_exps.weight", &[4, 2], GgmlType::F32, &data[..32])
        .tensor("blk.1.ffn_down_exps.weight", &[2, 4, 3], GgmlType::F32, &data);
    let p = write(d.path(), "e.gguf", &g.to_bytes());
    let m = GgufModel::open(&p).unwrap();
    let gate = m.tensor("blk.0.ffn_gate_exps.weight").unwrap();
    let r = m.expert_ranges(0, 2).unwrap();
    assert_eq!((r.gate.offset, r.gate.len), (gate.info.data.start + 64, 32));
    let e = m.expert_ranges(0, 3).unwrap_err().to_string();
    assert!(
        e.contains("blk.0.ffn_gate_exps.weight") && e.contains("expert 3 out of range"),
        "{e}"
    );
    let e = m.expert_ranges(1, 0).unwrap_err().to_string();
    assert!(
        e.contains("blk.1.ffn_up_exps.weight") && e.contains("3 dims"),
        "{e}"
    );
    let e = m.expert_ranges(2, 0).unwrap_err().to_string();
    assert!(
        e.contains("blk.2.ffn_gate_exps.weight") && e.contains("not found"),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut with_magic = b"GGUF\x03\0\0\0".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = parse(&bytes);
        let _ = parse(&with_magic);
    }

    #[test]
    fn edited_valid_files_never_panic(edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut b = image().to_bytes();
        let n = b.len();
        for (at, v) in edits {
            b[at % n] = v;
        }
        if let Ok(g) = parse(&b) {
            for t in &g.tensors {
                prop_assert!(t.data.end <= n as u64);
            }
        }
    }

    #[test]
    fn metadata_round_trips(values in proptest::collection::vec((any::<u32>(), any::<i64>(), "[a-z]{0,12}"), 0..8)) {
        let mut g = GgufImage::new();
        for (i, (u, s, text)) in values.iter().enumerate() {
            g.kv(&format!("k{i}.u"), Value::U32(*u))
                .kv(&format!("k{i}.s"), Value::I64(*s))
                .kv(&format!("k{i}.t"), Value::String(text.clone()));
        }
        let p = parse(&g.to_bytes()).unwrap();
        prop_assert_eq!(p.metadata.len(), values.len() * 3);
        for (i, (u, s, text)) in values.iter().enumerate() {
            prop_assert_eq!(p.metadata.get_u32(&format!("k{i}.u")).unwrap(), *u);
            prop_assert_eq!(p.metadata.get_i64(&format!("k{i}.s")).unwrap(), *s);
            prop_assert_eq!(p.metadata.get_str(&format!("k{i}.t")).unwrap(), text.as_str());
        }
    }
}
