//! What the memory-bound benches share: pseudo-random weights, the
//! memory-read roofline (the faster of two read strategies), and paired
//! rounds of baseline and case on the same thread pool, best of each.
//!
//! Shared machines change speed from one second to the next, so a ratio
//! to a baseline measured minutes earlier says little; each round here runs
//! the baseline right before the case.

use std::hint::black_box;
use std::time::Instant;

use colibri::kernels::Kernels;
use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};

/// Paired figures of one case at one thread count.
pub struct Record {
    pub case: String,
    pub threads: usize,
    /// Bytes of weights one pass of the case reads.
    pub bytes: usize,
    /// Best seconds of one pass of the case.
    pub seconds: f64,
    /// Best seconds of one baseline pass over `base_bytes`, from the rounds
    /// interleaved with the case's.
    pub base_seconds: f64,
    pub base_bytes: usize,
}

impl Record {
    pub fn gbs(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }

    pub fn base_gbs(&self) -> f64 {
        self.base_bytes as f64 / self.base_seconds / 1e9
    }
}

pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

/// Pseudo-random bytes, cheap enough for hundreds of MiB.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.extend_from_slice(&s.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Wrapping sum of a buffer in 64 KiB tasks, with the kernels' SIMD loads
/// and prefetching: the memory-read roofline.
fn read_all(k: &Kernels, buf: &[u8]) -> u64 {
    buf.par_chunks(1 << 16)
        .map(|c| k.read_sum(c))
        .reduce(|| 0, u64::wrapping_add)
}

/// Wrapping sum of a buffer in 64 KiB tasks as plain Rust (auto-vectorized,
/// hardware prefetch only): the second read strategy of the baseline.
fn read_plain(buf: &[u8]) -> u64 {
    buf.par_chunks(1 << 16)
        .map(|c| {
            c.chunks_exact(8)
                .map(|w| u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]))
                .fold(0u64, u64::wrapping_add)
        })
        .reduce(|| 0, u64::wrapping_add)
}

/// Seconds of one call of `f` under `pool`.
pub fn time_once(pool: &ThreadPool, f: &mut (impl FnMut() + Send)) -> f64 {
    let start = Instant::now();
    pool.install(&mut *f);
    start.elapsed().as_secs_f64()
}

/// Pools of one thread and of every thread rayon would use.
pub fn pools() -> Vec<(usize, ThreadPool)> {
    let all = rayon::current_num_threads();
    let mut counts = vec![1];
    if all > 1 {
        counts.push(all);
    }
    counts
        .into_iter()
        .map(|n| {
            let pool = ThreadPoolBuilder::new().num_threads(n).build();
            (n, pool.unwrap_or_else(|e| panic!("a pool of {n} threads: {e}")))
        })
        .collect()
}

/// Paired rounds of the roofline and one case.
pub struct Paired {
    pub rounds: usize,
    pub k: Kernels,
    /// The baseline's buffer: as large as the cases' matrices, so that
    /// both read from memory, not from the cache.
    pub buf: Vec<u8>,
    pub records: Vec<Record>,
}

impl Paired {
    /// `rounds` rounds on each pool of: the baseline (the faster of the two
    /// read strategies), then `f`; the best of each goes into a record.
    pub fn measure(
        &mut self,
        pools: &[(usize, ThreadPool)],
        case: &str,
        bytes: usize,
        mut f: impl FnMut() + Send,
    ) {
        let (k, buf) = (self.k, &self.buf);
        let mut base = || {
            black_box(read_all(&k, black_box(buf)));
        };
        let mut plain = || {
            black_box(read_plain(black_box(buf)));
        };
        for (threads, pool) in pools {
            // One unmeasured pass each to fault in pages and warm the pool.
            time_once(pool, &mut base);
            time_once(pool, &mut f);
            let (mut best_base, mut best) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..self.rounds {
                let (a, b) = (time_once(pool, &mut base), time_once(pool, &mut plain));
                best_base = best_base.min(a.min(b));
                best = best.min(time_once(pool, &mut f));
            }
            self.records.push(Record {
                case: case.to_string(),
                threads: *threads,
                bytes,
                seconds: best,
                base_seconds: best_base,
                base_bytes: buf.len(),
            });
        }
    }
}
