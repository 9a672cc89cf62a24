//! Messages to the KV persistence actor.

use crossbeam_channel::Sender;

use super::error::KvError;
use super::file::KvRecords;

/// One request to the KV persistence actor; applied strictly in send order.
#[derive(Debug)]
pub enum KvMsg {
    /// Store `records` at positions `at..` of `slot` (dropping any tail past `at`).
    Append {
        slot: usize,
        at: u64,
        records: KvRecords,
    },
    /// Keep the first `len` records of `slot`.
    Truncate { slot: usize, len: u64 },
    /// Forget `slot`'s conversation.
    Reset { slot: usize },
    /// Reply once everything sent before is on disk, with the first error since
    /// the previous flush (if any).
    Flush { reply: Sender<Result<(), KvError>> },
}
