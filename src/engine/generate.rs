//! The token loop: prefill, then decode one token at a time until a stop id,
//! the token limit, or the caller says stop.

use std::time::Instant;

use super::speculative::{self, Speculator};
use super::{Engine, EngineError};
use crate::model::lm::{Logits, SequenceState};
use crate::sampling::Sampler;

/// Most prompt tokens one forward pass runs: the decode loop's default
/// `prefill_chunk` too, so `coli run` and `coli serve` prefill alike.
pub const PREFILL_CHUNK: usize = 512;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Stop,
    Length,
    Cancelled,
}

/// What a generation did, for the STAT line and `--profile`.
#[derive(Clone, Debug, Default)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub generated: Vec<u32>,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    pub first_token_secs: f64,
    pub stop: Option<StopReason>,
}

impl GenStats {
    pub fn decode_tok_per_s(&self) -> f64 {
        if self.decode_secs > 0.0 && !self.generated.is_empty() {
            self.generated.len() as f64 / self.decode_secs
        } else {
            0.0
        }
    }
}

/// One conversation: its token history and KV cache. A token whose logits
/// were computed but which is not in the cache yet is kept as `pending`.
pub struct Session {
    pub kv: Box<dyn SequenceState>,
    pub tokens: Vec<u32>,
    /// Logits after the last token in `tokens`, when known.
    pub last_logits: Option<Vec<f32>>,
    /// Speculative decoding for greedy generation (off when `None`).
    pub spec: Option<Speculator>,
}

impl Session {
    pub fn new(kv: Box<dyn SequenceState>) -> Self {
        Self {
            kv,
            tokens: Vec::new(),
            last_logits: None,
            spec: None,
        }
    }

    pub fn reset(&mut self) {
        self.kv.truncate(0);
        self.tokens.clear();
        self.last_logits = None;
    }

    /// Keeps only the first `n` tokens (prefix reuse).
    pub fn truncate(&mut self, n: usize) {
        if n < self.tokens.len() {
            self.tokens.truncate(n);
            self.kv.truncate(n);
            self.last_logits = None;
        }
    }

    /// Runs `tokens` into the cache and returns the logits after the last one.
    ///
    /// A long prompt runs in pieces of [`PREFILL_CHUNK`] tokens: a forward
    /// pass holds activations for every row it runs (queries, keys, values,
    /// expert inputs and outputs), so one pass over a 32k-token prompt would
    /// hold gigabytes that a 512-row piece does not, and a piece's rows stay
    /// in the CPU caches between the layers. The pieces give the same
    /// numbers as one pass: every row's arithmetic depends only on its own
    /// position and the cache before it.
    pub fn feed(&mut self, engine: &mut Engine, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut logits = Vec::new();
        for piece in tokens.chunks(PREFILL_CHUNK) {
            let tag = engine.next_tag();
            let start = self.kv.len();
            match engine.model.forward(piece, self.kv.as_mut(), tag, Logits::Last) {
                Ok(l) => logits = l,
                Err(e) => {
                    // Earlier pieces are kept; the failed one may have left
                    // partial positions. A recurrent state keeps only what
                    // its last checkpoint restores, and `tokens` follows.
                    let kept = self.kv.truncate(start);
                    self.tokens.truncate(kept);
                    self.last_logits = None;
                    return Err(e.into());
                }
            }
            self.tokens.extend_from_slice(piece);
        }
        self.last_logits = Some(logits.clone());
        Ok(logits)
    }

    /// Appends `prompt` and generates up to `max_tokens` tokens. `on_token`
    /// sees each generated id and returns false to stop early. The last
    /// generated token is fed to the cache too, so the session can continue.
    pub fn generate(
        &mut self,
        engine: &mut Engine,
        prompt: &[u32],
        max_tokens: usize,
        sampler: &mut Sampler,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<GenStats, EngineError> {
        let greedy = !(sampler.params.temperature > 0.0 && sampler.params.temperature.is_finite());
        if greedy && let Some(mut spec) = self.spec.take() {
            let r = speculative::generate(self, &mut spec, engine, prompt, max_tokens, on_token);
            self.spec = Some(spec);
            return r;
        }
        let mut stats = GenStats {
            prompt_tokens: prompt.len(),
            ..GenStats::default()
        };
        let t0 = Instant::now();
        let mut logits = if prompt.is_empty() {
            match self.last_logits.clone() {
                Some(l) => l,
                None => return Ok(stats),
            }
        } else {
            self.feed(engine, prompt)?
        };
        stats.prefill_secs = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut reason = StopReason::Length;
        for i in 0..max_tokens {
            let id = sampler.sample(&logits);
            if i == 0 {
                stats.first_token_secs = t0.elapsed().as_secs_f64();
            }
            stats.generated.push(id);
            let go_on = on_token(id);
            if engine.stop_ids.contains(&id) {
                reason = StopReason::Stop;
                // The stop token still joins the history so the next turn follows it.
                self.feed(engine, &[id])?;
                break;
            }
            logits = self.feed(engine, &[id])?;
            if !go_on {
                reason = StopReason::Cancelled;
                break;
            }
        }
        stats.decode_secs = t1.elapsed().as_secs_f64();
        stats.stop = Some(reason);
        Ok(stats)
    }
}
