//! Messages into the decode-loop actor.

use crate::grammar::Constrained;
use crate::runtime::request::{Event, GenRequest, RequestError, RequestId};

/// Answer channel of a request/reply message.
pub type Reply<T> = flume::Sender<Result<T, RequestError>>;

/// What front ends send the decode loop (over one bounded flume channel).
pub enum LoopMsg {
    /// A new request; its events go to `events` (unbounded: a request's
    /// events are bounded by its `max_tokens`, and a slow reader must not
    /// stall the other streams).
    Submit {
        id: RequestId,
        req: GenRequest,
        events: flume::Sender<Event>,
        /// The request's compiled constraint (compiled before it was sent;
        /// boxed, so the message stays small).
        constraint: Option<Box<Constrained>>,
    },
    /// Ends a request: queued, prefilling or decoding. Unknown ids are ignored.
    Cancel { id: RequestId },
    /// The tokens a slot holds.
    SlotTokens { slot: usize, reply: Reply<Vec<u32>> },
    /// Keeps a slot's first `len` tokens (memory and state file).
    Truncate {
        slot: usize,
        len: usize,
        reply: Reply<()>,
    },
    /// Forgets a slot's conversation (memory and state file).
    Reset { slot: usize, reply: Reply<()> },
    /// Waits until every position computed so far is in the state files.
    Flush { reply: Reply<()> },
    /// Cancels everything, saves, stops the compute actor, then answers.
    Shutdown { reply: Reply<()> },
}
