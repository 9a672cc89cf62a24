//! Errors of the conversation-state files and their actor.

use std::path::PathBuf;

/// Why a conversation-state operation failed.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: a record must be {expected} bytes (token + payload), got {got}")]
    RecordSize {
        path: PathBuf,
        expected: usize,
        got: usize,
    },
    #[error("{path}: append at position {at} would leave a gap after the {count} stored records")]
    Gap { path: PathBuf, at: u64, count: u64 },
    #[error("{path}: cannot truncate to {len} records, only {count} are stored")]
    TruncateBeyond { path: PathBuf, len: u64, count: u64 },
    #[error("{path}: a recurrent state must be {expected} bytes, got {got}")]
    StateSize {
        path: PathBuf,
        expected: usize,
        got: usize,
    },
    #[error("{path}: cannot save a recurrent state at position {at}, only {count} records are stored")]
    StateBeyond { path: PathBuf, at: u64, count: u64 },
    #[error("KV slot {slot} does not exist ({slots} slots are open)")]
    BadSlot { slot: usize, slots: usize },
    #[error("the KV payload size {0} is too large for a record")]
    PayloadTooLarge(usize),
    #[error("the KV persistence actor has stopped")]
    ActorGone,
}
