//! The stdin protocol's [`ServeEngine`] as a client of the decode-loop
//! actor: `coli serve` and `coli chat` are front ends like the HTTP API,
//! one synchronous conversation call at a time over the same loop.

use std::ops::ControlFlow;
use std::time::{SystemTime, UNIX_EPOCH};

use super::session::{GenOutcome, GenParams, ServeEngine};
use crate::chat_template::{ChatMessage, TemplateError};
use crate::runtime::{Event, GenRequest, LoopHandle, PromptMode, RequestError, SlotChoice};
use crate::sampling::SamplingParams;
use crate::tokenizer::TokenizerError;

/// Why a call through the loop failed.
#[derive(Debug, thiserror::Error)]
pub enum LoopServerError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("chat template: {0}")]
    Template(#[from] TemplateError),
    #[error("the decode loop stopped before the reply ended")]
    Gone,
}

/// What the last generation call measured, beyond the STAT fields.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LastCall {
    pub outcome: Option<GenOutcome>,
    /// Seconds from admission to the first sampled token.
    pub first_token_secs: f64,
    /// Tokens prefilled.
    pub prompt_tokens: usize,
}

/// [`ServeEngine`] over a [`LoopHandle`], with a local copy of each slot's
/// tokens (the protocol reads them often; the loop owns the real ones).
pub struct LoopServer {
    handle: LoopHandle,
    mirror: Vec<Vec<u32>>,
    top_k: usize,
    last: LastCall,
}

/// A seed for calls that name none: different per call, as upstream.
fn fresh_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
}

impl LoopServer {
    pub fn new(handle: LoopHandle, top_k: usize) -> Result<Self, LoopServerError> {
        handle.info().tokenizer()?;
        let slots = handle.info().slots;
        let mirror = (0..slots)
            .map(|s| handle.slot_tokens(s))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            handle,
            mirror,
            top_k,
            last: LastCall::default(),
        })
    }

    pub fn handle(&self) -> &LoopHandle {
        &self.handle
    }

    pub fn last_call(&self) -> LastCall {
        self.last
    }

    fn refresh(&mut self, slot: usize) -> Result<(), LoopServerError> {
        let t = self.handle.slot_tokens(slot)?;
        if let Some(m) = self.mirror.get_mut(slot) {
            *m = t;
        }
        Ok(())
    }
}

impl ServeEngine for LoopServer {
    type Error = LoopServerError;

    fn tokenize(&self, text: &str) -> Result<Vec<u32>, Self::Error> {
        Ok(self.handle.info().tokenizer()?.encode(text)?)
    }

    fn render_user_turn(&self, history: &[ChatMessage], user_text: &str) -> Result<String, Self::Error> {
        Ok(self.handle.info().template.render_turn(history, user_text)?)
    }

    fn slot_tokens(&self, slot: usize) -> &[u32] {
        self.mirror.get(slot).map_or(&[], |t| t.as_slice())
    }

    fn truncate_slot(&mut self, slot: usize, len: usize) -> Result<(), Self::Error> {
        self.handle.truncate_slot(slot, len)?;
        self.refresh(slot)
    }

    fn reset_slot(&mut self, slot: usize) -> Result<(), Self::Error> {
        self.handle.reset_slot(slot)?;
        self.refresh(slot)
    }

    fn prefill_and_generate(
        &mut self,
        slot: usize,
        tokens: &[u32],
        params: &GenParams,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<GenOutcome, Self::Error> {
        let req = GenRequest {
            slot: SlotChoice::Exact(slot),
            mode: PromptMode::Append,
            prompt: tokens.to_vec(),
            max_tokens: params.max_tokens,
            sampling: SamplingParams {
                temperature: params.temperature,
                top_p: params.top_p,
                top_k: self.top_k,
                seed: params.seed.unwrap_or_else(fresh_seed),
            },
            stop: Vec::new(),
            constraint: None,
            special_tokens: false,
        };
        let mut stream = self.handle.submit(req)?;
        let mut stopped = false;
        let finish = loop {
            match stream.recv() {
                Some(Event::Started { prefill, .. }) => self.last.prompt_tokens = prefill,
                Some(Event::Text { text, .. }) => {
                    if !stopped && !text.is_empty() && on_text(&text).is_break() {
                        // The reader is gone: end the reply, keep what was made.
                        stopped = true;
                        stream.cancel();
                    }
                }
                Some(Event::Done(f)) => break f,
                Some(Event::Failed(e)) => {
                    self.refresh(slot)?;
                    return Err(e.into());
                }
                None => return Err(LoopServerError::Gone),
            }
        };
        self.refresh(slot)?;
        let outcome = GenOutcome {
            emitted: finish.emitted,
            tok_per_s: finish.tok_per_s(),
            hit_pct: finish.hit_pct,
        };
        self.last = LastCall {
            outcome: Some(outcome),
            first_token_secs: finish.first_token_secs,
            prompt_tokens: self.last.prompt_tokens,
        };
        Ok(outcome)
    }

    fn persist(&mut self, _slot: usize) -> Result<(), Self::Error> {
        Ok(self.handle.flush()?)
    }

    fn finish(&mut self) -> Result<(), Self::Error> {
        Ok(self.handle.shutdown()?)
    }
}
