//! Conversation slots on disk: restores each slot's tokens and sequence state
//! at start (no re-prefill) and mirrors later changes through the KV
//! persistence actor.
//!
//! The decode loop may call [`SlotStore::append_new`] after every forward
//! step: it queues only the positions gained since the last call, and waits
//! for the disk only when the actor's bounded queue is full (back-pressure,
//! after merging contiguous appends; see `colibri_actors::kv`). Queued
//! positions reach the disk in order without any further call; a crash loses
//! at most what is still queued, never the consistency of the file.
//! [`SlotStore::end_turn`] ends a turn without waiting. [`SlotStore::flush`]
//! and [`SlotStore::persist`] wait until what was queued is on disk, for
//! callers that need that now; [`SlotStore::close`] does so at shutdown.

use std::io::Write;
use std::path::{Path, PathBuf};

use colibri_actors::kv::{
    KvActor, KvError, KvFile, KvHandle, KvLayout, KvLoad, KvQueueLimits, KvQueueStats, KvRecords, slot_path,
};

use super::Session;
use crate::model::kv_cache::KvTypes;
use crate::model::lm::{SequenceState, fingerprint};

/// Version of the record payload this engine writes (what
/// `SequenceState::position_bytes` produces); mixed into the fingerprint so a
/// payload layout change invalidates older files.
pub const RECORD_FORMAT_VERSION: u64 = 1;

/// The layout of a state file for a model fingerprint, a record size, the
/// payload's kind (`SequenceState::payload_kind`: the KV cache types) and
/// the size of the recurrent part saved whole (`SequenceState::recurrent_bytes`).
pub fn kv_layout(
    model_fingerprint: u64,
    payload_bytes: usize,
    payload_kind: u32,
    state_bytes: usize,
) -> KvLayout {
    KvLayout {
        fingerprint: fingerprint(&[model_fingerprint, RECORD_FORMAT_VERSION]),
        payload_bytes,
        payload_kind,
        state_bytes,
    }
}

/// The layout of the state files of sequences like `state`.
pub fn state_layout(model_fingerprint: u64, state: &dyn SequenceState) -> KvLayout {
    kv_layout(
        model_fingerprint,
        state.record_bytes(),
        state.payload_kind(),
        state.recurrent_bytes(),
    )
}

/// A payload kind as `--kv-type` spells it, for messages.
fn kind_name(kind: u32) -> String {
    KvTypes::from_header_code(kind).map_or_else(|| format!("an unknown kind ({kind:#x})"), |t| t.to_string())
}

/// The open state files of every slot and what of each is already queued to disk.
pub struct SlotStore {
    handle: KvHandle<Vec<KvFile>>,
    layout: KvLayout,
    /// Positions of each slot already sent to the actor (= its file's count
    /// once the queue is applied).
    persisted: Vec<usize>,
    /// Where each slot's recurrent state was last sent to be saved (states
    /// with a recurrent part only).
    saved_state: Vec<Option<usize>>,
    dir: PathBuf,
}

/// Best-effort diagnostics: a closed stderr must not stop the engine.
fn note(diag: &mut dyn Write, msg: &str) {
    let _ = writeln!(diag, "{msg}");
}

impl SlotStore {
    /// Opens `<dir>/.coli_kv[.N]` for every slot and loads what they hold into
    /// `slots` (which must be empty). Files of another model are ignored with a
    /// message; a slot longer than `max_ctx` is started afresh. Returns `None`
    /// (saving off, with a message) when the files cannot be opened.
    pub fn open(
        dir: &Path,
        slots: &mut [Session],
        model_fingerprint: u64,
        max_ctx: usize,
        diag: &mut dyn Write,
    ) -> Option<Self> {
        let first = slots.first()?;
        let layout = state_layout(model_fingerprint, first.kv.as_ref());
        let mut files = Vec::with_capacity(slots.len());
        let mut persisted = Vec::with_capacity(slots.len());
        let mut saved_state = Vec::with_capacity(slots.len());
        for (i, session) in slots.iter_mut().enumerate() {
            let path = slot_path(dir, i);
            let mut ok = true;
            let opened = KvFile::open(&path, layout, &mut |token, payload| {
                if ok && session.kv.push_position_bytes(payload) {
                    session.tokens.push(token);
                } else {
                    ok = false;
                }
            });
            let (mut file, load) = match opened {
                Ok(f) => f,
                Err(e) => {
                    note(
                        diag,
                        &format!(
                            "coli: cannot use {} for conversation state ({e}); conversations will not be saved",
                            dir.display()
                        ),
                    );
                    for s in slots.iter_mut() {
                        s.reset();
                    }
                    return None;
                }
            };
            match load {
                KvLoad::Missing => {}
                KvLoad::Mismatch { reason } => note(
                    diag,
                    &format!("coli: ignoring {}: {reason}; starting afresh", path.display()),
                ),
                KvLoad::OtherKind { found } => note(
                    diag,
                    &format!(
                        "coli: ignoring {}: its KV cache is stored as {}, this run stores {} (--kv-type); starting afresh (run with the file's --kv-type to resume it)",
                        path.display(),
                        kind_name(found),
                        kind_name(layout.payload_kind)
                    ),
                ),
                KvLoad::Loaded { records, declared } => {
                    // A recurrent part is saved at the position the loaded
                    // records end; without it (or when it does not fit this
                    // state) the records alone cannot be used.
                    if layout.state_bytes > 0 {
                        let state = file.take_state();
                        let fits = state
                            .as_ref()
                            .is_some_and(|(at, _)| *at as usize == session.kv.len());
                        if !(fits && state.is_some_and(|(_, bytes)| session.kv.load_recurrent(&bytes))) {
                            session.reset();
                        }
                    }
                    if records < declared {
                        note(
                            diag,
                            &format!(
                                "coli: {} was cut short; resuming from {records} of {declared} positions",
                                path.display()
                            ),
                        );
                    }
                    if session.tokens.len() > max_ctx.saturating_sub(8) {
                        note(
                            diag,
                            &format!(
                                "coli: {} holds {} positions, more than the context ({max_ctx}); starting afresh",
                                path.display(),
                                session.tokens.len()
                            ),
                        );
                        session.reset();
                    } else if records > 0 {
                        note(
                            diag,
                            &format!("coli: slot {i}: resumed {} positions", session.tokens.len()),
                        );
                    }
                }
            }
            let held = session.tokens.len();
            if (held as u64) < file.len() {
                // Partly unusable records (or a reset above): drop them on disk too.
                if let Err(e) = file.truncate(held as u64) {
                    note(diag, &format!("coli: {e}"));
                }
            }
            saved_state.push((layout.state_bytes > 0 && held > 0).then_some(held));
            files.push(file);
            persisted.push(held);
        }
        match KvActor::spawn_with(files, KvQueueLimits::default()) {
            Ok(handle) => Some(SlotStore {
                handle,
                layout,
                persisted,
                saved_state,
                dir: dir.to_path_buf(),
            }),
            Err(e) => {
                note(diag, &format!("coli: {e}; conversations will not be saved"));
                None
            }
        }
    }

    /// Where the files are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Queues the positions `session` gained since the last call (only those
    /// in its sequence state, with their token ids): cheap enough to call
    /// after every forward step. Builds records for the new positions only,
    /// in batches of at most the queue's message size, and waits only when
    /// the actor's queue is full. A session that lost positions since the
    /// last call (without [`SlotStore::truncate`]) has them dropped on disk
    /// too.
    pub fn append_new(&mut self, slot: usize, session: &Session) -> Result<(), KvError> {
        let slots = self.persisted.len();
        let Some(&done) = self.persisted.get(slot) else {
            return Err(KvError::BadSlot { slot, slots });
        };
        let have = session.kv.len().min(session.tokens.len());
        if have < done {
            self.persisted[slot] = have;
            self.forget_state_above(slot, have);
            return self.handle.truncate(slot, have as u64);
        }
        let record = self.layout.record_size();
        let per = (self.handle.limits().message_bytes(record) / record).max(1);
        let mut from = done;
        while from < have {
            let n = per.min(have - from);
            let mut records = KvRecords::with_capacity(self.layout, n);
            for pos in from..from + n {
                records.push(session.tokens[pos], &session.kv.position_bytes(pos))?;
            }
            self.handle.append(slot, from as u64, records)?;
            from += n;
            self.persisted[slot] = from;
        }
        Ok(())
    }

    fn forget_state_above(&mut self, slot: usize, len: usize) {
        if let Some(s) = self.saved_state.get_mut(slot)
            && s.is_some_and(|at| at > len)
        {
            *s = None;
        }
    }

    /// Queues the positions not yet queued and, for a state with a
    /// recurrent part, that part as it is now (unless it was already saved
    /// at this length). The recurrent part is the size of the whole state
    /// of those layers, so it is saved at turn boundaries rather than every
    /// step: a crash loses what was computed since, and the next turn
    /// computes it again.
    pub fn save_state(&mut self, slot: usize, session: &Session) -> Result<(), KvError> {
        self.append_new(slot, session)?;
        if self.layout.state_bytes == 0 {
            return Ok(());
        }
        let Some(&done) = self.persisted.get(slot) else {
            return Ok(());
        };
        let at = session.kv.len();
        if at == 0 || at != done || self.saved_state.get(slot) == Some(&Some(at)) {
            return Ok(());
        }
        let Some(bytes) = session.kv.save_recurrent() else {
            return Ok(());
        };
        self.handle.save_state(slot, at as u64, bytes)?;
        self.saved_state[slot] = Some(at);
        Ok(())
    }

    /// Ends a turn without waiting for the disk: queues what
    /// [`SlotStore::append_new`] has not (and the recurrent part, see
    /// [`SlotStore::save_state`]), and returns the first write error the
    /// actor met since the last check or flush.
    pub fn end_turn(&mut self, slot: usize, session: &Session) -> Result<(), KvError> {
        self.save_state(slot, session)?;
        self.handle.check()
    }

    /// Queues new positions (and the recurrent part), then waits until
    /// everything queued (every slot) is on disk. Not needed for
    /// correctness (queued positions reach the disk anyway); for callers
    /// that need durability now.
    pub fn persist(&mut self, slot: usize, session: &Session) -> Result<(), KvError> {
        self.save_state(slot, session)?;
        self.handle.flush()
    }

    /// Waits until everything queued is on disk; returns the first write
    /// error since the last check or flush.
    pub fn flush(&mut self) -> Result<(), KvError> {
        self.handle.flush()
    }

    /// The persistence queue's counters (how often a step waited for the
    /// disk, bytes not yet written, ...).
    pub fn queue_stats(&self) -> KvQueueStats {
        self.handle.stats()
    }

    /// Keeps the first `len` positions of `slot` on disk. Waits only when the
    /// queue is full.
    pub fn truncate(&mut self, slot: usize, len: usize) -> Result<(), KvError> {
        if let Some(done) = self.persisted.get_mut(slot)
            && len < *done
        {
            *done = len;
            self.forget_state_above(slot, len);
            return self.handle.truncate(slot, len as u64);
        }
        Ok(())
    }

    /// Forgets `slot` on disk. Waits only when the queue is full.
    pub fn reset(&mut self, slot: usize) -> Result<(), KvError> {
        if let Some(done) = self.persisted.get_mut(slot) {
            *done = 0;
        }
        self.forget_state_above(slot, 0);
        self.handle.reset(slot)
    }

    /// Waits until everything queued is on disk and stops the actor. (A
    /// store dropped without this still writes what was queued.)
    pub fn close(self) -> Result<(), KvError> {
        self.handle.close().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_state::{FakeState, RECORD as PAYLOAD};

    fn sessions(n: usize) -> Vec<Session> {
        (0..n)
            .map(|_| Session::new(Box::new(FakeState(Vec::new()))))
            .collect()
    }

    fn payload(pos: usize, token: u32) -> Vec<u8> {
        (0..PAYLOAD)
            .map(|i| (pos * 7 + token as usize * 13 + i) as u8)
            .collect()
    }

    /// One decode step: the token's position joins the cache and the history.
    fn step(s: &mut Session, token: u32) {
        let pos = s.tokens.len();
        assert!(s.kv.push_position_bytes(&payload(pos, token)));
        s.tokens.push(token);
    }

    fn open(dir: &Path, slots: &mut [Session]) -> SlotStore {
        let mut diag = Vec::new();
        let store = SlotStore::open(dir, slots, 0x5107, 10_000, &mut diag);
        store.unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(&diag)))
    }

    /// What a restart restores: each slot's tokens and records.
    fn restored(dir: &Path, n: usize) -> Vec<(Vec<u32>, Vec<Vec<u8>>)> {
        let mut slots = sessions(n);
        let store = open(dir, &mut slots);
        store.close().unwrap();
        slots
            .iter()
            .map(|s| {
                let recs = (0..s.kv.len()).map(|p| s.kv.position_bytes(p)).collect();
                (s.tokens.clone(), recs)
            })
            .collect()
    }

    fn expected(s: &Session) -> (Vec<u32>, Vec<Vec<u8>>) {
        (
            s.tokens.clone(),
            (0..s.kv.len()).map(|p| s.kv.position_bytes(p)).collect(),
        )
    }

    #[test]
    fn positions_appended_every_step_survive_without_persist() {
        let dir = tempfile::tempdir().unwrap();
        let mut slots = sessions(2);
        let mut store = open(dir.path(), &mut slots);
        for i in 0..300u32 {
            step(&mut slots[0], 100 + i);
            store.append_new(0, &slots[0]).unwrap();
            if i % 3 == 0 {
                step(&mut slots[1], 7000 + i);
                store.append_new(1, &slots[1]).unwrap();
            }
        }
        // A second call without new positions queues nothing.
        let before = store.queue_stats();
        store.append_new(0, &slots[0]).unwrap();
        let after = store.queue_stats();
        assert_eq!(before.messages + before.merged, after.messages + after.merged);
        store.end_turn(0, &slots[0]).unwrap();
        store.end_turn(1, &slots[1]).unwrap();
        let s = store.queue_stats();
        let bound = KvQueueLimits::default().bound_bytes(4 + PAYLOAD);
        assert!(s.peak_unwritten_bytes <= bound, "{s:?}");
        // Neither persist nor close: dropping the store still writes what was queued.
        drop(store);
        let want: Vec<_> = slots.iter().map(expected).collect();
        assert_eq!(restored(dir.path(), 2), want);
    }

    #[test]
    fn truncation_and_reset_between_turns_reach_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut slots = sessions(2);
        let mut store = open(dir.path(), &mut slots);
        for i in 0..40 {
            step(&mut slots[0], i);
            store.append_new(0, &slots[0]).unwrap();
            step(&mut slots[1], i);
        }
        store.end_turn(0, &slots[0]).unwrap();
        store.end_turn(1, &slots[1]).unwrap();
        // Prefix reuse, told to the store ...
        slots[0].truncate(12);
        store.truncate(0, 12).unwrap();
        for i in 0..5 {
            step(&mut slots[0], 500 + i);
            store.append_new(0, &slots[0]).unwrap();
        }
        // ... and a reset.
        slots[1].reset();
        store.reset(1).unwrap();
        step(&mut slots[1], 900);
        store.end_turn(1, &slots[1]).unwrap();
        store.close().unwrap();
        let want: Vec<_> = slots.iter().map(expected).collect();
        assert_eq!(want[0].0.len(), 17);
        assert_eq!(restored(dir.path(), 2), want);
    }

    #[test]
    fn a_session_shortened_behind_the_stores_back_is_shortened_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut slots = sessions(1);
        let mut store = open(dir.path(), &mut slots);
        for i in 0..20 {
            step(&mut slots[0], i);
        }
        // A prefill: many positions in one call.
        store.append_new(0, &slots[0]).unwrap();
        slots[0].truncate(5);
        store.append_new(0, &slots[0]).unwrap();
        store.flush().unwrap();
        assert_eq!(restored_while_open(dir.path()), 5);
        step(&mut slots[0], 77);
        store.persist(0, &slots[0]).unwrap();
        store.close().unwrap();
        let want: Vec<_> = slots.iter().map(expected).collect();
        assert_eq!(restored(dir.path(), 1), want);
    }

    /// A session over a real KV cache of `types` holding `n` positions.
    fn kv_session(types: KvTypes, n: usize) -> Session {
        use crate::model::kv_cache::KvCache;
        let (layers, d) = (2, 40);
        let mut kv = KvCache::with_types(layers, d, types);
        for p in 0..n {
            for l in 0..layers {
                let row: Vec<f32> = (0..d)
                    .map(|i| ((p * 31 + l * 7 + i) % 17) as f32 * 0.3 - 2.0)
                    .collect();
                kv.k[l].push_rows(&row, d);
                kv.v[l].push_rows(&row.iter().map(|x| -x).collect::<Vec<_>>(), d);
            }
            kv.commit(1);
        }
        let mut s = Session::new(Box::new(kv));
        s.tokens = (0..n as u32).map(|t| t + 5).collect();
        s
    }

    fn open_with(dir: &Path, types: KvTypes) -> (Session, String) {
        let mut slots = vec![kv_session(types, 0)];
        let mut diag = Vec::new();
        let store = SlotStore::open(dir, &mut slots, 0x5107, 10_000, &mut diag).unwrap();
        store.close().unwrap();
        let s = slots.pop().unwrap();
        (s, String::from_utf8_lossy(&diag).into_owned())
    }

    #[test]
    fn every_kv_type_round_trips_and_another_type_is_refused_by_name() {
        use crate::model::kv_cache::KvType;
        for t in KvType::ALL {
            let types = KvTypes::both(t);
            let dir = tempfile::tempdir().unwrap();
            let mut slots = vec![kv_session(types, 0)];
            let mut store = open(dir.path(), &mut slots);
            slots[0] = kv_session(types, 6);
            store.append_new(0, &slots[0]).unwrap();
            store.close().unwrap();
            let (back, diag) = open_with(dir.path(), types);
            assert_eq!(expected(&back), expected(&slots[0]), "{t}: {diag}");
            // Another type: refused, naming the file and both types.
            let other = KvTypes {
                k: t,
                v: if t == KvType::Q8 { KvType::F16 } else { KvType::Q8 },
            };
            let (back, diag) = open_with(dir.path(), other);
            assert_eq!(back.tokens.len(), 0, "{t}");
            assert!(diag.contains(".coli_kv"), "{diag}");
            assert!(
                diag.contains(&format!("stored as {types}, this run stores {other}")),
                "{diag}"
            );
        }
    }

    #[test]
    fn files_from_before_the_kind_field_load_as_f32() {
        // Such files hold 0 at header offset 12, which is the all-f32 code.
        assert_eq!(KvTypes::default().header_code(), 0);
        let dir = tempfile::tempdir().unwrap();
        let f32s = KvTypes::default();
        let mut slots = vec![kv_session(f32s, 0)];
        let mut store = open(dir.path(), &mut slots);
        slots[0] = kv_session(f32s, 3);
        store.append_new(0, &slots[0]).unwrap();
        store.close().unwrap();
        let mut header = [0u8; 16];
        let f = std::fs::File::open(slot_path(dir.path(), 0)).unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut header, 0).unwrap();
        assert_eq!(&header[12..16], &[0, 0, 0, 0]);
        let (back, _) = open_with(dir.path(), f32s);
        assert_eq!(back.tokens.len(), 3);
    }

    /// Positions slot 0's file commits, read from a copy (the store is open).
    fn restored_while_open(dir: &Path) -> u64 {
        let copy = tempfile::tempdir().unwrap();
        std::fs::copy(slot_path(dir, 0), slot_path(copy.path(), 0)).unwrap();
        let layout = kv_layout(0x5107, PAYLOAD, 0, 0);
        let (f, _) = KvFile::open(&slot_path(copy.path(), 0), layout, &mut |_, _| {}).unwrap();
        f.len()
    }
}
