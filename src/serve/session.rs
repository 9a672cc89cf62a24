//! The serve state machine: frames in, engine calls and reply bytes out.
//! Semantics are documented on the [`crate::serve`] module.

use std::io::{self, BufRead, Write};
use std::ops::ControlFlow;

use super::error::ServeError;
use super::frame::{Frame, FrameLimits, FrameReader, MAX_PROMPT_BYTES};
use super::reply;
use crate::chat_template::ChatMessage;
use crate::runtime::limits;

/// Positions kept free at the end of the context (upstream's margin).
const CTX_RESERVE: usize = 8;
/// Most KV slots a server may have (upstream's `KV_SLOTS` range).
pub const MAX_KV_SLOTS: usize = crate::runtime::MAX_SLOTS;

/// Server-wide settings (flags and defaults), fixed for the session.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// Independent conversations (1..=16); PROMPT's `kv_slot` selects one.
    pub kv_slots: usize,
    /// Tokens per reply for chat lines, and the cap on PROMPT's `max_tokens`.
    pub max_tokens: usize,
    /// Context length of every slot, in tokens.
    pub max_ctx: usize,
    /// Sampling for chat lines (PROMPT brings its own).
    pub temperature: f32,
    pub top_p: f32,
    pub seed: Option<u64>,
    /// Longest plain/header line accepted.
    pub max_line: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            kv_slots: 1,
            max_tokens: 256,
            max_ctx: 4096,
            // Upstream's serve default: below 1.0 because the far tail of a
            // quantized model's distribution is mostly quantization noise.
            temperature: 0.7,
            top_p: 1.0,
            seed: None,
            max_line: MAX_PROMPT_BYTES,
        }
    }
}

/// Sampling controls of one generation call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenParams {
    /// Most tokens to emit; 0 means prefill only.
    pub max_tokens: usize,
    /// 0 = greedy.
    pub temperature: f32,
    pub top_p: f32,
    pub seed: Option<u64>,
}

/// What a generation call reports for the STAT line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenOutcome {
    /// Tokens emitted (streamed through `on_text`).
    pub emitted: usize,
    /// Emitted tokens per second of this call, prefill included.
    pub tok_per_s: f64,
    /// Expert cache hit rate of this call, percent.
    pub hit_pct: f64,
}

/// The model behind `coli serve`, implemented by the front end.
///
/// A slot is a token history plus its KV state. Invariants the engine keeps:
/// - after `prefill_and_generate(slot, tokens, ..)`, `slot_tokens(slot)` is the
///   old history + `tokens` + every emitted token (the KV of the last emitted
///   token may be computed lazily: it is never re-sent by the session, except
///   after a `truncate_slot` that removes it);
/// - `truncate_slot`/`reset_slot` change memory and the on-disk state alike.
pub trait ServeEngine {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Tokenizes text as-is (special-token text included, no BOS added).
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, Self::Error>;

    /// The text a user turn adds after `history` (chat template applied).
    fn render_user_turn(&self, history: &[ChatMessage], user_text: &str) -> Result<String, Self::Error>;

    /// The tokens currently held by `slot`.
    fn slot_tokens(&self, slot: usize) -> &[u32];

    /// Keeps the first `len` tokens of `slot` (and their KV).
    fn truncate_slot(&mut self, slot: usize, len: usize) -> Result<(), Self::Error>;

    /// Empties `slot`, in memory and on disk.
    fn reset_slot(&mut self, slot: usize) -> Result<(), Self::Error>;

    /// Prefills `tokens` (never empty) after the slot's history, then samples up
    /// to `params.max_tokens` tokens, streaming each decoded piece to `on_text`
    /// and stopping early at end-of-sequence or when `on_text` breaks.
    fn prefill_and_generate(
        &mut self,
        slot: usize,
        tokens: &[u32],
        params: &GenParams,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<GenOutcome, Self::Error>;

    /// Makes the slot's state durable (called after each reply and at EOF).
    fn persist(&mut self, slot: usize) -> Result<(), Self::Error>;

    /// Called once at EOF after every slot was persisted.
    fn finish(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Resident memory for STAT lines.
    fn rss_gb(&self) -> f64 {
        super::rss_gb()
    }
}

#[derive(Debug, Default, Clone)]
struct SlotState {
    /// The chat as the template sees it; empty for raw (PROMPT) content.
    chat: Vec<ChatMessage>,
    /// Parameters of the last reply when it stopped at its token limit (MORE).
    continuable: Option<GenParams>,
}

struct Session<'a, E: ServeEngine> {
    engine: &'a mut E,
    out: &'a mut dyn Write,
    diag: &'a mut dyn Write,
    cfg: &'a ServeConfig,
    slots: Vec<SlotState>,
    active: usize,
}

fn engine_err<E: std::error::Error + Send + Sync + 'static>(what: &str) -> impl FnOnce(E) -> ServeError + '_ {
    move |e| ServeError::Engine {
        what: what.to_string(),
        source: Box::new(e),
    }
}

/// How a generated reply is closed.
#[derive(Clone, Copy, PartialEq)]
enum Close {
    Chat { prompt_tokens: usize },
    Raw { prompt_tokens: usize },
    More,
}

/// A request the session refuses (reply already decided: malformed).
struct Refused(String);

impl<E: ServeEngine> Session<'_, E> {
    fn rss(&self) -> f64 {
        self.engine.rss_gb()
    }

    fn flush(&mut self) -> Result<(), ServeError> {
        self.out.flush().map_err(ServeError::Output)
    }

    fn refuse(&mut self, reason: &str) -> Result<(), ServeError> {
        // Diagnostics are best effort: a closed stderr must not stop serving.
        let _ = writeln!(self.diag, "coli serve: malformed request: {reason}");
        let rss = self.rss();
        reply::malformed(self.out, rss).map_err(ServeError::Output)?;
        self.flush()
    }

    fn idle(&mut self) -> Result<(), ServeError> {
        let rss = self.rss();
        reply::idle(self.out, rss).map_err(ServeError::Output)?;
        self.flush()
    }

    fn handle(&mut self, frame: Frame) -> Result<(), ServeError> {
        match frame {
            Frame::Eof => Ok(()),
            Frame::Malformed { reason } => self.refuse(&reason),
            Frame::Reset => {
                self.engine
                    .reset_slot(0)
                    .map_err(engine_err("resetting slot 0"))?;
                self.slots[0] = SlotState::default();
                self.idle()
            }
            Frame::More => self.more(),
            Frame::UserLine(line) => match self.chat_turn(&line) {
                Ok(()) => Ok(()),
                Err(Ok(Refused(reason))) => self.refuse(&reason),
                Err(Err(e)) => Err(e),
            },
            Frame::Prompt {
                body,
                max_tokens,
                temperature,
                top_p,
                kv_slot,
                seed,
            } => {
                let params = GenParams {
                    max_tokens: max_tokens.min(self.cfg.max_tokens),
                    temperature,
                    top_p,
                    seed,
                };
                match self.raw_prompt(&body, kv_slot.unwrap_or(0), params) {
                    Ok(()) => Ok(()),
                    Err(Ok(Refused(reason))) => self.refuse(&reason),
                    Err(Err(e)) => Err(e),
                }
            }
        }
    }

    fn tokenize(&self, text: &str) -> Result<Vec<u32>, Result<Refused, ServeError>> {
        self.engine
            .tokenize(text)
            .map_err(|e| Ok(Refused(format!("tokenizing failed: {e}"))))
    }

    fn render(&self, history: &[ChatMessage], line: &str) -> Result<String, Result<Refused, ServeError>> {
        self.engine
            .render_user_turn(history, line)
            .map_err(|e| Ok(Refused(format!("chat template failed: {e}"))))
    }

    fn chat_turn(&mut self, line: &str) -> Result<(), Result<Refused, ServeError>> {
        if line.is_empty() {
            return self.idle().map_err(Err);
        }
        self.active = 0;
        let resumed = self.slots[0].chat.is_empty() && !self.engine.slot_tokens(0).is_empty();
        let history = if resumed {
            vec![ChatMessage::user(""), ChatMessage::assistant("")]
        } else {
            self.slots[0].chat.clone()
        };
        let mut tokens = self.tokenize(&self.render(&history, line)?)?;
        let mut history = history;
        let held = self.engine.slot_tokens(0).len();
        if held > 0 && held + tokens.len() + CTX_RESERVE >= self.cfg.max_ctx {
            let _ = writeln!(
                self.diag,
                "coli serve: the conversation is full; starting a new one"
            );
            self.engine
                .reset_slot(0)
                .map_err(|e| Err(engine_err("resetting a full slot 0")(e)))?;
            history.clear();
            tokens = self.tokenize(&self.render(&history, line)?)?;
        }
        tokens.truncate(self.cfg.max_ctx.saturating_sub(CTX_RESERVE));
        if tokens.is_empty() {
            return Err(Ok(Refused("the turn is empty after tokenization".into())));
        }
        history.push(ChatMessage::user(line));
        self.slots[0].chat = history;
        let params = GenParams {
            max_tokens: self.cfg.max_tokens,
            temperature: self.cfg.temperature,
            top_p: self.cfg.top_p,
            seed: self.cfg.seed,
        };
        let text = self
            .generate(
                0,
                &tokens,
                params,
                Close::Chat {
                    prompt_tokens: tokens.len(),
                },
            )
            .map_err(Err)?;
        self.slots[0].chat.push(ChatMessage::assistant(&text));
        Ok(())
    }

    fn raw_prompt(
        &mut self,
        body: &[u8],
        slot: usize,
        params: GenParams,
    ) -> Result<(), Result<Refused, ServeError>> {
        if slot >= self.slots.len() {
            return Err(Ok(Refused(format!(
                "kv_slot {slot} must be below {}",
                self.slots.len()
            ))));
        }
        let text =
            std::str::from_utf8(body).map_err(|e| Ok(Refused(format!("prompt is not valid UTF-8: {e}"))))?;
        let mut tokens = self.tokenize(text)?;
        tokens.truncate(self.cfg.max_ctx.saturating_sub(CTX_RESERVE));
        if tokens.is_empty() {
            return Err(Ok(Refused("the prompt is empty after tokenization".into())));
        }
        self.active = slot;
        self.slots[slot].chat.clear();
        let held = self.engine.slot_tokens(slot);
        let mut keep = held.iter().zip(&tokens).take_while(|(a, b)| a == b).count();
        if keep == tokens.len() {
            // Nothing new: re-feed the last prompt token to get its logits again.
            keep -= 1;
        }
        if keep < held.len() {
            self.engine
                .truncate_slot(slot, keep)
                .map_err(|e| Err(engine_err("truncating a slot to the common prefix")(e)))?;
        }
        self.generate(
            slot,
            &tokens[keep..],
            params,
            // Tokens actually prefilled: what prefix reuse saved is visible.
            Close::Raw {
                prompt_tokens: tokens.len() - keep,
            },
        )
        .map_err(Err)?;
        Ok(())
    }

    fn more(&mut self) -> Result<(), ServeError> {
        let slot = self.active;
        let held = self.engine.slot_tokens(slot);
        let (Some(params), Some(&last)) = (self.slots[slot].continuable, held.last()) else {
            return self.idle();
        };
        let len = held.len();
        self.engine
            .truncate_slot(slot, len - 1)
            .map_err(engine_err("rewinding one token for MORE"))?;
        let text = self.generate(slot, &[last], params, Close::More)?;
        if let Some(m) = self.slots[slot].chat.last_mut().filter(|m| m.role == "assistant") {
            m.content.push_str(&text);
        }
        Ok(())
    }

    /// Prefill + generation + the closing bytes; returns the reply text.
    fn generate(
        &mut self,
        slot: usize,
        tokens: &[u32],
        params: GenParams,
        close: Close,
    ) -> Result<String, ServeError> {
        let len_after = self.engine.slot_tokens(slot).len() + tokens.len();
        let budget = limits::reply_budget(len_after, params.max_tokens, self.cfg.max_ctx);
        let call = GenParams {
            max_tokens: budget,
            ..params
        };
        let mut text = String::new();
        let mut out_err: Option<io::Error> = None;
        let out = &mut *self.out;
        let mut on_text = |piece: &str| {
            text.push_str(piece);
            match out.write_all(piece.as_bytes()).and_then(|()| out.flush()) {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    out_err = Some(e);
                    ControlFlow::Break(())
                }
            }
        };
        let result = self
            .engine
            .prefill_and_generate(slot, tokens, &call, &mut on_text);
        if let Some(e) = out_err {
            return Err(ServeError::Output(e));
        }
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                // Close the reply so a client is not left waiting, then stop.
                let _ = self.refuse("generation failed; see the error below");
                return Err(engine_err("generating")(e));
            }
        };
        let limited = outcome.emitted >= budget;
        self.slots[slot].continuable = limited.then_some(params);
        let rss = self.rss();
        let (e, tps, hit) = (outcome.emitted, outcome.tok_per_s, outcome.hit_pct);
        match close {
            Close::Chat { prompt_tokens } => {
                reply::end_and_stat(self.out, true, e, tps, hit, rss, prompt_tokens, limited)
            }
            Close::Raw { prompt_tokens } => {
                reply::end_and_stat(self.out, false, e, tps, hit, rss, prompt_tokens, limited)
            }
            Close::More => reply::more_end_and_stat(self.out, e, tps, hit, rss),
        }
        .map_err(ServeError::Output)?;
        self.flush()?;
        self.engine
            .persist(slot)
            .map_err(engine_err("persisting the conversation"))?;
        Ok(text)
    }
}

/// Serves the protocol until EOF: READY, then one reply per frame.
///
/// `diag` receives the reasons for refused frames (stderr in `coli serve`).
/// Returns `Ok(())` at EOF after persisting every slot; errors are I/O on the
/// streams or engine failures (a generation failure still closes its reply).
/// A write error on `out` ends the session like EOF (every slot persisted)
/// and is then returned.
pub fn run_serve<R: BufRead, E: ServeEngine>(
    input: R,
    out: &mut dyn Write,
    diag: &mut dyn Write,
    engine: &mut E,
    cfg: &ServeConfig,
) -> Result<(), ServeError> {
    if cfg.kv_slots == 0 || cfg.kv_slots > MAX_KV_SLOTS {
        return Err(ServeError::Config(format!(
            "kv_slots must be between 1 and {MAX_KV_SLOTS}, got {}",
            cfg.kv_slots
        )));
    }
    let limits = FrameLimits {
        kv_slots: cfg.kv_slots,
        max_body: MAX_PROMPT_BYTES,
        max_line: cfg.max_line,
    };
    let mut reader = FrameReader::new(input, limits);
    let mut s = Session {
        engine,
        out,
        diag,
        cfg,
        slots: vec![SlotState::default(); cfg.kv_slots],
        active: 0,
    };
    let rss = s.rss();
    reply::ready(s.out, rss).map_err(ServeError::Output)?;
    s.flush()?;
    let ended = loop {
        let frame = reader.next_frame().map_err(ServeError::Input)?;
        if frame == Frame::Eof {
            break Ok(());
        }
        match s.handle(frame) {
            Ok(()) => {}
            // Nobody reads the replies any more: the conversations are
            // still the client's, so they are saved as at EOF.
            Err(e @ ServeError::Output(_)) => break Err(e),
            Err(e) => return Err(e),
        }
    };
    for slot in 0..cfg.kv_slots {
        s.engine.persist(slot).map_err(engine_err("persisting at EOF"))?;
    }
    s.engine.finish().map_err(engine_err("finishing at EOF"))?;
    ended
}
