//! The state of a Qwen3-Next / Qwen3.5 sequence after N tokens: a KV cache
//! for the full-attention layers, and for each linear-attention layer a
//! recurrent state of fixed size (the convolution's last inputs and the
//! delta rule's matrix) that no earlier position can be recovered from.
//!
//! Going back to an earlier position therefore needs a copy of the
//! recurrent states taken there. Every forward of more than one token (a
//! prompt chunk, a draft verification) takes two: at its start and before
//! its last token. Those are the positions callers return to: the end of
//! the previous prompt or reply (a conversation's next turn that does not
//! reproduce the reply token for token), the prompt minus its last token (a
//! regenerated reply, whose last prompt token is computed again for its
//! logits), a rejected draft. [`SequenceState::truncate`] restores the
//! latest copy at or before the asked position and reports where it
//! landed; the caller computes the rest again. At most [`CHECKPOINTS`]
//! such copies are kept, the most recent ones. Besides them, up to
//! [`KEPT`] copies are taken where the decode loop asks
//! ([`SequenceState::keep_checkpoint`]: a position where another cached or
//! running sequence branches off this one, such as the end of a shared
//! system prompt), so that the prompt cache and other slots can start
//! there; those are not pushed out by the rolling ones.

use std::any::Any;

use super::config::LinearShape;
use crate::model::kv_cache::KvCache;
use crate::model::lm::SequenceState;

/// Copies of the recurrent states kept per sequence. Each is the size of
/// the whole recurrent state (Qwen3.6-35B-A3B: 30 layers × 2.1 MB), so the
/// count is small; four cover a turn's two positions and the previous turn's.
pub const CHECKPOINTS: usize = 4;

/// Copies kept at asked-for branch points, besides [`CHECKPOINTS`]: a
/// conversation usually branches from others once (where its system
/// prompt and tools end), and each copy costs as much as the rest
/// (Qwen3.6-35B-A3B: 66 MB).
pub const KEPT: usize = 2;

/// One linear-attention layer's recurrent state.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearState {
    /// The convolution's last `kernel - 1` inputs, oldest first, `[kernel - 1, conv_dim]`.
    pub conv: Vec<f32>,
    /// The delta rule's `[value_heads, key_dim, value_dim]`.
    pub delta: Vec<f32>,
}

impl LinearState {
    pub fn new(s: &LinearShape) -> Self {
        Self {
            conv: vec![0.0; (s.conv_kernel - 1) * s.conv_dim()],
            delta: vec![0.0; s.value_heads * s.key_dim * s.value_dim],
        }
    }

    fn reset(&mut self) {
        self.conv.fill(0.0);
        self.delta.fill(0.0);
    }

    fn values(&self) -> usize {
        self.conv.len() + self.delta.len()
    }
}

/// The linear layers' states after `at` positions.
#[derive(Clone, Debug)]
struct Checkpoint {
    at: usize,
    states: Vec<LinearState>,
    /// Taken at a position asked for (see [`KEPT`]).
    kept: bool,
}

/// A hybrid sequence state.
#[derive(Clone, Debug)]
pub struct HybridState {
    /// Keys and values of the full-attention layers (one cache layer per
    /// full layer, in layer order); its length is the state's.
    pub kv: KvCache,
    /// One per linear layer, in layer order.
    pub linear: Vec<LinearState>,
    /// Ascending positions.
    checkpoints: Vec<Checkpoint>,
    /// Positions asked for by [`SequenceState::keep_checkpoint`] and not
    /// reached yet, ascending.
    wanted: Vec<usize>,
    /// States of the linear layers before the last token of the running
    /// forward, one pushed per layer (see [`Self::begin`]).
    pending: Vec<LinearState>,
    /// A forward has started and not committed: the recurrent states may
    /// be part-way, so no position is valid until restored.
    dirty: bool,
}

impl HybridState {
    pub fn new(kv: KvCache, linear_layers: usize, shape: &LinearShape) -> Self {
        Self {
            kv,
            linear: vec![LinearState::new(shape); linear_layers],
            checkpoints: Vec::new(),
            wanted: Vec::new(),
            pending: Vec::new(),
            dirty: false,
        }
    }

    /// Called before a forward of `m` new tokens: takes the checkpoint at
    /// the current position when `m > 1` or when it was asked for, and
    /// marks the state as running.
    pub fn begin(&mut self, m: usize) {
        let at = self.kv.len();
        let asked = self.wanted.contains(&at);
        self.wanted.retain(|&p| p > at);
        if at > 0 && (m > 1 || asked) {
            self.checkpoint(at, self.linear.clone(), asked);
        }
        self.pending.clear();
        self.dirty = true;
    }

    /// The linear layer's state before the last token of the running
    /// forward, pushed by each linear layer in order (only when `m > 1`).
    pub fn push_pending(&mut self, layer_state: LinearState) {
        self.pending.push(layer_state);
    }

    /// Ends a forward of `m` tokens: the KV cache takes its positions, the
    /// states before the last token become a checkpoint.
    pub fn commit(&mut self, m: usize) {
        let start = self.kv.len();
        self.kv.commit(m);
        if m > 1 && self.pending.len() == self.linear.len() {
            let pending = std::mem::take(&mut self.pending);
            self.checkpoint(start + m - 1, pending, false);
        }
        self.pending.clear();
        self.dirty = false;
    }

    /// Records the states after `at` positions; those at or past `at` were
    /// of positions being computed again, and go. The oldest of each kind
    /// goes past its count.
    fn checkpoint(&mut self, at: usize, states: Vec<LinearState>, kept: bool) {
        // A copy already taken at `at` is kept if either asked for it.
        let kept = kept || self.checkpoints.iter().any(|c| c.at == at && c.kept);
        self.checkpoints.retain(|c| c.at < at);
        self.checkpoints.push(Checkpoint { at, states, kept });
        for (kind, limit) in [(false, CHECKPOINTS), (true, KEPT)] {
            if self.checkpoints.iter().filter(|c| c.kept == kind).count() > limit
                && let Some(i) = self.checkpoints.iter().position(|c| c.kept == kind)
            {
                self.checkpoints.remove(i);
            }
        }
    }

    /// The latest checkpoint at or before `n`.
    fn latest_at_or_before(&self, n: usize) -> Option<&Checkpoint> {
        self.checkpoints.iter().rev().find(|c| c.at <= n)
    }

    fn linear_bytes(&self) -> usize {
        4 * self.linear.iter().map(LinearState::values).sum::<usize>()
    }

    /// Positions a truncation can land on exactly (besides 0 and the end).
    pub fn checkpoint_positions(&self) -> Vec<usize> {
        self.checkpoints.iter().map(|c| c.at).collect()
    }
}

/// Every layer's convolution inputs then delta-rule matrix, in layer
/// order, as little-endian f32.
fn encode_states(states: &[LinearState], out: &mut Vec<u8>) {
    for l in states {
        for v in l.conv.iter().chain(&l.delta) {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// [`encode_states`]'s bytes back into `into` (whose sizes they match).
fn decode_states(raw: &[u8], into: &mut [LinearState]) {
    let mut vals = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    for l in into.iter_mut() {
        for v in l.conv.iter_mut().chain(l.delta.iter_mut()) {
            *v = vals.next().unwrap_or(0.0);
        }
    }
}

impl SequenceState for HybridState {
    fn len(&self) -> usize {
        self.kv.len()
    }

    fn truncate(&mut self, n: usize) -> usize {
        if !self.dirty && n >= self.kv.len() {
            return self.kv.len();
        }
        self.dirty = false;
        self.pending.clear();
        // Branch points were asked for the tokens being cut.
        self.wanted.clear();
        self.checkpoints.retain(|c| c.at <= n);
        match self.checkpoints.last() {
            Some(c) => {
                let p = c.at;
                self.linear.clone_from(&c.states);
                self.kv.truncate(p);
                p
            }
            None => {
                self.linear.iter_mut().for_each(LinearState::reset);
                self.kv.truncate(0);
                0
            }
        }
    }

    fn restorable(&self, n: usize) -> usize {
        if !self.dirty && n >= self.kv.len() {
            return self.kv.len();
        }
        self.latest_at_or_before(n).map_or(0, |c| c.at)
    }

    fn snapshot_bytes(&self) -> usize {
        self.linear_bytes()
    }

    fn snapshot_positions(&self) -> Vec<usize> {
        let mut at = self.checkpoint_positions();
        let now = self.kv.len();
        if !self.dirty && at.last() != Some(&now) {
            at.push(now);
        }
        at
    }

    fn snapshot(&self, pos: usize) -> Option<Vec<u8>> {
        let states = match self.checkpoints.iter().find(|c| c.at == pos) {
            Some(c) => &c.states,
            None if !self.dirty && pos == self.kv.len() => &self.linear,
            None => return None,
        };
        let mut out = Vec::with_capacity(self.linear_bytes());
        encode_states(states, &mut out);
        Some(out)
    }

    fn restore_snapshot(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() != self.linear_bytes() {
            return false;
        }
        decode_states(bytes, &mut self.linear);
        self.pending.clear();
        self.dirty = false;
        // Where another sequence's state was copied from is a branch point.
        let now = self.kv.len();
        self.checkpoint(now, self.linear.clone(), true);
        true
    }

    fn keep_checkpoint(&mut self, pos: usize) {
        if pos > self.kv.len() && !self.wanted.contains(&pos) {
            self.wanted.push(pos);
            self.wanted.sort_unstable();
            self.wanted.truncate(KEPT);
        }
    }

    fn wanted_checkpoint(&self) -> Option<usize> {
        let now = self.kv.len();
        self.wanted.iter().copied().find(|&p| p > now)
    }

    /// A position's record holds the full-attention layers' keys and
    /// values only; the linear layers' part is the recurrent state.
    fn record_bytes(&self) -> usize {
        self.kv.record_bytes()
    }

    fn position_bytes(&self, pos: usize) -> Vec<u8> {
        self.kv.position_bytes(pos)
    }

    fn push_position_bytes(&mut self, bytes: &[u8]) -> bool {
        self.kv.push_position_bytes(bytes)
    }

    fn payload_kind(&self) -> u32 {
        self.kv.types().header_code()
    }

    /// The linear layers' states now and at the latest checkpoint before
    /// now (so that a resumed conversation whose next prompt departs from
    /// the last reply, as a re-rendered chat history does, still starts
    /// from the prompt before it), with that checkpoint's position.
    fn recurrent_bytes(&self) -> usize {
        8 + 2 * self.linear_bytes()
    }

    /// `u64` position of the earlier checkpoint (`u64::MAX`: none), then
    /// its states, then the current ones; each state every linear layer's
    /// convolution inputs then delta-rule matrix, in layer order, as
    /// little-endian f32.
    fn save_recurrent(&self) -> Option<Vec<u8>> {
        if self.dirty {
            return None;
        }
        let now = self.kv.len();
        let earlier = self.checkpoints.iter().rev().find(|c| c.at < now);
        let mut out = Vec::with_capacity(self.recurrent_bytes());
        out.extend_from_slice(&earlier.map_or(u64::MAX, |c| c.at as u64).to_le_bytes());
        encode_states(earlier.map_or(&self.linear, |c| &c.states), &mut out);
        encode_states(&self.linear, &mut out);
        Some(out)
    }

    /// The saved states become the checkpoints, so that a failed forward or
    /// a departing prompt after the restore returns to one of them rather
    /// than to position 0.
    fn load_recurrent(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() != self.recurrent_bytes() {
            return false;
        }
        let now = self.kv.len();
        let mut at = [0u8; 8];
        at.copy_from_slice(&bytes[..8]);
        let earlier = usize::try_from(u64::from_le_bytes(at)).ok().filter(|&p| p < now);
        let (first, current) = bytes[8..].split_at(self.linear_bytes());
        self.pending.clear();
        self.dirty = false;
        self.checkpoints.clear();
        if let Some(p) = earlier {
            let mut states = self.linear.clone();
            decode_states(first, &mut states);
            self.checkpoint(p, states, false);
        }
        decode_states(current, &mut self.linear);
        self.checkpoint(now, self.linear.clone(), false);
        true
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> LinearShape {
        LinearShape {
            key_heads: 1,
            value_heads: 1,
            key_dim: 2,
            value_dim: 2,
            conv_kernel: 2,
        }
    }

    /// A state whose linear layer records its position in every value.
    fn run(st: &mut HybridState, m: usize) {
        st.begin(m);
        let start = st.len();
        for layer in 0..st.linear.len() {
            for t in 0..m {
                if t + 1 == m && m > 1 {
                    let before = st.linear[layer].clone();
                    st.push_pending(before);
                }
                st.linear[layer].delta.fill((start + t + 1) as f32);
            }
        }
        st.commit(m);
    }

    #[test]
    fn truncation_lands_on_the_latest_checkpoint_and_says_where() {
        let mut st = HybridState::new(KvCache::new(1, 4), 2, &shape());
        run(&mut st, 5); // checkpoint at 4
        run(&mut st, 1);
        run(&mut st, 3); // checkpoints at 6 and 8
        assert_eq!(st.len(), 9);
        assert_eq!(st.checkpoint_positions(), vec![4, 6, 8]);
        assert_eq!(st.truncate(9), 9);
        assert_eq!(st.truncate(7), 6);
        assert_eq!(st.len(), 6);
        assert!(st.linear.iter().all(|l| l.delta.iter().all(|&v| v == 6.0)));
        assert_eq!(st.truncate(3), 0);
        assert!(st.linear.iter().all(|l| l.delta.iter().all(|&v| v == 0.0)));
    }

    #[test]
    fn a_forward_that_did_not_commit_is_rolled_back() {
        let mut st = HybridState::new(KvCache::new(1, 4), 1, &shape());
        run(&mut st, 4); // checkpoint at 3
        st.begin(1);
        st.linear[0].delta.fill(99.0);
        // The pass failed: the caller truncates to the length before it.
        assert_eq!(st.truncate(4), 3);
        assert!(st.linear[0].delta.iter().all(|&v| v == 3.0));
    }

    #[test]
    fn the_recurrent_part_round_trips_with_its_earlier_checkpoint() {
        let mut st = HybridState::new(KvCache::new(1, 4), 2, &shape());
        run(&mut st, 5); // checkpoint at 4
        run(&mut st, 1);
        let bytes = st.save_recurrent().unwrap();
        assert_eq!(bytes.len(), st.recurrent_bytes());
        let mut back = HybridState::new(KvCache::new(1, 4), 2, &shape());
        // (The helper above moves only the recurrent part; the records
        // are placeholders of the right size.)
        for _ in 0..st.len() {
            assert!(back.push_position_bytes(&vec![0u8; st.record_bytes()]));
        }
        assert!(!back.load_recurrent(&bytes[1..]), "a short part is refused");
        assert!(back.load_recurrent(&bytes));
        assert_eq!(back.linear, st.linear);
        assert_eq!(back.checkpoint_positions(), vec![4, 6]);
        assert_eq!(back.truncate(5), 4);
        assert!(back.linear.iter().all(|l| l.delta.iter().all(|&v| v == 4.0)));
        // Part-way through a forward there is nothing consistent to save.
        st.begin(2);
        assert!(st.save_recurrent().is_none());
    }

    #[test]
    fn only_the_latest_checkpoints_are_kept() {
        let mut st = HybridState::new(KvCache::new(1, 4), 1, &shape());
        for _ in 0..10 {
            run(&mut st, 2);
        }
        assert_eq!(st.checkpoint_positions().len(), CHECKPOINTS);
        assert_eq!(*st.checkpoint_positions().last().unwrap(), 19);
    }

    #[test]
    fn an_asked_checkpoint_is_taken_where_a_forward_starts_and_outlives_the_rolling_ones() {
        let mut st = HybridState::new(KvCache::new(1, 4), 2, &shape());
        st.keep_checkpoint(64);
        assert_eq!(st.wanted_checkpoint(), Some(64));
        run(&mut st, 64);
        run(&mut st, 1); // a one-token forward starting at 64
        assert_eq!(st.wanted_checkpoint(), None);
        for _ in 0..10 {
            run(&mut st, 2);
        }
        let at = st.checkpoint_positions();
        assert!(at.contains(&64), "{at:?}");
        assert_eq!(at.len(), CHECKPOINTS + 1);
        assert_eq!(st.restorable(70), 64);
        assert_eq!(st.restorable(st.len()), st.len());
        // Cut back to it, the state is the one computed there.
        assert_eq!(st.truncate(70), 64);
        assert!(st.linear.iter().all(|l| l.delta.iter().all(|&v| v == 64.0)));
    }

    #[test]
    fn a_prefix_copied_up_to_a_snapshot_is_the_state_there() {
        use crate::model::sequence_state::{copy_prefix, reachable};
        // (No attention layer: the records are empty, the copy is the
        // recurrent part's.)
        let mut from = HybridState::new(KvCache::new(0, 4), 2, &shape());
        run(&mut from, 40); // checkpoint at 39
        run(&mut from, 10); // at 40 and 49
        assert_eq!(from.snapshot_positions(), vec![39, 40, 49, 50]);
        let mut to = HybridState::new(KvCache::new(0, 4), 2, &shape());
        assert_eq!(reachable(&from, 0, 45), 40);
        assert_eq!(copy_prefix(&from, &mut to, 45), 40);
        assert_eq!(to.len(), 40);
        assert!(to.linear.iter().all(|l| l.delta.iter().all(|&v| v == 40.0)));
        // The copy is a checkpoint of `to` now, and the whole state copies
        // with its current recurrent part.
        assert_eq!(to.restorable(45), 40);
        assert_eq!(copy_prefix(&from, &mut to, 50), 10);
        assert_eq!(to.linear, from.linear);
        // A snapshot of another size changes nothing.
        let mut other = HybridState::new(KvCache::new(0, 4), 3, &shape());
        assert_eq!(copy_prefix(&from, &mut other, 50), 0);
        assert!(!other.restore_snapshot(&from.snapshot(50).unwrap()));
        assert!(other.is_empty());
    }

    #[test]
    fn a_state_never_holds_more_copies_than_the_memory_plan_counts() {
        // The plan reserves 1 + CHECKPOINTS + KEPT copies of the linear
        // layers' state per sequence (`sequence_state_bytes`).
        let mut st = HybridState::new(KvCache::new(1, 4), 1, &shape());
        for i in 0..40 {
            st.keep_checkpoint(st.len() + 1 + i % 3);
            run(&mut st, 1 + i % 3);
            assert!(st.checkpoint_positions().len() <= CHECKPOINTS + KEPT);
        }
        assert_eq!(st.checkpoint_positions().len(), CHECKPOINTS + KEPT);
    }
}
