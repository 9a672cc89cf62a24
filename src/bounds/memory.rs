//! The memory roofline: what a token must read from RAM with every expert
//! resident, against the read bandwidth measured in the same run.

use std::time::Instant;

use rayon::prelude::*;

/// The roofline of one run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryBound {
    /// Bytes a second the compute pool reads from RAM.
    pub read_bw: f64,
    pub threads: usize,
    /// Dense bytes a step reads plus the routed experts it uses.
    pub bytes_per_token: f64,
    pub experts_per_token: f64,
    pub expert_bytes: f64,
}

impl MemoryBound {
    pub fn tok_per_s(&self) -> f64 {
        if self.bytes_per_token > 0.0 {
            self.read_bw / self.bytes_per_token
        } else {
            f64::INFINITY
        }
    }
}

/// Read bandwidth of memory with the calling pool's threads: the best of five
/// passes of the kernels' SIMD read (the same loads and prefetching the
/// matmul kernels use) over a buffer larger than any cache.
pub fn memory_bandwidth(bytes: usize) -> f64 {
    let k = crate::kernels::dispatch();
    let buf: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
    let mut best = 0f64;
    for _ in 0..5 {
        let t0 = Instant::now();
        let sum = buf
            .par_chunks(1 << 16)
            .map(|c| k.read_sum(c))
            .reduce(|| 0, u64::wrapping_add);
        let secs = t0.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        best = best.max(bytes as f64 / secs);
    }
    best
}
