//! The decode-loop actor: owns the conversation slots, the admission queue,
//! sampling, stop rules and limits, and drives the layer-compute actor one
//! batched step at a time (continuous batching). Front ends (the stdin
//! protocol, the multiplexed protocol, the HTTP API) hold a [`LoopHandle`]
//! and talk to it over one bounded flume channel; each request streams its
//! [`Event`]s back on its own channel.

mod active;
mod actor;
mod draft;
mod metrics;
mod msg;
mod slots;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use colibri_actors::{ExpertSource, SourceStats};

pub use metrics::{Metrics, MetricsSnapshot};
pub use msg::LoopMsg;

use self::actor::{Limits, LoopActor};
use self::slots::Slot;
use super::compute::ComputeHandle;
use super::prompt_cache::PromptCache;
use super::request::{Event, GenRequest, MAX_SLOTS, RequestError, RequestId};
use crate::chat_template::{ChatTemplate, TemplateError};
use crate::engine::speculative::{DraftMode, SpecOptions, resolve};
use crate::engine::{Engine, ModelFiles, Session, SlotStore};
use crate::grammar::{Constrained, ConstraintError, Grammars};
use crate::model::expert::ExpertWeights;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Depth of the loop's inbox: messages, not requests (the admission queue
/// is bounded separately by `queue_cap`).
const INBOX_DEPTH: usize = 1024;

/// How the loop runs.
#[derive(Clone, Debug)]
pub struct LoopConfig {
    /// Conversations held at once, and so the most requests decoded together.
    pub slots: usize,
    /// Context length of every slot.
    pub max_ctx: usize,
    /// Requests that may wait for a slot; more are refused (`QueueFull`).
    pub queue_cap: usize,
    /// Most prompt tokens of one request computed in one step; longer
    /// prompts take several steps, so decoding streams keep moving.
    pub prefill_chunk: usize,
    /// Compute threads (None: one per core).
    pub threads: Option<usize>,
    /// Where the slots' state files live (None: nothing saved).
    pub state_dir: Option<PathBuf>,
    /// Speculative decoding of every unconstrained request (None: off).
    pub draft: Option<SpecOptions>,
}

impl Default for LoopConfig {
    fn default() -> Self {
        Self {
            slots: 1,
            max_ctx: 4096,
            queue_cap: 64,
            prefill_chunk: crate::engine::PREFILL_CHUNK,
            threads: None,
            state_dir: None,
            draft: None,
        }
    }
}

/// What front ends need to know about the model being served.
pub struct ModelInfo {
    /// The model directory's name (what `/v1/models` lists).
    pub name: String,
    pub dir: PathBuf,
    /// None for models without tokenizer.json (see [`ModelInfo::tokenizer`]).
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub template: ChatTemplate,
    pub max_ctx: usize,
    pub vocab: usize,
    pub slots: usize,
    /// True when conversations are saved to state files.
    pub saving: bool,
    /// The prompt cache's byte budget (0: off).
    pub prompt_cache_bytes: u64,
    pub stop_ids: Vec<u32>,
    /// Compiles requests' constraints against this model's vocabulary.
    pub grammars: Arc<Grammars>,
    /// The drafter in use and the tokens per draft (None: drafting off).
    pub draft: Option<(DraftMode, usize)>,
}

impl ModelInfo {
    /// The tokenizer, or an error naming the missing file.
    pub fn tokenizer(&self) -> Result<&Arc<Tokenizer>, TokenizerError> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| TokenizerError::Missing(self.dir.join("tokenizer.json")))
    }
}

/// Why the loop could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("chat template: {0}")]
    Template(#[from] TemplateError),
    #[error("--kv-slots must be between 1 and {MAX_SLOTS}, got {0}")]
    SlotCount(usize),
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        what: &'static str,
        source: std::io::Error,
    },
}

/// The running actor: a handle to clone for front ends, and its thread.
pub struct DecodeLoop {
    handle: LoopHandle,
    join: Option<JoinHandle<()>>,
}

impl DecodeLoop {
    /// Takes the engine apart (the model goes to a new compute actor, the
    /// rest to the loop), restores saved slots, and starts both threads.
    /// Messages about restored or ignored state files go to `diag`.
    pub fn spawn(
        engine: Engine,
        cfg: &LoopConfig,
        mut diag: Box<dyn Write + Send>,
    ) -> Result<Self, LoopError> {
        if cfg.slots == 0 || cfg.slots > MAX_SLOTS {
            return Err(LoopError::SlotCount(cfg.slots));
        }
        let mut engine = engine;
        // Without a tokenizer the loop streams token ids only (benchmarks
        // on synthetic models); text front ends refuse such a model.
        let tokenizer = engine.tokenizer.take().map(Arc::new);
        let template = engine.files.chat_template(&mut |note| {
            let _ = writeln!(diag, "coli: {note}");
        })?;
        let mut sessions: Vec<Session> = (0..cfg.slots).map(|_| engine.new_session()).collect();
        let store = cfg.state_dir.as_ref().and_then(|dir| {
            SlotStore::open(
                dir,
                &mut sessions,
                engine.state_fingerprint(),
                cfg.max_ctx,
                diag.as_mut(),
            )
        });
        // Positions are copied between slots and through the prompt cache
        // as records (and, for a recurrent state, a snapshot at the end).
        let (record_bytes, snapshot_bytes) = sessions
            .first()
            .map_or((0, 0), |s| (s.kv.record_bytes(), s.kv.snapshot_bytes()));
        let cache = PromptCache::with_snapshots(
            engine.memory.needs.prompt_cache_bytes,
            record_bytes,
            snapshot_bytes,
        );
        let source: Arc<dyn ExpertSource<ExpertWeights>> = engine.model.source().clone();
        let vocab = engine.model.vocab_size();
        let draft = cfg
            .draft
            .clone()
            .map(|o| (resolve(o.mode, engine.model.draft_head()), o));
        let info = Arc::new(ModelInfo {
            name: engine
                .dir
                .file_name()
                .map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned()),
            dir: engine.dir.clone(),
            tokenizer: tokenizer.clone(),
            template,
            max_ctx: cfg.max_ctx,
            vocab,
            slots: cfg.slots,
            saving: store.is_some(),
            prompt_cache_bytes: cache.budget_bytes(),
            stop_ids: engine.stop_ids.clone(),
            grammars: Arc::new(match (&engine.files, &tokenizer) {
                (ModelFiles::Gguf(path), Some(tok)) => {
                    Grammars::for_tokenizer(path, tok, vocab, &engine.stop_ids)
                }
                _ => Grammars::for_model(&engine.dir, vocab, &engine.stop_ids),
            }),
            draft: draft.as_ref().map(|(m, o)| (*m, o.max_draft)),
        });
        let Engine { model, stop_ids, .. } = engine;
        let compute = ComputeHandle::spawn(model, cfg.threads).map_err(|source| LoopError::Thread {
            what: "compute",
            source,
        })?;
        let (tx, inbox) = flume::bounded(INBOX_DEPTH);
        let metrics = Arc::new(Metrics::default());
        let actor = LoopActor {
            limits: Limits {
                max_ctx: cfg.max_ctx,
                queue_cap: cfg.queue_cap,
                prefill_chunk: cfg.prefill_chunk,
                vocab,
                draft,
            },
            compute: Some(compute),
            source: source.clone(),
            tokenizer,
            stop_ids,
            slots: sessions.into_iter().map(Slot::new).collect(),
            cache,
            store,
            diag,
            metrics: metrics.clone(),
            inbox,
            active: Vec::new(),
            queue: Default::default(),
            generation: 0,
            step: 0,
            admissions: 0,
            shutdown: None,
            flushes: Vec::new(),
        };
        let join = std::thread::Builder::new()
            .name("decode-loop".into())
            .spawn(move || actor.run())
            .map_err(|source| LoopError::Thread {
                what: "decode loop",
                source,
            })?;
        Ok(Self {
            handle: LoopHandle {
                tx,
                next_id: Arc::new(AtomicU64::new(1)),
                metrics,
                info,
                source,
            },
            join: Some(join),
        })
    }

    pub fn handle(&self) -> LoopHandle {
        self.handle.clone()
    }

    /// Cancels what runs, saves every slot, and stops both threads.
    pub fn shutdown(mut self) -> Result<(), RequestError> {
        let r = self.handle.shutdown();
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
        r
    }
}

impl Drop for DecodeLoop {
    fn drop(&mut self) {
        if let Some(j) = self.join.take() {
            let _ = self.handle.shutdown();
            let _ = j.join();
        }
    }
}

/// A front end's end of the loop: cheap to clone, usable from any thread
/// (blocking calls) or from tokio (the `_async` ones).
#[derive(Clone)]
pub struct LoopHandle {
    tx: flume::Sender<LoopMsg>,
    next_id: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
    info: Arc<ModelInfo>,
    source: Arc<dyn ExpertSource<ExpertWeights>>,
}

impl LoopHandle {
    pub fn info(&self) -> &Arc<ModelInfo> {
        &self.info
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// The expert source's counters (hit rate, bytes read).
    pub fn source_stats(&self) -> SourceStats {
        self.source.stats()
    }

    fn prepare(&self, req: GenRequest, constraint: Option<Box<Constrained>>) -> (LoopMsg, RequestStream) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, rx) = flume::unbounded();
        let stream = RequestStream {
            id,
            rx,
            tx: self.tx.clone(),
            done: false,
        };
        (
            LoopMsg::Submit {
                id,
                req,
                events,
                constraint,
            },
            stream,
        )
    }

    /// Starts compiling the request's constraint, if it has one, on a
    /// thread of its own (never on the decode loop, whose other streams
    /// would wait).
    fn compile(&self, req: &GenRequest) -> Option<flume::Receiver<Result<Constrained, ConstraintError>>> {
        req.constraint
            .clone()
            .map(|spec| crate::grammar::compile_on_thread(self.info.grammars.clone(), spec))
    }

    /// Submits a request; its events arrive on the returned stream (the
    /// first says whether it was admitted). Dropping the stream cancels it.
    /// A constraint that does not compile is refused here
    /// ([`RequestError::Constraint`]), before the loop sees the request.
    pub fn submit(&self, req: GenRequest) -> Result<RequestStream, RequestError> {
        let constraint = match self.compile(&req) {
            Some(rx) => Some(Box::new(compiled(rx.recv().ok())?)),
            None => None,
        };
        let (msg, stream) = self.prepare(req, constraint);
        self.tx.send(msg).map_err(|_| RequestError::Shutdown)?;
        Ok(stream)
    }

    /// [`Self::submit`] from async code.
    pub async fn submit_async(&self, req: GenRequest) -> Result<RequestStream, RequestError> {
        let constraint = match self.compile(&req) {
            Some(rx) => Some(Box::new(compiled(rx.recv_async().await.ok())?)),
            None => None,
        };
        let (msg, stream) = self.prepare(req, constraint);
        self.tx
            .send_async(msg)
            .await
            .map_err(|_| RequestError::Shutdown)?;
        Ok(stream)
    }

    fn call<T>(&self, make: impl FnOnce(msg::Reply<T>) -> LoopMsg) -> Result<T, RequestError> {
        let (reply, rx) = flume::bounded(1);
        self.tx.send(make(reply)).map_err(|_| RequestError::Shutdown)?;
        recv_or_gone(&rx, &self.tx).ok_or(RequestError::Shutdown)?
    }

    /// The tokens slot `slot` holds (`SlotBusy` while a request runs there).
    pub fn slot_tokens(&self, slot: usize) -> Result<Vec<u32>, RequestError> {
        self.call(|reply| LoopMsg::SlotTokens { slot, reply })
    }

    /// Keeps the first `len` tokens of an idle slot, in memory and on disk.
    pub fn truncate_slot(&self, slot: usize, len: usize) -> Result<(), RequestError> {
        self.call(|reply| LoopMsg::Truncate { slot, len, reply })
    }

    /// Forgets an idle slot's conversation, in memory and on disk.
    pub fn reset_slot(&self, slot: usize) -> Result<(), RequestError> {
        self.call(|reply| LoopMsg::Reset { slot, reply })
    }

    /// Returns once everything computed so far is in the state files.
    pub fn flush(&self) -> Result<(), RequestError> {
        self.call(|reply| LoopMsg::Flush { reply })
    }

    /// Cancels everything, saves, and stops the loop (idempotent).
    pub fn shutdown(&self) -> Result<(), RequestError> {
        match self.call(|reply| LoopMsg::Shutdown { reply }) {
            Err(RequestError::Shutdown) => Ok(()),
            r => r,
        }
    }
}

/// A compile's outcome (None: its thread ended without one).
fn compiled(r: Option<Result<Constrained, ConstraintError>>) -> Result<Constrained, RequestError> {
    match r {
        Some(r) => r.map_err(RequestError::Constraint),
        None => Err(RequestError::Engine("the constraint compiler stopped".into())),
    }
}

/// How often a waiting front end checks that the loop still exists: a
/// message that reached the inbox just as the loop exited is never answered
/// (its reply channel stays open inside the dead inbox), so waits cannot
/// rely on disconnection alone.
const GONE_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Waits on `rx` until a value arrives or the loop behind `inbox` is gone.
fn recv_or_gone<T>(rx: &flume::Receiver<T>, inbox: &flume::Sender<LoopMsg>) -> Option<T> {
    loop {
        match rx.recv_timeout(GONE_POLL) {
            Ok(v) => return Some(v),
            Err(flume::RecvTimeoutError::Disconnected) => return None,
            Err(flume::RecvTimeoutError::Timeout) if inbox.is_disconnected() => return rx.try_recv().ok(),
            Err(flume::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// A request's events. Dropping it before `Done` cancels the request.
pub struct RequestStream {
    id: RequestId,
    rx: flume::Receiver<Event>,
    tx: flume::Sender<LoopMsg>,
    done: bool,
}

impl RequestStream {
    pub fn id(&self) -> RequestId {
        self.id
    }

    fn seen(&mut self, e: Option<Event>) -> Option<Event> {
        if matches!(e, Some(Event::Done(_) | Event::Failed(_)) | None) {
            self.done = true;
        }
        e
    }

    /// The next event (blocking); None once the loop is gone.
    pub fn recv(&mut self) -> Option<Event> {
        let e = recv_or_gone(&self.rx, &self.tx);
        self.seen(e)
    }

    /// The next event, from async code; None once the loop is gone.
    pub async fn recv_async(&mut self) -> Option<Event> {
        let e = loop {
            match tokio::time::timeout(GONE_POLL, self.rx.recv_async()).await {
                Ok(r) => break r.ok(),
                Err(_) if self.tx.is_disconnected() => break self.rx.try_recv().ok(),
                Err(_) => {}
            }
        };
        self.seen(e)
    }

    /// Asks the loop to end the request; a `Done` with reason `Cancelled`
    /// (or the normal end, if it came first) still arrives.
    pub fn cancel(&self) {
        // Full inbox: the loop also notices a dropped stream on its own.
        let _ = self.tx.try_send(LoopMsg::Cancel { id: self.id });
    }

    /// A handle that cancels this request from another thread while this
    /// stream is being read (a blocking `recv` holds `&mut self`).
    pub fn canceller(&self) -> Canceller {
        Canceller {
            id: self.id,
            tx: self.tx.clone(),
        }
    }
}

/// Cancels one request without owning its stream (see
/// [`RequestStream::canceller`]); the stream still receives the `Done`.
#[derive(Clone)]
pub struct Canceller {
    id: RequestId,
    tx: flume::Sender<LoopMsg>,
}

impl Canceller {
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// Asks the loop to end the request (a no-op once it has ended). Waits
    /// for room in the loop's inbox rather than dropping the request: the
    /// stream is still alive, so nothing else would tell the loop.
    pub fn cancel(&self) {
        let _ = self.tx.send(LoopMsg::Cancel { id: self.id });
    }

    /// A canceller tied to no loop, for front ends' unit tests.
    #[cfg(test)]
    pub fn detached() -> Self {
        let (tx, _) = flume::bounded(1);
        Self { id: 0, tx }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            self.cancel();
        }
    }
}
