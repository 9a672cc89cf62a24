//! Matvec over ggml block rows, the engine's path (`QMatrix::matvec_with`,
//! parallel over rows), against the memory-read roofline.
//!
//! Each supported type streams a matrix larger than the last-level cache
//! (`COLI_BENCH_MB` MiB of weights, default 512; `COLI_BENCH_COLS` columns,
//! default 4096, a multiple of every type's block) on one thread and on all
//! threads; `COLI_BENCH_ROUNDS` (default 5) paired rounds of the read
//! baseline then the matvec, best of each (benches/support/paired.rs). The
//! target is a ratio of at least 0.85 for every type with a SIMD kernel.
//! `COLI_BENCH_TYPES=Q4_K,Q8_0` limits the types; `COLI_BENCH_KERNELS=avx2`
//! runs the matvec on another available kernel set (the baseline keeps the
//! best one).
//!
//! A last table is the compute ceiling: one thread over 512 KiB of rows
//! that stay in L2. A type can stream at the memory's pace only if this is
//! comfortably above the one-thread baseline.

#[path = "support/paired.rs"]
mod paired;

use std::hint::black_box;
use std::time::Instant;

use colibri::kernels::ggml::{self, GgmlActs, GgmlType};
use colibri::kernels::{Kernels, dispatch};
use colibri::quant::{ByteStore, QMatrix};
use paired::{Paired, env_usize, pools, random_bytes};

/// Valid blocks of `ty`: random bytes with small finite scales.
fn blocks(ty: GgmlType, len: usize, seed: u64) -> Vec<u8> {
    let size = ty.type_size() as usize;
    let mut m = random_bytes(len, seed);
    let offs: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        GgmlType::IQ4_XS => &[0],
        GgmlType::MXFP4 => &[],
        _ => &[0],
    };
    for blk in m.chunks_exact_mut(size) {
        if ty == GgmlType::MXFP4 {
            blk[0] = 120 + blk[0] % 8;
        }
        for &o in offs {
            blk[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    m
}

/// GB/s of one thread over 512 KiB of `ty` rows that stay in L2: the
/// kernel's compute ceiling. Best of 30 passes.
fn in_cache(k: &Kernels, ty: GgmlType, cols: usize, x: &[f32]) -> f64 {
    let rb = ggml::row_bytes(ty, cols).unwrap_or(1);
    let rows = ((512 << 10) / rb).max(1);
    let m = blocks(ty, rows * rb, 5);
    let acts = GgmlActs::for_weights(ty, x).unwrap_or_else(|e| panic!("{ty}: {e}"));
    let mut out = vec![0f32; rows];
    let mut best = f64::INFINITY;
    for _ in 0..30 {
        let start = Instant::now();
        k.ggml_dot_rows(ty, black_box(&m), &acts, &mut out);
        black_box(&out);
        best = best.min(start.elapsed().as_secs_f64());
    }
    (rows * rb) as f64 / best / 1e9
}

fn main() {
    let mb = env_usize("COLI_BENCH_MB", 512);
    let cols = env_usize("COLI_BENCH_COLS", 4096);
    let bytes = mb << 20;
    let k = dispatch();
    let km = std::env::var("COLI_BENCH_KERNELS")
        .ok()
        .and_then(|name| Kernels::available().into_iter().find(|k| k.name == name))
        .unwrap_or(k);
    let only: Option<Vec<String>> = std::env::var("COLI_BENCH_TYPES")
        .ok()
        .map(|v| v.split(',').map(|t| t.trim().to_ascii_uppercase()).collect());
    let types: Vec<GgmlType> = ggml::SUPPORTED
        .into_iter()
        .filter(|t| only.as_ref().is_none_or(|o| o.iter().any(|n| n == t.name())))
        .collect();
    eprintln!(
        "kernels: {} (available: {:?})",
        km.name,
        Kernels::available().iter().map(|k| k.name).collect::<Vec<_>>()
    );
    let pools = pools();
    let mut bench = Paired {
        rounds: env_usize("COLI_BENCH_ROUNDS", 5),
        k,
        buf: random_bytes(bytes, 3),
        records: Vec::new(),
    };
    let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
    for &ty in &types {
        let rb = ggml::row_bytes(ty, cols).unwrap_or_else(|e| panic!("{ty} rows of {cols} columns: {e}"));
        let rows = (bytes / rb).max(1);
        let m = QMatrix::from_ggml(rows, cols, ty, ByteStore::from_vec(blocks(ty, rows * rb, 11)))
            .unwrap_or_else(|e| panic!("{ty} bench matrix: {e}"));
        let mut y = vec![0f32; rows];
        bench.measure(&pools, ty.name(), rows * rb, || {
            m.matvec_with(&km, black_box(&x), &mut y);
        });
    }

    println!(
        "\nggml matvec, weights {mb} MiB, {cols} columns, kernels {}, best of {} paired rounds",
        km.name, bench.rounds
    );
    println!(
        "{:<8} {:>5} {:>7} {:>8} {:>10} {:>6}",
        "type", "simd", "threads", "GB/s", "base GB/s", "ratio"
    );
    for r in &bench.records {
        let simd = types
            .iter()
            .find(|t| t.name() == r.case)
            .is_some_and(|&t| km.ggml_has_simd(t));
        println!(
            "{:<8} {:>5} {:>7} {:>8.2} {:>10.2} {:>6.3}",
            r.case,
            simd,
            r.threads,
            r.gbs(),
            r.base_gbs(),
            r.gbs() / r.base_gbs()
        );
    }
    let base1 = bench
        .records
        .iter()
        .find(|r| r.threads == 1)
        .map(|r| r.base_gbs())
        .unwrap_or(f64::NAN);
    println!("\nin cache (512 KiB of rows, 1 thread): compute ceiling");
    println!("{:<8} {:>8} {:>14}", "type", "GB/s", "x 1t baseline");
    for &ty in &types {
        let gbs = in_cache(&km, ty, cols, &x);
        println!("{:<8} {gbs:>8.2} {:>14.2}", ty.name(), gbs / base1);
    }
}
