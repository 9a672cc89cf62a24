//! One timed decode pass, the unit every benchmark figure comes from.

use std::time::Instant;

use colibri_actors::SourceStats;

use super::WyRand;
use crate::engine::{Engine, EngineError, Session};
use crate::sampling::{Sampler, SamplingParams};

/// What one pass did: every token it produced, and time and expert traffic
/// of the measured window (the tokens after the warm-up ones).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassResult {
    /// Warm-up and measured tokens, in order.
    pub tokens: Vec<u32>,
    /// Tokens in the measured window.
    pub measured: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    /// Source counters over the measured window only.
    pub window: SourceStats,
}

impl PassResult {
    pub fn tok_per_s(&self) -> f64 {
        if self.decode_secs > 0.0 {
            self.measured as f64 / self.decode_secs
        } else {
            0.0
        }
    }

    pub fn missed_bytes_per_token(&self) -> f64 {
        if self.measured == 0 {
            0.0
        } else {
            self.window.bytes_read as f64 / self.measured as f64
        }
    }
}

/// Counter differences `after - before`.
pub fn stats_delta(before: SourceStats, after: SourceStats) -> SourceStats {
    SourceStats {
        hits: after.hits.saturating_sub(before.hits),
        misses: after.misses.saturating_sub(before.misses),
        bytes_read: after.bytes_read.saturating_sub(before.bytes_read),
        pilot_hits: after.pilot_hits.saturating_sub(before.pilot_hits),
        pilot_routed: after.pilot_routed.saturating_sub(before.pilot_routed),
    }
}

/// A prompt of `len` ids drawn from `[0, vocab)` by `seed`: synthetic
/// models have no tokenizer, and a fixed prompt keeps passes comparable.
pub fn synthetic_prompt(vocab: usize, len: usize, seed: u64) -> Vec<u32> {
    let mut rng = WyRand::new(seed ^ 0x5052_4f4d_5054);
    let vocab = vocab.max(1) as u64;
    (0..len).map(|_| (rng.next_u64() % vocab) as u32).collect()
}

/// Resets `session`, prefills `prompt`, then decodes greedily
/// `warmup + tokens` tokens, timing only the last `tokens` decode steps.
/// Stop ids are ignored: a benchmark decodes exactly what it was asked.
///
/// Repeated passes on one engine must reuse one session: the reset moves
/// its generation on, so the expert source sees newer tags (a second fresh
/// session would start at generation 0 again, and the pipeline would treat
/// its requests as stale).
pub fn decode_pass(
    engine: &mut Engine,
    session: &mut Session,
    prompt: &[u32],
    warmup: usize,
    tokens: usize,
) -> Result<PassResult, EngineError> {
    session.reset();
    let mut sampler = Sampler::new(SamplingParams::default());
    let t0 = Instant::now();
    let mut logits = session.feed(engine, prompt)?;
    let prefill_secs = t0.elapsed().as_secs_f64();
    let mut out = Vec::with_capacity(warmup + tokens);
    for _ in 0..warmup {
        let id = sampler.sample(&logits);
        out.push(id);
        logits = session.feed(engine, &[id])?;
    }
    let before = engine.stats();
    let t1 = Instant::now();
    for _ in 0..tokens {
        let id = sampler.sample(&logits);
        out.push(id);
        logits = session.feed(engine, &[id])?;
    }
    let decode_secs = t1.elapsed().as_secs_f64();
    Ok(PassResult {
        tokens: out,
        measured: tokens,
        prefill_secs,
        decode_secs,
        window: stats_delta(before, engine.stats()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_is_seeded_and_in_range() {
        let a = synthetic_prompt(100, 50, 3);
        assert_eq!(a, synthetic_prompt(100, 50, 3));
        assert_ne!(a, synthetic_prompt(100, 50, 4));
        assert!(a.iter().all(|&t| t < 100));
    }

    #[test]
    fn rates() {
        let r = PassResult {
            measured: 4,
            decode_secs: 2.0,
            window: SourceStats {
                bytes_read: 400,
                ..SourceStats::default()
            },
            ..PassResult::default()
        };
        assert_eq!(r.tok_per_s(), 2.0);
        assert_eq!(r.missed_bytes_per_token(), 100.0);
    }
}
