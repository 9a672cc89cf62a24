//! Speculative greedy decoding: a cheap drafter proposes the next few tokens,
//! the model verifies them in one batched forward ([`Logits::All`]) and keeps
//! the longest prefix it agrees with, plus its own next token. Output is
//! identical to plain greedy decoding: every emitted token is the model's own
//! argmax at its position, and the sequence state is truncated back past
//! rejected drafts ([`SequenceState::truncate`]).
//!
//! Drafters: the model's next-token (MTP) head when it has one
//! ([`LanguageModel::draft`]), else n-gram prompt lookup (the continuation of
//! the most recent earlier occurrence of the last two tokens), which works
//! for any model. Drafting switches itself off when too few drafts are
//! accepted for the verification batches to pay.

use super::generate::{GenStats, Session, StopReason};
use super::{Engine, EngineError};
/// Most positions one verification forward may hold (the draft and the
/// token before it).
pub use crate::model::glm::ABSORB_MAX_TOKENS as MAX_VERIFY_TOKENS;
use crate::model::lm::Logits;
use crate::model::ops::argmax;

/// Where drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftMode {
    /// The MTP head when the model has one, else n-gram lookup.
    Auto,
    Mtp,
    Ngram,
}

/// Speculation settings of a session.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecOptions {
    pub mode: DraftMode,
    /// Drafts per verification forward.
    pub max_draft: usize,
    /// After `probe` proposals, drafting stops if fewer than this fraction
    /// were accepted.
    pub min_acceptance: f64,
    pub probe: u64,
}

impl Default for SpecOptions {
    fn default() -> Self {
        Self {
            mode: DraftMode::Auto,
            max_draft: 3,
            min_acceptance: 0.25,
            probe: 32,
        }
    }
}

/// A session's speculation state and statistics.
#[derive(Clone, Debug)]
pub struct Speculator {
    pub opts: SpecOptions,
    pub proposed: u64,
    pub accepted: u64,
    /// Forwards run while generating, and tokens they produced.
    pub forwards: u64,
    pub tokens: u64,
    /// Set when drafting is off, saying why.
    pub off: Option<String>,
    /// The drafter in use (decided on first use).
    pub using: Option<DraftMode>,
}

impl Speculator {
    pub fn new(opts: SpecOptions) -> Self {
        Self {
            opts,
            proposed: 0,
            accepted: 0,
            forwards: 0,
            tokens: 0,
            off: None,
            using: None,
        }
    }

    pub fn acceptance(&self) -> f64 {
        if self.proposed == 0 {
            0.0
        } else {
            self.accepted as f64 / self.proposed as f64
        }
    }

    pub fn tokens_per_forward(&self) -> f64 {
        if self.forwards == 0 {
            0.0
        } else {
            self.tokens as f64 / self.forwards as f64
        }
    }

    fn choose(&mut self, engine: &Engine) -> DraftMode {
        if let Some(m) = self.using {
            return m;
        }
        let m = resolve(self.opts.mode, engine.model.draft_head());
        self.using = Some(m);
        m
    }

    /// Counts a verification; switches drafting off when, after `probe`
    /// proposals, too few were accepted.
    pub(crate) fn record(&mut self, proposed: usize, accepted: usize) {
        self.proposed += proposed as u64;
        self.accepted += accepted as u64;
        if self.off.is_none()
            && self.proposed >= self.opts.probe
            && self.acceptance() < self.opts.min_acceptance
        {
            let why = format!(
                "{:.0}% of {} drafts accepted (< {:.0}%): drafting switched off",
                100.0 * self.acceptance(),
                self.proposed,
                100.0 * self.opts.min_acceptance
            );
            tracing::info!("speculative decoding: {why}");
            self.off = Some(why);
        }
    }
}

/// The drafter `mode` asks for, given whether the model has a draft head
/// (`head`, from [`crate::model::lm::LanguageModel::draft_head`]): MTP
/// when asked (or left to `Auto`) and available, n-gram lookup otherwise.
pub fn resolve(mode: DraftMode, head: Result<(), String>) -> DraftMode {
    match (mode, head) {
        (DraftMode::Ngram, _) => DraftMode::Ngram,
        (_, Ok(())) => DraftMode::Mtp,
        (DraftMode::Mtp, Err(why)) => {
            tracing::info!("speculative decoding: no MTP drafts ({why}); using n-gram lookup");
            DraftMode::Ngram
        }
        (DraftMode::Auto, Err(why)) => {
            tracing::debug!("speculative decoding: {why}; using n-gram lookup");
            DraftMode::Ngram
        }
    }
}

/// Up to `k` tokens that followed the most recent earlier occurrence of the
/// last two tokens of `ids`.
pub fn ngram_draft(ids: &[u32], k: usize) -> Vec<u32> {
    let n = ids.len();
    if n < 3 || k == 0 {
        return Vec::new();
    }
    let (a, b) = (ids[n - 2], ids[n - 1]);
    for i in (1..n - 1).rev() {
        if ids[i - 1] == a && ids[i] == b {
            return ids[i + 1..].iter().take(k).copied().collect();
        }
    }
    Vec::new()
}

/// Greedy generation with drafts (what [`Session::generate`] runs when the
/// session has a [`Speculator`] and the sampler is greedy).
pub(super) fn generate(
    session: &mut Session,
    spec: &mut Speculator,
    engine: &mut Engine,
    prompt: &[u32],
    max_tokens: usize,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<GenStats, EngineError> {
    let mut stats = GenStats {
        prompt_tokens: prompt.len(),
        ..GenStats::default()
    };
    let t0 = std::time::Instant::now();
    let mut logits = if prompt.is_empty() {
        match session.last_logits.clone() {
            Some(l) => l,
            None => return Ok(stats),
        }
    } else {
        session.feed(engine, prompt)?
    };
    stats.prefill_secs = t0.elapsed().as_secs_f64();
    let t1 = std::time::Instant::now();
    let mode = spec.choose(engine);
    let vocab = engine.model.vocab_size();
    let k_max = spec.opts.max_draft.min(MAX_VERIFY_TOKENS - 1);
    let mut reason = StopReason::Length;
    'outer: while stats.generated.len() < max_tokens {
        let id = argmax(&logits) as u32;
        if stats.generated.is_empty() {
            stats.first_token_secs = t0.elapsed().as_secs_f64();
        }
        stats.generated.push(id);
        let go_on = on_token(id);
        let room = max_tokens - stats.generated.len();
        if engine.stop_ids.contains(&id) || !go_on || room == 0 {
            reason = if engine.stop_ids.contains(&id) {
                StopReason::Stop
            } else if !go_on {
                StopReason::Cancelled
            } else {
                StopReason::Length
            };
            session.feed(engine, &[id])?;
            spec.forwards += 1;
            spec.tokens += 1;
            break;
        }
        let k = k_max.min(room);
        let drafts = if spec.off.is_some() || k == 0 {
            Vec::new()
        } else {
            match mode {
                DraftMode::Ngram => {
                    let mut ids = session.tokens.clone();
                    ids.push(id);
                    ngram_draft(&ids, k)
                }
                _ => {
                    let tag = engine.next_tag();
                    engine.model.draft(session.kv.as_mut(), id, k, tag)?
                }
            }
        };
        if drafts.is_empty() {
            logits = session.feed(engine, &[id])?;
            spec.forwards += 1;
            spec.tokens += 1;
            continue;
        }
        let base = session.tokens.len();
        let mut batch = Vec::with_capacity(1 + drafts.len());
        batch.push(id);
        batch.extend_from_slice(&drafts);
        let tag = engine.next_tag();
        let out = engine
            .model
            .forward(&batch, session.kv.as_mut(), tag, Logits::All)?;
        spec.forwards += 1;
        session.tokens.push(id);
        let mut kept = 0;
        while kept < drafts.len() && argmax(&out[kept * vocab..(kept + 1) * vocab]) as u32 == drafts[kept] {
            kept += 1;
        }
        spec.record(drafts.len(), kept);
        // Emit the accepted drafts one by one, honouring stops and cancels.
        let mut emitted = 0;
        let mut stop = None;
        for &d in &drafts[..kept] {
            stats.generated.push(d);
            emitted += 1;
            let go_on = on_token(d);
            if engine.stop_ids.contains(&d) {
                stop = Some(StopReason::Stop);
            } else if !go_on {
                stop = Some(StopReason::Cancelled);
            } else if stats.generated.len() >= max_tokens {
                stop = Some(StopReason::Length);
            }
            if stop.is_some() {
                break;
            }
        }
        session.tokens.extend_from_slice(&drafts[..emitted]);
        session.kv.truncate(base + 1 + emitted);
        spec.tokens += 1 + emitted as u64;
        logits = out[emitted * vocab..(emitted + 1) * vocab].to_vec();
        session.last_logits = Some(logits.clone());
        if let Some(r) = stop {
            reason = r;
            break 'outer;
        }
    }
    stats.decode_secs = t1.elapsed().as_secs_f64();
    stats.stop = Some(reason);
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_proposes_the_last_continuation() {
        assert_eq!(ngram_draft(&[1, 2, 3, 4, 1, 2], 2), vec![3, 4]);
        assert_eq!(ngram_draft(&[1, 2, 3, 1, 2, 9, 1, 2], 3), vec![9, 1, 2]);
        assert!(ngram_draft(&[1, 2, 3], 2).is_empty());
        assert!(ngram_draft(&[5, 6], 2).is_empty());
    }
}
