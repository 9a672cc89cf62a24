//! `coli serve` protocol: frame reader properties and the session state
//! machine driven through every frame type with a mock engine.

use std::ops::ControlFlow;

use colibri::chat_template::ChatMessage;
use colibri::serve::{
    Frame, FrameLimits, FrameReader, GenOutcome, GenParams, ServeConfig, ServeEngine, ServeError, run_serve,
};
use proptest::prelude::*;

// ---------------------------------------------------------------- mock engine

#[derive(Debug, thiserror::Error)]
#[error("mock: {0}")]
struct MockError(String);

#[derive(Debug, Clone, PartialEq)]
struct Call {
    slot: usize,
    prefill: Vec<u32>,
    max_tokens: usize,
    temperature: f32,
}

/// Tokens are bytes; generation streams `STREAM` one byte per token, `.` is EOS
/// (kept in the history, not emitted). MORE-style calls (re-feeding the last
/// emitted token) continue the stream, every other call restarts it.
struct Mock {
    slots: Vec<Vec<u32>>,
    cursor: Vec<usize>,
    last_emitted: Vec<Option<u32>>,
    calls: Vec<Call>,
    truncations: Vec<(usize, usize)>,
    resets: Vec<usize>,
    persisted: Vec<usize>,
    finished: bool,
    fail_generate: bool,
}

const STREAM: &[u8] = b"Hello world.";

impl Mock {
    fn new(slots: usize) -> Self {
        Mock {
            slots: vec![Vec::new(); slots],
            cursor: vec![0; slots],
            last_emitted: vec![None; slots],
            calls: Vec::new(),
            truncations: Vec::new(),
            resets: Vec::new(),
            persisted: Vec::new(),
            finished: false,
            fail_generate: false,
        }
    }
}

fn bytes_of(t: &[u32]) -> String {
    t.iter().map(|&b| b as u8 as char).collect()
}

impl ServeEngine for Mock {
    type Error = MockError;

    fn tokenize(&self, text: &str) -> Result<Vec<u32>, MockError> {
        if text.contains("BADTOK") {
            return Err(MockError("cannot tokenize".into()));
        }
        Ok(text.bytes().map(u32::from).collect())
    }

    fn render_user_turn(&self, history: &[ChatMessage], user_text: &str) -> Result<String, MockError> {
        if user_text == "BADTPL" {
            return Err(MockError("template raised".into()));
        }
        let pre = if history.is_empty() { "<s>" } else { "" };
        Ok(format!("{pre}[U]{user_text}[A]"))
    }

    fn slot_tokens(&self, slot: usize) -> &[u32] {
        &self.slots[slot]
    }

    fn truncate_slot(&mut self, slot: usize, len: usize) -> Result<(), MockError> {
        assert!(len <= self.slots[slot].len());
        self.truncations.push((slot, len));
        self.slots[slot].truncate(len);
        Ok(())
    }

    fn reset_slot(&mut self, slot: usize) -> Result<(), MockError> {
        self.resets.push(slot);
        self.slots[slot].clear();
        self.cursor[slot] = 0;
        self.last_emitted[slot] = None;
        Ok(())
    }

    fn prefill_and_generate(
        &mut self,
        slot: usize,
        tokens: &[u32],
        params: &GenParams,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<GenOutcome, MockError> {
        assert!(!tokens.is_empty(), "the session must never prefill nothing");
        if self.fail_generate {
            return Err(MockError("disk on fire".into()));
        }
        self.calls.push(Call {
            slot,
            prefill: tokens.to_vec(),
            max_tokens: params.max_tokens,
            temperature: params.temperature,
        });
        let cont = tokens.len() == 1 && self.last_emitted[slot] == Some(tokens[0]);
        if !cont {
            self.cursor[slot] = 0;
        }
        self.slots[slot].extend_from_slice(tokens);
        let mut emitted = 0;
        while emitted < params.max_tokens && self.cursor[slot] < STREAM.len() {
            let b = STREAM[self.cursor[slot]];
            self.cursor[slot] += 1;
            self.slots[slot].push(u32::from(b));
            self.last_emitted[slot] = Some(u32::from(b));
            if b == b'.' {
                break;
            }
            emitted += 1;
            if on_text(&(b as char).to_string()).is_break() {
                break;
            }
        }
        Ok(GenOutcome {
            emitted,
            tok_per_s: 12.5,
            hit_pct: 87.5,
        })
    }

    fn persist(&mut self, slot: usize) -> Result<(), MockError> {
        self.persisted.push(slot);
        Ok(())
    }

    fn finish(&mut self) -> Result<(), MockError> {
        self.finished = true;
        Ok(())
    }

    fn rss_gb(&self) -> f64 {
        1.5
    }
}

/// A mock that also records the chat history it is asked to render with.
struct Recording(Mock);

impl ServeEngine for Recording {
    type Error = MockError;
    fn tokenize(&self, t: &str) -> Result<Vec<u32>, MockError> {
        self.0.tokenize(t)
    }
    fn render_user_turn(&self, h: &[ChatMessage], u: &str) -> Result<String, MockError> {
        // Interior mutability is not worth it here: encode the history length in the text.
        Ok(format!("{}#{}", self.0.render_user_turn(h, u)?, h.len()))
    }
    fn slot_tokens(&self, s: usize) -> &[u32] {
        self.0.slot_tokens(s)
    }
    fn truncate_slot(&mut self, s: usize, l: usize) -> Result<(), MockError> {
        self.0.truncate_slot(s, l)
    }
    fn reset_slot(&mut self, s: usize) -> Result<(), MockError> {
        self.0.reset_slot(s)
    }
    fn prefill_and_generate(
        &mut self,
        s: usize,
        t: &[u32],
        p: &GenParams,
        f: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<GenOutcome, MockError> {
        self.0.prefill_and_generate(s, t, p, f)
    }
    fn persist(&mut self, s: usize) -> Result<(), MockError> {
        self.0.persist(s)
    }
    fn rss_gb(&self) -> f64 {
        1.5
    }
}

fn cfg(slots: usize, max_tokens: usize) -> ServeConfig {
    ServeConfig {
        kv_slots: slots,
        max_tokens,
        ..ServeConfig::default()
    }
}

fn serve<E: ServeEngine>(engine: &mut E, c: &ServeConfig, input: &[u8]) -> (String, String) {
    let mut out = Vec::new();
    let mut diag = Vec::new();
    run_serve(input, &mut out, &mut diag, engine, c).unwrap();
    (String::from_utf8(out).unwrap(), String::from_utf8(diag).unwrap())
}

const READY: &str = "\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.50\n";
const END: &str = "\x01\x01END\x01\x01\n";
const IDLE: &str = "\x01\x01END\x01\x01\nSTAT 0 0.00 0.0 1.50\n";
const BAD: &str = "\x01\x01END\x01\x01\nSTAT 0 0.00 0.0 1.50 0 0\n";

fn prompt(body: &str, rest: &str) -> String {
    format!("\x02PROMPT {} {rest}\n{body}\n", body.len())
}

// ---------------------------------------------------------------- session

#[test]
fn chat_turns_more_and_eof() {
    let mut m = Mock::new(1);
    let (out, diag) = serve(&mut m, &cfg(1, 5), b"hi\n\x02MORE\n\x02MORE\n\x02MORE\nagain\n");
    let want = [
        READY,
        // "<s>[U]hi[A]" = 11 tokens; 5 emitted = the limit.
        "Hello\n",
        END,
        "STAT 5 12.50 87.5 1.50 11 1\n",
        // MORE continues with the short STAT.
        " worl\n",
        END,
        "STAT 5 12.50 87.5 1.50\n",
        // "d" then EOS: not limited any more.
        "d\n",
        END,
        "STAT 1 12.50 87.5 1.50\n",
        // Nothing to continue.
        IDLE,
        // Second turn continues the conversation: no "<s>".
        "Hello\n",
        END,
        "STAT 5 12.50 87.5 1.50 11 1\n",
    ]
    .concat();
    assert_eq!(out, want);
    assert!(diag.is_empty(), "{diag}");
    let prefills: Vec<String> = m.calls.iter().map(|c| bytes_of(&c.prefill)).collect();
    assert_eq!(prefills, ["<s>[U]hi[A]", "o", "l", "[U]again[A]"]);
    assert!(m.calls.iter().all(|c| c.temperature == 0.7 && c.max_tokens == 5));
    // The history holds every emitted token plus EOS.
    assert_eq!(bytes_of(&m.slots[0]), "<s>[U]hi[A]Hello world.[U]again[A]Hello");
    assert_eq!(m.persisted, [0, 0, 0, 0, 0]);
    assert!(m.finished);
}

#[test]
fn chat_history_is_passed_to_the_template() {
    let mut r = Recording(Mock::new(1));
    let (out, _) = serve(&mut r, &cfg(1, 20), b"a\nb\n\x02RESET\nc\n");
    // Turn 1: empty history; turn 2: [user a, assistant "Hello world"]; after RESET empty again.
    let prefills: Vec<String> = r.0.calls.iter().map(|c| bytes_of(&c.prefill)).collect();
    assert_eq!(prefills, ["<s>[U]a[A]#0", "[U]b[A]#2", "<s>[U]c[A]#0"]);
    assert!(
        out.contains(&format!("Hello world\n{END}STAT 11 12.50 87.5 1.50 9 0\n{IDLE}")),
        "{out:?}"
    );
    assert_eq!(r.0.resets, [0]);
}

#[test]
fn resumed_slot_continues_without_preamble() {
    let mut r = Recording(Mock::new(1));
    r.0.slots[0] = vec![1, 2, 3]; // loaded from disk
    serve(&mut r, &cfg(1, 3), b"x\n");
    // Placeholder history of 2 messages: the template renders a continuation.
    assert_eq!(bytes_of(&r.0.calls[0].prefill), "[U]x[A]#2");
}

#[test]
fn raw_prompt_reuses_the_longest_common_prefix() {
    let mut m = Mock::new(2);
    let input = [
        prompt("abcdef", "3 0 1 1"),
        prompt("abcXY", "3 0.5 0.9 1 7"),
        // Equal to the whole history (prompt + 3 generated): re-feed the last token
        // (the mock then continues its stream).
        prompt("abcXYHel", "2 0 1 1"),
    ]
    .concat();
    let (out, diag) = serve(&mut m, &cfg(2, 100), input.as_bytes());
    let want = [
        READY,
        "Hel",
        END,
        "STAT 3 12.50 87.5 1.50 6 1\n",
        "Hel",
        END,
        // prompt_tokens = tokens actually prefilled after prefix reuse.
        "STAT 3 12.50 87.5 1.50 2 1\n",
        "lo",
        END,
        "STAT 2 12.50 87.5 1.50 1 1\n",
    ]
    .concat();
    assert_eq!(out, want, "{diag}");
    let prefills: Vec<String> = m.calls.iter().map(|c| bytes_of(&c.prefill)).collect();
    assert_eq!(prefills, ["abcdef", "XY", "l"]);
    assert_eq!(m.truncations, [(1, 3), (1, 7)]);
    assert_eq!(m.calls[1].temperature, 0.5);
    assert!(m.slots[0].is_empty());
    assert_eq!(m.persisted, [1, 1, 1, 0, 1]);
}

#[test]
fn two_slots_interleaved_keep_separate_histories() {
    let mut m = Mock::new(3);
    let input = [
        prompt("slot zero", "4 0 1 0"),
        prompt("slot two", "4 0 1 2"),
        prompt("slot zero and more", "4 0 1 0"),
        prompt("slot two", "4 0 1 2"),
        "\x02MORE\n".to_string(),
    ]
    .concat();
    let (out, _) = serve(&mut m, &cfg(3, 100), input.as_bytes());
    let prefills: Vec<(usize, String)> = m.calls.iter().map(|c| (c.slot, bytes_of(&c.prefill))).collect();
    assert_eq!(
        prefills,
        [
            (0, "slot zero".to_string()),
            (2, "slot two".to_string()),
            // "slot zero" + "Hell" generated: common prefix is "slot zero".
            (0, " and more".to_string()),
            // identical prompt: re-feed its last token.
            (2, "o".to_string()),
            // MORE continues the most recently used slot (2).
            (2, "l".to_string()),
        ]
    );
    assert_eq!(m.truncations, [(0, 9), (2, 7), (2, 11)]);
    assert!(out.ends_with(&format!(
        "Hell{END}STAT 4 12.50 87.5 1.50 1 1\no wo\n{END}STAT 4 12.50 87.5 1.50\n"
    )));
    assert_eq!(bytes_of(&m.slots[2]), "slot twoHello wo");
}

#[test]
fn prompt_max_tokens_is_capped_and_context_bounds_the_budget() {
    let mut m = Mock::new(1);
    let c = ServeConfig {
        kv_slots: 1,
        max_tokens: 4,
        max_ctx: 30,
        ..ServeConfig::default()
    };
    let (out, _) = serve(&mut m, &c, prompt("0123456789abc", "100 0 1").as_bytes());
    // The server cap (4) wins over the request (100).
    assert_eq!(m.calls[0].max_tokens, 4);
    assert!(out.ends_with("STAT 4 12.50 87.5 1.50 13 1\n"), "{out:?}");

    let mut m = Mock::new(1);
    let c = ServeConfig {
        kv_slots: 1,
        max_tokens: 100,
        max_ctx: 30,
        ..ServeConfig::default()
    };
    let long = "x".repeat(40);
    let (out, _) = serve(
        &mut m,
        &c,
        [prompt(&long, "100 0 1"), "\x02MORE\n".into()]
            .concat()
            .as_bytes(),
    );
    // The prompt is cut to max_ctx - 8 = 22 tokens; the budget is 30 - 22 - 2 = 6.
    assert_eq!(m.calls[0].max_tokens, 6);
    // MORE at 28 tokens: no room left, prefill only.
    assert_eq!(m.calls[1].max_tokens, 0);
    assert!(
        out.ends_with(&format!(
            "Hello {END}STAT 6 12.50 87.5 1.50 22 1\n\n{END}STAT 0 12.50 87.5 1.50\n"
        )),
        "{out:?}"
    );
}

#[test]
fn a_full_conversation_starts_over() {
    let mut m = Mock::new(1);
    let c = ServeConfig {
        kv_slots: 1,
        max_tokens: 3,
        max_ctx: 30,
        ..ServeConfig::default()
    };
    serve(&mut m, &c, b"first\nsecond\n");
    assert_eq!(m.resets, [0]);
    let prefills: Vec<String> = m.calls.iter().map(|c| bytes_of(&c.prefill)).collect();
    assert_eq!(prefills, ["<s>[U]first[A]", "<s>[U]second[A]"]);
}

#[test]
fn reset_and_empty_line_get_idle_replies() {
    let mut m = Mock::new(1);
    m.slots[0] = vec![9; 4];
    let (out, _) = serve(&mut m, &cfg(1, 3), b"\x02RESET\n\n\x02MORE\n");
    assert_eq!(out, [READY, IDLE, IDLE, IDLE].concat());
    assert!(m.slots[0].is_empty());
    assert!(m.calls.is_empty());
}

#[test]
fn every_malformed_frame_gets_the_malformed_reply_and_sync_is_kept() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (prompt("abc", "x 0 1").into_bytes(), "max_tokens"),
        (prompt("abc", "0 0 1").into_bytes(), "max_tokens"),
        (prompt("abc", "5 nan 1").into_bytes(), "temperature"),
        (prompt("abc", "5 inf 1").into_bytes(), "temperature"),
        (prompt("abc", "5 -1 1").into_bytes(), "temperature"),
        (prompt("abc", "5 0.5 0").into_bytes(), "top_p"),
        (prompt("abc", "5 0.5 1.01").into_bytes(), "top_p"),
        (prompt("abc", "5 0.5 1 2").into_bytes(), "kv_slot"),
        (prompt("abc", "5 0.5 1 0 1.5").into_bytes(), "seed"),
        (
            prompt("abc", "5 0.5 1 0 18446744073709551616").into_bytes(),
            "seed",
        ),
        (
            prompt("abc", "5 2.5 1").into_bytes(),
            "temperature must be a number in [0, 2], got 2.5",
        ),
        (prompt("a\0c", "5 0.5 1").into_bytes(), "NUL"),
        (prompt("BADTOK", "5 0.5 1").into_bytes(), "tokenizing failed"),
        (prompt("", "5 0.5 1").into_bytes(), "empty after tokenization"),
        (b"\x02PROMPT 2 5 0.5 1\n\xff\xfe\n".to_vec(), "UTF-8"),
        (b"\x02PROMPT -1 5 0.5 1\n".to_vec(), "negative"),
        (b"\x02PROMPT 99999999 5 0.5 1\n".to_vec(), "exceeds"),
        (b"\x02PROMPT abc 5 0.5 1\n".to_vec(), "not a number"),
        (b"\x02STATUS\n".to_vec(), "unknown command"),
        (b"BADTPL\n".to_vec(), "chat template failed"),
        (b"BADTOK\n".to_vec(), "tokenizing failed"),
        (b"\xc3(\n".to_vec(), "UTF-8"),
    ];
    for (frame, why) in cases {
        let mut m = Mock::new(2);
        let mut input = frame.clone();
        input.extend_from_slice(prompt("ok", "1 0 1").as_bytes());
        let (out, diag) = serve(&mut m, &cfg(2, 8), &input);
        let want = [READY, BAD, "H", END, "STAT 1 12.50 87.5 1.50 2 1\n"].concat();
        assert_eq!(out, want, "frame {:?}", frame.escape_ascii().to_string());
        assert!(
            diag.contains(why),
            "frame {:?}: diag {diag:?}",
            frame.escape_ascii().to_string()
        );
        assert_eq!(m.calls.len(), 1);
    }
}

#[test]
fn short_body_at_eof_is_malformed_then_exit() {
    let mut m = Mock::new(1);
    let (out, diag) = serve(&mut m, &cfg(1, 8), b"\x02PROMPT 50 1 0 1\nabc");
    assert_eq!(out, [READY, BAD].concat());
    assert!(diag.contains("ended early"));
    assert_eq!(m.persisted, [0]);
    assert!(m.finished);
}

#[test]
fn generation_failure_closes_the_reply_and_errors() {
    let mut m = Mock::new(1);
    m.fail_generate = true;
    let mut out = Vec::new();
    let mut diag = Vec::new();
    let err = run_serve(&b"hi\n"[..], &mut out, &mut diag, &mut m, &cfg(1, 8)).unwrap_err();
    assert!(matches!(err, ServeError::Engine { .. }), "{err}");
    assert!(String::from_utf8(out).unwrap().ends_with(BAD));
}

/// Takes `room` bytes, then fails like a pipe whose reader went away.
struct ClosingPipe {
    room: usize,
    got: Vec<u8>,
}

impl std::io::Write for ClosingPipe {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = b.len().min(self.room - self.got.len());
        if n == 0 && !b.is_empty() {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        self.got.extend_from_slice(&b[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_closed_output_ends_the_session_after_saving_every_slot() {
    let mut m = Mock::new(2);
    // READY and two bytes of the first reply go out, then the reader leaves.
    let mut out = ClosingPipe {
        room: READY.len() + 2,
        got: Vec::new(),
    };
    let err = run_serve(&b"hi\nthere\n"[..], &mut out, &mut Vec::new(), &mut m, &cfg(2, 8)).unwrap_err();
    assert!(
        matches!(&err, ServeError::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe),
        "{err}"
    );
    assert_eq!(String::from_utf8_lossy(&out.got), [READY, "He"].concat());
    // The turn that could not be read stopped early; nothing after it ran.
    assert_eq!(m.calls.len(), 1);
    assert_eq!(bytes_of(&m.slots[0]), "<s>[U]hi[A]Hel");
    // Every slot saved as at EOF, then the engine finished.
    assert_eq!(m.persisted, [0, 1]);
    assert!(m.finished);
}

#[test]
fn bad_slot_count_is_a_config_error() {
    let mut m = Mock::new(1);
    for slots in [0, 17] {
        let err = run_serve(&b""[..], &mut Vec::new(), &mut Vec::new(), &mut m, &cfg(slots, 8)).unwrap_err();
        assert!(matches!(err, ServeError::Config(_)));
    }
}

// ---------------------------------------------------------------- frame properties

fn drain(input: &[u8], limits: FrameLimits) -> Vec<Frame> {
    let mut r = FrameReader::new(input, limits);
    let mut frames = Vec::new();
    // Each frame consumes at least one byte: len + 1 calls must reach EOF.
    for _ in 0..=input.len() + 1 {
        let f = r.next_frame().unwrap();
        if f == Frame::Eof {
            return frames;
        }
        frames.push(f);
    }
    panic!("no progress: {} frames from {} bytes", frames.len(), input.len());
}

fn protocol_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40),
        Just(b"\x02PROMPT ".to_vec()),
        Just(b"\x02RESET\n".to_vec()),
        Just(b"\x02MORE\n".to_vec()),
        Just(b"\n".to_vec()),
        (0u32..30, 0u32..3).prop_map(|(n, k)| format!("\x02PROMPT {n} 5 0.5 0.5 {k}\n").into_bytes()),
    ];
    prop::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

/// Frames a well-behaved client may send that the server must refuse.
fn malformed_frame() -> impl Strategy<Value = Vec<u8>> {
    let body = prop::collection::vec(any::<u8>(), 0..30);
    prop_oneof![
        // valid length, some other field broken: the body follows
        (
            body.clone(),
            prop_oneof![
                Just("x 1 1"),
                Just("5 nan 1"),
                Just("5 1 0"),
                Just("5 1 1 9"),
                Just("5")
            ]
        )
            .prop_map(|(b, rest)| {
                let mut v = format!("\x02PROMPT {} {rest}\n", b.len()).into_bytes();
                v.extend_from_slice(&b);
                v.push(b'\n');
                v
            }),
        // NUL inside an otherwise valid frame
        body.clone().prop_map(|mut b| {
            b.push(0);
            let mut v = format!("\x02PROMPT {} 5 1 1\n", b.len()).into_bytes();
            v.extend_from_slice(&b);
            v
        }),
        // unusable length: no body is sent or read
        prop_oneof![Just("-5"), Just("abc"), Just("99999999999"), Just("+5")]
            .prop_map(|n| format!("\x02PROMPT {n} 5 1 1\n").into_bytes()),
        // unknown commands, invalid UTF-8, overlong lines
        "[A-Z]{1,8}".prop_map(|c| format!("\x02X{c}\n").into_bytes()),
        Just(b"\xff\xfe\xfd\n".to_vec()),
        Just([vec![b'a'; 300], vec![b'\n']].concat()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn arbitrary_bytes_never_panic_and_always_progress(input in protocol_bytes()) {
        drain(&input, FrameLimits { kv_slots: 2, max_body: 64, max_line: 100 });
    }

    #[test]
    fn random_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..400)) {
        drain(&input, FrameLimits { kv_slots: 2, max_body: 64, max_line: 100 });
    }

    #[test]
    fn a_valid_frame_after_malformed_ones_parses(
        bad in prop::collection::vec(malformed_frame(), 1..4),
        body in prop::collection::vec(1u8..=255, 0..50),
        max_tokens in 1usize..1000,
        slot in 0usize..2,
        seed in any::<u64>(),
    ) {
        let mut input = bad.concat();
        input.extend_from_slice(format!("\x02PROMPT {} {max_tokens} 0.25 0.5 {slot} {seed}\n", body.len()).as_bytes());
        input.extend_from_slice(&body);
        input.extend_from_slice(b"\nafter\n");
        let frames = drain(&input, FrameLimits { kv_slots: 2, max_body: 64, max_line: 100 });
        prop_assert_eq!(frames.len(), bad.len() + 2, "{:?}", frames);
        for f in &frames[..bad.len()] {
            prop_assert!(matches!(f, Frame::Malformed { .. }), "{:?}", f);
        }
        prop_assert_eq!(&frames[bad.len()], &Frame::Prompt {
            body: body.clone(), max_tokens, temperature: 0.25, top_p: 0.5, kv_slot: Some(slot), seed: Some(seed),
        });
        prop_assert_eq!(&frames[bad.len() + 1], &Frame::UserLine("after".into()));
    }
}
