//! A sequence state for unit tests: each position's record is derived from
//! every token up to it, as a real model's would be, so a record restored
//! after the wrong prefix shows.

use std::any::Any;

use crate::model::lm::SequenceState;

/// Bytes of one position's record.
pub const RECORD: usize = 16;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeState(pub Vec<Vec<u8>>);

impl SequenceState for FakeState {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn truncate(&mut self, n: usize) -> usize {
        self.0.truncate(n);
        self.0.len()
    }
    fn record_bytes(&self) -> usize {
        RECORD
    }
    fn position_bytes(&self, pos: usize) -> Vec<u8> {
        self.0[pos].clone()
    }
    fn push_position_bytes(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() != RECORD {
            return false;
        }
        self.0.push(bytes.to_vec());
        true
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The state after computing `tokens` from an empty one.
pub fn computed(tokens: &[u32]) -> FakeState {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let records = tokens
        .iter()
        .enumerate()
        .map(|(pos, &t)| {
            h = (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3) ^ pos as u64;
            let mut r = h.to_le_bytes().to_vec();
            r.extend_from_slice(&(!h).to_le_bytes());
            r
        })
        .collect();
    FakeState(records)
}
