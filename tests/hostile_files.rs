//! Malformed and hostile checkpoint files: each must be a clean error whose
//! message names the file and/or the tensor, never a panic or an
//! out-of-bounds read.

use std::path::{Path, PathBuf};

use colibri::quant::QFormat;
use colibri::st::{Checkpoint, StError};
use proptest::prelude::*;

/// A safetensors file from a literal header and `data` bytes of payload.
fn raw(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

fn dir_with(file: &str, bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join(file);
    std::fs::write(&p, bytes).unwrap();
    (d, p)
}

fn open_err(bytes: &[u8]) -> String {
    let (d, _) = dir_with("model.safetensors", bytes);
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(e.contains("model.safetensors"), "message must name the file: {e}");
    e
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const GOOD: &str = r#"{"a.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[4],"data_offsets":[16,20]}}"#;

#[test]
fn a_valid_file_opens() {
    let (d, _) = dir_with("model.safetensors", &raw(GOOD, &[0; 20]));
    let ck = Checkpoint::open(d.path()).unwrap();
    assert_eq!(ck.names().collect::<Vec<_>>(), ["a.weight", "b"]);
    assert_eq!(ck.f32_tensor("a.weight", &[2, 2]).unwrap(), vec![0.0; 4]);
    let one = Checkpoint::open(&d.path().join("model.safetensors")).unwrap();
    assert_eq!(one.len(), 2);
    assert_eq!(one.dir(), d.path());
}

#[test]
fn truncated_file() {
    let full = raw(GOOD, &[0; 20]);
    let e = open_err(&full[..full.len() - 3]);
    assert!(e.contains("\"b\"") && e.contains("truncated"), "{e}");
    // Cut inside the header.
    let e = open_err(&full[..20]);
    assert!(e.contains("past the end"), "{e}");
    // Shorter than the length prefix.
    let e = open_err(&full[..5]);
    assert!(e.contains("too short"), "{e}");
}

#[test]
fn header_length_beyond_the_file() {
    let mut f = raw(GOOD, &[0; 20]);
    f[..8].copy_from_slice(&(GOOD.len() as u64 + 1000).to_le_bytes());
    let e = open_err(&f);
    assert!(e.contains("past the end"), "{e}");
}

#[test]
fn header_length_two_to_the_63() {
    let mut f = raw(GOOD, &[0; 20]);
    f[..8].copy_from_slice(&(1u64 << 63).to_le_bytes());
    let e = open_err(&f);
    assert!(e.contains("exceeds the limit"), "{e}");
    f[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    open_err(&f);
}

#[test]
fn invalid_json() {
    let e = open_err(&raw(r#"{"a":{"dtype":"F32","#, &[]));
    assert!(e.contains("invalid JSON"), "{e}");
    let e = open_err(&raw("[1, 2, 3]", &[]));
    assert!(e.contains("invalid JSON"), "{e}");
    let e = open_err(&raw(r#"{"a": 5}"#, &[]));
    assert!(e.contains("\"a\"") && e.contains("malformed"), "{e}");
    let e = open_err(&raw(
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}}"#,
        &[0; 4],
    ));
    assert!(e.contains("\"a\""), "{e}");
}

#[test]
fn offsets_outside_the_data() {
    let h = r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let e = open_err(&raw(h, &[0; 8]));
    assert!(e.contains("\"w\"") && e.contains("outside"), "{e}");
    let h = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}}"#;
    let e = open_err(&raw(h, &[0; 8]));
    assert!(e.contains("\"w\""), "{e}");
}

#[test]
fn overlapping_and_unordered_offsets() {
    let h = r#"{"x":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"y":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}"#;
    let e = open_err(&raw(h, &[0; 12]));
    assert!(
        e.contains("\"y\"") && e.contains("overlaps") && e.contains("\"x\""),
        "{e}"
    );
    let h = r#"{"x":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}}"#;
    let e = open_err(&raw(h, &[0; 8]));
    assert!(e.contains("\"x\"") && e.contains("end before"), "{e}");
    // A hole between tensors is refused, as every safetensors reader does.
    let h = r#"{"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"y":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}"#;
    let e = open_err(&raw(h, &[0; 12]));
    assert!(e.contains("\"y\"") && e.contains("unused bytes"), "{e}");
    // Bytes after the last tensor.
    let h = r#"{"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
    let e = open_err(&raw(h, &[0; 9]));
    assert!(e.contains("cover 4"), "{e}");
}

#[test]
fn shape_and_byte_count_disagree() {
    let h = r#"{"w":{"dtype":"F32","shape":[3,2],"data_offsets":[0,16]}}"#;
    let e = open_err(&raw(h, &[0; 16]));
    assert!(e.contains("\"w\"") && e.contains("needs 24 bytes"), "{e}");
}

#[test]
fn shape_overflow() {
    let h = r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,16]}}"#;
    let e = open_err(&raw(h, &[0; 16]));
    assert!(e.contains("\"w\"") && e.contains("overflow"), "{e}");
    let h = r#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,16]}}"#;
    let e = open_err(&raw(h, &[0; 16]));
    assert!(e.contains("\"w\""), "{e}");
    let h = r#"{"w":{"dtype":"F32","shape":[1e300],"data_offsets":[0,16]}}"#;
    let e = open_err(&raw(h, &[0; 16]));
    assert!(e.contains("\"w\""), "{e}");
}

#[test]
fn unknown_dtype() {
    let h = r#"{"w":{"dtype":"Q7","shape":[4],"data_offsets":[0,4]}}"#;
    let e = open_err(&raw(h, &[0; 4]));
    assert!(e.contains("\"w\"") && e.contains("Q7"), "{e}");
    let h = r#"{"w":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}"#;
    let e = open_err(&raw(h, &[0; 2]));
    assert!(e.contains("\"w\"") && e.contains("unsupported dtype"), "{e}");
    // A valid integer tensor cannot be read as floats.
    let h = r#"{"w":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}"#;
    let (d, _) = dir_with("model.safetensors", &raw(h, &[0; 4]));
    let e = Checkpoint::open(d.path())
        .unwrap()
        .f32_tensor("w", &[1])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"w\"") && e.contains("I32") && e.contains("model.safetensors"),
        "{e}"
    );
}

#[test]
fn wrong_shape_names_expected_and_found() {
    let (d, _) = dir_with("model.safetensors", &raw(GOOD, &[0; 20]));
    let ck = Checkpoint::open(d.path()).unwrap();
    let e = ck.f32_tensor("a.weight", &[4]).unwrap_err().to_string();
    assert!(
        e.contains("a.weight") && e.contains("[4]") && e.contains("[2, 2]"),
        "{e}"
    );
    let e = ck
        .matrix("a.weight", 2, 3, QFormat::Int8)
        .unwrap_err()
        .to_string();
    assert!(e.contains("a.weight") && e.contains("[2, 3]"), "{e}");
    let e = ck.f32_tensor("nope", &[1]).unwrap_err().to_string();
    assert!(e.contains("nope") && e.contains("not found"), "{e}");
}

fn write_index(dir: &Path, map: serde_json::Value) {
    let j = serde_json::json!({ "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), j.to_string()).unwrap();
}

#[test]
fn index_pointing_to_a_missing_shard() {
    let (d, _) = dir_with("a.safetensors", &raw(GOOD, &[0; 20]));
    write_index(
        d.path(),
        serde_json::json!({"a.weight": "a.safetensors", "b": "gone.safetensors"}),
    );
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("gone.safetensors") && e.contains("\"b\"") && e.contains("index.json"),
        "{e}"
    );
}

#[test]
fn index_naming_a_tensor_not_in_its_shard() {
    let (d, _) = dir_with("a.safetensors", &raw(GOOD, &[0; 20]));
    write_index(
        d.path(),
        serde_json::json!({"a.weight": "a.safetensors", "c": "a.safetensors"}),
    );
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(e.contains("\"c\"") && e.contains("a.safetensors"), "{e}");
}

#[test]
fn index_escaping_the_directory_or_malformed() {
    let (d, _) = dir_with("a.safetensors", &raw(GOOD, &[0; 20]));
    write_index(d.path(), serde_json::json!({"a.weight": "../a.safetensors"}));
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(e.contains("a.weight") && e.contains("not a file name"), "{e}");
    write_index(d.path(), serde_json::json!({"a.weight": 7}));
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(e.contains("a.weight"), "{e}");
    std::fs::write(d.path().join("model.safetensors.index.json"), "{nope").unwrap();
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(e.contains("index.json") && e.contains("invalid JSON"), "{e}");
}

#[test]
fn duplicate_tensor_across_shards() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("x-1.safetensors"), raw(GOOD, &[0; 20])).unwrap();
    std::fs::write(d.path().join("x-2.safetensors"), raw(GOOD, &[0; 20])).unwrap();
    let e = Checkpoint::open(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("a.weight") && e.contains("x-1.safetensors") && e.contains("x-2.safetensors"),
        "{e}"
    );
}

#[test]
fn empty_directory() {
    let d = tempfile::tempdir().unwrap();
    let e = Checkpoint::open(d.path()).unwrap_err();
    assert!(matches!(e, StError::NoFiles { .. }), "{e}");
    let e = Checkpoint::open(&d.path().join("missing"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing"), "{e}");
}

/// A U8 tensor `w` of `shape` holding `bytes` bytes, plus `w.qs` scales.
fn quant_file(shape: &str, bytes: usize, scales: Option<&[f32]>) -> (tempfile::TempDir, Checkpoint) {
    let mut h = format!(r#"{{"w":{{"dtype":"U8","shape":{shape},"data_offsets":[0,{bytes}]}}"#);
    let mut data = vec![0x11u8; bytes];
    if let Some(s) = scales {
        let end = bytes + 4 * s.len();
        h.push_str(&format!(
            r#","w.qs":{{"dtype":"F32","shape":[{}],"data_offsets":[{bytes},{end}]}}"#,
            s.len()
        ));
        data.extend(f32s(s));
    }
    h.push('}');
    let (d, _) = dir_with("model.safetensors", &raw(&h, &data));
    let ck = Checkpoint::open(d.path()).unwrap();
    (d, ck)
}

#[test]
fn quantized_tensor_reads_back() {
    let (_d, ck) = quant_file("[4,8]", 32, Some(&[1.0, 2.0, 3.0, 4.0]));
    assert_eq!(
        ck.matrix("w", 4, 8, QFormat::F32).unwrap().format(),
        QFormat::Int8
    );
    let (_d, ck) = quant_file("[32]", 32, Some(&[1.0, 2.0, 3.0, 4.0]));
    assert_eq!(
        ck.matrix("w", 4, 16, QFormat::F32).unwrap().format(),
        QFormat::Int4
    );
}

#[test]
fn quantized_tensor_without_scales() {
    let (_d, ck) = quant_file("[4,8]", 32, None);
    let e = ck.matrix("w", 4, 8, QFormat::Int8).unwrap_err().to_string();
    assert!(e.contains("w.qs") && e.contains("model.safetensors"), "{e}");
}

#[test]
fn wrong_scale_count() {
    let (_d, ck) = quant_file("[4,8]", 32, Some(&[1.0, 2.0, 3.0]));
    let e = ck.matrix("w", 4, 8, QFormat::Int8).unwrap_err().to_string();
    assert!(
        e.contains("\"w\"") && e.contains("3 scales") && e.contains("model.safetensors"),
        "{e}"
    );
}

#[test]
fn nan_or_negative_scale() {
    for bad in [f32::NAN, -1.0, 0.0, f32::INFINITY] {
        let (_d, ck) = quant_file("[4,8]", 32, Some(&[1.0, bad, 3.0, 4.0]));
        let e = ck.matrix("w", 4, 8, QFormat::Int8).unwrap_err().to_string();
        assert!(e.contains("\"w\"") && e.contains("scale 1"), "{e}");
    }
}

#[test]
fn byte_count_matching_no_layout() {
    let (_d, ck) = quant_file("[4,5]", 20, Some(&[1.0; 4]));
    let e = ck.matrix("w", 4, 8, QFormat::Int8).unwrap_err().to_string();
    assert!(
        e.contains("\"w\"") && e.contains("20 bytes") && e.contains("no quantized layout"),
        "{e}"
    );
    // A 2-D byte tensor whose row count is not the matrix's.
    let (_d, ck) = quant_file("[8,4]", 32, Some(&[1.0; 4]));
    let e = ck.matrix("w", 4, 8, QFormat::Int8).unwrap_err().to_string();
    assert!(e.contains("\"w\"") && e.contains("[8, 4]"), "{e}");
}

#[test]
fn scales_of_the_wrong_dtype() {
    let h = r#"{"w":{"dtype":"U8","shape":[4,8],"data_offsets":[0,32]},"w.qs":{"dtype":"F16","shape":[4],"data_offsets":[32,40]}}"#;
    let (d, _) = dir_with("model.safetensors", &raw(h, &[0x11; 40]));
    let e = Checkpoint::open(d.path())
        .unwrap()
        .matrix("w", 4, 8, QFormat::Int8)
        .unwrap_err()
        .to_string();
    assert!(e.contains("w.qs") && e.contains("F16"), "{e}");
}

/// Opens a file and reads every tensor every way; only errors are allowed.
fn exercise(bytes: &[u8]) {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("model.safetensors"), bytes).unwrap();
    let Ok(ck) = Checkpoint::open(d.path()) else {
        return;
    };
    let names: Vec<String> = ck.names().map(str::to_string).collect();
    for n in &names {
        let Ok(meta) = ck.info(n) else { continue };
        let shape = meta.shape.clone();
        let _ = ck.f32_tensor(n, &shape);
        let _ = ck.bytes(n);
        if let [r, c] = shape[..] {
            let _ = ck.matrix(n, r, c, QFormat::Int4);
            let _ = ck.matrix(n, r, c * 2, QFormat::Int8);
        }
    }
}

fn valid_quant_file() -> Vec<u8> {
    let h = r#"{"w":{"dtype":"U8","shape":[4,8],"data_offsets":[0,32]},"w.qs":{"dtype":"F32","shape":[4],"data_offsets":[32,48]},"n":{"dtype":"BF16","shape":[2,4],"data_offsets":[48,64]}}"#;
    let mut data = vec![0x5au8; 32];
    data.extend(f32s(&[0.5, 1.0, 1.5, 2.0]));
    data.extend([0x3fu8; 16]);
    raw(h, &data)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any single-byte corruption or truncation of a valid file is handled.
    #[test]
    fn corrupted_files_never_panic(pos in 0usize..400, val in any::<u8>(), cut in 0usize..400) {
        let mut f = valid_quant_file();
        let p = pos % f.len();
        f[p] = val;
        exercise(&f);
        let f = valid_quant_file();
        exercise(&f[..cut.min(f.len())]);
    }

    /// Arbitrary header text never panics the parser.
    #[test]
    fn arbitrary_headers_never_panic(h in ".{0,200}", data in proptest::collection::vec(any::<u8>(), 0..64)) {
        exercise(&raw(&h, &data));
    }
}
