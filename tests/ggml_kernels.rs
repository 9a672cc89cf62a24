//! The ggml block kernels against ggml itself (fixtures/ggml-kernels, made
//! by tools/make_ggml_kernel_fixtures.py from ggml 0.25.3), and every SIMD
//! kernel set against the scalar reference on random valid blocks.
//!
//! Bounds. Dequantization and activation quantization are compared bit for
//! bit. A dot product is a sum of f32 terms (scale products times exact
//! integer sums); ggml's x86 kernels and ours split those terms over SIMD
//! lanes differently and add them in different orders, so results differ
//! by rounding only: at most about `n u Σ|part|` for `n` additions of unit
//! roundoff `u = 2^-24` over a few hundred parts. The tests allow
//! `TOL × (Σ|term| + Σ_j |ŵ_j x̂_j|)` with `TOL = 2e-5`, where the first sum
//! is [`ggml::vec_dot_magnitude`] and the second bounds the lane parts
//! (dequantized weight times dequantized activation): tight enough that
//! any wrong integer (one activation step on one column) fails, which is
//! what the bound is for.

use colibri::kernels::Kernels;
use colibri::kernels::ggml::{self, GgmlActs, GgmlError, GgmlType};
use proptest::prelude::*;

const TOL: f32 = 2e-5;

struct Case {
    cols: usize,
    blocks: Vec<u8>,
    deq: Vec<f32>,
    x: Vec<f32>,
    qacts: Vec<u8>,
    dot: f32,
}

struct Reader<'a>(&'a [u8], usize);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let s = &self.0[self.1..self.1 + n];
        self.1 += n;
        s
    }
    fn u32(&mut self) -> u32 {
        let b = self.take(4);
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        self.take(4 * n)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

/// The fixture of one type (layout: fixtures/README.md).
fn fixture(ty: GgmlType) -> (GgmlType, Vec<Case>) {
    let path = format!(
        "{}/fixtures/ggml-kernels/{}.bin",
        env!("CARGO_MANIFEST_DIR"),
        ty.name().to_lowercase().replace("_k", "_K")
    );
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut r = Reader(&data, 0);
    assert_eq!(r.take(4), b"GGKF");
    assert_eq!(r.u32(), 1);
    assert_eq!(GgmlType::from_id(r.u32()), Some(ty));
    let aty = GgmlType::from_id(r.u32()).expect("activation type");
    let n = r.u32();
    let cases = (0..n)
        .map(|_| {
            let cols = r.u32() as usize;
            let blocks = r.take(ggml::row_bytes(ty, cols).unwrap()).to_vec();
            let deq = r.f32s(cols);
            let x = r.f32s(cols);
            let qacts = r.take(ggml::row_bytes(aty, cols).unwrap()).to_vec();
            let dot = r.f32s(1)[0];
            Case {
                cols,
                blocks,
                deq,
                x,
                qacts,
                dot,
            }
        })
        .collect();
    assert_eq!(r.1, data.len(), "{path}: trailing bytes");
    (aty, cases)
}

/// The rounding allowance for `row · acts` (see the module docs).
fn allowance(ty: GgmlType, row: &[u8], acts: &GgmlActs) -> f32 {
    let mut w = vec![0f32; acts.cols()];
    ggml::dequantize_row(ty, row, &mut w).unwrap();
    let parts: f32 = w.iter().zip(acts.dequantize()).map(|(w, a)| (w * a).abs()).sum();
    TOL * (ggml::vec_dot_magnitude(ty, row, acts).unwrap() + parts) + f32::MIN_POSITIVE
}

#[test]
fn every_type_matches_ggml() {
    for ty in ggml::SUPPORTED {
        let (aty, cases) = fixture(ty);
        assert_eq!(ggml::vec_dot_type(ty), Ok(aty), "{ty}");
        for c in &cases {
            let mut out = vec![0f32; c.cols];
            ggml::dequantize_row(ty, &c.blocks, &mut out).unwrap();
            for (j, (a, b)) in out.iter().zip(&c.deq).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{ty} column {j}: {a} vs ggml {b}");
            }
            let acts = GgmlActs::for_weights(ty, &c.x).unwrap();
            assert_eq!(acts.ty(), aty);
            assert!(
                acts.to_bytes() == c.qacts,
                "{ty}: {aty} activation bytes differ from ggml's"
            );
            let tol = allowance(ty, &c.blocks, &acts);
            let reference = ggml::vec_dot(ty, &c.blocks, &acts).unwrap();
            assert!(
                (reference - c.dot).abs() <= tol,
                "{ty} ({} cols): reference {reference} vs ggml {} (allowed {tol})",
                c.cols,
                c.dot
            );
            for k in Kernels::available() {
                let v = k.ggml_dot(ty, &c.blocks, &acts);
                assert!(
                    (v - c.dot).abs() <= tol,
                    "{ty} {}: {v} vs ggml {} (allowed {tol})",
                    k.name,
                    c.dot
                );
            }
        }
    }
}

#[test]
fn errors_name_the_type_and_length() {
    let e = ggml::row_bytes(GgmlType::Q4_K, 300).unwrap_err();
    assert_eq!(
        e,
        GgmlError::PartialBlock {
            ty: GgmlType::Q4_K,
            cols: 300,
            block: 256
        }
    );
    assert_eq!(
        e.to_string(),
        "a Q4_K row of 300 columns is not a whole number of 256-column blocks"
    );
    let e = ggml::dequantize_row(GgmlType::Q8_0, &[0; 33], &mut [0.0; 32]).unwrap_err();
    assert_eq!(e.to_string(), "a Q8_0 row of 32 columns takes 34 bytes, got 33");
    let e = ggml::dequantize_row(GgmlType::IQ2_XXS, &[0; 66], &mut [0.0; 256]).unwrap_err();
    assert!(
        e.to_string().starts_with("ggml type IQ2_XXS has no kernel"),
        "{e}"
    );
    let e = GgmlActs::quantize(GgmlType::Q8_0, &[0.0; 48]).unwrap_err();
    assert!(matches!(e, GgmlError::PartialBlock { cols: 48, .. }), "{e}");
    let acts = GgmlActs::quantize(GgmlType::Q8_0, &[1.0; 256]).unwrap();
    let e = ggml::vec_dot(GgmlType::Q4_K, &[0; 144], &acts).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Q4_K rows of 256 columns need Q8_K activations of 256 columns, got Q8_0 of 256"
    );
}

#[test]
fn zero_activations_quantize_to_zero() {
    for aty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
        let a = GgmlActs::quantize(aty, &[0.0; 256]).unwrap();
        assert!(a.values().iter().all(|&q| q == 0) && a.scales().iter().all(|&d| d == 0.0));
    }
}

/// Byte offsets of a block's f16 scale fields (the rest may be anything).
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        MXFP4 => &[],
        _ => &[0],
    }
}

/// A random valid row: random bytes, finite f16 scales, MXFP4 exponents
/// in a range whose products stay finite.
fn row(ty: GgmlType, blocks: usize, bytes: &[u8], scales: &[f32]) -> Vec<u8> {
    let size = ty.type_size() as usize;
    let mut row: Vec<u8> = bytes.iter().cycle().take(blocks * size).copied().collect();
    for (b, blk) in row.chunks_exact_mut(size).enumerate() {
        if ty == GgmlType::MXFP4 {
            blk[0] = 100 + blk[0] % 50;
        }
        for (k, &off) in scale_offsets(ty).iter().enumerate() {
            let s = half::f16::from_f32(scales[(2 * b + k) % scales.len()]).to_le_bytes();
            blk[off..off + 2].copy_from_slice(&s);
        }
    }
    row
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every kernel set equals the scalar reference within the rounding
    /// allowance; several rows at once equal one row at a time exactly.
    #[test]
    fn simd_matches_reference(
        t in 0usize..ggml::SUPPORTED.len(),
        blocks in 1usize..=9,
        bytes in prop::collection::vec(any::<u8>(), 64..512),
        scales in prop::collection::vec(-2.0f32..2.0, 1..16),
        x in prop::collection::vec(-8.0f32..8.0, 64..=512),
    ) {
        let ty = ggml::SUPPORTED[t];
        // 32-column types get more blocks so that odd counts and the
        // AVX-512 pairing are covered.
        let blocks = if ty.block_size() == 32 { blocks * 3 } else { blocks };
        let cols = blocks * ty.block_size() as usize;
        let w = row(ty, blocks, &bytes, &scales);
        let xs: Vec<f32> = x.iter().cycle().take(cols).copied().collect();
        let acts = GgmlActs::for_weights(ty, &xs).unwrap();
        let reference = ggml::vec_dot(ty, &w, &acts).unwrap();
        let tol = allowance(ty, &w, &acts);
        let flipped: Vec<u8> = bytes.iter().rev().copied().collect();
        let other = row(ty, blocks, &flipped, &scales);
        let two: Vec<u8> = w.iter().chain(&other).copied().collect();
        for k in Kernels::available() {
            let v = k.ggml_dot(ty, &w, &acts);
            prop_assert!((v - reference).abs() <= tol,
                "{ty} {} cols on {}: {v} vs reference {reference} (allowed {tol})", cols, k.name);
            let mut out = [0f32; 2];
            k.ggml_dot_rows(ty, &two, &acts, &mut out);
            prop_assert_eq!(out[0].to_bits(), v.to_bits());
            prop_assert_eq!(out[1].to_bits(), k.ggml_dot(ty, &other, &acts).to_bits());
        }
        // NEON, and AVX2 on Q2_K, Q3_K and IQ4_XS, form and add the
        // reference's f32 terms in its order.
        let low_bit = matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::IQ4_XS);
        for k in Kernels::available().iter().filter(|k| k.name == "neon" || (low_bit && k.name == "avx2")) {
            prop_assert_eq!(k.ggml_dot(ty, &w, &acts).to_bits(), reference.to_bits(), "{} on {}", ty, k.name);
        }
        // The x86 sets add a 32-column type's lanes in ggml's order: the
        // same bits, so the AVX-512 kernels reproduce llama.cpp's results.
        if ty.block_size() == 32 {
            let x86: Vec<(&str, f32)> = Kernels::available()
                .iter()
                .filter(|k| k.name.starts_with("avx"))
                .map(|k| (k.name, k.ggml_dot(ty, &w, &acts)))
                .collect();
            for (name, v) in &x86 {
                prop_assert_eq!(v.to_bits(), x86[0].1.to_bits(), "{} {} vs {}", ty, name, x86[0].0);
            }
        }
    }
}
