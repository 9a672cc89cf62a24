//! Reading `coli serve` frames from stdin without ever losing sync.
//!
//! Every call to [`FrameReader::next_frame`] consumes at least one byte or
//! returns [`Frame::Eof`], so a driver loop always terminates. A `PROMPT`
//! whose `<bytes>` field parses and is within the limit always has its body
//! consumed, whatever else is wrong with the header; a bad length cannot be
//! trusted, so nothing past the header line is consumed then.

use std::io::{self, BufRead};

use crate::runtime::limits::{self, LimitError};

/// Largest PROMPT body accepted (the contract's 16 MiB).
pub const MAX_PROMPT_BYTES: usize = 16 << 20;

/// What the reader must know to validate frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Number of KV slots; a `kv_slot` at or above it is refused.
    pub kv_slots: usize,
    /// Largest PROMPT body.
    pub max_body: usize,
    /// Longest plain or header line kept; longer lines are skipped as malformed.
    pub max_line: usize,
}

impl FrameLimits {
    /// Contract limits for `kv_slots` slots.
    pub fn new(kv_slots: usize) -> Self {
        FrameLimits {
            kv_slots,
            max_body: MAX_PROMPT_BYTES,
            max_line: MAX_PROMPT_BYTES,
        }
    }
}

/// One request from the client.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A plain line (without its `\n`): a chat turn for slot 0.
    UserLine(String),
    /// `\x02RESET`.
    Reset,
    /// `\x02MORE`.
    More,
    /// `\x02PROMPT <bytes> <max_tokens> <temperature> <top_p> [kv_slot] [seed]` and its body.
    Prompt {
        body: Vec<u8>,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        kv_slot: Option<usize>,
        seed: Option<u64>,
    },
    /// A frame that was consumed but cannot be served; `reason` goes to stderr.
    Malformed { reason: String },
    /// End of input.
    Eof,
}

/// Frame reader over any buffered input.
pub struct FrameReader<R> {
    inner: R,
    limits: FrameLimits,
    eof: bool,
}

/// A line as read: bytes without `\n`, and whether it overflowed `max_line`.
struct RawLine {
    bytes: Vec<u8>,
    overflow: usize,
}

/// Printable, bounded rendering of client bytes for error messages.
fn show(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(40)];
    let mut s: String = cut.escape_ascii().to_string();
    if bytes.len() > cut.len() {
        s.push_str("...");
    }
    s
}

impl<R: BufRead> FrameReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R, limits: FrameLimits) -> Self {
        FrameReader {
            inner,
            limits,
            eof: false,
        }
    }

    /// Reads one line, keeping at most `max_line` bytes; `None` at EOF with nothing read.
    fn read_line(&mut self) -> io::Result<Option<RawLine>> {
        let mut line = RawLine {
            bytes: Vec::new(),
            overflow: 0,
        };
        let mut any = false;
        loop {
            let buf = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                self.eof = true;
                return Ok(any.then_some(line));
            }
            any = true;
            let (chunk, used, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], i + 1, true),
                None => (buf, buf.len(), false),
            };
            let room = self.limits.max_line.saturating_sub(line.bytes.len());
            let keep = chunk.len().min(room);
            line.bytes.extend_from_slice(&chunk[..keep]);
            line.overflow += chunk.len() - keep;
            self.inner.consume(used);
            if done {
                return Ok(Some(line));
            }
        }
    }

    /// Reads exactly `n` bytes; `None` when EOF comes first (the partial body is dropped).
    fn read_body(&mut self, n: usize) -> io::Result<Option<Vec<u8>>> {
        let mut body = Vec::with_capacity(n);
        while body.len() < n {
            let buf = match self.inner.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                self.eof = true;
                return Ok(None);
            }
            let take = buf.len().min(n - body.len());
            body.extend_from_slice(&buf[..take]);
            self.inner.consume(take);
        }
        // The `\n` after the body is optional, as upstream: consume it only if present.
        loop {
            match self.inner.fill_buf() {
                Ok(b) => {
                    if b.first() == Some(&b'\n') {
                        self.inner.consume(1);
                    }
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(Some(body))
    }

    /// The next frame. I/O errors other than EOF are returned; bad input never is.
    pub fn next_frame(&mut self) -> io::Result<Frame> {
        if self.eof {
            return Ok(Frame::Eof);
        }
        let Some(line) = self.read_line()? else {
            return Ok(Frame::Eof);
        };
        if line.overflow > 0 {
            let total = line.bytes.len() + line.overflow;
            return Ok(Frame::Malformed {
                reason: format!(
                    "line of {total} bytes exceeds the {} byte limit",
                    self.limits.max_line
                ),
            });
        }
        let bytes = line.bytes;
        if bytes.first() != Some(&0x02) {
            return Ok(match String::from_utf8(bytes) {
                Ok(s) => Frame::UserLine(s),
                Err(e) => Frame::Malformed {
                    reason: format!("line is not valid UTF-8: {}", show(e.as_bytes())),
                },
            });
        }
        let cmd = bytes.strip_suffix(b"\r").unwrap_or(&bytes);
        match cmd {
            b"\x02RESET" => return Ok(Frame::Reset),
            b"\x02MORE" => return Ok(Frame::More),
            _ => {}
        }
        match bytes.strip_prefix(b"\x02PROMPT ") {
            Some(fields) => self.prompt(fields),
            None => Ok(Frame::Malformed {
                reason: format!("unknown command {}", show(&bytes)),
            }),
        }
    }

    fn prompt(&mut self, header: &[u8]) -> io::Result<Frame> {
        let fields: Vec<&[u8]> = header
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty())
            .collect();
        let Some(len_field) = fields.first() else {
            return Ok(Frame::Malformed {
                reason: "PROMPT without a byte count".into(),
            });
        };
        let n = match parse_len(len_field, self.limits.max_body) {
            Ok(n) => n,
            Err(reason) => {
                return Ok(Frame::Malformed {
                    reason: format!("PROMPT {reason}; no body read"),
                });
            }
        };
        let Some(body) = self.read_body(n)? else {
            return Ok(Frame::Malformed {
                reason: format!("PROMPT body ended early (EOF before {n} bytes)"),
            });
        };
        match parse_fields(&fields[1..], self.limits.kv_slots) {
            Err(reason) => Ok(Frame::Malformed {
                reason: format!("PROMPT {reason}"),
            }),
            Ok(_) if body.contains(&0) => Ok(Frame::Malformed {
                reason: "PROMPT body contains a NUL byte".into(),
            }),
            Ok(p) => Ok(Frame::Prompt {
                body,
                max_tokens: p.max_tokens,
                temperature: p.temperature,
                top_p: p.top_p,
                kv_slot: p.kv_slot,
                seed: p.seed,
            }),
        }
    }
}

fn field_str<'a>(name: &str, f: &'a [u8]) -> Result<&'a str, String> {
    std::str::from_utf8(f).map_err(|_| format!("{name} is not text: {}", show(f)))
}

fn parse_len(f: &[u8], max: usize) -> Result<usize, String> {
    let s = field_str("byte count", f)?;
    if s.starts_with('-') {
        return Err(format!("byte count {s} is negative"));
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("byte count {} is not a number", show(f)));
    }
    match s.parse::<u64>() {
        Ok(n) if n <= max as u64 => Ok(n as usize),
        _ => Err(format!("byte count {} exceeds the {max} byte limit", show(f))),
    }
}

/// A field checked by its shared limit; the reason names the field.
fn checked<T>(name: &str, f: &[u8], check: fn(&str) -> Result<T, LimitError>) -> Result<T, String> {
    check(field_str(name, f)?).map_err(|e| format!("{name} {e}"))
}

struct PromptParams {
    max_tokens: usize,
    temperature: f32,
    top_p: f32,
    kv_slot: Option<usize>,
    seed: Option<u64>,
}

fn parse_fields(f: &[&[u8]], kv_slots: usize) -> Result<PromptParams, String> {
    if f.len() < 3 {
        return Err(format!(
            "needs <bytes> <max_tokens> <temperature> <top_p>, got {} fields",
            f.len() + 1
        ));
    }
    if f.len() > 5 {
        return Err(format!("has {} fields, at most 6 are allowed", f.len() + 1));
    }
    let max_tokens = checked("max_tokens", f[0], limits::max_tokens)?;
    let temperature = checked("temperature", f[1], limits::temperature)?;
    let top_p = checked("top_p", f[2], limits::top_p)?;
    let kv_slot = match f.get(3) {
        None => None,
        Some(s) => match field_str("kv_slot", s)?.parse::<usize>() {
            Ok(k) if k < kv_slots => Some(k),
            _ => return Err(format!("kv_slot {} must be an integer below {kv_slots}", show(s))),
        },
    };
    let seed = match f.get(4) {
        None => None,
        Some(s) => Some(checked("seed", s, limits::seed)?),
    };
    Ok(PromptParams {
        max_tokens,
        temperature,
        top_p,
        kv_slot,
        seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(input: &[u8], slots: usize) -> Vec<Frame> {
        let mut r = FrameReader::new(input, FrameLimits::new(slots));
        let mut out = Vec::new();
        loop {
            let f = r.next_frame().unwrap();
            let end = f == Frame::Eof;
            out.push(f);
            if end {
                return out;
            }
        }
    }

    fn malformed(f: &Frame, needle: &str) -> bool {
        matches!(f, Frame::Malformed { reason } if reason.contains(needle))
    }

    #[test]
    fn plain_commands_and_prompt() {
        let got = frames(
            b"hello\n\x02RESET\n\x02MORE\r\n\x02PROMPT 3 5 0.7 0.9 1 42\nab\n\nlast",
            2,
        );
        assert_eq!(got[0], Frame::UserLine("hello".into()));
        assert_eq!(got[1], Frame::Reset);
        assert_eq!(got[2], Frame::More);
        assert_eq!(
            got[3],
            Frame::Prompt {
                body: b"ab\n".to_vec(),
                max_tokens: 5,
                temperature: 0.7,
                top_p: 0.9,
                kv_slot: Some(1),
                seed: Some(42)
            }
        );
        assert_eq!(got[4], Frame::UserLine("last".into()));
        assert_eq!(got[5], Frame::Eof);
    }

    #[test]
    fn body_newline_is_optional() {
        let got = frames(b"\x02PROMPT 2 1 0 1\nhiyo\n", 1);
        assert!(matches!(&got[0], Frame::Prompt { body, .. } if body == b"hi"));
        assert_eq!(got[1], Frame::UserLine("yo".into()));
    }

    #[test]
    fn invalid_fields_still_consume_the_body() {
        for hdr in [
            "3 x 0.5 0.5",
            "3 0 0.5 0.5",
            "3 5 nan 0.5",
            "3 5 inf 0.5",
            "3 5 -0.1 0.5",
            "3 5 2.5 0.5",
            "3 5 0.5 0",
            "3 5 0.5 1.5",
            "3 5 0.5 nan",
            "3 5 0.5 0.5 1",
            "3 5 0.5 0.5 -1",
            "3 5 0.5 0.5 0 x",
            "3 5 0.5 0.5 0 1 9",
            "3 5",
        ] {
            let input = format!("\x02PROMPT {hdr}\nA\nB\nnext\n");
            let got = frames(input.as_bytes(), 1);
            assert!(malformed(&got[0], "PROMPT"), "{hdr}: {got:?}");
            assert_eq!(got[1], Frame::UserLine("next".into()), "{hdr}");
        }
    }

    #[test]
    fn bad_length_reads_no_body() {
        for (hdr, why) in [
            ("-3 5 0.5 0.5", "negative"),
            ("x 5 0.5 0.5", "not a number"),
            ("16777217 5 0.5 0.5", "exceeds"),
            ("99999999999999999999999 5 0.5 0.5", "exceeds"),
        ] {
            let input = format!("\x02PROMPT {hdr}\nbody\n");
            let got = frames(input.as_bytes(), 1);
            assert!(malformed(&got[0], why), "{hdr}: {got:?}");
            assert_eq!(got[1], Frame::UserLine("body".into()));
        }
        let got = frames(b"\x02PROMPT \n", 1);
        assert!(malformed(&got[0], "without a byte count"));
    }

    #[test]
    fn nul_short_body_unknown_and_utf8() {
        let got = frames(b"\x02PROMPT 3 5 0.5 0.5\na\0b\nok\n", 1);
        assert!(malformed(&got[0], "NUL"));
        assert_eq!(got[1], Frame::UserLine("ok".into()));
        let got = frames(b"\x02PROMPT 10 5 0.5 0.5\nabc", 1);
        assert!(malformed(&got[0], "ended early"));
        assert_eq!(got[1], Frame::Eof);
        let got = frames(b"\x02FOO bar\n\x02PROMPT5\n\xff\xfe\n", 1);
        assert!(malformed(&got[0], "unknown command \\x02FOO"));
        assert!(malformed(&got[1], "unknown command"));
        assert!(malformed(&got[2], "UTF-8"));
        assert_eq!(got[3], Frame::Eof);
    }

    #[test]
    fn overlong_line_is_skipped_whole() {
        let mut r = FrameReader::new(
            &b"0123456789abcdef\nok\n"[..],
            FrameLimits {
                kv_slots: 1,
                max_body: 8,
                max_line: 4,
            },
        );
        assert!(
            matches!(r.next_frame().unwrap(), Frame::Malformed { reason } if reason.contains("16 bytes"))
        );
        assert_eq!(r.next_frame().unwrap(), Frame::UserLine("ok".into()));
    }

    #[test]
    fn limit_is_inclusive() {
        let mut input = format!("\x02PROMPT {} 1 0 1\n", 8).into_bytes();
        input.extend_from_slice(b"12345678\n");
        let mut r = FrameReader::new(
            &input[..],
            FrameLimits {
                kv_slots: 1,
                max_body: 8,
                max_line: 64,
            },
        );
        assert!(matches!(r.next_frame().unwrap(), Frame::Prompt { body, .. } if body.len() == 8));
        assert_eq!(r.next_frame().unwrap(), Frame::Eof);
    }
}
