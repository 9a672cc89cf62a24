//! One request through the decode loop: submitted and admitted
//! ([`start`] returns once the loop said yes or no, so the HTTP status is
//! known before any byte of the reply), then its text and the reason it
//! stopped. Dropping a [`Job`] before its end cancels the request.

use std::sync::Arc;

use crate::runtime::{Event, FinishReason, GenRequest, LoopHandle, RequestError, RequestStream};
use crate::tokenizer::Tokenizer;

/// Why a reply ended, in the terms the APIs report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopKind {
    /// The model ended its turn (a stop token).
    EndTurn,
    /// One of the request's stop strings (which one, when it can be told).
    Sequence(Option<String>),
    /// The token budget or the context's end.
    Length,
}

/// How a finished reply ended, with its token counts and times.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub stop: StopKind,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens not computed (the slot's history, another slot, the
    /// prompt cache).
    pub cached_tokens: usize,
    /// Prompt tokens computed.
    pub prefilled: usize,
    /// Seconds from admission to the first sampled token (the prefill).
    pub prompt_secs: f64,
    /// Seconds from the first sampled token to the end.
    pub predicted_secs: f64,
}

impl Outcome {
    /// OpenAI's `finish_reason`.
    pub fn openai_reason(&self) -> &'static str {
        match self.stop {
            StopKind::EndTurn | StopKind::Sequence(_) => "stop",
            StopKind::Length => "length",
        }
    }

    /// OpenAI's `finish_reason` for a chat reply that made `calls` tool
    /// calls: `tool_calls` when it made some and was not cut short.
    pub fn openai_chat_reason(&self, calls: usize) -> &'static str {
        match self.stop {
            StopKind::Length => "length",
            _ if calls > 0 => "tool_calls",
            _ => self.openai_reason(),
        }
    }

    /// Anthropic's `stop_reason` for a reply that made `calls` tool calls.
    pub fn anthropic_chat_reason(&self, calls: usize) -> &'static str {
        match self.stop {
            StopKind::Length => "max_tokens",
            _ if calls > 0 => "tool_use",
            _ => self.anthropic_reason(),
        }
    }

    /// Anthropic's `stop_reason`.
    pub fn anthropic_reason(&self) -> &'static str {
        match self.stop {
            StopKind::EndTurn => "end_turn",
            StopKind::Sequence(_) => "stop_sequence",
            StopKind::Length => "max_tokens",
        }
    }

    /// Anthropic's `stop_sequence`.
    pub fn stop_sequence(&self) -> Option<&str> {
        match &self.stop {
            StopKind::Sequence(s) => s.as_deref(),
            _ => None,
        }
    }
}

/// What a running request produced next.
#[derive(Debug)]
pub enum Step {
    Text(String),
    Done(Outcome),
    Failed(RequestError),
}

/// An admitted request.
pub struct Job {
    stream: RequestStream,
    tokenizer: Arc<Tokenizer>,
    stops: Vec<String>,
    /// The reply's text keeps special tokens (so stop strings were matched
    /// against that text).
    special: bool,
    /// Generated tokens streamed so far (to tell which stop string matched).
    tokens: Vec<u32>,
    pub prompt_tokens: usize,
    /// Prompt tokens the loop did not have to compute, known at admission.
    pub cached_tokens: usize,
}

/// Submits `req` and waits until the loop admits it (it may wait in the
/// admission queue) or refuses it.
pub async fn start(handle: &LoopHandle, req: GenRequest) -> Result<Job, RequestError> {
    let stops = req.stop.clone();
    let special = req.special_tokens;
    let prompt_tokens = req.prompt.len();
    let mut stream = handle.submit_async(req).await?;
    loop {
        match stream.recv_async().await {
            Some(Event::Started { prefill, .. }) => {
                return Ok(Job {
                    stream,
                    tokenizer: handle
                        .info()
                        .tokenizer()
                        .map_err(|e| RequestError::Engine(e.to_string()))?
                        .clone(),
                    stops,
                    special,
                    tokens: Vec::new(),
                    prompt_tokens,
                    cached_tokens: prompt_tokens.saturating_sub(prefill),
                });
            }
            Some(Event::Failed(e)) => return Err(e),
            // Cancelled while queued: only a shutdown does that.
            Some(Event::Done(_)) | None => return Err(RequestError::Shutdown),
            Some(Event::Text { .. }) => {}
        }
    }
}

impl Job {
    /// The next piece of text (never empty), or the end.
    pub async fn next(&mut self) -> Step {
        loop {
            match self.stream.recv_async().await {
                Some(Event::Text { text, tokens }) => {
                    self.tokens.extend_from_slice(&tokens);
                    if !text.is_empty() {
                        return Step::Text(text);
                    }
                }
                Some(Event::Done(f)) => {
                    let stop = match f.reason {
                        FinishReason::Length => StopKind::Length,
                        // Every streamed token was text: a stop string ended it.
                        FinishReason::Stop if f.emitted >= f.usage.completion_tokens => {
                            StopKind::Sequence(self.matched_stop())
                        }
                        FinishReason::Stop => StopKind::EndTurn,
                        // Only a shutdown cancels a request whose reader is here.
                        FinishReason::Cancelled => return Step::Failed(RequestError::Shutdown),
                    };
                    return Step::Done(Outcome {
                        stop,
                        prompt_tokens: f.usage.prompt_tokens,
                        completion_tokens: f.usage.completion_tokens,
                        cached_tokens: f.usage.cached(),
                        prefilled: f.usage.prefilled,
                        prompt_secs: f.first_token_secs,
                        predicted_secs: (f.total_secs - f.first_token_secs).max(0.0),
                    });
                }
                Some(Event::Failed(e)) => return Step::Failed(e),
                Some(Event::Started { .. }) => {}
                None => return Step::Failed(RequestError::Shutdown),
            }
        }
    }

    /// The whole reply (non-streaming calls).
    pub async fn collect(mut self) -> Result<(String, Outcome), RequestError> {
        let mut text = String::new();
        loop {
            match self.next().await {
                Step::Text(t) => text.push_str(&t),
                Step::Done(o) => return Ok((text, o)),
                Step::Failed(e) => return Err(e),
            }
        }
    }

    /// The stop string that ended the reply: the earliest one in the text
    /// of the generated tokens.
    fn matched_stop(&self) -> Option<String> {
        let text = self.tokenizer.decode_with(&self.tokens, self.special).ok()?;
        self.stops
            .iter()
            .filter_map(|s| text.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at)
            .map(|(_, s)| s.clone())
    }
}
