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

/// A state with a recurrent part, as a linear-attention model's: records as
/// [`FakeState`]'s, and a snapshot (a digest of every token so far) that
/// exists only at its checkpoints and its end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeRecurrent {
    pub records: FakeState,
    /// Ascending checkpoint positions and their snapshots.
    pub checkpoints: Vec<(usize, Vec<u8>)>,
    /// The recurrent part after `records.len()` positions.
    pub current: Vec<u8>,
}

/// Bytes of [`FakeRecurrent`]'s snapshot.
pub const SNAPSHOT: usize = 24;

/// The snapshot of `records` (the first `records.len()` positions).
fn digest(records: &[Vec<u8>]) -> Vec<u8> {
    let mut d = vec![0xa5; SNAPSHOT];
    if let Some(last) = records.last() {
        d[..RECORD].copy_from_slice(last);
    }
    d[RECORD..].copy_from_slice(&(records.len() as u64).to_le_bytes());
    d
}

impl SequenceState for FakeRecurrent {
    fn len(&self) -> usize {
        self.records.len()
    }
    fn truncate(&mut self, n: usize) -> usize {
        if n >= self.len() {
            return self.len();
        }
        self.checkpoints.retain(|(p, _)| *p <= n);
        let (at, snap) = self.checkpoints.last().cloned().unwrap_or((0, digest(&[])));
        self.records.truncate(at);
        self.current = snap;
        at
    }
    fn restorable(&self, n: usize) -> usize {
        if n >= self.len() {
            return self.len();
        }
        self.checkpoints
            .iter()
            .rev()
            .find(|(p, _)| *p <= n)
            .map_or(0, |(p, _)| *p)
    }
    fn recurrent_bytes(&self) -> usize {
        SNAPSHOT
    }
    fn snapshot_bytes(&self) -> usize {
        SNAPSHOT
    }
    fn snapshot_positions(&self) -> Vec<usize> {
        let mut at: Vec<usize> = self.checkpoints.iter().map(|(p, _)| *p).collect();
        if at.last() != Some(&self.len()) {
            at.push(self.len());
        }
        at
    }
    fn snapshot(&self, pos: usize) -> Option<Vec<u8>> {
        if pos == self.len() {
            return Some(self.current.clone());
        }
        self.checkpoints
            .iter()
            .find(|(p, _)| *p == pos)
            .map(|(_, s)| s.clone())
    }
    fn restore_snapshot(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() != SNAPSHOT {
            return false;
        }
        self.current = bytes.to_vec();
        self.checkpoints.push((self.len(), self.current.clone()));
        true
    }
    fn record_bytes(&self) -> usize {
        RECORD
    }
    fn position_bytes(&self, pos: usize) -> Vec<u8> {
        self.records.position_bytes(pos)
    }
    fn push_position_bytes(&mut self, bytes: &[u8]) -> bool {
        self.records.push_position_bytes(bytes)
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl FakeRecurrent {
    /// Whether the recurrent part is the one computing its records' tokens
    /// gives (a record restored without its snapshot would not be).
    pub fn consistent(&self) -> bool {
        self.current == digest(&self.records.0)
    }
}

/// The recurrent state after computing `tokens` from an empty one, with
/// checkpoints taken at `at`.
pub fn computed_recurrent(tokens: &[u32], at: &[usize]) -> FakeRecurrent {
    let records = computed(tokens);
    let checkpoints = at
        .iter()
        .filter(|&&p| p <= tokens.len())
        .map(|&p| (p, digest(&records.0[..p])))
        .collect();
    FakeRecurrent {
        current: digest(&records.0),
        records,
        checkpoints,
    }
}
