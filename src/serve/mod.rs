//! `coli serve`: the stdin/stdout protocol of docs/serve-protocol.md, and
//! (`--batch`, in [`batch`]) the multiplexed one of docs/serve-batch-protocol.md.
//!
//! Three layers, each testable alone:
//! - [`frame`]: bytes in -> [`Frame`]s, never desynchronising on bad input;
//! - [`reply`]: the exact bytes out (READY, END, both STAT shapes);
//! - [`session`]: [`run_serve`], a state machine over frames that drives a
//!   [`ServeEngine`] (the model) and owns every protocol decision.
//!
//! # Session semantics (what [`run_serve`] does per frame)
//! - **plain line**: a chat turn on slot 0. The text the turn adds is
//!   [`ServeEngine::render_user_turn`]`(history, line)` (the engine renders
//!   its chat template, e.g. with `ChatTemplate::render_turn`); its tokens are
//!   prefilled after the slot's history and the reply streamed, then
//!   `\n` END + long STAT (`prompt_tokens` = the turn's tokens). When the slot
//!   holds tokens but no chat history (state resumed from disk, or raw PROMPT
//!   traffic on slot 0) the history passed is a placeholder `[user "",
//!   assistant ""]`, so the template yields a continuation without the
//!   conversation preamble (BOS, `[gMASK]<sop>`). If the turn would not fit
//!   `max_ctx`, slot 0 is reset and the turn starts a new conversation. An
//!   empty line gets END + short zero STAT.
//! - **`\x02RESET`**: slot 0 is cleared (memory and disk via
//!   [`ServeEngine::reset_slot`]); END + short zero STAT.
//! - **`\x02MORE`**: continues the last reply of the most recently used slot
//!   if it stopped at its token limit, with the same sampling parameters: the
//!   last token is re-fed (it was sampled but not yet forwarded) and
//!   generation resumes; `\n` END + short STAT. Otherwise END + short zero STAT.
//! - **`\x02PROMPT`**: the body is tokenized as-is (no template) for slot
//!   `kv_slot` (default 0). The longest common prefix with the slot's tokens is
//!   kept ([`ServeEngine::truncate_slot`]) and only the tail is prefilled; a
//!   prompt equal to (a prefix of) the history re-feeds its last token to get
//!   fresh logits. `max_tokens` is capped by [`ServeConfig::max_tokens`]. Reply:
//!   raw text, END without a leading newline, long STAT with `prompt_tokens` =
//!   the tokens actually prefilled (the prompt minus the reused prefix), so a
//!   front end can see what prefix reuse saved.
//! - **malformed frame** (and a prompt that is empty after tokenization, not
//!   UTF-8, or that the engine refuses to tokenize/render): the reason goes to
//!   the diagnostics stream; END + `STAT 0 0.00 0.0 <rss> 0 0`.
//! - **EOF**: [`ServeEngine::persist`] for every slot, then
//!   [`ServeEngine::finish`]; `Ok(())`. A reply stream that fails (the
//!   client closed stdout) ends the session the same way, then its error is
//!   returned.
//!
//! The generation budget of a reply is
//! [`limits::reply_budget`](crate::runtime::limits::reply_budget)`(len,
//! max_tokens, max_ctx)`, `min(max_tokens, max_ctx - len - 2)`, where `len`
//! counts the slot's tokens after the prefill; `length_limited` is
//! `emitted >= budget`, exactly as upstream.

pub mod batch;
mod error;
pub mod frame;
mod loop_engine;
pub mod reply;
mod rss;
mod session;

pub use error::ServeError;
pub use frame::{Frame, FrameLimits, FrameReader, MAX_PROMPT_BYTES};
pub use loop_engine::{LastCall, LoopServer, LoopServerError};
pub use rss::rss_gb;
pub use session::{GenOutcome, GenParams, MAX_KV_SLOTS, ServeConfig, ServeEngine, run_serve};
