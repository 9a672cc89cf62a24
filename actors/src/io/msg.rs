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
    /// The token step (and layer) the load is for; a prefetch whose step has
    /// passed is dropped unread (see [`IoRequest::is_droppable`]).
    pub tag: Tag,
    pub key: ExpertKey,
    pub priority: Priority,
    /// The load of a pinned expert: never dropped as stale, whatever its tag.
    pub pin: bool,
    pub ticket: Arc<Ticket>,
    pub reply: Sender<IoEvent<T>>,
}

impl<T> IoRequest<T> {
    /// True when a worker may drop the request unread because `now` (the
    /// pipeline's [`TagClock`](crate::tag::TagClock)) has moved past its
    /// token step: a prefetch issued for step `s` is stale once step `s + 1`
    /// (or a newer generation) is announced. Demand loads (compute waits for
    /// them) and pins are never dropped.
    pub fn is_droppable(&self, now: Tag) -> bool {
        self.priority == Priority::Prefetch && !self.pin && self.tag.is_stale_against(now)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(priority: Priority, pin: bool, tag: Tag) -> IoRequest<()> {
        IoRequest {
            tag,
            key: ExpertKey::new(tag.layer, 0),
            priority,
            pin,
            ticket: Ticket::new(1),
            reply: crossbeam_channel::unbounded().0,
        }
    }

    #[test]
    fn only_prefetches_of_passed_steps_are_droppable() {
        let issued = Tag::new(3, 7, 2);
        let prefetch = request(Priority::Prefetch, false, issued);
        // Same step (any layer): still wanted.
        assert!(!prefetch.is_droppable(Tag::new(3, 7, 0)));
        assert!(!prefetch.is_droppable(Tag::new(3, 6, 0)));
        // The next step, or a new generation, passes it.
        assert!(prefetch.is_droppable(Tag::new(3, 8, 0)));
        assert!(prefetch.is_droppable(Tag::new(4, 0, 0)));
        let passed = Tag::new(9, 0, 0);
        assert!(!request(Priority::Demand, false, issued).is_droppable(passed));
        assert!(!request(Priority::Prefetch, true, issued).is_droppable(passed));
    }
}
