//! The exact bytes `coli serve --batch` writes (docs/serve-batch-protocol.md).

use crate::runtime::{Finish, RequestError};

/// First line of the handshake.
pub const READY: &[u8] = b"\x01\x01READY\x01\x01\n";
/// Most payload bytes in one DATA frame (what clients accept).
pub const MAX_DATA: usize = 65536;

/// Non-finite statistics would print as `inf`/`NaN`, which clients cannot parse.
fn finite(x: f64) -> f64 {
    if x.is_finite() { x } else { 0.0 }
}

/// `READY` and the initial status line.
pub fn ready(rss_gb: f64) -> Vec<u8> {
    let mut v = READY.to_vec();
    v.extend_from_slice(format!("STAT 0 0.0 0.0 {:.2} 0 0\n", finite(rss_gb)).as_bytes());
    v
}

/// `ACCEPT <id> <prompt_tokens>`: the request was admitted to its slot.
pub fn accept(id: &str, prompt_tokens: usize) -> Vec<u8> {
    format!("ACCEPT {id} {prompt_tokens}\n").into_bytes()
}

/// `DATA <id> <n>`, the `n` bytes, `\n`.
pub fn data(id: &str, bytes: &[u8]) -> Vec<u8> {
    let mut v = format!("DATA {id} {}\n", bytes.len()).into_bytes();
    v.extend_from_slice(bytes);
    v.push(b'\n');
    v
}

/// `text` cut into pieces of at most [`MAX_DATA`] bytes, on character
/// boundaries.
pub fn data_chunks(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = rest.len().min(MAX_DATA);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

/// What a DONE line reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// Tokens streamed as text.
    pub emitted: usize,
    pub tok_per_s: f64,
    pub hit_pct: f64,
    pub rss_gb: f64,
    pub prompt_tokens: usize,
    pub length_limited: bool,
}

impl Stat {
    pub fn of(f: &Finish, rss_gb: f64) -> Self {
        Self {
            emitted: f.emitted,
            tok_per_s: f.tok_per_s(),
            hit_pct: f.hit_pct,
            rss_gb,
            prompt_tokens: f.usage.prompt_tokens,
            length_limited: f.length_limited,
        }
    }
}

/// `DONE <id> STAT <emitted> <tok/s> <hit%> <rss_gb> <prompt_tokens> <length_limited>`.
pub fn done(id: &str, s: &Stat) -> Vec<u8> {
    format!(
        "DONE {id} STAT {} {:.3} {:.1} {:.2} {} {}\n",
        s.emitted,
        finite(s.tok_per_s),
        finite(s.hit_pct),
        finite(s.rss_gb),
        s.prompt_tokens,
        u8::from(s.length_limited)
    )
    .into_bytes()
}

/// The error codes of ERROR lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Code {
    BadFrame,
    BadRequest,
    SlotBusy,
    DuplicateId,
    EmptyPrompt,
    NotFound,
    Cancelled,
    ContextExceeded {
        used: usize,
        limit: usize,
    },
    QueueFull,
    Shutdown,
    /// The engine failed; the message follows the code.
    Engine(String),
}

impl Code {
    /// The code for a request the decode loop refused or failed.
    pub fn of(e: &RequestError) -> Self {
        match e {
            RequestError::QueueFull(_) => Code::QueueFull,
            RequestError::SlotBusy(_) => Code::SlotBusy,
            RequestError::BadSlot { .. } | RequestError::BadToken { .. } | RequestError::Constraint(_) => {
                Code::BadRequest
            }
            RequestError::DuplicateId(_) => Code::DuplicateId,
            RequestError::EmptyPrompt => Code::EmptyPrompt,
            RequestError::ContextExceeded { used, limit } => Code::ContextExceeded {
                used: *used,
                limit: *limit,
            },
            RequestError::Cancelled => Code::Cancelled,
            RequestError::Shutdown => Code::Shutdown,
            RequestError::Engine(msg) => Code::Engine(msg.clone()),
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Code::BadFrame => f.write_str("BAD_FRAME"),
            Code::BadRequest => f.write_str("BAD_REQUEST"),
            Code::SlotBusy => f.write_str("SLOT_BUSY"),
            Code::DuplicateId => f.write_str("DUPLICATE_ID"),
            Code::EmptyPrompt => f.write_str("EMPTY_PROMPT"),
            Code::NotFound => f.write_str("NOT_FOUND"),
            Code::Cancelled => f.write_str("CANCELLED"),
            Code::ContextExceeded { used, limit } => write!(f, "CONTEXT_EXCEEDED {used} {limit}"),
            Code::QueueFull => f.write_str("QUEUE_FULL"),
            Code::Shutdown => f.write_str("SHUTDOWN"),
            Code::Engine(msg) => {
                // One line, whatever the message holds.
                let msg: String = msg
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                write!(f, "ENGINE_ERROR {}", msg.trim())
            }
        }
    }
}

/// `ERROR <id> <code>`; `id` None (a frame without a usable id) prints `0`.
pub fn error(id: Option<&str>, code: &Code) -> Vec<u8> {
    let line = format!("ERROR {} {code}", id.unwrap_or("0"));
    let mut v = line.trim_end().as_bytes().to_vec();
    v.push(b'\n');
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{FinishReason, Usage};

    #[test]
    fn exact_bytes() {
        assert_eq!(ready(1.234), b"\x01\x01READY\x01\x01\nSTAT 0 0.0 0.0 1.23 0 0\n");
        assert_eq!(accept("7", 12), b"ACCEPT 7 12\n");
        assert_eq!(data("a-1", b"x\ny"), b"DATA a-1 3\nx\ny\n");
        assert_eq!(data("a-1", b""), b"DATA a-1 0\n\n");
        let s = Stat {
            emitted: 12,
            tok_per_s: 3.1236,
            hit_pct: 87.25,
            rss_gb: 0.5,
            prompt_tokens: 7,
            length_limited: true,
        };
        assert_eq!(done("9", &s), b"DONE 9 STAT 12 3.124 87.2 0.50 7 1\n");
        let nan = Stat {
            tok_per_s: f64::NAN,
            hit_pct: f64::INFINITY,
            length_limited: false,
            ..s
        };
        assert_eq!(done("9", &nan), b"DONE 9 STAT 12 0.000 0.0 0.50 7 0\n");
        assert_eq!(error(Some("4"), &Code::SlotBusy), b"ERROR 4 SLOT_BUSY\n");
        assert_eq!(error(None, &Code::BadRequest), b"ERROR 0 BAD_REQUEST\n");
        assert_eq!(
            error(Some("4"), &Code::ContextExceeded { used: 90, limit: 64 }),
            b"ERROR 4 CONTEXT_EXCEEDED 90 64\n"
        );
        assert_eq!(
            error(Some("4"), &Code::Engine("disk\nfull\r".into())),
            b"ERROR 4 ENGINE_ERROR disk full\n"
        );
        assert_eq!(
            error(Some("4"), &Code::Engine(String::new())),
            b"ERROR 4 ENGINE_ERROR\n"
        );
    }

    #[test]
    fn codes_of_request_errors() {
        let cases = [
            (RequestError::QueueFull(3), "QUEUE_FULL"),
            (RequestError::SlotBusy(1), "SLOT_BUSY"),
            (RequestError::BadSlot { slot: 9, slots: 4 }, "BAD_REQUEST"),
            (
                RequestError::BadToken {
                    id: 5000,
                    vocab: 1024,
                },
                "BAD_REQUEST",
            ),
            (RequestError::DuplicateId(3), "DUPLICATE_ID"),
            (RequestError::EmptyPrompt, "EMPTY_PROMPT"),
            (
                RequestError::ContextExceeded { used: 5, limit: 4 },
                "CONTEXT_EXCEEDED 5 4",
            ),
            (RequestError::Cancelled, "CANCELLED"),
            (RequestError::Shutdown, "SHUTDOWN"),
            (RequestError::Engine("boom".into()), "ENGINE_ERROR boom"),
        ];
        for (e, want) in cases {
            assert_eq!(Code::of(&e).to_string(), want);
        }
    }

    #[test]
    fn stat_of_a_finish() {
        let f = Finish {
            reason: FinishReason::Length,
            usage: Usage {
                prompt_tokens: 11,
                prefilled: 4,
                completion_tokens: 6,
            },
            emitted: 5,
            length_limited: true,
            first_token_secs: 0.1,
            total_secs: 2.0,
            hit_pct: 50.0,
        };
        let s = Stat::of(&f, 1.5);
        assert_eq!(done("x", &s), b"DONE x STAT 5 2.500 50.0 1.50 11 1\n");
    }

    #[test]
    fn chunks_keep_characters_whole() {
        assert_eq!(data_chunks("").count(), 0);
        assert_eq!(data_chunks("abc").collect::<Vec<_>>(), ["abc"]);
        let text = "é".repeat(MAX_DATA); // two bytes each
        let pieces: Vec<&str> = data_chunks(&text).collect();
        assert!(pieces.iter().all(|p| !p.is_empty() && p.len() <= MAX_DATA));
        assert_eq!(pieces.concat(), text);
        assert_eq!(pieces.len(), 2);
        let text = format!("ab{}", "€".repeat(MAX_DATA / 3)); // € is three bytes
        let pieces: Vec<&str> = data_chunks(&text).collect();
        assert_eq!(pieces[0].len(), MAX_DATA - 2);
        assert_eq!(pieces.concat(), text);
    }
}
