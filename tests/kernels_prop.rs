//! Property tests: every SIMD kernel set available on this CPU agrees with the
//! scalar reference on random shapes, formats and values; matmul equals
//! matvec per token exactly; results do not depend on the thread count.

use colibri::kernels::{Kernels, QActs, RowRef, q8, scalar};
use colibri::quant::{ByteStore, QFormat, QMatrix};
use proptest::prelude::*;

/// A format, with a group size in [16, 256] for grouped int4.
fn format() -> impl Strategy<Value = QFormat> {
    prop_oneof![
        Just(QFormat::F32),
        Just(QFormat::Int8),
        Just(QFormat::Int4),
        Just(QFormat::Int2),
        (16usize..=256).prop_map(|group| QFormat::Int4Grouped { group }),
        // Group sizes that are whole SIMD chunks / activation blocks.
        prop::sample::select(vec![8usize, 16, 32, 64, 128, 192, 256])
            .prop_map(|group| QFormat::Int4Grouped { group }),
    ]
}

/// One random row and activation.
#[derive(Debug, Clone)]
struct Case {
    format: QFormat,
    cols: usize,
    bytes: Vec<u8>,
    weights: Vec<f32>,
    scales: Vec<f32>,
    x: Vec<f32>,
}

impl Case {
    fn row(&self) -> RowRef<'_> {
        match self.format {
            QFormat::F32 => RowRef::F32(&self.weights),
            format => RowRef::Packed {
                format,
                cols: self.cols,
                bytes: &self.bytes,
                scales: &self.scales,
            },
        }
    }

    /// The row's weights as f32.
    fn dequantized(&self) -> Vec<f32> {
        let mut w = vec![0.0; self.cols];
        scalar::dequantize_row(&self.row(), &mut w);
        w
    }
}

fn case(max_cols: usize) -> impl Strategy<Value = Case> {
    (format(), 1..=max_cols, any::<u64>()).prop_map(|(format, cols, seed)| {
        let mut rng = Lcg(seed | 1);
        let bytes = (0..format.row_bytes(cols)).map(|_| rng.next() as u8).collect();
        let weights = (0..cols).map(|_| rng.uniform() * 2.0).collect();
        let scales = (0..format.scales_per_row(cols))
            .map(|_| 1e-3 + rng.uniform().abs() * 0.5)
            .collect();
        let x = (0..cols).map(|_| rng.uniform() * 4.0).collect();
        Case {
            format,
            cols,
            bytes,
            weights,
            scales,
            x,
        }
    })
}

/// Small deterministic generator so one proptest seed gives a whole case.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() % (1 << 24)) as f32 / (1 << 23) as f32 - 1.0
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn simd_dot_matches_scalar(c in case(300)) {
        let row = c.row();
        let want = scalar::dot(&row, &c.x);
        let mag: f32 = c.dequantized().iter().zip(&c.x).map(|(w, x)| (w * x).abs()).sum();
        for k in Kernels::available() {
            let got = k.dot(&row, &c.x);
            prop_assert!(
                (got - want).abs() <= 1e-5 * mag + 1e-30,
                "{}: {} cols {}: {got} vs {want} (mag {mag})", k.name, c.format, c.cols
            );
        }
    }

    /// Long int4 rows (several nibble-kernel blocks, every group layout)
    /// through prepared activations: each row equals `dot`, bit for bit,
    /// and the scalar reference within tolerance.
    #[test]
    fn prepared_int4_matches_scalar(
        cols in 1usize..1200,
        group in prop::sample::select(vec![0usize, 8, 16, 32, 64, 128, 192, 256, 512]),
        seed in any::<u64>(),
    ) {
        let format = if group == 0 { QFormat::Int4 } else { QFormat::Int4Grouped { group } };
        let mut rng = Lcg(seed | 1);
        let bytes: Vec<u8> = (0..format.row_bytes(cols)).map(|_| rng.next() as u8).collect();
        let scales: Vec<f32> = (0..format.scales_per_row(cols))
            .map(|_| 1e-3 + rng.uniform().abs() * 0.5)
            .collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.uniform() * 4.0).collect();
        let row = RowRef::Packed { format, cols, bytes: &bytes, scales: &scales };
        let want = scalar::dot(&row, &x);
        let mut w = vec![0.0; cols];
        scalar::dequantize_row(&row, &mut w);
        let mag: f32 = w.iter().zip(&x).map(|(w, x)| (w * x).abs()).sum();
        for k in Kernels::available() {
            let a = k.prepare(format, &x);
            let got = k.dot_acts(&row, &a);
            prop_assert_eq!(got.to_bits(), k.dot(&row, &x).to_bits(), "{} {}", k.name, format);
            prop_assert!(
                (got - want).abs() <= 1e-5 * mag + 1e-30,
                "{}: {} cols {}: {got} vs {want} (mag {mag})", k.name, format, cols
            );
            // Activations prepared for another format still give the same value.
            let plain = k.dot_acts(&row, &k.prepare(QFormat::Int8, &x));
            prop_assert!((plain - want).abs() <= 1e-5 * mag + 1e-30, "{} plain", k.name);
        }
    }

    /// Up to a dozen 64-byte chunks a row: the integer kernels' unrolled
    /// loop, partial last chunk and scale walks.
    #[test]
    fn q8_dot_matches_reference(c in case(1500)) {
        let row = c.row();
        let a = QActs::quantize_for(c.format, &c.x);
        let plain = QActs::quantize(&c.x);
        let want = q8::dot_ref(&row, &a);
        let w = c.dequantized();
        let mag: f32 = (0..c.cols)
            .map(|j| (w[j] * a.values()[j] as f32 * a.block_scales()[j / 64]).abs())
            .sum();
        for k in Kernels::available() {
            // Prepared for the row's packing (the SIMD path), and plain
            // (the reference fallback): the same value within rounding.
            for a in [&a, &plain] {
                let got = k.dot_q8(&row, a);
                prop_assert!(
                    (got - want).abs() <= 2e-6 * mag + 1e-30,
                    "{}: {} cols {}: {got} vs {want} (mag {mag})", k.name, c.format, c.cols
                );
            }
        }
        // And the quantized result is close to the exact one.
        let exact = scalar::dot(&row, &c.x);
        let full: f32 = w.iter().zip(&c.x).map(|(w, x)| (w * x).abs()).sum();
        prop_assert!((want - exact).abs() <= 0.02 * full + 1e-30, "{want} vs {exact}");
    }

    /// The integer GEMM over many rows and tokens: every value within
    /// rounding of the scalar reference, and a token's values the same
    /// whatever else is in the batch (tiles of rows × tokens, remainders).
    #[test]
    fn q8_rows_match_reference_and_do_not_depend_on_the_batch(
        format in format(),
        cols in 1usize..700,
        rows in 1usize..11,
        n in 1usize..8,
        seed in any::<u64>(),
    ) {
        prop_assume!(format != QFormat::F32);
        let mut rng = Lcg(seed | 1);
        let (rb, spr) = (format.row_bytes(cols), format.scales_per_row(cols));
        let bytes: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
        let scales: Vec<f32> = (0..rows * spr).map(|_| 1e-3 + rng.uniform().abs()).collect();
        let acts: Vec<QActs> = (0..n)
            .map(|_| {
                let x: Vec<f32> = (0..cols).map(|_| rng.uniform() * 4.0).collect();
                QActs::quantize_for(format, &x)
            })
            .collect();
        let refs: Vec<&QActs> = acts.iter().collect();
        let ldo = rows + 3;
        for k in Kernels::available() {
            let mut all = vec![f32::NAN; n * ldo];
            k.dot_q8_rows(format, cols, &bytes, &scales, rows, &refs, &mut all, ldo);
            for (t, a) in acts.iter().enumerate() {
                let mut one = vec![0f32; rows];
                k.dot_q8_rows(format, cols, &bytes, &scales, rows, &[a], &mut one, rows);
                for i in 0..rows {
                    let row = RowRef::Packed {
                        format,
                        cols,
                        bytes: &bytes[i * rb..(i + 1) * rb],
                        scales: &scales[i * spr..(i + 1) * spr],
                    };
                    let got = all[t * ldo + i];
                    prop_assert_eq!(got.to_bits(), one[i].to_bits(), "{} {} token {} row {}", k.name, format, t, i);
                    let want = q8::dot_ref(&row, a);
                    let mut w = vec![0f32; cols];
                    scalar::dequantize_row(&row, &mut w);
                    let mag: f32 = (0..cols)
                        .map(|j| (w[j] * a.values()[j] as f32 * a.block_scales()[j / 64]).abs())
                        .sum();
                    prop_assert!(
                        (got - want).abs() <= 2e-6 * mag + 1e-30,
                        "{} {} cols {}: {} vs {}", k.name, format, cols, got, want
                    );
                }
            }
        }
    }

    #[test]
    fn matmul_equals_matvec_per_token(
        c in case(300),
        rows in 1usize..40,
        n in 1usize..10,
        seed in any::<u64>(),
    ) {
        let mut rng = Lcg(seed | 1);
        let cols = c.cols;
        let m = match c.format {
            QFormat::F32 => {
                let w = (0..rows * cols).map(|_| rng.uniform()).collect();
                QMatrix::from_f32(rows, cols, w).unwrap()
            }
            format => {
                let bytes = (0..rows * format.row_bytes(cols)).map(|_| rng.next() as u8).collect();
                let scales = (0..rows * format.scales_per_row(cols))
                    .map(|_| 1e-3 + rng.uniform().abs())
                    .collect();
                QMatrix::from_parts(rows, cols, format, ByteStore::from_vec(bytes), scales).unwrap()
            }
        };
        let x: Vec<f32> = (0..n * cols).map(|_| rng.uniform() * 3.0).collect();
        for k in Kernels::available() {
            let mut y = vec![0.0; n * rows];
            m.matmul_with(&k, &x, n, &mut y);
            for t in 0..n {
                let mut yv = vec![0.0; rows];
                m.matvec_with(&k, &x[t * cols..(t + 1) * cols], &mut yv);
                for r in 0..rows {
                    prop_assert_eq!(
                        y[t * rows + r].to_bits(), yv[r].to_bits(),
                        "{} {} token {} row {}", k.name, c.format, t, r
                    );
                }
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let (rows, cols) = (301, 777);
    for format in [
        QFormat::Int8,
        QFormat::Int4,
        QFormat::Int4Grouped { group: 64 },
        QFormat::Int4Grouped { group: 37 },
    ] {
        let bytes: Vec<u8> = (0..rows * format.row_bytes(cols))
            .map(|i| (i * 131 % 256) as u8)
            .collect();
        let scales: Vec<f32> = (0..rows * format.scales_per_row(cols))
            .map(|r| 0.01 + r as f32 * 1e-4)
            .collect();
        let m = QMatrix::from_parts(rows, cols, format, ByteStore::from_vec(bytes), scales).unwrap();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.7).sin()).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut y = vec![0.0; rows];
            pool.install(|| m.matvec(&x, &mut y));
            let mut yq = vec![0.0; rows];
            pool.install(|| m.matvec_q8(&x, &mut yq));
            (y, yq)
        };
        let one = run(1);
        for threads in [2, 3, 5] {
            assert_eq!(run(threads), one, "{format}: {threads} threads");
        }
    }
}

#[test]
fn dispatch_is_one_of_the_available_sets() {
    let best = colibri::kernels::dispatch();
    assert!(Kernels::available().contains(&best), "{}", best.name);
}

#[test]
fn read_sum_agrees_across_kernel_sets() {
    let bytes: Vec<u8> = (0..100_003u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let want = Kernels::scalar().read_sum(&bytes);
    for k in Kernels::available() {
        for len in [0, 7, 8, 255, 256, 1000, bytes.len()] {
            assert_eq!(
                k.read_sum(&bytes[..len]),
                Kernels::scalar().read_sum(&bytes[..len]),
                "{} {len}",
                k.name
            );
        }
        assert_eq!(k.read_sum(&bytes), want, "{}", k.name);
    }
}
