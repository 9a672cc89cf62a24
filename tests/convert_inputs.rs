//! `coli convert` from the input precisions releases ship, for the
//! Qwen3-MoE, GLM-4.x, gpt-oss, MiniMax-M2, DeepSeek-V3.2, GLM-4.7-Flash and
//! Qwen3.5 families: FP8 (e4m3 with 128x128
//! `_scale_inv` block scales, BF16 elsewhere, as in Qwen3-*-FP8 and
//! GLM-4.5-FP8) and BF16 (GLM-4.5, gpt-oss's BF16 release with its fused,
//! interleaved, input-major experts read through strided views). Each input
//! is written by the test from an f32 fixture, together with an F32 *twin*
//! holding exactly the values the input encodes; converting the input must
//! give the container converting the twin gives, byte for byte, and the
//! tokens of the twin.

use std::path::{Path, PathBuf};

use colibri::cli::validate::{Reference, greedy};
use colibri::convert::convert;
use colibri::engine::{Engine, EngineOptions};
use colibri::quant::QFormat;
use colibri::sampling::{Sampler, SamplingParams};
use colibri::st::fp8::{FP8_BLOCK, dequantize_fp8, e4m3_to_f32};
use colibri::st::{Checkpoint, Dtype, decode_f32};
use safetensors::tensor::TensorView;

const SIDE_FILES: [&str; 6] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "REF.json",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

/// One tensor to write: name, dtype, shape, bytes.
type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

fn le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `x` rounded to the nearest bf16 (ties to even), as torch's `.to(bfloat16)`.
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

fn bf16_value(x: f32) -> f32 {
    f32::from_bits((bf16_bits(x) as u32) << 16)
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

/// `[rows, cols]` as FP8 e4m3 with 128x128 block scales (`amax / 448` per
/// block, the DeepSeek-V3 / Qwen3-FP8 recipe).
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

fn write_dir(src: &Path, dir: &Path, tensors: &[Tensor]) {
    std::fs::create_dir_all(dir).unwrap();
    for f in SIDE_FILES {
        if src.join(f).is_file() {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

/// Whether a release stores `name` as an FP8 block-scaled matrix: every
/// matrix but the embedding, the routers and the norms. The output head is
/// FP8 here (releases keep it BF16) so that one matrix spans several
/// 128-row blocks, the last one partial (vocab 259 / 263 = 3 blocks).
fn fp8_in_release(name: &str, shape: &[usize]) -> bool {
    shape.len() == 2
        && !name.ends_with("embed_tokens.weight")
        && !name.contains("norm")
        && !name.ends_with(".gate.weight")
        && !name.ends_with("shared_expert_gate.weight")
        && !name.starts_with("model.visual.")
}

/// Writes `fp8_dir` (FP8 + `_scale_inv` matrices, BF16 elsewhere) and its
/// F32 twin from fixture `name`. Returns the FP8 tensor names.
fn make_fp8(name: &str, fp8_dir: &Path, twin_dir: &Path) -> Vec<String> {
    let src_dir = fixture(name);
    let src = Checkpoint::open(&src_dir).unwrap();
    let (mut fp8, mut twin, mut names) = (Vec::new(), Vec::new(), Vec::new());
    for tensor in src.names() {
        let meta = src.info(tensor).unwrap();
        let w = decode_f32(meta.dtype, src.bytes(tensor).unwrap()).unwrap();
        if fp8_in_release(tensor, &meta.shape) {
            let (rows, cols) = (meta.shape[0], meta.shape[1]);
            let (bytes, scales) = encode_fp8(&w, rows, cols);
            let d = dequantize_fp8(tensor, &bytes, rows, cols, &scales).unwrap();
            let sshape = vec![rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK)];
            fp8.push((tensor.to_string(), Dtype::F8_E4M3, meta.shape.clone(), bytes));
            fp8.push((format!("{tensor}_scale_inv"), Dtype::F32, sshape, le(&scales)));
            twin.push((tensor.to_string(), Dtype::F32, meta.shape.clone(), le(&d)));
            names.push(tensor.to_string());
        } else {
            let bits: Vec<u8> = w.iter().flat_map(|&x| bf16_bits(x).to_le_bytes()).collect();
            let vals: Vec<f32> = w.iter().map(|&x| bf16_value(x)).collect();
            fp8.push((tensor.to_string(), Dtype::BF16, meta.shape.clone(), bits));
            twin.push((tensor.to_string(), Dtype::F32, meta.shape.clone(), le(&vals)));
        }
    }
    write_dir(&src_dir, fp8_dir, &fp8);
    write_dir(&src_dir, twin_dir, &twin);
    names
}

/// Writes `bf16_dir` (every tensor BF16, as the release ships) and its F32
/// twin (the same bf16 values widened) from fixture `name`.
fn make_bf16(name: &str, bf16_dir: &Path, twin_dir: &Path) {
    let src_dir = fixture(name);
    let src = Checkpoint::open(&src_dir).unwrap();
    let (mut bf16, mut twin) = (Vec::new(), Vec::new());
    for tensor in src.names() {
        let meta = src.info(tensor).unwrap();
        let w = decode_f32(meta.dtype, src.bytes(tensor).unwrap()).unwrap();
        let bits: Vec<u8> = w.iter().flat_map(|&x| bf16_bits(x).to_le_bytes()).collect();
        let vals: Vec<f32> = w.iter().map(|&x| bf16_value(x)).collect();
        bf16.push((tensor.to_string(), Dtype::BF16, meta.shape.clone(), bits));
        twin.push((tensor.to_string(), Dtype::F32, meta.shape.clone(), le(&vals)));
    }
    write_dir(&src_dir, bf16_dir, &bf16);
    write_dir(&src_dir, twin_dir, &twin);
}

fn converted(input: &Path, out: &Path, experts: QFormat, dense: QFormat) -> PathBuf {
    convert(input, out, experts, dense, None).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
    out.to_path_buf()
}

fn container_bytes(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("model.safetensors")).unwrap()
}

/// Greedy tokens from the fixture's prompt (stop tokens ignored).
fn generate(dir: &Path, opts: &EngineOptions, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut engine = Engine::load(dir, opts).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    engine.stop_ids.clear();
    let mut s = engine.new_session();
    let mut sampler = Sampler::new(SamplingParams::default());
    s.generate(&mut engine, prompt, n, &mut sampler, &mut |_| true)
        .unwrap()
        .generated
}

/// Greedy agreement with the f32 oracle, for the log (FP8 and BF16 change
/// the numbers, so the oracle's tokens are not expected).
fn log_agreement(what: &str, dir: &Path, fixture_dir: &Path) {
    let r = Reference::load(&fixture_dir.join("REF.json")).unwrap();
    let mut engine = Engine::load(dir, &EngineOptions::default()).unwrap();
    let (ok, total) = greedy(&mut engine, &r).unwrap();
    eprintln!("{what}: greedy {ok}/{total} against the f32 oracle");
}

fn f32_opts() -> EngineOptions {
    EngineOptions::default()
}

fn int8_exact() -> EngineOptions {
    EngineOptions {
        expert_bits: 8,
        dense_bits: 8,
        int8_acts: false,
        ..EngineOptions::default()
    }
}

/// FP8 Qwen3-MoE and GLM-4.x checkpoints: the f32 container holds exactly
/// the dequantized e4m3 values (no `_scale_inv` left), an int8 container is
/// byte-identical to the twin's, and both decode the twin's tokens.
#[test]
fn fp8_qwen3_and_glm4_convert_through_their_block_scales() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["qwen3-moe-tiny", "glm4-moe-tiny"] {
        check_fp8(name, tmp.path());
    }
}

/// The same for the families released in FP8 since (MiniMax-M2,
/// DeepSeek-V3.2, GLM-4.7-Flash, Qwen3.5/3.6 saved as its multimodal
/// release): MLA's low-rank projections, the indexer, the Gated DeltaNet
/// projections and the shared experts all decode through their block scales.
#[test]
fn fp8_new_families_convert_through_their_block_scales() {
    let tmp = tempfile::tempdir().unwrap();
    for name in [
        "minimax-m2-tiny",
        "deepseek-v32-tiny",
        "glm4-moe-lite-tiny",
        "qwen3-5-moe-tiny",
    ] {
        check_fp8(name, tmp.path());
    }
}

fn check_fp8(name: &str, tmp: &Path) {
    {
        let root = tmp.join(name);
        let (fp8_dir, twin) = (root.join("fp8"), root.join("twin"));
        let names = make_fp8(name, &fp8_dir, &twin);
        assert!(names.iter().any(|n| n.contains(".experts.")), "{name}");
        assert!(names.iter().any(|n| n == "lm_head.weight"), "{name}");
        if name.starts_with("glm4") || name.starts_with("deepseek") {
            assert!(names.iter().any(|n| n.contains("shared_experts")), "{name}");
        }
        if name.starts_with("qwen3-5") {
            assert!(
                names.iter().any(|n| n.contains("linear_attn.in_proj_qkv")),
                "{name}"
            );
        }
        let fp8 = Checkpoint::open(&fp8_dir).unwrap();

        let f32_out = converted(&fp8_dir, &root.join("f32"), QFormat::F32, QFormat::F32);
        let ck = Checkpoint::open(&f32_out).unwrap();
        assert!(ck.names().all(|n| !n.ends_with("_scale_inv")), "{name}");
        for t in &names {
            let m = fp8.info(t).unwrap();
            let (rows, cols) = (m.shape[0], m.shape[1]);
            let s = decode_f32(Dtype::F32, fp8.bytes(&format!("{t}_scale_inv")).unwrap()).unwrap();
            let want = dequantize_fp8(t, fp8.bytes(t).unwrap(), rows, cols, &s).unwrap();
            assert_eq!(ck.f32_tensor(t, &[rows, cols]).unwrap(), want, "{name}: {t}");
        }
        drop(ck);
        let twin_f32 = converted(&twin, &root.join("twin-f32"), QFormat::F32, QFormat::F32);
        assert!(
            container_bytes(&f32_out) == container_bytes(&twin_f32),
            "{name}: f32 containers differ"
        );

        let int8 = converted(&fp8_dir, &root.join("int8"), QFormat::Int8, QFormat::Int8);
        let twin_int8 = converted(&twin, &root.join("twin-int8"), QFormat::Int8, QFormat::Int8);
        assert!(
            container_bytes(&int8) == container_bytes(&twin_int8),
            "{name}: int8 containers differ"
        );

        let prompt = Reference::load(&twin.join("REF.json")).unwrap().prompt_ids;
        let want = generate(&twin, &f32_opts(), &prompt, 16);
        assert_eq!(generate(&f32_out, &f32_opts(), &prompt, 16), want, "{name}: f32");
        let want8 = generate(&twin, &int8_exact(), &prompt, 16);
        let opts = EngineOptions {
            int8_acts: false,
            ..EngineOptions::default()
        };
        assert_eq!(generate(&int8, &opts, &prompt, 16), want8, "{name}: int8");
        log_agreement(&format!("{name} fp8 -> f32"), &f32_out, &fixture(name));
    }
}

/// BF16 GLM-4.x and gpt-oss checkpoints (gpt-oss in its BF16-release
/// layout: fused `gate_up_proj [E, H, 2I]` with gate/up interleaved, read
/// through strided views) convert to the containers of their F32 twins,
/// byte for byte, at f32 and at int4 experts / int8 dense, and decode the
/// twin's tokens.
#[test]
fn bf16_glm4_and_gpt_oss_convert_like_their_f32_twins() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["glm4-moe-tiny", "gpt-oss-tiny"] {
        let root = tmp.path().join(name);
        let (bf16, twin) = (root.join("bf16"), root.join("twin"));
        make_bf16(name, &bf16, &twin);
        let ck = Checkpoint::open(&bf16).unwrap();
        assert!(
            ck.names().all(|n| ck.info(n).unwrap().dtype == Dtype::BF16),
            "{name}"
        );
        if name.starts_with("gpt-oss") {
            assert_eq!(
                ck.info("model.layers.0.mlp.experts.gate_up_proj").unwrap().shape,
                vec![5, 40, 36]
            );
        }
        drop(ck);
        for (experts, dense) in [(QFormat::F32, QFormat::F32), (QFormat::Int4, QFormat::Int8)] {
            let tag = format!("{experts}-{dense}");
            let a = converted(&bf16, &root.join(format!("bf16-{tag}")), experts, dense);
            let b = converted(&twin, &root.join(format!("twin-{tag}")), experts, dense);
            assert!(
                container_bytes(&a) == container_bytes(&b),
                "{name} {tag}: containers differ"
            );
            let ck = Checkpoint::open(&a).unwrap();
            assert_eq!(ck.info("model.norm.weight").unwrap().dtype, Dtype::F32, "{name}");
            if name.starts_with("gpt-oss") {
                assert!(ck.has("model.layers.2.mlp.experts.4.up_proj.weight"), "{name}");
                assert_eq!(
                    ck.info("model.layers.2.mlp.experts.4.up_proj.bias")
                        .unwrap()
                        .dtype,
                    Dtype::F32
                );
            }
        }
        // The f32 container against the oracle's weights widened from bf16:
        // each expert matrix is the strided slice of the fused tensor.
        let f32_out = root.join("bf16-f32-f32");
        if name.starts_with("gpt-oss") {
            let src = Checkpoint::open(&bf16).unwrap();
            let out = Checkpoint::open(&f32_out).unwrap();
            let (h, i) = (40, 18);
            let fused = decode_f32(
                Dtype::BF16,
                src.bytes("model.layers.1.mlp.experts.gate_up_proj").unwrap(),
            )
            .unwrap();
            let e = 3;
            let up = out
                .f32_tensor("model.layers.1.mlp.experts.3.up_proj.weight", &[i, h])
                .unwrap();
            for r in 0..i {
                for c in 0..h {
                    // gate_up[e, c, 2r + 1] is up row r, column c.
                    assert_eq!(up[r * h + c], fused[e * h * 2 * i + c * 2 * i + 2 * r + 1]);
                }
            }
        }
        let prompt = Reference::load(&twin.join("REF.json")).unwrap().prompt_ids;
        let twin_f32 = root.join("twin-f32-f32");
        let want = generate(&twin_f32, &f32_opts(), &prompt, 16);
        assert_eq!(generate(&f32_out, &f32_opts(), &prompt, 16), want, "{name}");
        log_agreement(&format!("{name} bf16 -> f32"), &f32_out, &fixture(name));
        log_agreement(
            &format!("{name} bf16 -> int4/int8"),
            &root.join("bf16-int4-int8"),
            &fixture(name),
        );
    }
}
