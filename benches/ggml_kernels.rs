//! Matvec over ggml block rows at one thread: GB/s of weight bytes per type
//! for a 2048-column matrix, against `Kernels::read_sum` over the same bytes
//! in the same run (the memory-read roofline the other matvec benches use),
//! printed as a ratio. Rounds alternate kernel and roofline passes so both
//! see the same machine state; the median of `COLI_BENCH_ROUNDS` (default
//! 5) rounds is reported. Criterion also times each type's pass.

use std::hint::black_box;
use std::time::{Duration, Instant};

use colibri::kernels::ggml::{self, GgmlActs, GgmlType};
use criterion::{Criterion, criterion_group, criterion_main};

const COLS: usize = 2048;
const ROWS: usize = 8192;

/// Random valid rows: pseudo-random bytes with small finite f16 scales.
fn matrix(ty: GgmlType) -> Vec<u8> {
    let size = ty.type_size() as usize;
    let n = ggml::row_bytes(ty, COLS).unwrap_or(0) * ROWS;
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut m: Vec<u8> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 32) as u8
        })
        .collect();
    let offs: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
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

fn secs(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bench(c: &mut Criterion) {
    let k = colibri::kernels::dispatch();
    let rounds: usize = std::env::var("COLI_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let x: Vec<f32> = (0..COLS)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut table = Vec::new();
    let mut g = c.benchmark_group("ggml_matvec");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800));
    for ty in ggml::SUPPORTED {
        let m = matrix(ty);
        let acts = GgmlActs::for_weights(ty, &x).expect("whole blocks");
        let mut out = vec![0f32; ROWS];
        let (mut kern, mut base) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            kern.push(secs(|| k.ggml_dot_rows(ty, &m, &acts, &mut out)));
            base.push(secs(|| {
                black_box(k.read_sum(&m));
            }));
        }
        let gb = m.len() as f64 / 1e9;
        let (kg, bg) = (gb / median(kern), gb / median(base));
        table.push((ty, k.ggml_has_simd(ty), kg, bg));
        g.bench_function(ty.name(), |b| {
            b.iter(|| k.ggml_dot_rows(ty, &m, &acts, black_box(&mut out)))
        });
    }
    g.finish();
    println!(
        "\nggml matvec, {COLS} columns x {ROWS} rows, 1 thread, kernels {}",
        k.name
    );
    println!(
        "{:<8} {:>5} {:>8} {:>10} {:>6}",
        "type", "simd", "GB/s", "base GB/s", "ratio"
    );
    for (ty, simd, kg, bg) in table {
        println!(
            "{:<8} {:>5} {kg:>8.2} {bg:>10.2} {:>6.2}",
            ty.name(),
            simd,
            kg / bg
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
