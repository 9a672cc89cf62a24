//! Conversation slots on disk: restores each slot's tokens and sequence state
//! at start (no re-prefill) and mirrors later changes through the KV
//! persistence actor, so the decode loop never waits for the disk except at
//! a turn boundary ([`SlotStore::persist`] flushes).

use std::io::Write;
use std::path::{Path, PathBuf};

use colibri_actors::kv::{KvActor, KvError, KvFile, KvHandle, KvLayout, KvLoad, KvRecords, slot_path};

use super::Session;
use crate::model::lm::fingerprint;

/// Version of the record payload this engine writes (what
/// `SequenceState::position_bytes` produces); mixed into the fingerprint so a
/// payload layout change invalidates older files.
pub const RECORD_FORMAT_VERSION: u64 = 1;

/// The layout of a state file for a model fingerprint and a record size.
pub fn kv_layout(model_fingerprint: u64, payload_bytes: usize) -> KvLayout {
    KvLayout {
        fingerprint: fingerprint(&[model_fingerprint, RECORD_FORMAT_VERSION]),
        payload_bytes,
    }
}

/// The open state files of every slot and what of each is already queued to disk.
pub struct SlotStore {
    handle: KvHandle<Vec<KvFile>>,
    layout: KvLayout,
    /// Positions of each slot already sent to the actor (= its file's count
    /// once the queue is applied).
    persisted: Vec<usize>,
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
        let layout = kv_layout(model_fingerprint, first.kv.record_bytes());
        let mut files = Vec::with_capacity(slots.len());
        let mut persisted = Vec::with_capacity(slots.len());
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
                KvLoad::Loaded { records, declared } => {
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
            files.push(file);
            persisted.push(held);
        }
        match KvActor::spawn(files, colibri_actors::kv::DEFAULT_QUEUE_DEPTH) {
            Ok(handle) => Some(SlotStore {
                handle,
                layout,
                persisted,
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
    /// in its sequence state, with their token ids). Never blocks.
    pub fn append_new(&mut self, slot: usize, session: &Session) -> Result<(), KvError> {
        let Some(done) = self.persisted.get_mut(slot) else {
            return Err(KvError::BadSlot {
                slot,
                slots: self.persisted.len(),
            });
        };
        let have = session.kv.len().min(session.tokens.len());
        if have <= *done {
            return Ok(());
        }
        let mut records = KvRecords::new(self.layout);
        for pos in *done..have {
            records.push(session.tokens[pos], &session.kv.position_bytes(pos))?;
        }
        let at = *done as u64;
        *done = have;
        self.handle.append(slot, at, records)
    }

    /// Queues new positions, then waits until everything queued is on disk.
    pub fn persist(&mut self, slot: usize, session: &Session) -> Result<(), KvError> {
        self.append_new(slot, session)?;
        self.handle.flush()
    }

    /// Waits until everything queued is on disk.
    pub fn flush(&mut self) -> Result<(), KvError> {
        self.handle.flush()
    }

    /// Keeps the first `len` positions of `slot` on disk. Never blocks.
    pub fn truncate(&mut self, slot: usize, len: usize) -> Result<(), KvError> {
        if let Some(done) = self.persisted.get_mut(slot)
            && len < *done
        {
            *done = len;
            return self.handle.truncate(slot, len as u64);
        }
        Ok(())
    }

    /// Forgets `slot` on disk. Never blocks.
    pub fn reset(&mut self, slot: usize) -> Result<(), KvError> {
        if let Some(done) = self.persisted.get_mut(slot) {
            *done = 0;
        }
        self.handle.reset(slot)
    }

    /// Flushes and stops the actor.
    pub fn close(self) -> Result<(), KvError> {
        self.handle.close().map(|_| ())
    }
}
