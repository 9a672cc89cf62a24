//! The thread that owns the state files and applies [`KvMsg`]s in order.
//!
//! Policy: the decode loop must never wait for the disk and no state may be
//! lost. [`KvHandle`] therefore `try_send`s into a bounded channel and, when
//! the channel is full, parks the message in a sender-side spill queue that is
//! drained (still in order) by later sends. Only [`KvHandle::flush`] and
//! [`KvHandle::close`] block, and they are called at turn boundaries / EOF.
//! Write errors are kept by the actor and reported by the next flush, so a
//! failing disk surfaces at the turn boundary instead of stalling decode.

use std::collections::VecDeque;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use super::error::KvError;
use super::file::{KvFile, KvRecords};
use super::message::KvMsg;

/// Channel depth used when the caller has no better figure (one message per
/// turn or per flushed batch of tokens, so this is many turns of slack).
pub const DEFAULT_QUEUE_DEPTH: usize = 64;

/// Where the actor applies messages: the real files, or a test double.
pub trait KvSink: Send + 'static {
    fn append(&mut self, slot: usize, at: u64, records: &KvRecords) -> Result<(), KvError>;
    fn truncate(&mut self, slot: usize, len: u64) -> Result<(), KvError>;
    fn reset(&mut self, slot: usize) -> Result<(), KvError>;
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
}

/// Spawns the persistence thread.
pub struct KvActor;

impl KvActor {
    /// Starts the actor on `sink` (usually the `Vec<KvFile>` opened and loaded at start).
    pub fn spawn<S: KvSink>(sink: S, depth: usize) -> Result<KvHandle<S>, KvError> {
        let (tx, rx) = crossbeam_channel::bounded(depth.max(1));
        let join = std::thread::Builder::new()
            .name("kv-persist".into())
            .spawn(move || run(sink, rx))
            .map_err(|source| KvError::Io {
                op: "spawning the KV persistence thread for",
                path: Default::default(),
                source,
            })?;
        Ok(KvHandle {
            tx: Some(tx),
            spill: VecDeque::new(),
            join: Some(join),
        })
    }
}

fn run<S: KvSink>(mut sink: S, rx: Receiver<KvMsg>) -> S {
    let mut first_err: Option<KvError> = None;
    for msg in rx.iter() {
        let res = match msg {
            KvMsg::Append { slot, at, records } => sink.append(slot, at, &records),
            KvMsg::Truncate { slot, len } => sink.truncate(slot, len),
            KvMsg::Reset { slot } => sink.reset(slot),
            KvMsg::Flush { reply } => {
                // The requester may have given up; nothing else to tell.
                let _ = reply.send(first_err.take().map_or(Ok(()), Err));
                continue;
            }
        };
        if let Err(e) = res {
            tracing::warn!("KV persistence: {e}");
            first_err.get_or_insert(e);
        }
    }
    sink
}

/// The decode side's end of the actor. Sends never block (see module docs).
pub struct KvHandle<S: KvSink> {
    tx: Option<Sender<KvMsg>>,
    spill: VecDeque<KvMsg>,
    join: Option<JoinHandle<S>>,
}

impl<S: KvSink> KvHandle<S> {
    /// Queues `records` for positions `at..` of `slot`. Never blocks.
    pub fn append(&mut self, slot: usize, at: u64, records: KvRecords) -> Result<(), KvError> {
        self.send(KvMsg::Append { slot, at, records })
    }

    /// Queues a truncation of `slot` to `len` records. Never blocks.
    pub fn truncate(&mut self, slot: usize, len: u64) -> Result<(), KvError> {
        self.send(KvMsg::Truncate { slot, len })
    }

    /// Queues a reset of `slot`. Never blocks.
    pub fn reset(&mut self, slot: usize) -> Result<(), KvError> {
        self.send(KvMsg::Reset { slot })
    }

    /// Messages waiting in the spill queue because the channel was full.
    pub fn spilled(&self) -> usize {
        self.spill.len()
    }

    fn sender(&self) -> Result<&Sender<KvMsg>, KvError> {
        self.tx.as_ref().ok_or(KvError::ActorGone)
    }

    /// Moves spilled messages into the channel while it has room.
    fn drain_spill(&mut self) -> Result<(), KvError> {
        while let Some(msg) = self.spill.pop_front() {
            match self.sender()?.try_send(msg) {
                Ok(()) => {}
                Err(TrySendError::Full(msg)) => {
                    self.spill.push_front(msg);
                    return Ok(());
                }
                Err(TrySendError::Disconnected(_)) => return Err(KvError::ActorGone),
            }
        }
        Ok(())
    }

    fn send(&mut self, msg: KvMsg) -> Result<(), KvError> {
        self.drain_spill()?;
        if !self.spill.is_empty() {
            self.spill.push_back(msg);
            return Ok(());
        }
        match self.sender()?.try_send(msg) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(msg)) => {
                self.spill.push_back(msg);
                Ok(())
            }
            Err(TrySendError::Disconnected(_)) => Err(KvError::ActorGone),
        }
    }

    /// Blocks until everything queued so far is applied; returns the first
    /// write error since the previous flush.
    pub fn flush(&mut self) -> Result<(), KvError> {
        while let Some(msg) = self.spill.pop_front() {
            self.sender()?.send(msg).map_err(|_| KvError::ActorGone)?;
        }
        let (reply, done) = crossbeam_channel::bounded(1);
        self.sender()?
            .send(KvMsg::Flush { reply })
            .map_err(|_| KvError::ActorGone)?;
        done.recv().map_err(|_| KvError::ActorGone)?
    }

    /// Flushes, stops the thread and gives the sink back.
    pub fn close(mut self) -> Result<S, KvError> {
        let flushed = self.flush();
        self.tx = None;
        let sink = self
            .join
            .take()
            .ok_or(KvError::ActorGone)?
            .join()
            .map_err(|_| KvError::ActorGone)?;
        flushed.map(|()| sink)
    }
}

impl<S: KvSink> Drop for KvHandle<S> {
    fn drop(&mut self) {
        // Deliver what is left (no loss), then let the thread finish.
        if let Some(tx) = self.tx.take() {
            for msg in self.spill.drain(..) {
                if tx.send(msg).is_err() {
                    break;
                }
            }
        }
        if let Some(join) = self.join.take() {
            let _ = join.join();
        }
    }
}
