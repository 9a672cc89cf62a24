//! The I/O worker pool actor: N blocking threads that turn expert keys into
//! decoded experts.
//!
//! Two bounded queues, demand and prefetch; a worker always takes demand
//! first, so a speculative read never sits in front of one compute waits for.
//! Decoding happens on the worker, off the compute threads.

mod msg;
mod worker;

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Sender, TrySendError, bounded};

pub use msg::{IoEvent, IoRequest, LoadedExpert, Priority, ReadReport, Ticket};

use crate::buffer::BufPool;
use crate::error::SourceError;
use crate::expert::ExpertMap;
use crate::source::ExpertDecoder;
use crate::storage::Storage;
use crate::tag::TagClockReader;

/// How to build an [`IoPool`].
pub struct IoPoolConfig {
    pub workers: usize,
    /// Extra attempts for a failed demand read (prefetches get none).
    pub retries: u32,
    /// Bound of each queue.
    pub queue_cap: usize,
}

/// Handle to the worker threads; dropping it (or [`IoPool::shutdown`]) closes
/// the queues and the workers exit after their current read.
pub struct IoPool<T> {
    demand: Option<Sender<IoRequest<T>>>,
    prefetch: Option<Sender<IoRequest<T>>>,
    handles: Vec<JoinHandle<()>>,
}

impl<T: Send + Sync + 'static> IoPool<T> {
    /// `clock` is the pipeline's tag clock, advanced by its owner; stale
    /// prefetches are recognised against it.
    pub fn spawn(
        cfg: &IoPoolConfig,
        storage: Arc<dyn Storage>,
        map: Arc<ExpertMap>,
        decoder: Arc<dyn ExpertDecoder<T>>,
        clock: TagClockReader,
        buffers: BufPool,
    ) -> Result<Self, SourceError> {
        let cap = cfg.queue_cap.max(1);
        let (dtx, drx) = bounded(cap);
        let (ptx, prx) = bounded(cap);
        let mut handles = Vec::new();
        for i in 0..cfg.workers.max(1) {
            let ctx = worker::WorkerCtx {
                storage: storage.clone(),
                map: map.clone(),
                decoder: decoder.clone(),
                clock: clock.clone(),
                retries: cfg.retries,
                buffers: buffers.clone(),
            };
            let (d, p) = (drx.clone(), prx.clone());
            let h = std::thread::Builder::new()
                .name(format!("coli-io-{i}"))
                .spawn(move || worker::run(ctx, d, p))
                .map_err(|e| SourceError::Shutdown(format!("cannot start I/O worker: {e}")))?;
            handles.push(h);
        }
        Ok(Self {
            demand: Some(dtx),
            prefetch: Some(ptx),
            handles,
        })
    }

    /// Queues a request without blocking; a full queue hands it back.
    pub fn try_submit(&self, req: IoRequest<T>) -> Result<(), TrySendError<IoRequest<T>>> {
        let q = match req.priority {
            Priority::Demand => &self.demand,
            Priority::Prefetch => &self.prefetch,
        };
        match q {
            Some(q) => q.try_send(req),
            None => Err(TrySendError::Disconnected(req)),
        }
    }

    /// Closes the queues and waits for the workers. Whoever receives their
    /// replies must have dropped that receiver (or keep draining it) first.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl<T> Drop for IoPool<T> {
    fn drop(&mut self) {
        self.demand = None;
        self.prefetch = None;
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}
