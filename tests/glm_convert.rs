//! `coli convert` for GLM-5 / DeepSeek-V3 checkpoints: containers give the
//! same tokens as their source quantized at load with the same formats, the
//! MTP layer stays int8 in int4 containers, and FP8 (e4m3 + 128x128 block
//! scales) inputs are dequantized exactly before quantizing.

use std::path::{Path, PathBuf};

use colibri::cli::validate::Reference;
use colibri::convert::{ConvertError, convert, parse_format};
use colibri::engine::{Engine, EngineOptions};
use colibri::quant::QFormat;
use colibri::sampling::{Sampler, SamplingParams};
use colibri::st::fp8::{FP8_BLOCK, dequantize_fp8, e4m3_to_f32};
use colibri::st::{Checkpoint, Dtype, decode_f32};
use safetensors::tensor::TensorView;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

fn prompt(dir: &Path) -> Vec<u32> {
    Reference::load(&dir.join("REF.json")).unwrap().prompt_ids
}

fn generate(dir: &Path, opts: &EngineOptions, n: usize) -> Vec<u32> {
    let mut engine = Engine::load(dir, opts).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    engine.stop_ids.clear();
    let mut s = engine.new_session();
    let mut sampler = Sampler::new(SamplingParams::default());
    s.generate(&mut engine, &prompt(dir), n, &mut sampler, &mut |_| true)
        .unwrap()
        .generated
}

fn at_bits(expert_bits: u32, dense_bits: u32) -> EngineOptions {
    EngineOptions {
        expert_bits,
        dense_bits,
        ..EngineOptions::default()
    }
}

/// (dtype, shape) of a tensor in a container.
fn stored(ck: &Checkpoint, name: &str) -> (Dtype, Vec<usize>) {
    let m = ck.info(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    (m.dtype, m.shape.clone())
}

#[test]
fn containers_match_load_time_quantization() {
    let tmp = tempfile::tempdir().unwrap();
    // (experts, dense, --expert-bits, --dense-bits) with the same meaning.
    let cases = [
        ("int8", "int8", 8, 8),
        ("int4", "int8", 4, 8),
        ("f32", "f32", 32, 32),
    ];
    for name in ["glm-tiny", "glm-mtp"] {
        let src = fixture(name);
        for (experts, dense, eb, db) in cases {
            let out = tmp.path().join(format!("{name}-{experts}-{dense}"));
            let report = convert(
                &src,
                &out,
                parse_format(experts).unwrap(),
                parse_format(dense).unwrap(),
                None,
            )
            .unwrap();
            let want = generate(&src, &at_bits(eb, db), 16);
            let got = generate(&out, &EngineOptions::default(), 16);
            assert_eq!(got, want, "{name} {experts}/{dense}");
            // glm-tiny: 2 sparse layers x 8; glm-mtp: 1 sparse + the MTP layer, x 6
            let experts_per = if name == "glm-tiny" { 8 } else { 6 };
            assert_eq!(report.experts, 2 * experts_per);
        }
    }
}

#[test]
fn int4_containers_keep_the_mtp_layer_int8_and_still_draft() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("glm-mtp");
    // hidden 64, moe_intermediate 16: g16 gives 4 groups on 64 columns;
    // g64 one group (stored like per-row int4, which reads back the same).
    for fmt in ["int4-g64", "int4-g16", "int4"] {
        let out = tmp.path().join(fmt);
        convert(&src, &out, parse_format(fmt).unwrap(), QFormat::Int4, None).unwrap();
        let ck = Checkpoint::open(&out).unwrap();
        let groups = if fmt == "int4-g16" { 4 } else { 1 };
        // main sparse layer 1: int4, 2 values per byte
        let g = "model.layers.1.mlp.experts.3.gate_proj.weight";
        assert_eq!(stored(&ck, g), (Dtype::U8, vec![16, 32]), "{fmt}");
        let gs = stored(&ck, &format!("{g}.qs")).1;
        assert_eq!(gs.iter().product::<usize>(), 16 * groups, "{fmt}");
        // MTP layer 2: int8, one byte per value, one scale per row
        for (n, shape) in [
            ("model.layers.2.mlp.experts.3.gate_proj.weight", [16, 64]),
            ("model.layers.2.mlp.experts.5.down_proj.weight", [64, 16]),
            ("model.layers.2.self_attn.q_b_proj.weight", [96, 32]),
            ("model.layers.2.eh_proj.weight", [64, 128]),
            ("model.layers.2.mlp.shared_experts.up_proj.weight", [16, 64]),
        ] {
            assert_eq!(stored(&ck, n), (Dtype::U8, shape.to_vec()), "{fmt} {n}");
            assert_eq!(stored(&ck, &format!("{n}.qs")).1, vec![shape[0]], "{fmt} {n}");
        }
        // the main layers' dense matrices follow --dense int4
        assert_eq!(
            stored(&ck, "model.layers.1.self_attn.q_b_proj.weight"),
            (Dtype::U8, vec![96, 16])
        );
        // norms, routers, correction biases, indexer weighting stay F32
        for n in [
            "model.layers.2.enorm.weight",
            "model.layers.1.mlp.gate.weight",
            "model.layers.1.mlp.gate.e_score_correction_bias",
            "model.layers.0.self_attn.indexer.weights_proj.weight",
            "model.layers.0.self_attn.indexer.k_norm.bias",
        ] {
            assert_eq!(ck.info(n).unwrap().dtype, Dtype::F32, "{n}");
        }
        assert_eq!(ck.metadata().get("mtp_experts").map(String::as_str), Some("int8"));
        let engine = Engine::load(&out, &EngineOptions::default()).unwrap();
        engine.model.draft_head().unwrap();
        assert_eq!(generate(&out, &EngineOptions::default(), 12).len(), 12);
    }
    // int4 per row: the container equals the source quantized at load (the
    // MTP layer is raised to int8 there too).
    let out = tmp.path().join("int4");
    assert_eq!(
        generate(&out, &EngineOptions::default(), 16),
        generate(&src, &at_bits(4, 4), 16)
    );
}

#[test]
fn group_sizes_that_do_not_divide_the_columns_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // 64 columns are not a multiple of 48.
    let err = convert(
        &fixture("glm-tiny"),
        &tmp.path().join("c"),
        parse_format("int4-g48").unwrap(),
        QFormat::F32,
        None,
    )
    .unwrap_err();
    assert!(matches!(err, ConvertError::Input { .. }), "{err}");
    assert!(err.to_string().contains("group size 48"), "{err}");
    assert!(!tmp.path().join("c").exists());
}

/// The nearest float8 e4m3 byte to `x` (finite values only).
fn to_e4m3(x: f32, table: &[(u8, f32)]) -> u8 {
    let mut best = (0u8, f32::INFINITY);
    for &(b, v) in table {
        let d = (v - x).abs();
        if d < best.1 {
            best = (b, d);
        }
    }
    best.0
}

/// Encodes a `[rows, cols]` matrix as FP8 with 128x128 block scales.
fn encode_fp8(w: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let table: Vec<(u8, f32)> = (0..=255u8)
        .map(|b| (b, e4m3_to_f32(b)))
        .filter(|(_, v)| v.is_finite())
        .collect();
    let (br, bc) = (rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK));
    let mut scales = vec![0f32; br * bc];
    for r in 0..rows {
        for c in 0..cols {
            let s = &mut scales[(r / FP8_BLOCK) * bc + c / FP8_BLOCK];
            *s = s.max(w[r * cols + c].abs() / 448.0);
        }
    }
    for s in &mut scales {
        if *s == 0.0 {
            *s = 1.0;
        }
    }
    let bytes = (0..rows * cols)
        .map(|i| {
            let s = scales[(i / cols / FP8_BLOCK) * bc + (i % cols) / FP8_BLOCK];
            to_e4m3(w[i] / s, &table)
        })
        .collect();
    (bytes, scales)
}

fn le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes `fp8_dir` (FP8 matrices + `_scale_inv`, the rest F32) and
/// `f32_dir` (the same model with every FP8 matrix dequantized) from
/// glm-mtp. Returns the FP8 tensor names.
fn make_fp8(fp8_dir: &Path, f32_dir: &Path) -> Vec<String> {
    let src_dir = fixture("glm-mtp");
    let src = Checkpoint::open(&src_dir).unwrap();
    let mut fp8: Vec<(String, Vec<usize>, Vec<u8>, Dtype)> = Vec::new();
    let mut deq: Vec<(String, Vec<usize>, Vec<u8>, Dtype)> = Vec::new();
    let mut names = Vec::new();
    for name in src.names() {
        let meta = src.info(name).unwrap();
        let w = decode_f32(meta.dtype, src.bytes(name).unwrap()).unwrap();
        let matrix = meta.shape.len() == 2
            && !name.contains("norm")
            && !name.ends_with("mlp.gate.weight")
            && !name.contains("weights_proj");
        if matrix {
            let (rows, cols) = (meta.shape[0], meta.shape[1]);
            let (bytes, scales) = encode_fp8(&w, rows, cols);
            let d = dequantize_fp8(name, &bytes, rows, cols, &scales).unwrap();
            let sshape = vec![rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK)];
            fp8.push((name.to_string(), meta.shape.clone(), bytes, Dtype::F8_E4M3));
            fp8.push((format!("{name}_scale_inv"), sshape, le(&scales), Dtype::F32));
            deq.push((name.to_string(), meta.shape.clone(), le(&d), Dtype::F32));
            names.push(name.to_string());
        } else {
            fp8.push((name.to_string(), meta.shape.clone(), le(&w), Dtype::F32));
            deq.push((name.to_string(), meta.shape.clone(), le(&w), Dtype::F32));
        }
    }
    for (dir, tensors) in [(fp8_dir, &fp8), (f32_dir, &deq)] {
        std::fs::create_dir_all(dir).unwrap();
        for f in ["config.json", "generation_config.json", "REF.json"] {
            std::fs::copy(src_dir.join(f), dir.join(f)).unwrap();
        }
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, s, b, d)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    }
    names
}

#[test]
fn fp8_checkpoints_convert_through_their_block_scales() {
    let tmp = tempfile::tempdir().unwrap();
    let (fp8_dir, f32_dir) = (tmp.path().join("fp8"), tmp.path().join("deq"));
    let names = make_fp8(&fp8_dir, &f32_dir);
    assert!(names.iter().any(|n| n.contains(".experts.")));
    let fp8 = Checkpoint::open(&fp8_dir).unwrap();

    // f32: the container holds exactly the dequantized e4m3 values; the
    // `_scale_inv` tensors are consumed, not copied.
    let out = tmp.path().join("f32");
    convert(&fp8_dir, &out, QFormat::F32, QFormat::F32, None).unwrap();
    let ck = Checkpoint::open(&out).unwrap();
    assert!(ck.names().all(|n| !n.ends_with("_scale_inv")));
    for name in &names {
        let m = fp8.info(name).unwrap();
        let (rows, cols) = (m.shape[0], m.shape[1]);
        let s = decode_f32(Dtype::F32, fp8.bytes(&format!("{name}_scale_inv")).unwrap()).unwrap();
        let want = dequantize_fp8(name, fp8.bytes(name).unwrap(), rows, cols, &s).unwrap();
        assert_eq!(ck.f32_tensor(name, &[rows, cols]).unwrap(), want, "{name}");
    }

    // int8 experts and dense: every weight within half a quantization step
    // (per-row scale / 2) of the e4m3 reference.
    let out8 = tmp.path().join("int8");
    convert(&fp8_dir, &out8, QFormat::Int8, QFormat::Int8, None).unwrap();
    let ck8 = Checkpoint::open(&out8).unwrap();
    let ref_ck = Checkpoint::open(&out).unwrap();
    for name in &names {
        let m = fp8.info(name).unwrap();
        let (rows, cols) = (m.shape[0], m.shape[1]);
        let want = ref_ck.f32_tensor(name, &[rows, cols]).unwrap();
        let q = ck8.matrix(name, rows, cols, QFormat::F32).unwrap();
        assert_eq!(q.format(), QFormat::Int8, "{name}");
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            q.dequantize_row(r, &mut row);
            let step = q.scales()[r];
            for (c, (got, w)) in row.iter().zip(&want[r * cols..(r + 1) * cols]).enumerate() {
                assert!(
                    (got - w).abs() <= step * 0.5 + 1e-6 * w.abs(),
                    "{name}[{r},{c}]: {got} vs {w} (step {step})"
                );
            }
        }
    }

    // Converting the FP8 checkpoint is the same as converting its
    // dequantized F32 twin: byte-identical containers, identical tokens.
    let twin = tmp.path().join("twin-int8");
    convert(&f32_dir, &twin, QFormat::Int8, QFormat::Int8, None).unwrap();
    assert!(
        std::fs::read(out8.join("model.safetensors")).unwrap()
            == std::fs::read(twin.join("model.safetensors")).unwrap()
    );
    let opts = EngineOptions::default();
    assert_eq!(generate(&out8, &opts, 12), generate(&f32_dir, &at_bits(8, 8), 12));
}

#[test]
fn fp8_inputs_without_scales_or_with_orphan_scales_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (fp8_dir, f32_dir) = (tmp.path().join("fp8"), tmp.path().join("deq"));
    make_fp8(&fp8_dir, &f32_dir);
    let ck = Checkpoint::open(&fp8_dir).unwrap();
    let drop_one = |skip: &str, dir: &Path| {
        let owned: Vec<(String, Vec<usize>, Vec<u8>, Dtype)> = ck
            .names()
            .filter(|n| *n != skip)
            .map(|n| {
                let m = ck.info(n).unwrap();
                (
                    n.to_string(),
                    m.shape.clone(),
                    ck.bytes(n).unwrap().to_vec(),
                    m.dtype,
                )
            })
            .collect();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::copy(fp8_dir.join("config.json"), dir.join("config.json")).unwrap();
        let views: Vec<(String, TensorView<'_>)> = owned
            .iter()
            .map(|(n, s, b, d)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    };
    let w = "model.layers.1.mlp.experts.2.up_proj.weight";
    let a = tmp.path().join("no-scales");
    drop_one(&format!("{w}_scale_inv"), &a);
    let err = convert(&a, &tmp.path().join("o1"), QFormat::Int8, QFormat::F32, None).unwrap_err();
    assert!(err.to_string().contains("block scales"), "{err}");
    assert!(err.to_string().contains(w), "{err}");
    let b = tmp.path().join("orphan");
    drop_one(w, &b);
    let err = convert(&b, &tmp.path().join("o2"), QFormat::Int8, QFormat::F32, None).unwrap_err();
    assert!(err.to_string().contains("without an F8_E4M3 tensor"), "{err}");
}
