//! The attention inner loops on every kernel set this CPU has equal their
//! scalar definitions bit for bit: `dot_f32` against `ops::dot` (the
//! reference attention scores were always computed with), `axpy` against
//! `o += w * x`, the f16 cache read against `half`'s `to_f32` (every one of
//! the 65,536 halves), the q8 read against `q as f32 * d`, the block
//! product `gemm_acc` against its axpys in order, and the per-tile grids
//! (`dot_f32_grid`, `axpy_grid`) against single dots and axpys. Bit equality,
//! not a tolerance: the transformers-oracle tests check tokens exactly, so a
//! kernel set must not change a single score.

use colibri::kernels::Kernels;
use colibri::model::ops::dot;
use half::f16;
use proptest::prelude::*;

/// Values spanning many binades (so rounding differences would show),
/// with exact zeros and both signs.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -4.0f32..4.0,
        2 => -1e-3f32..1e-3,
        1 => -3e4f32..3e4,
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
    ]
}

/// Two vectors of one random length in 0..=300 (every remainder of 16,
/// 8 and 4, and lengths below one vector).
fn pair() -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (0usize..=300).prop_flat_map(|n| {
        (
            prop::collection::vec(value(), n),
            prop::collection::vec(value(), n),
        )
    })
}

/// One vector and four more of the same random length in 0..=300.
fn five() -> impl Strategy<Value = (Vec<f32>, [Vec<f32>; 4])> {
    (0usize..=300).prop_flat_map(|n| {
        let v = move || prop::collection::vec(value(), n);
        (v(), [v(), v(), v(), v()])
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn four_dots_at_once_equal_four_single_dots((a, b) in five()) {
        let b4 = [&b[0][..], &b[1][..], &b[2][..], &b[3][..]];
        let want = b4.map(|v| dot(&a, v).to_bits());
        for k in Kernels::available() {
            prop_assert_eq!(k.dot_f32_x4(&a, b4).map(f32::to_bits), want, "{}: len {}", k.name, a.len());
        }
    }

    #[test]
    fn four_axpys_at_once_equal_four_in_a_row((o, x) in five(), w in prop::array::uniform4(value())) {
        let x4 = [&x[0][..], &x[1][..], &x[2][..], &x[3][..]];
        let mut want = o.clone();
        for j in 0..4 {
            for (o, &v) in want.iter_mut().zip(x4[j]) {
                *o += w[j] * v;
            }
        }
        let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        for k in Kernels::available() {
            let mut got = o.clone();
            k.axpy_x4(&mut got, w, x4);
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            prop_assert_eq!(got, want.clone(), "{}: len {}", k.name, o.len());
        }
    }

    #[test]
    fn dot_is_bit_identical_to_the_scalar_reference((a, b) in pair(), skip in 0usize..4) {
        // Unaligned starts too (`skip`), as a head slice of a cache row may be.
        let (a, b) = (&a[skip.min(a.len())..], &b[skip.min(b.len())..]);
        let want = dot(a, b);
        for k in Kernels::available() {
            let got = k.dot_f32(a, b);
            prop_assert_eq!(got.to_bits(), want.to_bits(), "{}: len {}: {} vs {}", k.name, a.len(), got, want);
        }
    }

    #[test]
    fn dot_of_unequal_lengths_uses_the_common_prefix((a, b) in pair(), cut in 0usize..40) {
        let b = &b[..b.len().saturating_sub(cut)];
        let want = dot(&a, b);
        for k in Kernels::available() {
            prop_assert_eq!(k.dot_f32(&a, b).to_bits(), want.to_bits(), "{}", k.name);
            prop_assert_eq!(k.dot_f32(b, &a).to_bits(), dot(b, &a).to_bits(), "{}", k.name);
        }
    }

    #[test]
    fn axpy_is_bit_identical_to_multiply_then_add((o, x) in pair(), w in value()) {
        let mut want = o.clone();
        for (o, &v) in want.iter_mut().zip(&x) {
            *o += w * v;
        }
        for k in Kernels::available() {
            let mut got = o.clone();
            k.axpy(&mut got, w, &x);
            let (g, e): (Vec<u32>, Vec<u32>) = (got.iter().map(|v| v.to_bits()).collect(), want.iter().map(|v| v.to_bits()).collect());
            prop_assert_eq!(g, e, "{}: len {}", k.name, x.len());
        }
    }

    /// The linear-attention block products: every tile shape and
    /// remainder (rows not a multiple of 4, columns not of 32 / 16 / 8).
    #[test]
    fn gemm_acc_is_bit_identical_to_axpys_in_order(
        (r, kk, d, o, a, b) in (0usize..11, 0usize..20, 1usize..70).prop_flat_map(|(r, kk, d)| (
            Just(r), Just(kk), Just(d),
            prop::collection::vec(value(), r * d),
            prop::collection::vec(value(), r * kk),
            prop::collection::vec(value(), kk * d),
        ))
    ) {
        let mut want = o.clone();
        for i in 0..r {
            for m in 0..kk {
                for j in 0..d {
                    want[i * d + j] += a[i * kk + m] * b[m * d + j];
                }
            }
        }
        let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        for k in Kernels::available() {
            let mut got = o.clone();
            k.gemm_acc(&mut got, &a, &b, kk, d);
            prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.clone(), "{}: {}x{}x{}", k.name, r, kk, d);
        }
    }

    /// A block of query rows against a tile of keys at a stride: every
    /// score equals `ops::dot` times the scale, for row counts and key
    /// counts that are and are not multiples of 4 and heads with and
    /// without a remainder of 16, into rows `ld >= nk` apart (what lies
    /// between them is left alone).
    #[test]
    fn grid_scores_are_bit_identical_to_single_dots(
        (nr, hd, nk, pad, q, keys, scale) in (0usize..10, 1usize..150, 0usize..12, 0usize..5).prop_flat_map(|(nr, hd, nk, pad)| (
            Just(nr), Just(hd), Just(nk), Just(pad),
            prop::collection::vec(prop::collection::vec(value(), hd), nr),
            prop::collection::vec(value(), nk * (hd + pad)),
            value(),
        ))
    ) {
        let stride = hd + pad;
        let ld = nk + pad % 3;
        let rows: Vec<&[f32]> = q.iter().map(Vec::as_slice).collect();
        let mut want = vec![f32::NAN.to_bits(); nr * ld];
        for r in 0..nr {
            for j in 0..nk {
                want[r * ld + j] = (dot(&q[r], &keys[j * stride..j * stride + hd]) * scale).to_bits();
            }
        }
        for k in Kernels::available() {
            let mut got = vec![f32::NAN; nr * ld];
            k.dot_f32_grid(&rows, &keys, stride, nk, scale, &mut got, ld);
            prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.clone(), "{}: {}x{} by {}", k.name, nr, hd, nk);
        }
    }

    /// Weighted sums of a tile of values for a block of rows, each over its
    /// own span of keys (mostly one shared span, as in a causal block, so
    /// the four-row path runs, with some rows differing), the weights in
    /// rows `ld >= nk` apart: per element the rounded multiply then add of
    /// every key in order.
    #[test]
    fn grid_weighted_sums_equal_axpys_in_order(
        (nr, hd, nk, pad, o, w, vals, common, own) in (0usize..10, 1usize..100, 0usize..12, 0usize..5).prop_flat_map(|(nr, hd, nk, pad)| (
            Just(nr), Just(hd), Just(nk), Just(pad),
            prop::collection::vec(value(), nr * hd),
            prop::collection::vec(value(), nr * (nk + pad % 3)),
            prop::collection::vec(value(), nk * (hd + pad)),
            (0..=nk, 0..=nk),
            prop::collection::vec(prop::option::weighted(0.2, (0..=nk, 0..=nk)), nr),
        ))
    ) {
        let stride = hd + pad;
        let ld = nk + pad % 3;
        let order = |(a, b): (usize, usize)| (a.min(b), a.max(b));
        let spans: Vec<(usize, usize)> = own.iter().map(|s| order(s.unwrap_or(common))).collect();
        let mut want = o.clone();
        for (r, &(a, b)) in spans.iter().enumerate() {
            for j in a..b {
                for i in 0..hd {
                    want[r * hd + i] += w[r * ld + j] * vals[j * stride + i];
                }
            }
        }
        let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        for k in Kernels::available() {
            let mut got = o.clone();
            k.axpy_grid(&mut got, hd, &w, ld, nk, &spans, &vals, stride);
            prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.clone(), "{}: {}x{} by {}", k.name, nr, hd, nk);
        }
    }

    #[test]
    fn q8_dequant_is_bit_identical_to_the_scalar_reference(
        q in prop::collection::vec(any::<i8>(), 0..80),
        d in value(),
    ) {
        let want: Vec<u32> = q.iter().map(|&v| (v as f32 * d).to_bits()).collect();
        for k in Kernels::available() {
            let mut got = vec![f32::NAN; q.len()];
            k.dequant_i8(&q, d, &mut got);
            prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.clone(), "{}", k.name);
        }
    }
}

/// Every half, NaNs and infinities included, at every offset within a
/// vector and a length that leaves a remainder.
#[test]
fn f16_conversion_is_bit_identical_to_half_for_every_value() {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let want: Vec<u32> = all.iter().map(|h| h.to_f32().to_bits()).collect();
    for k in Kernels::available() {
        for skip in [0usize, 1, 5, 9, 15] {
            let src = &all[skip..all.len() - 3];
            let mut got = vec![0f32; src.len()];
            k.f16_to_f32(src, &mut got);
            for (i, g) in got.iter().enumerate() {
                assert_eq!(g.to_bits(), want[skip + i], "{}: half {:#06x}", k.name, skip + i);
            }
        }
        // Short inputs: only the scalar remainder.
        for n in 0..20 {
            let mut got = vec![0f32; n];
            k.f16_to_f32(&all[1000..1000 + n], &mut got);
            assert!(
                got.iter().zip(&want[1000..]).all(|(g, w)| g.to_bits() == *w),
                "{} len {n}",
                k.name
            );
        }
    }
}
