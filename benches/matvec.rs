//! Matrix-vector throughput against a plain memory-read baseline.
//!
//! Each weight format streams a matrix larger than the last-level cache
//! (`COLI_BENCH_MB` MiB of weights, default 512; `COLI_BENCH_COLS` columns,
//! default 4096) on one thread and on all threads. The summary prints GB/s of
//! weight bytes and the ratio to a SIMD sum over a buffer of the same size
//! with the same thread count: the target is a ratio of at least 0.8 for int8
//! and int4. Shared machines change speed from one second to the next, so the
//! ratios come from paired passes: `COLI_BENCH_ROUNDS` (default 7) rounds of
//! one baseline pass then one case pass, back to back, best of each.
//! Criterion's per-case reports run first; `COLI_BENCH_QUICK=1` skips them.
//! `COLI_BENCH_KERNELS` (e.g. `avx2`) runs the matvec cases on another
//! available kernel set; the baseline always uses the best one.
//!
//! A last table shows the compute ceiling: one thread walking 512 KiB of
//! rows that stay in L2, so no memory traffic. A kernel can stream at the
//! memory's pace only if this figure is comfortably above the baseline.

#[path = "support/paired.rs"]
mod paired;

use std::hint::black_box;
use std::time::{Duration, Instant};

use colibri::kernels::{Kernels, QActs, RowRef, dispatch};
use colibri::quant::{ByteStore, QFormat, QMatrix};
use criterion::{Criterion, SamplingMode, Throughput};
use paired::{Paired, env_usize, pools, random_bytes};
use rayon::ThreadPool;

/// What the cases share: thread pools, the paired rounds, criterion.
struct Bench {
    c: Criterion,
    quick: bool,
    pools: Vec<(usize, ThreadPool)>,
    paired: Paired,
}

impl Bench {
    /// Criterion's report for `case` (unless quick), then the paired rounds.
    fn case(&mut self, case: &str, bytes: usize, mut f: impl FnMut() + Send) {
        if !self.quick {
            let mut group = self.c.benchmark_group(case);
            group
                .throughput(Throughput::Bytes(bytes as u64))
                .sampling_mode(SamplingMode::Flat)
                .sample_size(10)
                .warm_up_time(Duration::from_millis(300))
                .measurement_time(Duration::from_millis(1500));
            for (threads, pool) in &self.pools {
                group.bench_function(format!("{threads}t"), |b| {
                    b.iter_custom(|iters| {
                        let start = Instant::now();
                        for _ in 0..iters {
                            pool.install(&mut f);
                        }
                        start.elapsed()
                    })
                });
            }
            group.finish();
        }
        self.paired.measure(&self.pools, case, bytes, f);
    }
}

/// A `[rows, cols]` matrix of about `bytes` weight bytes in `format`.
fn matrix(format: QFormat, bytes: usize, cols: usize) -> QMatrix {
    let rows = (bytes / format.row_bytes(cols)).max(1);
    match format {
        QFormat::F32 => {
            let raw = random_bytes(rows * cols, 7);
            let w = raw.iter().map(|&b| (b as i8) as f32 / 128.0).collect();
            QMatrix::from_f32(rows, cols, w).expect("f32 bench matrix")
        }
        f => {
            let raw = random_bytes(rows * f.row_bytes(cols), 11);
            let scales = vec![0.01; rows * f.scales_per_row(cols)];
            QMatrix::from_parts(rows, cols, f, ByteStore::from_vec(raw), scales).expect("bench matrix")
        }
    }
}

/// GB/s of one thread computing `f32`-activation (or, with `q8`,
/// int8-activation) row dot products over 512 KiB of `format` rows that
/// stay in L2: the kernel's compute ceiling. Best of 30 passes.
fn in_cache(k: &Kernels, format: QFormat, cols: usize, q8: bool) -> f64 {
    let rb = format.row_bytes(cols);
    let spr = format.scales_per_row(cols);
    let rows = ((512 << 10) / rb).max(1);
    let bytes = random_bytes(rows * rb, 5);
    let scales = vec![0.01f32; rows * spr];
    let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
    let a = k.prepare(format, &x);
    let qa = QActs::quantize_for(format, &x);
    let row = |r: usize| RowRef::Packed {
        format,
        cols,
        bytes: &bytes[r * rb..(r + 1) * rb],
        scales: &scales[r * spr..(r + 1) * spr],
    };
    let mut best = f64::INFINITY;
    for _ in 0..30 {
        let start = Instant::now();
        let mut sink = 0f32;
        for r in 0..rows {
            sink += if q8 {
                k.dot_q8(&row(r), &qa)
            } else {
                k.dot_acts(&row(r), &a)
            };
        }
        black_box(sink);
        best = best.min(start.elapsed().as_secs_f64());
    }
    (rows * rb) as f64 / best / 1e9
}

fn main() {
    let mb = env_usize("COLI_BENCH_MB", 512);
    let cols = env_usize("COLI_BENCH_COLS", 4096);
    let bytes = mb << 20;
    let pools = pools();
    let k = dispatch();
    let km = std::env::var("COLI_BENCH_KERNELS")
        .ok()
        .and_then(|name| Kernels::available().into_iter().find(|k| k.name == name))
        .unwrap_or(k);
    eprintln!(
        "kernels: {} (available: {:?})",
        km.name,
        Kernels::available().iter().map(|k| k.name).collect::<Vec<_>>()
    );
    let mut bench = Bench {
        c: Criterion::default().configure_from_args(),
        quick: std::env::var("COLI_BENCH_QUICK").is_ok_and(|v| v == "1"),
        pools,
        paired: Paired {
            rounds: env_usize("COLI_BENCH_ROUNDS", 7),
            k,
            buf: random_bytes(bytes, 3),
            records: Vec::new(),
        },
    };

    let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
    for (name, format) in [
        ("int8", QFormat::Int8),
        ("int4", QFormat::Int4),
        ("int4-g64", QFormat::Int4Grouped { group: 64 }),
        ("f32", QFormat::F32),
    ] {
        let m = matrix(format, bytes, cols);
        let mut y = vec![0f32; m.rows()];
        bench.case(&format!("matvec-{name}"), m.resident_bytes(), || {
            m.matvec_with(&km, black_box(&x), &mut y);
        });
        if format != QFormat::F32 && km.has_int_dot() {
            bench.case(&format!("matvec-q8-{name}"), m.resident_bytes(), || {
                m.matvec_q8_with(&km, black_box(&x), &mut y);
            });
        }
        if format == QFormat::Int4 {
            // Prefill: 16 tokens reading each row once. GB/s counts the
            // weight bytes once per token, i.e. equivalent matvec traffic.
            let n = 16;
            let xs: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut ys = vec![0f32; n * m.rows()];
            bench.case("matmul16-int4", m.resident_bytes() * n, || {
                m.matmul_with(&km, black_box(&xs), n, &mut ys);
            });
        }
    }
    bench.c.final_summary();

    println!(
        "\nweights {mb} MiB, {cols} columns, kernels {}, best of {} paired rounds",
        km.name, bench.paired.rounds
    );
    println!(
        "{:<20} {:>7} {:>10} {:>10} {:>8}",
        "case", "threads", "GB/s", "base GB/s", "ratio"
    );
    for r in &bench.paired.records {
        let (gbs, base) = (r.gbs(), r.base_gbs());
        println!(
            "{:<20} {:>7} {:>10.2} {:>10.2} {:>8.3}",
            r.case,
            r.threads,
            gbs,
            base,
            gbs / base
        );
    }

    let base1 = bench
        .paired
        .records
        .iter()
        .find(|r| r.threads == 1)
        .map(|r| r.base_gbs())
        .unwrap_or(f64::NAN);
    println!("\nin cache (512 KiB of rows, 1 thread): compute ceiling");
    println!("{:<20} {:>10} {:>14}", "case", "GB/s", "x 1t baseline");
    for (name, format) in [
        ("int8", QFormat::Int8),
        ("int4", QFormat::Int4),
        ("int4-g64", QFormat::Int4Grouped { group: 64 }),
    ] {
        let mut cases = vec![(format!("dot-{name}"), false)];
        if km.has_int_dot() {
            cases.push((format!("dot-q8-{name}"), true));
        }
        for (case, q8) in cases {
            let gbs = in_cache(&km, format, cols, q8);
            println!("{case:<20} {gbs:>10.2} {:>14.2}", gbs / base1);
        }
    }
}
