//! Drives the real `coli` binary as a subprocess, every read bounded in time.
#![allow(dead_code)]

pub mod http;
pub mod oracle;
pub mod schema;
pub mod synth;

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub const END: &[u8] = b"\x01\x01END\x01\x01\n";
pub const READY: &[u8] = b"\x01\x01READY\x01\x01\n";
/// Longest wait for any one reply (debug build on a busy machine).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(90);

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn tiny_chat_model() -> PathBuf {
    repo().join("models").join("colibri-tiny")
}

pub fn olmoe_fixture() -> PathBuf {
    repo().join("fixtures").join("olmoe-tiny")
}

pub fn coli() -> &'static str {
    env!("CARGO_BIN_EXE_coli")
}

/// A `coli` command that cannot touch the user's files: HOME, the XDG
/// state, data and cache directories and the models directory
/// (`COLI_MODELS`) all lie in a temporary directory of its own, removed when
/// this command and every child it spawned are gone; `COLI_MODEL` and
/// `RUST_LOG` from the environment are removed. Every test that runs `coli`
/// starts it through this (an explicit `--state-dir` is still honoured).
/// Builder methods return `&mut Self` (not the `Command` inside) so a
/// spawned child always keeps the directory alive.
pub struct ColiCommand {
    cmd: Command,
    home: Arc<tempfile::TempDir>,
}

/// A fresh [`ColiCommand`].
pub fn coli_command() -> ColiCommand {
    let home = Arc::new(tempfile::tempdir().expect("a temporary HOME for coli"));
    let root = home.path();
    let mut cmd = Command::new(coli());
    cmd.env("HOME", root)
        .env("XDG_STATE_HOME", root.join("state"))
        .env("XDG_DATA_HOME", root.join("data"))
        .env("XDG_CACHE_HOME", root.join("cache"))
        .env("COLI_MODELS", root.join("models"))
        .env_remove("COLI_MODEL")
        .env_remove("RUST_LOG");
    ColiCommand { cmd, home }
}

impl ColiCommand {
    /// The temporary directory HOME and the others point into.
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    pub fn arg(&mut self, a: impl AsRef<OsStr>) -> &mut Self {
        self.cmd.arg(a);
        self
    }

    pub fn args<S: AsRef<OsStr>>(&mut self, args: impl IntoIterator<Item = S>) -> &mut Self {
        self.cmd.args(args);
        self
    }

    pub fn env(&mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> &mut Self {
        self.cmd.env(k, v);
        self
    }

    pub fn env_remove(&mut self, k: impl AsRef<OsStr>) -> &mut Self {
        self.cmd.env_remove(k);
        self
    }

    pub fn stdin(&mut self, s: Stdio) -> &mut Self {
        self.cmd.stdin(s);
        self
    }

    pub fn stdout(&mut self, s: Stdio) -> &mut Self {
        self.cmd.stdout(s);
        self
    }

    pub fn stderr(&mut self, s: Stdio) -> &mut Self {
        self.cmd.stderr(s);
        self
    }

    /// Runs to the end (stdin, unless set, is empty), capturing stdout and stderr.
    pub fn output(&mut self) -> Output {
        self.cmd.output().expect("running coli")
    }

    pub fn spawn(&mut self) -> ColiChild {
        ColiChild {
            child: self.cmd.spawn().expect("spawning coli"),
            _home: self.home.clone(),
        }
    }
}

/// A running `coli` and the temporary directory of its [`ColiCommand`].
pub struct ColiChild {
    child: Child,
    _home: Arc<tempfile::TempDir>,
}

impl ColiChild {
    pub fn wait_with_output(self) -> Output {
        self.child.wait_with_output().expect("waiting for coli")
    }
}

impl Deref for ColiChild {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for ColiChild {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

/// One reply: the bytes before END and the STAT fields after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub text: Vec<u8>,
    pub stat: Vec<String>,
}

impl Reply {
    pub fn field(&self, i: usize) -> usize {
        self.stat[i]
            .parse()
            .unwrap_or_else(|_| panic!("STAT field {i} of {:?}", self.stat))
    }
    pub fn is_malformed(&self) -> bool {
        self.text.is_empty()
            && self.stat.len() == 6
            && self.stat[0] == "0"
            && self.stat[1] == "0.00"
            && self.stat[2] == "0.0"
            && self.stat[4] == "0"
            && self.stat[5] == "0"
    }
    pub fn text_str(&self) -> String {
        String::from_utf8_lossy(&self.text).into_owned()
    }
}

/// A running `coli serve`.
pub struct Server {
    child: ColiChild,
    stdin: Option<ChildStdin>,
    rx: Receiver<Vec<u8>>,
    buf: Vec<u8>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// The thread copying stderr; joined (it ends at the child's exit) before
    /// stderr is read for a verdict, so no message is missed.
    stderr_reader: Option<thread::JoinHandle<()>>,
}

fn drain<R: Read + Send + 'static>(
    mut r: R,
    mut sink: impl FnMut(Vec<u8>) -> bool + Send + 'static,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if !sink(chunk[..n].to_vec()) {
                        break;
                    }
                }
            }
        }
    })
}

/// Starts `coli ARGS...` (a [`coli_command`]) with piped stdin, stdout and
/// stderr.
pub fn spawn_coli<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> ColiChild {
    coli_command()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}

impl Server {
    /// Starts `coli serve --model MODEL ARGS...` (no READY read yet).
    pub fn spawn(model: &Path, args: &[&str]) -> Server {
        let child = spawn_coli(
            [
                std::ffi::OsStr::new("serve"),
                "--model".as_ref(),
                model.as_os_str(),
            ]
            .into_iter()
            .chain(args.iter().map(std::ffi::OsStr::new)),
        );
        Self::attach(child)
    }

    /// Starts a prepared `coli` command (arguments, environment) with piped
    /// stdio (no READY read yet).
    pub fn from_command(mut cmd: ColiCommand) -> Server {
        let child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        Self::attach(child)
    }

    fn attach(mut child: ColiChild) -> Server {
        let stdin = child.stdin.take();
        let (tx, rx) = channel();
        if let Some(out) = child.stdout.take() {
            drain(out, move |b| tx.send(b).is_ok());
        }
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stderr_reader = child.stderr.take().map(|err| {
            let sink = stderr.clone();
            drain(err, move |b| {
                sink.lock().map(|mut s| s.extend_from_slice(&b)).is_ok()
            })
        });
        Server {
            child,
            stdin,
            rx,
            buf: Vec::new(),
            stderr,
            stderr_reader,
        }
    }

    /// Starts the server and checks the READY handshake.
    pub fn start(model: &Path, args: &[&str]) -> Server {
        let mut s = Server::spawn(model, args);
        s.expect_ready();
        s
    }

    pub fn expect_ready(&mut self) {
        let head = self.read_exact_prefix(READY.len());
        assert_eq!(head, READY, "stderr: {}", self.stderr());
        let line = self.read_line();
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 5, "{line:?}");
        assert_eq!(&f[..4], ["STAT", "0", "0.00", "0.0"], "{line:?}");
        assert!(f[4].parse::<f64>().is_ok(), "{line:?}");
    }

    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .map(|s| String::from_utf8_lossy(&s).into_owned())
            .unwrap_or_default()
    }

    fn fill(&mut self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(b) => self.buf.extend_from_slice(&b),
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.child.kill();
                panic!(
                    "coli serve did not answer in time; got {:?}; stderr: {}",
                    String::from_utf8_lossy(&self.buf),
                    self.stderr()
                );
            }
            Err(RecvTimeoutError::Disconnected) => {
                // stdout closed: the child is exiting; its last words are in
                // stderr once the reader has seen the pipe close.
                wait_bounded(&mut self.child, REPLY_TIMEOUT);
                self.join_stderr();
                panic!(
                    "coli serve closed stdout; got {:?}; stderr: {}",
                    String::from_utf8_lossy(&self.buf),
                    self.stderr()
                );
            }
        }
    }

    fn read_exact_prefix(&mut self, n: usize) -> Vec<u8> {
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
                return String::from_utf8(line[..i].to_vec()).expect("STAT line is text");
            }
            self.fill(deadline);
        }
    }

    /// Reads one reply: text, END, STAT line.
    pub fn reply(&mut self) -> Reply {
        let deadline = Instant::now() + REPLY_TIMEOUT;
        let text = loop {
            if let Some(i) = self.buf.windows(END.len()).position(|w| w == END) {
                let text: Vec<u8> = self.buf[..i].to_vec();
                self.buf.drain(..i + END.len());
                break text;
            }
            self.fill(deadline);
        };
        let line = self.read_line();
        let mut f: Vec<String> = line.split(' ').map(str::to_string).collect();
        assert_eq!(f.first().map(String::as_str), Some("STAT"), "{line:?}");
        f.remove(0);
        Reply { text, stat: f }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).expect("writing to coli serve");
        stdin.flush().expect("flushing to coli serve");
    }

    /// Sends a PROMPT frame (body + `\n`) and reads its reply.
    pub fn prompt(&mut self, body: &[u8], fields: &str) -> Reply {
        let mut frame = format!("\x02PROMPT {} {fields}\n", body.len()).into_bytes();
        frame.extend_from_slice(body);
        frame.push(b'\n');
        self.send(&frame);
        self.reply()
    }

    /// Sends a chat line and reads its reply.
    pub fn line(&mut self, text: &str) -> Reply {
        self.send(format!("{text}\n").as_bytes());
        self.reply()
    }

    /// Closes stdin (EOF for the server) without waiting.
    pub fn close_input(&mut self) {
        self.stdin = None;
    }

    /// Closes stdin and waits (bounded) for the exit; returns status and stderr.
    pub fn finish(mut self) -> (ExitStatus, String) {
        self.stdin = None;
        let status = wait_bounded(&mut self.child, REPLY_TIMEOUT);
        self.join_stderr();
        (status, self.stderr())
    }

    /// Waits until stderr's reader has copied everything (the pipe closes
    /// when the child and every process holding it have exited).
    fn join_stderr(&mut self) {
        if let Some(h) = self.stderr_reader.take() {
            let _ = h.join();
        }
    }

    /// SIGKILL, no goodbye.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits for `child`, killing it (and failing) past `limit`.
pub fn wait_bounded(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().expect("waiting for coli") {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("coli did not exit in time");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh temporary directory for state files.
pub fn state_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}
