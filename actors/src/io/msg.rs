//! Messages of the I/O worker pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::Sender;

use crate::error::SourceError;
use crate::expert::ExpertKey;
use crate::tag::Tag;

/// Demand reads (compute is waiting) always go before prefetches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Priority {
    Demand,
    Prefetch,
}

/// One load of one expert. A load may be queued twice (first as a prefetch,
/// then as a demand once compute needs it); both copies share the ticket and
/// whichever worker claims it first does the read, the other drops its copy.
#[derive(Debug)]
pub struct Ticket {
    pub id: u64,
    claimed: AtomicBool,
}

impl Ticket {
    pub fn new(id: u64) -> Arc<Self> {
        Arc::new(Self {
            id,
            claimed: AtomicBool::new(false),
        })
    }

    /// True for exactly one caller. The coordinator claims a queued load's
    /// ticket to cancel it: the worker that pops it then drops it unread.
    pub fn claim(&self) -> bool {
        !self.claimed.swap(true, Ordering::AcqRel)
    }
}

/// Read `key`, decode it, send the result to `reply`.
pub struct IoRequest<T> {
    pub tag: Tag,
    pub key: ExpertKey,
    pub priority: Priority,
    /// The pipeline epoch the request was issued in; a prefetch from an
    /// older epoch than the current one is dropped unread.
    pub epoch: u64,
    pub ticket: Arc<Ticket>,
    pub reply: Sender<IoEvent<T>>,
}

/// A decoded expert and what it costs to keep.
pub struct LoadedExpert<T> {
    pub value: Arc<T>,
    pub resident_bytes: u64,
}

/// What one load cost.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadReport {
    pub bytes: u64,
    /// Storage requests issued (over all attempts).
    pub reads: u64,
    /// Attempts that failed and were retried or given up.
    pub failed_attempts: u64,
    pub read_ns: u64,
}

/// A worker's answer.
pub enum IoEvent<T> {
    Loaded {
        key: ExpertKey,
        load_id: u64,
        priority: Priority,
        result: Result<LoadedExpert<T>, SourceError>,
        report: ReadReport,
    },
    /// A stale prefetch dropped without reading.
    Skipped { key: ExpertKey, load_id: u64 },
}
