//! One timed decode pass, the unit every benchmark figure comes from.

use std::time::Instant;

use colibri_actors::{PipelineProfile, SourceStats};

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
    /// Pipeline counters over the measured window (demand and prefetch
    /// bytes, pilot precision); `None` for sources without them.
    pub profile: Option<PipelineProfile>,
    /// The engine's routing-trace marks at the window's start and end
    /// (`TraceRecorder::mark`): the window's steps are those between.
    pub window_marks: (u64, u64),
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
        self.per_token(self.window.bytes_read)
    }

    fn per_token(&self, bytes: u64) -> f64 {
        if self.measured == 0 {
            0.0
        } else {
            bytes as f64 / self.measured as f64
        }
    }

    /// Bytes per token read for experts compute used (demand reads and
    /// prefetches that were then delivered): what the I/O bound divides
    /// by. All bytes read when the source has no breakdown.
    pub fn needed_bytes_per_token(&self) -> f64 {
        match &self.profile {
            Some(p) => self.per_token(p.needed_bytes()),
            None => self.missed_bytes_per_token(),
        }
    }

    /// Prefetched bytes per token evicted or discarded before any use.
    pub fn wasted_bytes_per_token(&self) -> f64 {
        self.profile
            .as_ref()
            .map_or(0.0, |p| self.per_token(p.prefetch_wasted_bytes))
    }
}

/// Token ids from a replay file: integers separated by whitespace and/or
/// commas. `None` when the text is not such a list (it is then prose for
/// the tokenizer); an empty list is `Some(vec![])`.
pub fn parse_replay_ids(text: &str) -> Option<Vec<u32>> {
    text.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .map(|w| w.parse::<u32>().ok())
        .collect()
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
    timed_pass(engine, session, prompt, None, warmup, tokens)
}

/// Like [`decode_pass`], but the `warmup + tokens` decode steps feed the
/// given `forced` ids one at a time instead of the greedy choice (teacher
/// forcing), so routing follows real text rather than the loop a random
/// model falls into. `tokens` of the result are still the greedy choices at
/// each step (what the determinism check compares). `forced` must hold at
/// least `warmup + tokens` ids.
pub fn replay_pass(
    engine: &mut Engine,
    session: &mut Session,
    prompt: &[u32],
    forced: &[u32],
    warmup: usize,
    tokens: usize,
) -> Result<PassResult, EngineError> {
    if forced.len() < warmup + tokens {
        return Err(EngineError::Option(format!(
            "replay: {} forced tokens, need {} (warm-up {warmup} + measured {tokens})",
            forced.len(),
            warmup + tokens
        )));
    }
    timed_pass(engine, session, prompt, Some(forced), warmup, tokens)
}

fn timed_pass(
    engine: &mut Engine,
    session: &mut Session,
    prompt: &[u32],
    forced: Option<&[u32]>,
    warmup: usize,
    tokens: usize,
) -> Result<PassResult, EngineError> {
    session.reset();
    let mut sampler = Sampler::new(SamplingParams::default());
    let t0 = Instant::now();
    let mut logits = session.feed(engine, prompt)?;
    let prefill_secs = t0.elapsed().as_secs_f64();
    let mut out = Vec::with_capacity(warmup + tokens);
    let mut before = (engine.stats(), engine.profile());
    let mut t1 = Instant::now();
    let mut start_mark = engine.usage().trace().mark();
    for i in 0..warmup + tokens {
        if i == warmup {
            before = (engine.stats(), engine.profile());
            start_mark = engine.usage().trace().mark();
            t1 = Instant::now();
        }
        let id = sampler.sample(&logits);
        out.push(id);
        let feed = forced.and_then(|f| f.get(i).copied()).unwrap_or(id);
        logits = session.feed(engine, &[feed])?;
    }
    let decode_secs = t1.elapsed().as_secs_f64();
    let profile = match (before.1, engine.profile()) {
        (Some(b), Some(a)) => Some(a.since(&b)),
        _ => None,
    };
    Ok(PassResult {
        tokens: out,
        measured: tokens,
        prefill_secs,
        decode_secs,
        window: stats_delta(before.0, engine.stats()),
        profile,
        window_marks: (start_mark, engine.usage().trace().mark()),
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
    fn replay_ids_or_text() {
        assert_eq!(parse_replay_ids("1, 2,3\n 4\t5,"), Some(vec![1, 2, 3, 4, 5]));
        assert_eq!(parse_replay_ids("  \n"), Some(vec![]));
        assert_eq!(parse_replay_ids("The river runs 2 miles"), None);
        assert_eq!(parse_replay_ids("1 -2"), None);
        assert_eq!(parse_replay_ids("99999999999"), None);
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
