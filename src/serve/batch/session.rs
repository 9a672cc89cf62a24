//! The session: the calling thread reads and decodes frames and submits
//! requests; one forwarder thread per request turns its events into frames;
//! one writer thread puts every frame on the output.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use super::codec::{Decoder, Item, Limits, Submit};
use super::reply::{self, Code, Stat};
use super::writer::{Entry, INTENT_CANCEL, INTENT_NONE, INTENT_STOP, Out, QUEUE_FRAMES, Table, write_loop};
use crate::runtime::{
    Event, FinishReason, GenRequest, LoopHandle, PromptMode, RequestError, RequestStream, SlotChoice,
};
use crate::sampling::SamplingParams;
use crate::serve::rss_gb;

/// Server-wide settings (flags), fixed for the session.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchConfig {
    /// Top-k cut for every request (SUBMIT has no field for it); 0 = none.
    pub top_k: usize,
    /// Cap on SUBMIT's max_tokens.
    pub max_tokens: usize,
    /// Seed of every request (None: a fresh one per request).
    pub seed: Option<u64>,
}

/// Why a session ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("reading the request stream: {0}")]
    Input(#[source] io::Error),
    #[error("writing the reply stream: {0}")]
    Output(#[source] io::Error),
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("stopping the decode loop: {0}")]
    Shutdown(#[source] RequestError),
}

/// A seed for a request when the server has none: different per request.
fn fresh_seed(serial: u64) -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed);
    t ^ serial.rotate_left(32)
}

/// Runs the protocol over `input` and `output` until `input` ends, then
/// waits for every request in flight to finish. Writes READY first; why a
/// frame was refused goes to `diag` (the ERROR frame carries only the code).
/// The loop behind `handle` keeps running (the caller shuts it down).
pub fn run_session<W: Write + Send + 'static>(
    handle: &LoopHandle,
    input: impl Read,
    mut output: W,
    diag: &mut dyn Write,
    cfg: &BatchConfig,
) -> Result<(), BatchError> {
    output
        .write_all(&reply::ready(rss_gb()))
        .and_then(|()| output.flush())
        .map_err(BatchError::Output)?;
    let table = Arc::new(Table::default());
    let (tx, rx) = flume::bounded::<Out>(QUEUE_FRAMES);
    let broken = Arc::new(AtomicBool::new(false));
    let writer = {
        let table = table.clone();
        let broken = broken.clone();
        std::thread::Builder::new()
            .name("batch-writer".into())
            .spawn(move || {
                let r = write_loop(output, &rx, &table);
                if r.is_err() {
                    broken.store(true, Ordering::SeqCst);
                    // Nobody can read the replies: end what runs.
                    table.cancel_all();
                }
                table.close();
                r
            })
            .map_err(|source| BatchError::Thread {
                what: "writer",
                source,
            })?
    };
    let mut reader = Reader {
        handle,
        cfg,
        diag,
        table: table.clone(),
        tx,
        broken: broken.clone(),
        serial: 0,
        last_image: None,
        forwarders: Vec::new(),
    };
    let read = reader.read_all(input);
    if read.is_err() {
        table.cancel_all();
    }
    // EOF: every request in flight finishes, then the writer drains.
    let forwarders = std::mem::take(&mut reader.forwarders);
    drop(reader);
    for f in forwarders {
        let _ = f.join();
    }
    let written = match writer.join() {
        Ok(r) => r.map_err(BatchError::Output),
        Err(_) => Err(BatchError::Output(io::Error::other("the writer thread panicked"))),
    };
    read?;
    written
}

/// The reading side: decodes frames and acts on them.
struct Reader<'a> {
    handle: &'a LoopHandle,
    cfg: &'a BatchConfig,
    diag: &'a mut dyn Write,
    table: Arc<Table>,
    tx: flume::Sender<Out>,
    broken: Arc<AtomicBool>,
    serial: u64,
    /// The id of the last IMAGE frame, refused with the SUBMIT it announces.
    last_image: Option<String>,
    forwarders: Vec<JoinHandle<()>>,
}

impl Reader<'_> {
    fn read_all(&mut self, mut input: impl Read) -> Result<(), BatchError> {
        let mut decoder = Decoder::new(Limits::new(self.handle.info().slots));
        let mut buf = vec![0u8; 1 << 16];
        let mut items = Vec::new();
        loop {
            let n = match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(BatchError::Input(e)),
            };
            decoder.push(&buf[..n], &mut items);
            for item in items.drain(..) {
                self.on_item(item)?;
            }
            if self.broken.load(Ordering::SeqCst) {
                // The writer failed; its error is the session's.
                return Ok(());
            }
        }
        if let Some(item) = decoder.finish() {
            self.on_item(item)?;
        }
        Ok(())
    }

    fn send(&self, bytes: Vec<u8>) {
        // A closed channel means the writer failed; it reports that.
        let _ = self.tx.send(Out::Bytes(bytes));
    }

    fn error(&self, id: Option<&str>, code: &Code) {
        self.send(reply::error(id, code));
    }

    /// An ERROR frame for a refused request, and the reason on `diag`.
    fn refuse(&mut self, id: Option<&str>, code: &Code, reason: &str) {
        // Diagnostics are best effort: a closed stderr must not stop serving.
        let _ = writeln!(
            self.diag,
            "coli serve --batch: request {} refused: {reason}",
            id.unwrap_or("0")
        );
        self.error(id, code);
    }

    fn on_item(&mut self, item: Item) -> Result<(), BatchError> {
        match item {
            Item::Submit(s) => return self.submit(s),
            Item::Stop(id) => self.end(&id, INTENT_STOP),
            Item::Cancel(id) => self.end(&id, INTENT_CANCEL),
            Item::Image(id) => self.last_image = Some(id),
            Item::Rejected { id, why, reason } => {
                let code = match why {
                    super::codec::Reject::BadRequest => Code::BadRequest,
                    super::codec::Reject::BadFrame => Code::BadFrame,
                };
                self.refuse(id.as_deref(), &code, &reason);
            }
        }
        Ok(())
    }

    fn end(&self, id: &str, intent: u8) {
        if !self.table.end(id, intent) {
            self.error(Some(id), &Code::NotFound);
        }
    }

    fn submit(&mut self, s: Submit) -> Result<(), BatchError> {
        let id = s.id;
        if self.last_image.take().is_some_and(|img| img == id) {
            // Images are not supported: the request they belong to is refused.
            self.refuse(Some(&id), &Code::BadRequest, "images are not supported");
            return Ok(());
        }
        if self.table.contains(&id) {
            self.error(Some(&id), &Code::DuplicateId);
            return Ok(());
        }
        let info = self.handle.info();
        let Ok(text) = std::str::from_utf8(&s.prompt) else {
            self.refuse(Some(&id), &Code::BadRequest, "the prompt is not UTF-8");
            return Ok(());
        };
        let prompt = match info.tokenizer.as_ref().map(|t| t.encode(text)) {
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                self.refuse(Some(&id), &Code::BadRequest, &format!("tokenizing failed: {e}"));
                return Ok(());
            }
            None => {
                self.refuse(Some(&id), &Code::BadRequest, "the model has no tokenizer");
                return Ok(());
            }
        };
        self.serial += 1;
        let serial = self.serial;
        let prompt_tokens = prompt.len();
        let req = GenRequest {
            slot: SlotChoice::Exact(s.slot),
            mode: PromptMode::Replace,
            prompt,
            max_tokens: s.max_tokens.min(self.cfg.max_tokens),
            sampling: SamplingParams {
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: self.cfg.top_k,
                seed: self.cfg.seed.unwrap_or_else(|| fresh_seed(serial)),
            },
            stop: Vec::new(),
            constraint: None,
            special_tokens: false,
        };
        self.wait_for_room();
        if self.broken.load(Ordering::SeqCst) {
            return Ok(());
        }
        let stream = match self.handle.submit(req) {
            Ok(st) => st,
            Err(e) => {
                self.error(Some(&id), &Code::of(&e));
                return Ok(());
            }
        };
        let intent = Arc::new(AtomicU8::new(INTENT_NONE));
        self.table.insert(
            id.clone(),
            Entry {
                serial,
                canceller: stream.canceller(),
                intent: intent.clone(),
            },
        );
        let fwd = Forwarder {
            id,
            serial,
            prompt_tokens,
            intent,
            tx: self.tx.clone(),
        };
        let h = std::thread::Builder::new()
            .name(format!("batch-req-{serial}"))
            .spawn(move || fwd.run(stream))
            .map_err(|source| BatchError::Thread {
                what: "request",
                source,
            })?;
        self.forwarders.retain(|f| !f.is_finished());
        self.forwarders.push(h);
        Ok(())
    }
}

impl Reader<'_> {
    /// Requests whose last line may wait for stdout: one running and one
    /// finished per slot. A client that reads its replies never has more
    /// (it submits on a slot after reading the previous DONE there).
    fn pending_limit(&self) -> usize {
        2 * self.handle.info().slots
    }

    /// Waits, without reading stdin, while the pending limit is reached:
    /// the client is not reading stdout, so its requests stop here instead
    /// of their replies piling up in memory.
    fn wait_for_room(&mut self) {
        let limit = self.pending_limit();
        let diag = &mut *self.diag;
        self.table.wait_for_room(limit, |n| {
            // Best effort, like every diagnostic.
            let _ = writeln!(
                diag,
                "coli serve --batch: {n} replies wait for stdout to be read (limit {limit}); \
                 reading no more requests until one is written"
            );
        });
    }
}

/// Turns one request's events into frames for the writer.
struct Forwarder {
    id: String,
    serial: u64,
    prompt_tokens: usize,
    intent: Arc<AtomicU8>,
    tx: flume::Sender<Out>,
}

impl Forwarder {
    /// Returns early (dropping the stream, which cancels the request) if the
    /// writer is gone.
    fn run(self, mut stream: RequestStream) {
        let id = self.id.as_str();
        let last = loop {
            let Some(event) = stream.recv() else {
                break reply::error(Some(id), &Code::Shutdown);
            };
            match event {
                Event::Started { .. } => {
                    if self
                        .tx
                        .send(Out::Bytes(reply::accept(id, self.prompt_tokens)))
                        .is_err()
                    {
                        return;
                    }
                }
                Event::Text { text, .. } => {
                    for piece in reply::data_chunks(&text) {
                        if self
                            .tx
                            .send(Out::Bytes(reply::data(id, piece.as_bytes())))
                            .is_err()
                        {
                            return;
                        }
                    }
                }
                Event::Done(f) => {
                    let stopped = self.intent.load(Ordering::SeqCst) == INTENT_STOP;
                    break if f.reason == FinishReason::Cancelled && !stopped {
                        reply::error(Some(id), &Code::Cancelled)
                    } else {
                        reply::done(id, &Stat::of(&f, rss_gb()))
                    };
                }
                Event::Failed(e) => break reply::error(Some(id), &Code::of(&e)),
            }
        };
        let _ = self.tx.send(Out::Last {
            id: self.id,
            serial: self.serial,
            bytes: last,
        });
    }
}
