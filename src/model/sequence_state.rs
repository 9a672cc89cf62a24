//! "The state of a sequence after N tokens", the one abstraction the decode
//! loop's slots, the prompt cache, speculative rollback and `.coli_kv`
//! state files are written against, whatever kind of layers a model has.
//!
//! Attention layers keep one record per position (a KV cache or MLA's
//! compressed latent): any prefix of the records is the state after that
//! prefix, so positions can be cut back, copied one by one between slots
//! and kept in the prompt cache. Linear-attention layers (Gated DeltaNet)
//! keep a fixed-size recurrent state that no earlier position can be
//! recovered from: such a state can only go back to a *checkpoint*, a copy
//! of the recurrent part taken when a forward passed that position, and
//! it is copied elsewhere as records up to a checkpoint plus that
//! checkpoint's *snapshot* (the recurrent part's bytes). Both kinds answer
//! the same questions, so every caller handles both: it truncates or
//! copies, reads back how far it got, and computes the rest again.

use std::any::Any;

/// See the module documentation.
pub trait SequenceState: Send {
    /// Positions held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Keeps at most positions `0..n` and returns how many it kept: exactly
    /// `n` for a per-position cache; for a recurrent state the latest
    /// checkpoint at or before `n` (0 when none is), so the caller computes
    /// the tokens from the returned length on again.
    fn truncate(&mut self, n: usize) -> usize;
    /// What [`Self::truncate`]`(n)` would keep, without truncating (the
    /// worth of reusing this state for a prompt that shares `n` positions).
    fn restorable(&self, n: usize) -> usize {
        n.min(self.len())
    }
    /// Whether the whole state is the concatenation of the per-position
    /// records ([`Self::position_bytes`]), so any prefix of them can be
    /// copied. False for a state with recurrent layers: its records cover
    /// only the attention layers, and the rest is a snapshot's.
    fn positional(&self) -> bool {
        self.recurrent_bytes() == 0
    }
    /// Bytes of the recurrent part of a state file (fixed whatever the
    /// length; 0 when the records are the whole state).
    fn recurrent_bytes(&self) -> usize {
        0
    }
    /// The recurrent part as it is after [`Self::len`] positions, for a
    /// state file; `None` while a forward is part-way or when there is none.
    fn save_recurrent(&self) -> Option<Vec<u8>> {
        None
    }
    /// Sets the recurrent part from [`Self::save_recurrent`]'s bytes, taken
    /// at the current length (the records pushed before it); false (and
    /// nothing changed) when they are not of this state's size.
    fn load_recurrent(&mut self, bytes: &[u8]) -> bool {
        bytes.is_empty() && self.recurrent_bytes() == 0
    }
    /// Bytes of one snapshot: the recurrent part at one position (0 for a
    /// positional state).
    fn snapshot_bytes(&self) -> usize {
        0
    }
    /// Positions, ascending, whose snapshot [`Self::snapshot`] can give:
    /// the checkpoints and the current length. None for a positional state,
    /// whose every record boundary will do.
    fn snapshot_positions(&self) -> Vec<usize> {
        Vec::new()
    }
    /// The recurrent part as it was after `pos` positions, `pos` one of
    /// [`Self::snapshot_positions`].
    fn snapshot(&self, _pos: usize) -> Option<Vec<u8>> {
        None
    }
    /// Makes `bytes`, a snapshot taken after exactly the positions this
    /// state now holds (its records just pushed), the recurrent part, and a
    /// checkpoint to come back to; false (nothing changed) when the size is
    /// wrong.
    fn restore_snapshot(&mut self, bytes: &[u8]) -> bool {
        bytes.is_empty()
    }
    /// Asks for a checkpoint at `pos` when a forward starts there, kept
    /// beside the rolling ones: a position where other sequences branch
    /// off this one (a shared system prompt), so that they can start
    /// there later. Nothing for a positional state.
    fn keep_checkpoint(&mut self, _pos: usize) {}
    /// The nearest position past [`Self::len`] asked for by
    /// [`Self::keep_checkpoint`]: a chunked prefill ends a chunk there so
    /// that the next one starts on it.
    fn wanted_checkpoint(&self) -> Option<usize> {
        None
    }
    /// Bytes of one position's record.
    fn record_bytes(&self) -> usize;
    /// Position `pos`'s state for every layer.
    fn position_bytes(&self, pos: usize) -> Vec<u8>;
    /// Appends one position from a record; false when the size is wrong.
    fn push_position_bytes(&mut self, bytes: &[u8]) -> bool;
    /// How the records encode their values, written in a state file's
    /// header so that a file of another encoding is refused by name rather
    /// than misread: [`crate::model::kv_cache::KvTypes::header_code`] for a
    /// KV cache; 0 (all f32) for states without a choice.
    fn payload_kind(&self) -> u32 {
        0
    }
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// The positions of `from` that `to` can take when both hold the same
/// tokens and `to` holds the first `to.len()` of them: the first `upto`
/// (at most `from.len()`) for a positional state; for a recurrent one, up
/// to the latest snapshot position of `from` within that, the only places
/// its recurrent part can be taken from. `to.len()` when nothing is gained.
pub fn reachable(from: &dyn SequenceState, have: usize, upto: usize) -> usize {
    let upto = upto.min(from.len());
    if from.positional() {
        return upto.max(have);
    }
    from.snapshot_positions()
        .into_iter()
        .filter(|&p| p > have && p <= upto)
        .max()
        .unwrap_or(have)
}

/// Extends `to`, which holds the first `to.len()` positions of the tokens
/// `from` was computed on, with `from`'s positions up to
/// [`reachable`]`(from, to.len(), upto)`: their records, then (for a
/// recurrent state) the snapshot at the end. Returns the positions added;
/// `to` is left as it was when the two states are not of one shape.
pub fn copy_prefix(from: &dyn SequenceState, to: &mut dyn SequenceState, upto: usize) -> usize {
    let have = to.len();
    if from.record_bytes() != to.record_bytes()
        || from.snapshot_bytes() != to.snapshot_bytes()
        || from.positional() != to.positional()
        || have > from.len()
    {
        return 0;
    }
    let end = reachable(from, have, upto);
    if end <= have {
        return 0;
    }
    let snapshot = match from.positional() {
        true => None,
        false => match from.snapshot(end) {
            Some(s) => Some(s),
            None => return 0,
        },
    };
    for pos in have..end {
        if !to.push_position_bytes(&from.position_bytes(pos)) {
            if snapshot.is_none() {
                return pos - have;
            }
            to.truncate(have);
            return to.len().saturating_sub(have);
        }
    }
    if let Some(s) = snapshot
        && !to.restore_snapshot(&s)
    {
        to.truncate(have);
        return to.len().saturating_sub(have);
    }
    end - have
}
