//! Conversation state on disk (`.coli_kv`, `.coli_kv.N`) and the actor that writes it.
//!
//! Re-prefilling a long conversation after a restart costs as much as the
//! conversation itself, so every slot's per-position KV state is appended to a
//! file and read back at start. The file knows nothing about layers or heads:
//! a record is a token id plus an opaque payload whose size the model gives
//! ([`KvLayout`]); a caller-computed fingerprint of the model shape guards
//! against loading another model's state.
//!
//! Crash safety comes from ordering alone: record bytes are written and synced
//! before the record count in the header is rewritten, so a process killed at
//! any instant leaves a file whose header count covers only complete records.
//! [`crash`] checks this beyond kill -9: it records the writer's operations
//! and replays every state a power loss could leave.
//!
//! Writes happen on a dedicated thread ([`KvActor`]) behind a bounded queue:
//! the decode loop waits for the disk only when the queue is full
//! (back-pressure), after contiguous appends were merged; see [`KvHandle`]
//! (and [`KvQueueLimits::bound_bytes`]) for the memory bound and the
//! ordering and no-loss guarantees.

mod actor;
pub mod crash;
mod error;
mod file;
mod message;

pub use actor::{
    DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_QUEUE_DEPTH, KvActor, KvHandle, KvMonitor, KvQueueLimits,
    KvQueueStats, KvSink,
};
pub use error::KvError;
pub use file::{
    FORMAT_VERSION, HEADER_LEN, KV_FILE_NAME, KvFile, KvLayout, KvLoad, KvRecords, KvStorage, MAGIC,
    slot_path,
};
pub use message::KvMsg;
