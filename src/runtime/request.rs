//! What a front end asks the decode loop for and what it hears back. These
//! types belong to the runtime: the stdin protocol, the multiplexed protocol
//! and the HTTP API all translate to and from them.

use crate::sampling::SamplingParams;

/// Identifies a request for its whole life (cancellation, events).
pub type RequestId = u64;

/// Most KV slots (concurrent conversations) a server may hold.
pub const MAX_SLOTS: usize = 16;

/// Which conversation slot a request runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotChoice {
    /// This slot; refused with [`RequestError::SlotBusy`] while another
    /// request runs in it.
    Exact(usize),
    /// Any free slot (the one whose history is worth most to the prompt:
    /// `decode_loop/slots.rs`); waits in the admission queue while all are
    /// busy.
    Any,
}

/// How the prompt relates to what the slot already holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptMode {
    /// The tokens follow the slot's history (a chat turn, a continuation).
    Append,
    /// The tokens are the whole sequence: the longest common prefix with the
    /// slot's history is kept and only the rest is computed.
    Replace,
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub slot: SlotChoice,
    pub mode: PromptMode,
    pub prompt: Vec<u32>,
    /// Most tokens to generate (0: prefill only).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Text that ends the reply when generated (not included in it).
    pub stop: Vec<String>,
    /// What the reply must match, enforced while sampling (`None`: free text).
    pub constraint: Option<super::constraint::ConstraintSpec>,
    /// Stream special tokens as text too (end-of-turn tokens excepted):
    /// the chat front ends read reasoning and tool calls out of markers
    /// that are special tokens in some vocabularies (gpt-oss's
    /// `<|channel|>`, GLM's `<tool_call>`). Stop strings then see them too.
    pub special_tokens: bool,
}

/// Why a reply ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// The token limit or the context's end.
    Length,
    /// The client cancelled or went away, or the server shut down.
    Cancelled,
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens in the request's prompt.
    pub prompt_tokens: usize,
    /// Of those, tokens computed (the rest were reused from the slot).
    pub prefilled: usize,
    /// Tokens generated (a stop token included, as it was sampled).
    pub completion_tokens: usize,
}

impl Usage {
    /// Prompt tokens not computed for this request: reused from the slot's
    /// history, or copied from another slot or the prompt cache.
    pub fn cached(&self) -> usize {
        self.prompt_tokens.saturating_sub(self.prefilled)
    }
}

/// How a request ended, with what the STAT lines and usage fields print.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    pub usage: Usage,
    /// Generated tokens streamed as text (stop tokens are not).
    pub emitted: usize,
    /// The reply stopped at its token budget.
    pub length_limited: bool,
    /// Seconds from admission to the first sampled token.
    pub first_token_secs: f64,
    /// Seconds from admission to the end.
    pub total_secs: f64,
    /// Expert cache hit rate while the request ran, percent.
    pub hit_pct: f64,
}

impl Finish {
    /// Emitted tokens per second over the request's life, prefill included.
    pub fn tok_per_s(&self) -> f64 {
        if self.total_secs > 0.0 {
            self.emitted as f64 / self.total_secs
        } else {
            0.0
        }
    }
}

/// What the decode loop tells a request's owner, in order: `Started` or
/// `Failed` first, then `Text` pieces, then `Done` (or `Failed`).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Started {
        slot: usize,
        /// Positions the slot holds once the prompt is in.
        context_tokens: usize,
        /// Prompt tokens that will be computed (the rest are reused).
        prefill: usize,
    },
    /// Text of one or more generated tokens (possibly empty while a
    /// multi-byte character or a possible stop string is incomplete).
    Text {
        text: String,
        tokens: Vec<u32>,
    },
    Done(Finish),
    Failed(RequestError),
}

/// Why a request was refused or failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the admission queue is full ({0} requests waiting)")]
    QueueFull(usize),
    #[error("slot {0} is busy with another request")]
    SlotBusy(usize),
    #[error("slot {slot} does not exist ({slots} slots)")]
    BadSlot { slot: usize, slots: usize },
    #[error("request id {0} is already in use")]
    DuplicateId(RequestId),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("{used} tokens exceed the context of {limit}")]
    ContextExceeded { used: usize, limit: usize },
    #[error("token id {id} is outside the vocabulary ({vocab})")]
    BadToken { id: u32, vocab: usize },
    #[error("the request was cancelled")]
    Cancelled,
    #[error("the server is shutting down")]
    Shutdown,
    /// The request's constraint does not compile (refused at admission).
    #[error("{0}")]
    Constraint(#[from] crate::grammar::ConstraintError),
    #[error("{0}")]
    Engine(String),
}
