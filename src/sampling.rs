//! Turning logits into the next token: greedy, or temperature / top-k /
//! top-p sampling from a seeded generator, so the same seed gives the same
//! text on every run and every placement.

/// Sampling parameters; `temperature == 0` is greedy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 = no top-k cut.
    pub top_k: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

/// SplitMix64: tiny, fast, and its output is fixed forever by its definition,
/// unlike generators whose stream may change between crate versions.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Token ids by descending logit (IEEE total order), ties by ascending id:
/// one integer key per token, sorted as plain `u64`s, which is several
/// times faster than a comparator over the logits and gives exactly the
/// same order (every key is distinct, so the unstable sort is stable here).
fn ranked(logits: &[f32]) -> Vec<usize> {
    let mut keys: Vec<u64> = logits
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let b = x.to_bits();
            // Ascending `k` follows `total_cmp`; `!k` makes it descending.
            let k = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
            (u64::from(!k) << 32) | i as u64
        })
        .collect();
    keys.sort_unstable();
    keys.into_iter().map(|k| (k & 0xffff_ffff) as usize).collect()
}

/// A sampler owns its generator, so a conversation's draws continue across turns.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Self {
            params,
            rng: Rng::new(params.seed),
        }
    }

    /// Picks the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        match self.distribution(logits) {
            None => crate::model::ops::argmax(logits) as u32,
            Some((idx, probs)) => {
                let r = self.rng.next_f64();
                draw(&idx, &probs, r, None)
            }
        }
    }

    /// Decides a drafted token `draft` against the target's `logits`
    /// (speculative sampling): returns the token to emit and whether it is
    /// the draft. Both drafters (n-gram lookup and the MTP head's argmax)
    /// are deterministic, so the proposal is a point mass at `draft` and
    /// the standard `min(1, p/q)` rule becomes: accept with probability
    /// `p(draft)`, else draw from `p` without `draft`, renormalised. Every
    /// token then comes out with probability `p` exactly, `p` being what
    /// [`Self::sample`] draws from (temperature, top-k, top-p applied).
    /// Greedy: the argmax, accepted when it is the draft (no draws, so the
    /// tokens are those of plain greedy decoding).
    pub fn verify(&mut self, logits: &[f32], draft: u32) -> (u32, bool) {
        let Some((idx, probs)) = self.distribution(logits) else {
            let id = crate::model::ops::argmax(logits) as u32;
            return (id, id == draft);
        };
        let pd = idx
            .iter()
            .position(|&i| i as u32 == draft)
            .map_or(0.0, |j| probs[j]);
        if self.rng.next_f64() < pd {
            return (draft, true);
        }
        let r = self.rng.next_f64() * (1.0 - pd);
        (draw(&idx, &probs, r, Some(draft)), false)
    }

    /// The candidates (by descending logit) and their probabilities after
    /// the sampling transforms; None when greedy.
    fn distribution(&self, logits: &[f32]) -> Option<(Vec<usize>, Vec<f64>)> {
        let p = self.params;
        if p.temperature <= 0.0 || !p.temperature.is_finite() {
            return None;
        }
        // Candidates sorted by logit (ties by id), optionally cut to top-k.
        let mut idx = ranked(logits);
        if p.top_k > 0 {
            idx.truncate(p.top_k);
        }
        let max = logits[idx[0]];
        let mut probs: Vec<f64> = idx
            .iter()
            .map(|&i| (((logits[i] - max) / p.temperature) as f64).exp())
            .collect();
        let sum: f64 = probs.iter().sum();
        for q in &mut probs {
            *q /= sum;
        }
        if p.top_p > 0.0 && p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, q) in probs.iter().enumerate() {
                acc += q;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            idx.truncate(keep);
            let s: f64 = probs.iter().sum();
            for q in &mut probs {
                *q /= s;
            }
        }
        Some((idx, probs))
    }
}

/// The candidate at which the running sum of `probs` passes `r` (the last
/// one when rounding leaves `r` beyond the total), skipping `except`: with
/// `r` uniform in `[0, 1 - p(except))` that is a draw from the distribution
/// without `except`, renormalised.
fn draw(idx: &[usize], probs: &[f64], r: f64, except: Option<u32>) -> u32 {
    let mut acc = 0.0;
    let mut last = None;
    for (i, q) in idx.iter().zip(probs) {
        if Some(*i as u32) == except {
            continue;
        }
        acc += q;
        last = Some(*i as u32);
        if r < acc {
            return *i as u32;
        }
    }
    // Only `except` had any mass (never drawn: its acceptance was certain).
    last.or(except).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_and_seeded_sampling() {
        let logits = [0.1, 2.0, 1.9, -1.0];
        let mut g = Sampler::new(SamplingParams::default());
        assert_eq!(g.sample(&logits), 1);
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            top_k: 3,
            seed: 7,
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        assert!(a.iter().all(|&t| t != 3), "top-k 3 excludes the lowest logit");
        assert!(a.contains(&1) && a.contains(&2));
    }

    proptest::proptest! {
        /// The integer ranking is the comparator's order exactly.
        #[test]
        fn ranking_matches_total_order(v in proptest::collection::vec(proptest::prelude::any::<f32>(), 0..300), dup in 0usize..4) {
            let mut v = v;
            for i in 0..dup.min(v.len()) {
                let j = v.len() - 1 - i;
                v[j] = v[i];
            }
            let mut want: Vec<usize> = (0..v.len()).collect();
            want.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
            proptest::prop_assert_eq!(ranked(&v), want);
        }
    }

    /// Speculative sampling gives each token its probability under the
    /// sampler's own distribution, whatever the draft: 200,000 seeded
    /// verifications per draft, each token's frequency within 5 standard
    /// deviations of a binomial(N, p) count of the exact probability (a
    /// false alarm per cell has odds below 1e-6; the seed fixes the draws,
    /// so the test is deterministic), and the draft accepted as often as
    /// its own probability says.
    #[test]
    fn verify_preserves_the_distribution() {
        let logits = [1.0, 2.5, 0.3, 2.0, -1.0, 1.7];
        let s0 = Sampler::new(SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 5,
            seed: 11,
        });
        let (idx, probs) = s0.distribution(&logits).unwrap();
        let mut exact = [0f64; 6];
        for (&i, &q) in idx.iter().zip(&probs) {
            exact[i] = q;
        }
        assert_eq!(exact[4], 0.0, "top-k 5 drops the lowest logit");
        const N: usize = 200_000;
        for draft in 0..6u32 {
            let mut s = s0.clone();
            let mut counts = [0usize; 6];
            let mut accepted = 0usize;
            for _ in 0..N {
                let (t, ok) = s.verify(&logits, draft);
                assert_eq!(ok, t == draft);
                counts[t as usize] += 1;
                accepted += usize::from(ok);
            }
            for (t, &p) in exact.iter().enumerate() {
                let f = counts[t] as f64 / N as f64;
                let sd = (p * (1.0 - p) / N as f64).sqrt();
                assert!(
                    (f - p).abs() <= 5.0 * sd + 1e-12,
                    "draft {draft}: token {t} drawn {f:.5}, exact {p:.5}"
                );
            }
            assert_eq!(accepted, counts[draft as usize]);
        }
    }

    #[test]
    fn greedy_verify_is_the_argmax() {
        let mut g = Sampler::new(SamplingParams::default());
        assert_eq!(g.verify(&[0.1, 2.0, 1.9], 1), (1, true));
        assert_eq!(g.verify(&[0.1, 2.0, 1.9], 2), (1, false));
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 0.01,
            top_k: 0,
            seed: 1,
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.0, 3.0, 1.0]), 1);
        }
    }
}
