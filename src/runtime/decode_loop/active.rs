//! A request admitted into a slot: its sampler, stop rules, constraint,
//! streaming text decoder and counters. Turning logits into the next event
//! happens here.

use std::time::Instant;

use colibri_actors::SourceStats;

use crate::engine::speculative::Speculator;
use crate::grammar::{Constrained, EnforceError, Progress};
use crate::runtime::request::{Event, Finish, FinishReason, RequestId, Usage};
use crate::runtime::stop::StopMatcher;
use crate::sampling::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};

pub struct Active {
    pub id: RequestId,
    pub slot: usize,
    pub events: flume::Sender<Event>,
    pub sampler: Sampler,
    pub stop: StopMatcher,
    pub detok: StreamDecoder,
    /// Most tokens to sample (`max_tokens` cut by the context).
    pub budget: usize,
    pub generated: usize,
    pub emitted: usize,
    pub usage: Usage,
    pub started: Instant,
    pub first_token_secs: Option<f64>,
    pub stats_before: SourceStats,
    /// Cancelled while lent to a step: finished when the step returns.
    pub cancelled: bool,
    /// What the reply must match (None: free text, and no cost).
    pub constraint: Option<Constrained>,
    /// Speculative decoding's state (None: this request decodes without
    /// drafts: `--draft off`, or a constrained reply, whose mask is
    /// prepared for one position per step).
    pub spec: Option<Speculator>,
}

/// What sampling one token decided.
pub enum Next {
    /// Keep decoding (the token was pushed to the history).
    Continue,
    /// The request is over.
    Finished(FinishReason, bool),
    /// The constraint could not be enforced: the request fails.
    Failed(EnforceError),
}

impl Active {
    /// Samples from `logits` (masked first by the constraint, if any),
    /// appends the token to `history` (computed at the next step, or at the
    /// next request on this slot), streams its text and applies the stop
    /// rules. A constraint that is complete ends the reply as its end token
    /// would: the token is appended without a forward step, since the mask
    /// would allow nothing else.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        history: &mut Vec<u32>,
        stop_ids: &[u32],
        tok: Option<&Tokenizer>,
    ) -> Next {
        if let Some(c) = self.constraint.as_mut()
            && let Err(e) = c.mask_logits(logits)
        {
            return Next::Failed(e);
        }
        let id = self.sampler.sample(logits);
        self.take(id, history, stop_ids, tok)
    }

    /// Decides the tokens after a verified draft: `rows` holds the logits
    /// of every position the step computed for this request (the token
    /// before the draft, then each draft token), `drafts` the draft. Row
    /// `i` decides draft `i` ([`Sampler::verify`]); the first token that is
    /// not the draft, or one past the last draft (row `drafts.len()`),
    /// ends the step's tokens. Each token goes through the same stop rules
    /// as a sampled one ([`Self::take`]), so a stop, the budget or a
    /// cancel ends the run early. Returns what the last token decided,
    /// the tokens taken and how many of them were drafts accepted.
    pub fn verify(
        &mut self,
        rows: &[f32],
        vocab: usize,
        drafts: &[u32],
        history: &mut Vec<u32>,
        stop_ids: &[u32],
        tok: Option<&Tokenizer>,
    ) -> (Next, usize, usize) {
        let (mut taken, mut accepted) = (0, 0);
        for (i, row) in rows.chunks_exact(vocab.max(1)).enumerate() {
            let (id, agreed) = match drafts.get(i) {
                Some(&d) => self.sampler.verify(row, d),
                None => (self.sampler.sample(row), false),
            };
            taken += 1;
            accepted += usize::from(agreed);
            let next = self.take(id, history, stop_ids, tok);
            if !agreed || self.cancelled || !matches!(next, Next::Continue) {
                return (next, taken, accepted);
            }
        }
        (Next::Continue, taken, accepted)
    }

    /// Takes `id` as the reply's next token: appends it to `history`,
    /// streams its text and applies the stop rules.
    fn take(&mut self, id: u32, history: &mut Vec<u32>, stop_ids: &[u32], tok: Option<&Tokenizer>) -> Next {
        self.generated += 1;
        self.usage.completion_tokens += 1;
        if self.first_token_secs.is_none() {
            self.first_token_secs = Some(self.started.elapsed().as_secs_f64());
        }
        history.push(id);
        if stop_ids.contains(&id) {
            let rest = self.stop.finish();
            self.send_text(rest, Vec::new());
            return Next::Finished(FinishReason::Stop, false);
        }
        let progress = match self.constraint.as_mut().map(|c| c.commit(id)) {
            Some(Err(e)) => return Next::Failed(e),
            Some(Ok(p)) => p,
            None => Progress::Open,
        };
        self.emitted += 1;
        let piece = match tok.map(|t| self.detok.push(t, id)) {
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                tracing::warn!("request {}: token {id} does not decode: {e}", self.id);
                String::new()
            }
            None => String::new(),
        };
        let released = self.stop.push(&piece);
        self.send_text(released.text, vec![id]);
        if released.stopped {
            return Next::Finished(FinishReason::Stop, false);
        }
        if progress == Progress::Complete {
            // Within the budget only: the history never outgrows the context.
            if let Some(&end) = stop_ids.first()
                && self.generated < self.budget
            {
                history.push(end);
                self.generated += 1;
                self.usage.completion_tokens += 1;
            }
            let rest = self.stop.finish();
            self.send_text(rest, Vec::new());
            return Next::Finished(FinishReason::Stop, false);
        }
        if self.generated >= self.budget {
            let rest = self.stop.finish();
            self.send_text(rest, Vec::new());
            return Next::Finished(FinishReason::Length, true);
        }
        Next::Continue
    }

    fn send_text(&mut self, text: String, tokens: Vec<u32>) {
        if text.is_empty() && tokens.is_empty() {
            return;
        }
        if self.events.send(Event::Text { text, tokens }).is_err() {
            // The reader is gone: nobody wants the rest.
            self.cancelled = true;
        }
    }

    /// The closing record.
    pub fn finish(&self, reason: FinishReason, length_limited: bool, after: SourceStats) -> Finish {
        let hits = after.hits.saturating_sub(self.stats_before.hits);
        let misses = after.misses.saturating_sub(self.stats_before.misses);
        Finish {
            reason,
            usage: self.usage,
            emitted: self.emitted,
            length_limited,
            first_token_secs: self.first_token_secs.unwrap_or(0.0),
            total_secs: self.started.elapsed().as_secs_f64(),
            hit_pct: if hits + misses == 0 {
                0.0
            } else {
                100.0 * hits as f64 / (hits + misses) as f64
            },
        }
    }
}
