//! Client-to-server frames of `coli serve --batch` (docs/serve-batch-protocol.md).
//!
//! [`Decoder`] is a push decoder: input goes in as chunks of any size and
//! [`Item`]s come out, the same items whatever the chunking. It never loses
//! track of frame boundaries on its own:
//! - a header line is at most [`MAX_HEADER`] bytes; a longer one is skipped
//!   to its `\n` and refused;
//! - a `SUBMIT` or `IMAGE` whose length field(s) parse has exactly that many
//!   payload bytes consumed, whatever else is wrong with its header (a refused
//!   frame's payload is skipped, not kept), so the next header is where the
//!   client put it;
//! - a length that does not parse cannot be trusted, so nothing past the
//!   header line is consumed;
//! - a payload not followed by `\n` (or `\r\n`) is refused as a bad frame and
//!   the input is skipped to the next `\n`.
//!
//! Lines whose first field is not a command are ignored, as are empty lines.

use crate::runtime::limits::{self, LimitError};

/// Longest header line, `\r` included, `\n` excluded.
pub const MAX_HEADER: usize = 4096;
/// Largest prompt payload.
pub const MAX_PAYLOAD: u64 = 16 << 20;
/// Longest request id.
pub const MAX_ID: usize = 63;
/// `SUBMIT` and its six required positional fields.
const SUBMIT_FIELDS: usize = 7;
/// ... and the two optional ones (extra payload bytes, prefix hint).
const SUBMIT_MAX_FIELDS: usize = SUBMIT_FIELDS + 2;

/// What the decoder needs to know to validate frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// KV slots: a `SUBMIT` slot at or above this is refused.
    pub slots: usize,
    /// Largest prompt payload accepted.
    pub max_payload: u64,
}

impl Limits {
    pub fn new(slots: usize) -> Self {
        Self {
            slots,
            max_payload: MAX_PAYLOAD,
        }
    }
}

/// A well-formed `SUBMIT`.
#[derive(Debug, Clone, PartialEq)]
pub struct Submit {
    pub id: String,
    pub slot: usize,
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    /// The payload: the whole prompt, as bytes.
    pub prompt: Vec<u8>,
}

/// Why a frame was consumed but refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// The header is wrong (a field, a limit, an unsupported extension).
    BadRequest,
    /// The framing is wrong (no `\n` after the payload, input ended mid-frame).
    BadFrame,
}

impl Reject {
    pub fn code(self) -> &'static str {
        match self {
            Reject::BadRequest => "BAD_REQUEST",
            Reject::BadFrame => "BAD_FRAME",
        }
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Submit(Submit),
    /// `STOP <id>`: end the request normally.
    Stop(String),
    /// `CANCEL <id>`: abort the request.
    Cancel(String),
    /// `IMAGE <id> ...`: a well-formed image frame (its payload was skipped).
    Image(String),
    /// A frame that was consumed and must be answered with an error; `id` is
    /// None when the header carried no usable id. `reason` says what was
    /// wrong, for the log (the ERROR frame carries only the code).
    Rejected {
        id: Option<String>,
        why: Reject,
        reason: String,
    },
}

impl Item {
    fn rejected(id: Option<String>, why: Reject, reason: impl Into<String>) -> Item {
        Item::Rejected {
            id,
            why,
            reason: reason.into(),
        }
    }
}

/// What a payload being read will turn into once its `\n` arrives.
#[derive(Debug)]
enum Pending {
    Submit(Submit),
    Image(String),
    /// A refused frame: the payload is skipped, then BAD_REQUEST.
    Refused {
        id: Option<String>,
        reason: String,
    },
}

impl Pending {
    fn id(&self) -> Option<String> {
        match self {
            Pending::Submit(s) => Some(s.id.clone()),
            Pending::Image(id) => Some(id.clone()),
            Pending::Refused { id, .. } => id.clone(),
        }
    }

    fn into_item(self) -> Item {
        match self {
            Pending::Submit(s) => Item::Submit(s),
            Pending::Image(id) => Item::Image(id),
            Pending::Refused { id, reason } => Item::rejected(id, Reject::BadRequest, reason),
        }
    }
}

#[derive(Debug)]
enum State {
    /// Collecting a header line.
    Header,
    /// The header line is too long: skipping to its `\n`. `known` is Some
    /// (with the id, if any) when the line starts with a command.
    Overlong { known: Option<Option<String>> },
    /// `left` payload bytes still to read.
    Payload { left: u64, pending: Pending },
    /// The payload is in; expecting `\n` (`cr`: a `\r` was seen).
    Close { pending: Pending, cr: bool },
    /// After a bad frame: skipping to the next `\n`.
    Resync,
}

/// The incremental frame decoder.
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    state: State,
    line: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Command {
    Submit,
    Stop,
    Cancel,
    Image,
}

fn command(field: &[u8]) -> Option<Command> {
    match field {
        b"SUBMIT" => Some(Command::Submit),
        b"STOP" => Some(Command::Stop),
        b"CANCEL" => Some(Command::Cancel),
        b"IMAGE" => Some(Command::Image),
        _ => None,
    }
}

fn fields(line: &[u8]) -> Vec<&[u8]> {
    line.split(|&b| b == b' ' || b == b'\t')
        .filter(|f| !f.is_empty())
        .collect()
}

/// A request id: 1 to [`MAX_ID`] visible ASCII bytes, not `0` (the id that
/// errors about unidentifiable frames carry).
pub fn parse_id(field: &[u8]) -> Option<String> {
    let ok = !field.is_empty()
        && field.len() <= MAX_ID
        && field != b"0"
        && field.iter().all(|b| b.is_ascii_graphic());
    if ok {
        std::str::from_utf8(field).ok().map(str::to_string)
    } else {
        None
    }
}

fn text(field: &[u8]) -> Option<&str> {
    std::str::from_utf8(field).ok()
}

fn parse_u64(field: &[u8]) -> Option<u64> {
    text(field)?.parse().ok()
}

fn parse_i32(field: &[u8]) -> Option<i32> {
    text(field)?.parse().ok()
}

/// What a line that overflowed says about itself: Some when it starts with a
/// command (then the id, when the truncated line has a valid one).
fn classify(line: &[u8]) -> Option<Option<String>> {
    let f = fields(line);
    command(f.first()?)?;
    Some(f.get(1).and_then(|id| parse_id(id)))
}

impl Decoder {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            state: State::Header,
            line: Vec::new(),
        }
    }

    /// True between frames (nothing buffered, no payload pending).
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Header) && self.line.is_empty()
    }

    /// Consumes all of `input`, appending every frame it completes to `out`.
    pub fn push(&mut self, mut input: &[u8], out: &mut Vec<Item>) {
        while !input.is_empty() {
            match std::mem::replace(&mut self.state, State::Header) {
                State::Header => {
                    let nl = input.iter().position(|&b| b == b'\n');
                    let body = &input[..nl.unwrap_or(input.len())];
                    let room = MAX_HEADER - self.line.len();
                    if body.len() > room {
                        self.line.extend_from_slice(&body[..room]);
                        let known = classify(&self.line);
                        self.line.clear();
                        self.state = State::Overlong { known };
                        input = &input[room..];
                        continue;
                    }
                    self.line.extend_from_slice(body);
                    match nl {
                        Some(i) => {
                            input = &input[i + 1..];
                            let line = std::mem::take(&mut self.line);
                            self.header(&line, out);
                        }
                        None => input = &[],
                    }
                }
                State::Overlong { known } => match input.iter().position(|&b| b == b'\n') {
                    Some(i) => {
                        if let Some(id) = known {
                            out.push(Item::rejected(
                                id,
                                Reject::BadRequest,
                                format!("the header line is longer than {MAX_HEADER} bytes"),
                            ));
                        }
                        input = &input[i + 1..];
                    }
                    None => {
                        self.state = State::Overlong { known };
                        input = &[];
                    }
                },
                State::Payload { left, mut pending } => {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(input.len());
                    if let Pending::Submit(s) = &mut pending {
                        s.prompt.extend_from_slice(&input[..n]);
                    }
                    input = &input[n..];
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        State::Close { pending, cr: false }
                    } else {
                        State::Payload { left, pending }
                    };
                }
                State::Close { pending, cr } => {
                    let b = input[0];
                    input = &input[1..];
                    match b {
                        b'\n' => out.push(pending.into_item()),
                        b'\r' if !cr => self.state = State::Close { pending, cr: true },
                        _ => {
                            out.push(Item::rejected(
                                pending.id(),
                                Reject::BadFrame,
                                "the payload is not followed by a newline",
                            ));
                            self.state = State::Resync;
                        }
                    }
                }
                State::Resync => match input.iter().position(|&b| b == b'\n') {
                    Some(i) => input = &input[i + 1..],
                    None => {
                        self.state = State::Resync;
                        input = &[];
                    }
                },
            }
        }
    }

    /// End of input: a frame left incomplete is refused as a bad frame.
    pub fn finish(self) -> Option<Item> {
        let id = match self.state {
            State::Header if self.line.is_empty() => return None,
            State::Header => classify(&self.line).flatten(),
            State::Overlong { known } => known.flatten(),
            State::Payload { pending, .. } | State::Close { pending, .. } => pending.id(),
            State::Resync => return None,
        };
        Some(Item::rejected(
            id,
            Reject::BadFrame,
            "the input ended inside a frame",
        ))
    }

    /// Moves to reading `len` payload bytes for `pending` (or straight to
    /// its closing `\n`).
    fn expect_payload(&mut self, len: u64, pending: Pending) {
        self.state = if len == 0 {
            State::Close { pending, cr: false }
        } else {
            State::Payload { left: len, pending }
        };
    }

    /// A complete header line (without its `\n`).
    fn header(&mut self, line: &[u8], out: &mut Vec<Item>) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let f = fields(line);
        let Some(cmd) = f.first().and_then(|c| command(c)) else {
            return;
        };
        let id = f.get(1).and_then(|id| parse_id(id));
        match cmd {
            Command::Stop | Command::Cancel => out.push(match (f.len(), id) {
                (2, Some(id)) if cmd == Command::Stop => Item::Stop(id),
                (2, Some(id)) => Item::Cancel(id),
                (2, None) => Item::rejected(None, Reject::BadRequest, bad_id()),
                (n, id) => Item::rejected(id, Reject::BadRequest, format!("needs 2 fields, got {n}")),
            }),
            Command::Image => {
                let Some(len) = f.get(2).and_then(|x| parse_u64(x)) else {
                    return out.push(Item::rejected(
                        id,
                        Reject::BadRequest,
                        "the byte count does not parse",
                    ));
                };
                let grid = |i: usize| f.get(i).and_then(|x| parse_i32(x)).is_some_and(|g| g >= 1);
                let pending = match id {
                    Some(id) if f.len() == 5 && len <= self.limits.max_payload && grid(3) && grid(4) => {
                        Pending::Image(id)
                    }
                    None => Pending::Refused {
                        id: None,
                        reason: bad_id(),
                    },
                    id => Pending::Refused {
                        id,
                        reason: "needs <bytes> within the payload limit and a grid of whole numbers >= 1"
                            .into(),
                    },
                };
                self.expect_payload(len, pending);
            }
            Command::Submit => {
                let Some(len) = submit_length(&f) else {
                    return out.push(Item::rejected(
                        id,
                        Reject::BadRequest,
                        "a byte count does not parse",
                    ));
                };
                let pending = match self.submit(&f, id.clone()) {
                    Ok(s) => Pending::Submit(s),
                    Err(reason) => Pending::Refused { id, reason },
                };
                self.expect_payload(len, pending);
            }
        }
    }

    /// The `SUBMIT` header's fields as a request (its prompt still empty),
    /// or why it is refused. The sampling fields are checked by the limits
    /// every front end shares.
    fn submit(&self, f: &[&[u8]], id: Option<String>) -> Result<Submit, String> {
        let id = id.ok_or_else(bad_id)?;
        if f.len() < SUBMIT_FIELDS || f.len() > SUBMIT_MAX_FIELDS {
            return Err(format!(
                "needs {SUBMIT_FIELDS} to {SUBMIT_MAX_FIELDS} fields, got {}",
                f.len()
            ));
        }
        // key=value extension tokens (per-token logprobs, token-id prompts,
        // ...) are not supported: any refuses the request.
        if f[SUBMIT_FIELDS..].iter().any(|x| x.contains(&b'=')) {
            return Err("key=value fields are not supported".into());
        }
        let slot = parse_i32(f[2])
            .and_then(|s| usize::try_from(s).ok())
            .filter(|&s| s < self.limits.slots)
            .ok_or_else(|| format!("slot must be a whole number below {}", self.limits.slots))?;
        let bytes = parse_u64(f[3]).unwrap_or(u64::MAX);
        if bytes > self.limits.max_payload {
            return Err(format!(
                "the prompt exceeds the {} byte limit",
                self.limits.max_payload
            ));
        }
        let max_tokens = checked("max_tokens", f[4], limits::max_tokens)?;
        let temperature = checked("temperature", f[5], limits::temperature)?;
        let top_p = checked("top_p", f[6], limits::top_p)?;
        // Extra payload bytes after the prompt (a grammar upstream): only 0.
        if let Some(x) = f.get(7)
            && parse_u64(x) != Some(0)
        {
            return Err("extra payload bytes (grammars) are not supported".into());
        }
        // The prefix-length hint: accepted and unused (prefix reuse is automatic).
        if let Some(x) = f.get(8)
            && parse_i32(x).is_none()
        {
            return Err("the prefix hint must be an integer".into());
        }
        Ok(Submit {
            id,
            slot,
            max_tokens,
            temperature,
            top_p,
            prompt: Vec::with_capacity(usize::try_from(bytes.min(1 << 16)).unwrap_or(0)),
        })
    }
}

/// Why a frame without a usable id is refused.
fn bad_id() -> String {
    format!("the id must be 1 to {MAX_ID} visible ASCII bytes, not 0")
}

/// A field checked by its shared limit; the reason names the field.
fn checked<T>(name: &str, f: &[u8], check: fn(&str) -> Result<T, LimitError>) -> Result<T, String> {
    let text = text(f).ok_or_else(|| format!("{name} is not text"))?;
    check(text).map_err(|e| format!("{name} {e}"))
}

/// Payload bytes a `SUBMIT` header declares (prompt plus the optional extra
/// bytes of field 7), when they can be trusted: the prompt length parses, and
/// field 7 is absent, an extension token, or a length that parses.
fn submit_length(f: &[&[u8]]) -> Option<u64> {
    let bytes = parse_u64(f.get(3)?)?;
    let extra = match f.get(7) {
        None => 0,
        Some(x) if x.contains(&b'=') => 0,
        Some(x) => parse_u64(x)?,
    };
    bytes.checked_add(extra)
}

/// The bytes of a `SUBMIT` frame (what a client sends; used by tests).
pub fn submit_frame(
    id: &str,
    slot: usize,
    max_tokens: usize,
    temperature: f32,
    top_p: f32,
    prompt: &[u8],
) -> Vec<u8> {
    let mut v = format!(
        "SUBMIT {id} {slot} {} {max_tokens} {temperature} {top_p}\n",
        prompt.len()
    )
    .into_bytes();
    v.extend_from_slice(prompt);
    v.push(b'\n');
    v
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
