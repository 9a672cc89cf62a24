//! Messages of the pipeline coordinator (the actor that owns the cache, the
//! in-flight table and the pilot's recall records).

use std::sync::Arc;

use crossbeam_channel::Sender;

use crate::error::SourceError;
use crate::expert::ExpertKey;
use crate::pilot::Prediction;
use crate::tag::Tag;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FetchMode {
    /// Deliver hits now, load misses and deliver them on arrival.
    Full,
    /// Deliver hits, answer `Missing` for the rest (no-overlap mode, pass 1).
    HitsOnly,
    /// Load and deliver without counting hits/misses (no-overlap, pass 2).
    LoadOnly,
}

pub(crate) enum CoordMsg<T> {
    Fetch {
        id: u64,
        tag: Tag,
        /// `(index in the caller's keys, key)`.
        items: Vec<(usize, ExpertKey)>,
        mode: FetchMode,
        reply: Sender<Delivery<T>>,
    },
    /// The caller stopped waiting (its sink failed).
    Abandon {
        id: u64,
    },
    Advance {
        tag: Tag,
        ack: Sender<()>,
    },
    Predicted(Prediction),
    Pin {
        keys: Vec<ExpertKey>,
        pin: bool,
    },
    Shutdown,
}

/// What a waiting `fetch` receives.
pub(crate) enum Delivery<T> {
    /// Every hit of a fetch, in one message.
    Experts(Vec<(usize, Arc<T>)>),
    /// One miss, on arrival.
    Expert(usize, Arc<T>),
    Missing(usize),
    Failed(SourceError),
    Cancelled,
}
