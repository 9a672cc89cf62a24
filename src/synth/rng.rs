//! A small, fast, seeded generator for synthetic weights.
//!
//! Weights are produced in fixed-size chunks, each from its own generator
//! seeded by (tensor seed, chunk index), so the values do not depend on how
//! many threads fill a tensor, and a 7 GB model generates in seconds of CPU.

/// Values per independently seeded chunk.
pub const CHUNK: usize = 1 << 16;

/// wyrand: one 64-bit multiply per output, good enough statistics for
/// random weights (this is not a cryptographic generator).
#[derive(Clone, Debug)]
pub struct WyRand {
    state: u64,
}

impl WyRand {
    pub fn new(seed: u64) -> Self {
        Self {
            state: splitmix(seed),
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.state) * u128::from(self.state ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Fills `out` with values uniform in `[-amp, amp)`, two per draw.
    pub fn fill_uniform(&mut self, out: &mut [f32], amp: f32) {
        const INV: f32 = 1.0 / (1u32 << 23) as f32;
        let mut pairs = out.chunks_exact_mut(2);
        for pair in &mut pairs {
            let r = self.next_u64();
            pair[0] = (((r >> 40) as u32) as f32 * INV - 1.0) * amp;
            pair[1] = ((((r >> 8) & 0xff_ffff) as u32) as f32 * INV - 1.0) * amp;
        }
        if let [last] = pairs.into_remainder() {
            let r = self.next_u64();
            *last = (((r >> 40) as u32) as f32 * INV - 1.0) * amp;
        }
    }
}

/// SplitMix64 finalizer: spreads nearby seeds apart.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a of a tensor name, mixed with the model seed: each tensor gets its
/// own stream whatever order tensors are generated in.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    splitmix(seed ^ h)
}

/// `n` values uniform in `[-amp, amp)`, deterministic in (`seed`, `n`),
/// generated chunk-parallel.
pub fn uniform(seed: u64, n: usize, amp: f32) -> Vec<f32> {
    use rayon::prelude::*;
    let mut v = vec![0f32; n];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
        WyRand::new(seed ^ splitmix(i as u64)).fill_uniform(chunk, amp);
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_deterministic_bounded_and_centred() {
        let a = uniform(7, 200_001, 0.5);
        let b = uniform(7, 200_001, 0.5);
        assert_eq!(a, b);
        assert!(a.iter().all(|x| (-0.5..0.5).contains(x)));
        let mean = a.iter().map(|&x| f64::from(x)).sum::<f64>() / a.len() as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        // uniform[-a, a) has variance a^2 / 3
        let var = a.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / a.len() as f64;
        assert!((var - 0.25 / 3.0).abs() < 0.005, "var {var}");
        assert_ne!(uniform(8, 16, 0.5), uniform(7, 16, 0.5));
    }

    #[test]
    fn names_get_distinct_seeds() {
        assert_ne!(tensor_seed(1, "a"), tensor_seed(1, "b"));
        assert_ne!(tensor_seed(1, "a"), tensor_seed(2, "a"));
    }
}
