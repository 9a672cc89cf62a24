//! The thread that owns the state files and applies [`KvMsg`]s in order.
//!
//! The queue's policy (bound, back-pressure, merging, ordering, errors) is
//! documented on [`KvHandle`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use super::error::KvError;
use super::file::{KvFile, KvRecords};
use super::message::KvMsg;

/// Queue depth (messages) used when the caller has no better figure.
pub const DEFAULT_QUEUE_DEPTH: usize = 16;

/// Merge and split limit of one message's records (2 MiB): with the default
/// depth, at most 34 MiB of records wait for the disk (records up to 2 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 2 << 20;

/// How much the queue between the decode loop and the writer may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvQueueLimits {
    /// Messages queued at most (0 is taken as 1).
    pub depth: usize,
    /// Record bytes of one message at most (merges stop here, larger appends
    /// are split); a single record larger than this travels alone.
    pub max_message_bytes: usize,
}

impl Default for KvQueueLimits {
    fn default() -> Self {
        KvQueueLimits {
            depth: DEFAULT_QUEUE_DEPTH,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

impl KvQueueLimits {
    fn effective_depth(&self) -> usize {
        self.depth.max(1)
    }

    /// Record bytes one message may hold, for records of `record_size` bytes.
    pub fn message_bytes(&self, record_size: usize) -> usize {
        self.max_message_bytes.max(record_size)
    }

    /// Most record bytes queued or being written at once, for records of
    /// `record_size` bytes: `(depth + 1) × message_bytes(record_size)`.
    pub fn bound_bytes(&self, record_size: usize) -> usize {
        (self.effective_depth() + 1).saturating_mul(self.message_bytes(record_size))
    }
}

/// Counters of the queue, for front ends and tests. Cheap to read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvQueueStats {
    /// Messages that took a queue place (merged appends not counted).
    pub messages: u64,
    /// Appends merged into the last queued message instead.
    pub merged: u64,
    /// Sends that found the queue full and waited for the writer.
    pub waits: u64,
    /// True while a send is waiting for room.
    pub sender_waiting: bool,
    /// Messages the writer has applied (successfully or not).
    pub applied: u64,
    /// Messages in the queue now (the one being written not included).
    pub queued: usize,
    /// Record bytes queued or being written now.
    pub unwritten_bytes: usize,
    /// The most record bytes queued or being written at any one time.
    pub peak_unwritten_bytes: usize,
}

/// Where the actor applies messages: the real files, or a test double.
pub trait KvSink: Send + 'static {
    fn append(&mut self, slot: usize, at: u64, records: &KvRecords) -> Result<(), KvError>;
    fn truncate(&mut self, slot: usize, len: u64) -> Result<(), KvError>;
    fn reset(&mut self, slot: usize) -> Result<(), KvError>;
    fn save_state(&mut self, slot: usize, at: u64, bytes: &[u8]) -> Result<(), KvError>;
}

fn slot_mut(files: &mut [KvFile], slot: usize) -> Result<&mut KvFile, KvError> {
    let slots = files.len();
    files.get_mut(slot).ok_or(KvError::BadSlot { slot, slots })
}

/// The real sink: one open file per slot, index = slot number.
impl KvSink for Vec<KvFile> {
    fn append(&mut self, slot: usize, at: u64, records: &KvRecords) -> Result<(), KvError> {
        slot_mut(self, slot)?.append(at, records)
    }
    fn truncate(&mut self, slot: usize, len: u64) -> Result<(), KvError> {
        slot_mut(self, slot)?.truncate(len)
    }
    fn reset(&mut self, slot: usize) -> Result<(), KvError> {
        slot_mut(self, slot)?.reset()
    }
    fn save_state(&mut self, slot: usize, at: u64, bytes: &[u8]) -> Result<(), KvError> {
        slot_mut(self, slot)?.save_state(at, bytes)
    }
}

/// What the sender and the writer share, under one lock.
struct State {
    queue: VecDeque<KvMsg>,
    stats: KvQueueStats,
    /// The first write error since the last flush / check.
    first_err: Option<KvError>,
    /// No more sends: the writer drains the queue and stops.
    closed: bool,
    /// The writer thread has ended (normally or by a panic in the sink).
    stopped: bool,
}

struct Shared {
    state: Mutex<State>,
    /// The writer waits here for a message (or close).
    work: Condvar,
    /// Senders, flushes and monitors wait here for the writer's progress.
    progress: Condvar,
    limits: KvQueueLimits,
}

/// Marks the writer stopped when its thread ends, also by a panic, so that
/// nobody waits for it forever.
struct StopGuard(Arc<Shared>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        self.0.state.lock().stopped = true;
        self.0.progress.notify_all();
    }
}

/// Spawns the persistence thread.
pub struct KvActor;

impl KvActor {
    /// Starts the actor on `sink` (usually the `Vec<KvFile>` opened and loaded
    /// at start) with `depth` queued messages and the default message size.
    pub fn spawn<S: KvSink>(sink: S, depth: usize) -> Result<KvHandle<S>, KvError> {
        Self::spawn_with(
            sink,
            KvQueueLimits {
                depth,
                ..KvQueueLimits::default()
            },
        )
    }

    /// Starts the actor on `sink` with the given queue limits.
    pub fn spawn_with<S: KvSink>(sink: S, limits: KvQueueLimits) -> Result<KvHandle<S>, KvError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(limits.effective_depth()),
                stats: KvQueueStats::default(),
                first_err: None,
                closed: false,
                stopped: false,
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
            limits,
        });
        let guard = StopGuard(shared.clone());
        let join = std::thread::Builder::new()
            .name("kv-persist".into())
            .spawn(move || run(sink, guard))
            .map_err(|source| KvError::Io {
                op: "spawning the KV persistence thread for",
                path: Default::default(),
                source,
            })?;
        Ok(KvHandle {
            shared,
            join: Some(join),
        })
    }
}

fn apply<S: KvSink>(sink: &mut S, msg: &KvMsg) -> Result<(), KvError> {
    match msg {
        KvMsg::Append { slot, at, records } => sink.append(*slot, *at, records),
        KvMsg::Truncate { slot, len } => sink.truncate(*slot, *len),
        KvMsg::Reset { slot } => sink.reset(*slot),
        KvMsg::SaveState { slot, at, bytes } => sink.save_state(*slot, *at, bytes),
    }
}

fn run<S: KvSink>(mut sink: S, guard: StopGuard) -> S {
    let shared = &guard.0;
    loop {
        let msg = {
            let mut st = shared.state.lock();
            loop {
                if let Some(m) = st.queue.pop_front() {
                    st.stats.queued = st.queue.len();
                    break m;
                }
                if st.closed {
                    return sink;
                }
                shared.work.wait(&mut st);
            }
        };
        // A place is free: a waiting sender may go on.
        shared.progress.notify_all();
        let bytes = msg.record_bytes();
        let res = apply(&mut sink, &msg);
        drop(msg);
        {
            let mut st = shared.state.lock();
            st.stats.unwritten_bytes -= bytes;
            st.stats.applied += 1;
            if let Err(e) = res {
                tracing::warn!("KV persistence: {e}");
                st.first_err.get_or_insert(e);
            }
        }
        shared.progress.notify_all();
    }
}

/// A read-only view of a running actor's queue that can be shared with other
/// threads (a front end's status line, a test).
#[derive(Clone)]
pub struct KvMonitor {
    shared: Arc<Shared>,
}

impl KvMonitor {
    /// The counters now.
    pub fn stats(&self) -> KvQueueStats {
        self.shared.state.lock().stats
    }

    /// Waits until `pred` holds for the counters and returns them; an error
    /// when the writer stops first.
    pub fn wait_until(&self, mut pred: impl FnMut(&KvQueueStats) -> bool) -> Result<KvQueueStats, KvError> {
        let mut st = self.shared.state.lock();
        loop {
            if pred(&st.stats) {
                return Ok(st.stats);
            }
            if st.stopped {
                return Err(KvError::ActorGone);
            }
            self.shared.progress.wait(&mut st);
        }
    }
}

/// The decode side's end of the actor: sends wait only when the queue is
/// full.
///
/// Policy: bounded memory, no loss, order kept, and a slow disk costs the
/// decode loop as little as possible.
///
/// - Sends put messages in a queue of at most
///   [`KvQueueLimits::depth`] messages. An append that continues the last
///   queued message (same slot, next position) is merged into it while the
///   merged records stay within [`KvQueueLimits::max_message_bytes`]; merging
///   is tried first, so a stream of one-position appends costs one queue
///   place (and one write) per `max_message_bytes` while the writer is busy.
/// - When the queue is full and the message cannot be merged, the send waits
///   until the writer takes a message (back-pressure). Nothing is parked
///   outside the queue. [`KvQueueStats::waits`] counts such waits.
/// - An append larger than `max_message_bytes` is split into batches of at
///   most that many bytes (at least one record each), so every queued message
///   holds at most `max(max_message_bytes, record size)` record bytes.
/// - Record bytes queued or being written are therefore at most
///   `(depth + 1) × max(max_message_bytes, record size)`
///   ([`KvQueueLimits::bound_bytes`]): `depth` queued messages and the one
///   being written. A caller blocked in a send also holds the batch it is
///   sending.
/// - The writer applies one message at a time, as soon as it is at the head
///   of the queue: each append is written, synced and committed (see
///   [`KvFile::append`](super::KvFile::append)) before the next message.
///   There is no timer: a position reaches the disk once the messages ahead
///   of it are written.
/// - [`KvHandle::flush`] and [`KvHandle::close`] wait until everything sent
///   is applied. Write errors are kept by the writer and reported by the next
///   [`KvHandle::flush`] or [`KvHandle::check`] (which does not wait), so a
///   failing disk surfaces at a turn boundary instead of inside decode.
/// - Dropping the handle delivers every queued message, then stops the thread.
pub struct KvHandle<S: KvSink> {
    shared: Arc<Shared>,
    join: Option<JoinHandle<S>>,
}

impl<S: KvSink> KvHandle<S> {
    /// Queues `records` for positions `at..` of `slot`. Merges into the last
    /// queued message when it can; waits only when the queue is full.
    /// Batches over [`KvQueueLimits::max_message_bytes`] are queued in parts,
    /// in order.
    pub fn append(&mut self, slot: usize, at: u64, records: KvRecords) -> Result<(), KvError> {
        let max = self.shared.limits.max_message_bytes;
        if records.byte_len() <= max || records.len() <= 1 {
            return self.push(KvMsg::Append { slot, at, records });
        }
        let per = (max / records.record_size()).max(1);
        let mut from = 0;
        while from < records.len() {
            let part = records.slice(from, per);
            let n = part.len();
            self.push(KvMsg::Append {
                slot,
                at: at + from as u64,
                records: part,
            })?;
            from += n;
        }
        Ok(())
    }

    /// Queues a truncation of `slot` to `len` records; waits only when the queue is full.
    pub fn truncate(&mut self, slot: usize, len: u64) -> Result<(), KvError> {
        self.push(KvMsg::Truncate { slot, len })
    }

    /// Queues a reset of `slot`; waits only when the queue is full.
    pub fn reset(&mut self, slot: usize) -> Result<(), KvError> {
        self.push(KvMsg::Reset { slot })
    }

    /// Queues a save of `slot`'s recurrent state, valid after its first
    /// `at` records (queued before it); waits only when the queue is full.
    /// Its bytes count against the queue like records do.
    pub fn save_state(&mut self, slot: usize, at: u64, bytes: Vec<u8>) -> Result<(), KvError> {
        self.push(KvMsg::SaveState { slot, at, bytes })
    }

    /// The limits the queue was started with.
    pub fn limits(&self) -> KvQueueLimits {
        self.shared.limits
    }

    /// The queue's counters now.
    pub fn stats(&self) -> KvQueueStats {
        self.shared.state.lock().stats
    }

    /// A view of the counters for another thread.
    pub fn monitor(&self) -> KvMonitor {
        KvMonitor {
            shared: self.shared.clone(),
        }
    }

    fn push(&mut self, msg: KvMsg) -> Result<(), KvError> {
        let shared = &*self.shared;
        let depth = shared.limits.effective_depth();
        let max = shared.limits.max_message_bytes;
        let bytes = msg.record_bytes();
        let mut msg = msg;
        let mut st = shared.state.lock();
        let mut waited = false;
        let res = loop {
            if st.stopped || st.closed {
                break Err(KvError::ActorGone);
            }
            // Coalesce first: a merge takes no place in the queue.
            if let Some(last) = st.queue.back_mut() {
                match last.absorb(msg, max) {
                    Ok(()) => {
                        st.stats.merged += 1;
                        break Ok(());
                    }
                    Err(m) => msg = m,
                }
            }
            if st.queue.len() < depth {
                st.queue.push_back(msg);
                st.stats.messages += 1;
                st.stats.queued = st.queue.len();
                shared.work.notify_one();
                break Ok(());
            }
            if !waited {
                waited = true;
                st.stats.waits += 1;
                st.stats.sender_waiting = true;
                shared.progress.notify_all();
            }
            shared.progress.wait(&mut st);
        };
        st.stats.sender_waiting = false;
        if res.is_ok() {
            st.stats.unwritten_bytes += bytes;
            st.stats.peak_unwritten_bytes = st.stats.peak_unwritten_bytes.max(st.stats.unwritten_bytes);
        }
        drop(st);
        shared.progress.notify_all();
        res
    }

    /// Returns, without waiting, the first write error the writer met since
    /// the previous flush or check; [`KvError::ActorGone`] when it stopped.
    pub fn check(&mut self) -> Result<(), KvError> {
        let mut st = self.shared.state.lock();
        if let Some(e) = st.first_err.take() {
            return Err(e);
        }
        if st.stopped {
            return Err(KvError::ActorGone);
        }
        Ok(())
    }

    /// Blocks until everything queued so far is applied (on disk, for the
    /// real files); returns the first write error since the previous flush
    /// or check.
    pub fn flush(&mut self) -> Result<(), KvError> {
        let shared = &*self.shared;
        let mut st = shared.state.lock();
        let target = st.stats.messages;
        while st.stats.applied < target {
            if st.stopped {
                return Err(KvError::ActorGone);
            }
            shared.progress.wait(&mut st);
        }
        st.first_err.take().map_or(Ok(()), Err)
    }

    fn stop(&mut self) -> Option<std::thread::Result<S>> {
        self.shared.state.lock().closed = true;
        self.shared.work.notify_one();
        self.join.take().map(JoinHandle::join)
    }

    /// Flushes, stops the thread and gives the sink back.
    pub fn close(mut self) -> Result<S, KvError> {
        let flushed = self.flush();
        let sink = self
            .stop()
            .ok_or(KvError::ActorGone)?
            .map_err(|_| KvError::ActorGone)?;
        flushed.map(|()| sink)
    }
}

impl<S: KvSink> Drop for KvHandle<S> {
    fn drop(&mut self) {
        // The writer applies what is queued (no loss), then ends.
        let _ = self.stop();
    }
}
