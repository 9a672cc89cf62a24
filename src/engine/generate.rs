//! The token loop: prefill, then decode one token at a time until a stop id,
//! the token limit, or the caller says stop.

use std::time::Instant;

use super::speculative::{self, Speculator};
use super::{Engine, EngineError};
use crate::model::lm::{Logits, SequenceState};
use crate::sampling::Sampler;

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
    pub fn feed(&mut self, engine: &mut Engine, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let tag = engine.next_tag();
        let logits = engine
            .model
            .forward(tokens, self.kv.as_mut(), tag, Logits::Last)?;
        self.tokens.extend_from_slice(tokens);
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
