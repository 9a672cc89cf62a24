//! Routing as data: what a run's routers asked for, step by step, and what
//! any cache of a given size would have had to read for it.
//!
//! A streamed run's reads are decided by two things: the routing (which
//! experts each layer picks at each step) and the cache policy (which of
//! them are still resident). Recording the first as a [`RoutingTrace`]
//! separates them: a trace can be replayed offline through LRU, through LRU
//! with pins, and through the optimal policy that knows the future
//! ([`replay::optimal`], Belady's rule), so a run's bytes can be judged
//! against bytes no cache of that size could avoid, and a pin set can be
//! tested before it is used ([`pins::choose`]).
//!
//! - [`trace`]: the trace and the recorder a run's expert source feeds;
//! - [`file`]: the trace's text file (`coli bench --trace-out`, the state
//!   directory's `routing.trace`);
//! - [`replay`]: LRU, pinned LRU and optimal replays of a trace;
//! - [`pins`]: the pin policy: the history's hottest experts, taken only
//!   where a replay says they beat LRU.

pub mod file;
pub mod pins;
pub mod repin;
pub mod replay;
pub mod trace;

pub use file::TraceFileError;
pub use pins::{PinChoice, choose as choose_pins};
pub use repin::Pinner;
pub use replay::{Capacity, Outcome};
pub use trace::{RoutingTrace, TraceRecorder};
