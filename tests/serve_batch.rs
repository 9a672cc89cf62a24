//! `coli serve --batch` end to end: the real binary on the bundled model,
//! driven the way a multiplexing gateway drives it (docs/serve-batch-protocol.md).
//!
//! No test waits for time to pass: every step waits for a frame (with a
//! generous hang guard). Where a step races the model (a CANCEL, or a second
//! SUBMIT, against a request that must still be running), the server runs
//! with a simulated slow disk and one resident expert per layer, so every
//! token needs a 20 ms read per layer: the racing request is still
//! generating for seconds after the competing frame, which arrives in the
//! same write or right after its first DATA.

mod support;

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::process::{ChildStdin, ExitStatus};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use colibri::tokenizer::Tokenizer;
use support::{ColiChild, READY, REPLY_TIMEOUT, spawn_coli, tiny_chat_model, wait_bounded};

/// One frame from the server.
#[derive(Debug, Clone, PartialEq)]
enum Frame {
    Accept { id: String, prompt_tokens: usize },
    Data { id: String, bytes: Vec<u8> },
    Done { id: String, stat: Vec<String> },
    Error { id: String, code: Vec<String> },
}

impl Frame {
    fn id(&self) -> &str {
        match self {
            Frame::Accept { id, .. }
            | Frame::Data { id, .. }
            | Frame::Done { id, .. }
            | Frame::Error { id, .. } => id,
        }
    }

    fn is_last(&self) -> bool {
        matches!(self, Frame::Done { .. } | Frame::Error { .. })
    }
}

/// Everything one request got, ending with its DONE or ERROR.
#[derive(Debug, Clone)]
struct Outcome {
    frames: Vec<Frame>,
}

impl Outcome {
    fn text(&self) -> Vec<u8> {
        self.frames
            .iter()
            .filter_map(|f| match f {
                Frame::Data { bytes, .. } => Some(bytes.as_slice()),
                _ => None,
            })
            .flatten()
            .copied()
            .collect()
    }

    fn last(&self) -> &Frame {
        self.frames.last().expect("a last frame")
    }

    /// The DONE fields after `STAT`, checking the frame order on the way:
    /// ACCEPT, DATA..., DONE.
    fn done(&self) -> Vec<String> {
        let Frame::Done { stat, .. } = self.last() else {
            panic!("expected DONE: {self:?}")
        };
        assert!(matches!(self.frames[0], Frame::Accept { .. }), "{self:?}");
        assert!(
            self.frames[1..self.frames.len() - 1]
                .iter()
                .all(|f| matches!(f, Frame::Data { .. })),
            "{self:?}"
        );
        assert_eq!(stat.len(), 6, "{stat:?}");
        let accepted = match &self.frames[0] {
            Frame::Accept { prompt_tokens, .. } => prompt_tokens.to_string(),
            _ => unreachable!(),
        };
        assert_eq!(stat[4], accepted, "DONE and ACCEPT agree on the prompt: {self:?}");
        stat.clone()
    }

    /// The ERROR code fields (after the id).
    fn error(&self) -> Vec<String> {
        match self.last() {
            Frame::Error { code, .. } => code.clone(),
            f => panic!("expected ERROR: {f:?} in {self:?}"),
        }
    }
}

/// A running `coli serve --batch`.
struct Batch {
    child: ColiChild,
    stdin: Option<ChildStdin>,
    rx: Receiver<Vec<u8>>,
    buf: VecDeque<u8>,
    /// Frames read but not yet asked for, by id.
    stash: HashMap<String, VecDeque<Frame>>,
    /// Every frame in arrival order.
    log: Vec<Frame>,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_reader: Option<thread::JoinHandle<()>>,
}

fn pump<R: Read + Send + 'static>(
    mut r: R,
    mut sink: impl FnMut(Vec<u8>) -> bool + Send + 'static,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 || !sink(chunk[..n].to_vec()) {
                break;
            }
        }
    })
}

impl Batch {
    /// Starts the server on the bundled model (no state files, 4 slots unless
    /// `args` says otherwise) and checks the handshake.
    fn start(args: &[&str]) -> Batch {
        let model = tiny_chat_model();
        let mut argv: Vec<&std::ffi::OsStr> = vec!["serve".as_ref(), "--batch".as_ref(), "--model".as_ref()];
        argv.push(model.as_os_str());
        argv.extend(
            ["--no-kv-save", "--kv-slots", "4"]
                .iter()
                .map(std::ffi::OsStr::new),
        );
        argv.extend(args.iter().map(std::ffi::OsStr::new));
        let mut child = spawn_coli(argv);
        let stdin = child.stdin.take();
        let (tx, rx) = channel();
        if let Some(out) = child.stdout.take() {
            pump(out, move |b| tx.send(b).is_ok());
        }
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stderr_reader = child.stderr.take().map(|err| {
            let sink = stderr.clone();
            pump(err, move |b| {
                sink.lock().map(|mut s| s.extend_from_slice(&b)).is_ok()
            })
        });
        let mut b = Batch {
            child,
            stdin,
            rx,
            buf: VecDeque::new(),
            stash: HashMap::new(),
            log: Vec::new(),
            stderr,
            stderr_reader,
        };
        let head = b.read_exact(READY.len());
        assert_eq!(head, READY, "stderr: {}", b.stderr());
        let line = b.read_line();
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 7, "{line:?}");
        assert_eq!(&f[..4], ["STAT", "0", "0.0", "0.0"], "{line:?}");
        assert!(f[4].parse::<f64>().is_ok(), "{line:?}");
        assert_eq!(&f[5..], ["0", "0"], "{line:?}");
        b
    }

    fn stderr(&self) -> String {
        self.stderr
            .lock()
            .map(|s| String::from_utf8_lossy(&s).into_owned())
            .unwrap_or_default()
    }

    fn fill(&mut self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(b) => self.buf.extend(b),
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.child.kill();
                panic!(
                    "coli serve --batch did not answer in time; frames so far {:?}; stderr: {}",
                    self.log,
                    self.stderr()
                );
            }
            Err(RecvTimeoutError::Disconnected) => {
                wait_bounded(&mut self.child, REPLY_TIMEOUT);
                if let Some(h) = self.stderr_reader.take() {
                    let _ = h.join();
                }
                panic!(
                    "coli serve --batch closed stdout; frames so far {:?}; stderr: {}",
                    self.log,
                    self.stderr()
                );
            }
        }
    }

    fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let deadline = Instant::now() + REPLY_TIMEOUT;
        while self.buf.len() < n {
            self.fill(deadline);
        }
        self.buf.drain(..n).collect()
    }

    fn read_line(&mut self) -> String {
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return String::from_utf8(line[..i].to_vec()).expect("a header line is text");
            }
            self.fill(deadline);
        }
    }

    /// Reads the next frame off the wire.
    fn read_frame(&mut self) -> Frame {
        let line = self.read_line();
        let f: Vec<String> = line.split(' ').map(str::to_string).collect();
        assert!(f.len() >= 2, "{line:?}");
        let id = f[1].clone();
        let frame = match f[0].as_str() {
            "ACCEPT" => {
                assert_eq!(f.len(), 3, "{line:?}");
                Frame::Accept {
                    id,
                    prompt_tokens: f[2].parse().expect("prompt tokens"),
                }
            }
            "DATA" => {
                assert_eq!(f.len(), 3, "{line:?}");
                let n: usize = f[2].parse().expect("DATA length");
                assert!(n <= 65536, "{line:?}");
                let mut bytes = self.read_exact(n + 1);
                assert_eq!(bytes.pop(), Some(b'\n'), "DATA ends with a newline");
                Frame::Data { id, bytes }
            }
            "DONE" => {
                assert_eq!(f.get(2).map(String::as_str), Some("STAT"), "{line:?}");
                Frame::Done {
                    id,
                    stat: f[3..].to_vec(),
                }
            }
            "ERROR" => Frame::Error {
                id,
                code: f[2..].to_vec(),
            },
            _ => panic!("unexpected line {line:?}"),
        };
        self.log.push(frame.clone());
        frame
    }

    /// The next frame for `id` (frames for other ids are kept for later).
    fn next_for(&mut self, id: &str) -> Frame {
        if let Some(f) = self.stash.get_mut(id).and_then(VecDeque::pop_front) {
            return f;
        }
        loop {
            let f = self.read_frame();
            if f.id() == id {
                return f;
            }
            self.stash.entry(f.id().to_string()).or_default().push_back(f);
        }
    }

    /// Every frame for `id` up to its DONE or ERROR.
    fn outcome(&mut self, id: &str) -> Outcome {
        let mut frames = Vec::new();
        loop {
            let f = self.next_for(id);
            let last = f.is_last();
            frames.push(f);
            if last {
                return Outcome { frames };
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).expect("writing to coli serve --batch");
        stdin.flush().expect("flushing to coli serve --batch");
    }

    fn close_input(&mut self) {
        self.stdin = None;
    }

    /// Closes stdin, waits (bounded) for the exit; returns status and stderr.
    fn finish(mut self) -> (ExitStatus, String) {
        self.stdin = None;
        let status = wait_bounded(&mut self.child, REPLY_TIMEOUT);
        if let Some(h) = self.stderr_reader.take() {
            let _ = h.join();
        }
        (status, self.stderr())
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A greedy SUBMIT frame.
fn submit(id: &str, slot: usize, max_tokens: usize, prompt: &[u8]) -> Vec<u8> {
    let mut v = format!("SUBMIT {id} {slot} {} {max_tokens} 0 1\n", prompt.len()).into_bytes();
    v.extend_from_slice(prompt);
    v.push(b'\n');
    v
}

fn chat(question: &str) -> Vec<u8> {
    format!("<|user|>\n{question}\n<|assistant|>\n").into_bytes()
}

/// Server flags that make every token take a few 20 ms simulated reads.
const SLOW: &[&str] = &["--disk-sim", "lat=20ms", "--cache-cap", "1", "--pilot", "off"];
/// A request that, on a SLOW server, runs for seconds unless ended.
fn long_request(id: &str, slot: usize) -> Vec<u8> {
    submit(id, slot, 64, &chat("What does the word \"river\" mean?"))
}

#[test]
fn concurrent_requests_match_solo_runs() {
    let questions = [
        "What does the word \"river\" mean?",
        "What does the word \"lantern\" mean?",
        "Define \"quiet\".",
    ];
    let prompts: Vec<Vec<u8>> = questions.iter().map(|q| chat(q)).collect();

    // Alone: one request at a time, each on a fresh slot.
    let mut solo = Batch::start(&[]);
    let mut alone = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let id = format!("solo-{i}");
        solo.send(&submit(&id, i, 24, p));
        let o = solo.outcome(&id);
        let stat = o.done();
        alone.push((o.text(), stat));
    }
    let (status, err) = solo.finish();
    assert!(status.success(), "{status:?} {err}");

    // Together: every SUBMIT in one write, on a slow server so that all are
    // admitted long before any ends; the replies come interleaved.
    let mut s = Batch::start(SLOW);
    let mut frames = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        frames.extend(submit(&format!("{}", 100 + i), i, 24, p));
    }
    s.send(&frames);
    for (i, (text, stat)) in alone.iter().enumerate() {
        let o = s.outcome(&format!("{}", 100 + i));
        let got = o.done();
        assert_eq!(
            &o.text(),
            text,
            "request {i}: {:?} vs alone",
            String::from_utf8_lossy(&o.text())
        );
        assert!(!text.is_empty());
        assert_eq!(got[0], stat[0], "emitted");
        assert_eq!(got[4], stat[4], "prompt tokens");
        assert_eq!(got[5], stat[5], "length limited");
    }
    let first_done = s.log.iter().position(Frame::is_last).expect("a DONE");
    let accepted = s.log[..first_done]
        .iter()
        .filter(|f| matches!(f, Frame::Accept { .. }))
        .count();
    assert_eq!(accepted, prompts.len(), "all in flight at once: {:?}", s.log);
    let ids_before_done: std::collections::HashSet<&str> = s.log[..first_done]
        .iter()
        .filter(|f| matches!(f, Frame::Data { .. }))
        .map(Frame::id)
        .collect();
    assert_eq!(
        ids_before_done.len(),
        prompts.len(),
        "interleaved replies: {:?}",
        s.log
    );
    let (status, err) = s.finish();
    assert!(status.success(), "{status:?} {err}");
}

#[test]
fn slot_busy_duplicate_id_not_found_cancel_and_reuse() {
    let mut s = Batch::start(SLOW);
    // "a" runs for seconds; the frames after it arrive in the same write.
    let mut w = long_request("a", 0);
    w.extend(submit("b", 0, 8, &chat("Define \"quiet\".")));
    w.extend(submit("a", 1, 8, &chat("Define \"quiet\".")));
    w.extend_from_slice(b"CANCEL nope\nSTOP nope2\n");
    s.send(&w);
    assert_eq!(s.outcome("b").error(), ["SLOT_BUSY"]);
    assert_eq!(s.outcome("nope").error(), ["NOT_FOUND"]);
    assert_eq!(s.outcome("nope2").error(), ["NOT_FOUND"]);
    // The duplicate's refusal shares the id of the request still running.
    let first = s.outcome("a");
    assert_eq!(first.error(), ["DUPLICATE_ID"], "{first:?}");
    assert!(
        first.frames[..first.frames.len() - 1]
            .iter()
            .all(|f| matches!(f, Frame::Accept { .. } | Frame::Data { .. })),
        "{first:?}"
    );
    // Cancel "a" once it is generating: its reply ends with CANCELLED.
    let seen_data = first.frames.iter().any(|f| matches!(f, Frame::Data { .. }));
    if !seen_data {
        loop {
            match s.next_for("a") {
                Frame::Data { .. } => break,
                Frame::Accept { .. } => {}
                f => panic!("a ended before it was cancelled: {f:?}"),
            }
        }
    }
    s.send(b"CANCEL a\n");
    let rest = s.outcome("a");
    assert_eq!(rest.error(), ["CANCELLED"], "{rest:?}");
    assert!(
        rest.frames[..rest.frames.len() - 1]
            .iter()
            .all(|f| matches!(f, Frame::Accept { .. } | Frame::Data { .. })),
        "{rest:?}"
    );
    // A second CANCEL finds nothing.
    s.send(b"CANCEL a\n");
    assert_eq!(s.outcome("a").error(), ["NOT_FOUND"]);

    // The slot and the id are free again, and give the reply a fresh server gives.
    let prompt = chat("What does the word \"lantern\" mean?");
    s.send(&submit("a", 0, 6, &prompt));
    let again = s.outcome("a");
    again.done();
    let mut fresh = Batch::start(&[]);
    fresh.send(&submit("ref", 0, 6, &prompt));
    let reference = fresh.outcome("ref");
    reference.done();
    assert_eq!(again.text(), reference.text());
    let (status, err) = fresh.finish();
    assert!(status.success(), "{status:?} {err}");
    let (status, err) = s.finish();
    assert!(status.success(), "{status:?} {err}");
}

#[test]
fn cancel_right_after_submit_and_stop_mid_generation() {
    let mut s = Batch::start(SLOW);
    // CANCEL in the same write as its SUBMIT: ends with CANCELLED, with or
    // without an ACCEPT first (the loop may have admitted it already).
    let mut w = long_request("c", 2);
    w.extend_from_slice(b"CANCEL c\n");
    s.send(&w);
    let c = s.outcome("c");
    assert_eq!(c.error(), ["CANCELLED"], "{c:?}");

    // STOP once generating: a normal DONE, not an error.
    s.send(&long_request("d", 2));
    loop {
        match s.next_for("d") {
            Frame::Data { .. } => break,
            Frame::Accept { .. } => {}
            f => panic!("d ended before STOP: {f:?}"),
        }
    }
    s.send(b"STOP d\n");
    let d = s.outcome("d");
    let Frame::Done { stat, .. } = d.last() else {
        panic!("STOP ends with DONE: {d:?}")
    };
    assert_eq!(stat.len(), 6);
    assert_eq!(stat[5], "0", "a stopped reply is not length limited: {stat:?}");
    let emitted: usize = stat[0].parse().expect("emitted");
    assert!((1..64).contains(&emitted), "STOP ended it early: {stat:?}");

    // Slot 2 serves again.
    s.send(&submit("e", 2, 2, &chat("Define \"quiet\".")));
    s.outcome("e").done();
    let (status, err) = s.finish();
    assert!(status.success(), "{status:?} {err}");
}

#[test]
fn empty_prompt_and_context_exceeded() {
    let mut s = Batch::start(&["--ctx", "64"]);
    s.send(b"SUBMIT e 0 0 8 0 1\n\n");
    assert_eq!(s.outcome("e").error(), ["EMPTY_PROMPT"]);

    let prompt = b"the quick brown fox jumps over the lazy dog ".repeat(8);
    let tokens = Tokenizer::load(&tiny_chat_model())
        .expect("tokenizer")
        .encode(std::str::from_utf8(&prompt).expect("text"))
        .expect("tokens")
        .len();
    assert!(tokens > 64, "{tokens}");
    s.send(&submit("big", 1, 8, &prompt));
    assert_eq!(
        s.outcome("big").error(),
        [
            "CONTEXT_EXCEEDED".to_string(),
            tokens.to_string(),
            "64".to_string()
        ]
    );
    // The slot was not touched: a short request runs there.
    s.send(&submit("small", 1, 4, &chat("Define \"quiet\".")));
    s.outcome("small").done();
    let (status, err) = s.finish();
    assert!(status.success(), "{status:?} {err}");
}

#[test]
fn malformed_frames_then_a_valid_request() {
    let mut s = Batch::start(&[]);
    let prompt = chat("What does the word \"lantern\" mean?");
    s.send(&submit("ref", 1, 16, &prompt));
    let reference = s.outcome("ref");
    reference.done();

    let mut w = Vec::new();
    w.extend_from_slice(b"SUBMIT 9 0 3 8 0 1\nabcX\n"); // no newline after the payload
    w.extend_from_slice(b"SUBMIT 10 0 5 8 nope 1\nhello\n"); // a bad field: payload skipped
    w.extend_from_slice(b"SUBMIT 11 7 5 8 0 1\nhello\n"); // slot 7 of 4
    w.extend_from_slice(b"SUBMIT 12 0 5 8 0 1 0 logprobs=5\nhello\n"); // an extension
    w.extend_from_slice(b"SUBMIT 13 0 5 8 0 1 4\nhelloGBNF\n"); // extra payload bytes
    w.extend_from_slice(b"SUBMIT 14 0 x 8 0 1\n"); // no usable length: header only
    w.extend_from_slice(b"CANCEL\n"); // no id
    w.extend_from_slice(b"this is not a command\n\n");
    w.extend_from_slice(b"IMAGE 15 3 2 2\nxyz\n"); // images are not supported...
    w.extend(submit("15", 0, 8, &prompt)); // ...so the request they belong to is refused
    w.extend(submit("16", 2, 16, &prompt));
    s.send(&w);
    assert_eq!(s.outcome("9").error(), ["BAD_FRAME"]);
    for id in ["10", "11", "12", "13", "14", "0", "15"] {
        assert_eq!(s.outcome(id).error(), ["BAD_REQUEST"], "{id}");
    }
    let good = s.outcome("16");
    good.done();
    assert_eq!(good.text(), reference.text());
    let (status, err) = s.finish();
    assert!(status.success(), "{status:?} {err}");
}

#[test]
fn gateway_shaped_frames() {
    // What a gateway writes: numeric ids, %.8g sampling values, the optional
    // extra-bytes field (0) and prefix hint, CRLF line ends.
    let mut s = Batch::start(&[]);
    let prompt = chat("Define \"quiet\".");
    let mut w = format!("SUBMIT 1 0 {} 12 0 1 0\r\n", prompt.len()).into_bytes();
    w.extend_from_slice(&prompt);
    w.extend_from_slice(b"\r\n");
    w.extend(format!("SUBMIT 2 1 {} 12 0 1 0 7\n", prompt.len()).into_bytes());
    w.extend_from_slice(&prompt);
    w.push(b'\n');
    w.extend(format!("SUBMIT 3 2 {} 12 0.69999999 0.94999999\n", prompt.len()).into_bytes());
    w.extend_from_slice(&prompt);
    w.push(b'\n');
    s.send(&w);
    let one = s.outcome("1");
    let two = s.outcome("2");
    one.done();
    two.done();
    assert_eq!(one.text(), two.text(), "same greedy request, same reply");
    s.outcome("3").done();
    let (status, err) = s.finish();
    assert!(status.success(), "{status:?} {err}");
}

#[test]
fn eof_lets_requests_in_flight_finish() {
    let mut s = Batch::start(&[]);
    let mut w = submit("x", 0, 32, &chat("What does the word \"river\" mean?"));
    w.extend(submit("y", 1, 32, &chat("Define \"quiet\".")));
    w.extend_from_slice(b"CANCEL zz"); // cut off by the end of input
    s.send(&w);
    s.close_input();
    s.outcome("x").done();
    s.outcome("y").done();
    assert_eq!(s.outcome("zz").error(), ["BAD_FRAME"]);
    let (status, err) = s.finish();
    assert!(status.success(), "{status:?} {err}");
    assert!(err.contains("ready"), "{err}");
}
