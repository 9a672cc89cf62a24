//! Messages to the KV persistence actor.

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
    /// Save `slot`'s recurrent state, valid after its first `at` records.
    SaveState { slot: usize, at: u64, bytes: Vec<u8> },
}

impl KvMsg {
    /// Record bytes the message holds (what it costs in the queue).
    pub fn record_bytes(&self) -> usize {
        match self {
            KvMsg::Append { records, .. } => records.byte_len(),
            KvMsg::SaveState { bytes, .. } => bytes.len(),
            KvMsg::Truncate { .. } | KvMsg::Reset { .. } => 0,
        }
    }

    /// Merges `next` into `self` when applying the two in order equals applying
    /// the merged message: both append to the same slot, `next` starts where
    /// `self` ends, and the records fit in `max_bytes`. Gives `next` back otherwise.
    pub(crate) fn absorb(&mut self, next: KvMsg, max_bytes: usize) -> Result<(), KvMsg> {
        if let (
            KvMsg::Append { slot, at, records },
            KvMsg::Append {
                slot: next_slot,
                at: next_at,
                records: next_records,
            },
        ) = (&mut *self, &next)
            && *slot == *next_slot
            && *next_at == *at + records.len() as u64
            && records.extend_within(next_records, max_bytes)
        {
            return Ok(());
        }
        Err(next)
    }
}
