//! One slot's conversation-state file: header + fixed-size records.
//!
//! Layout (all integers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `COLIKVR\0` |
//! | 8 | 4 | format version ([`FORMAT_VERSION`]) |
//! | 12 | 4 | payload kind (caller's: how the payload encodes its values; 0 in files written before the field existed) |
//! | 16 | 8 | model-shape fingerprint (caller's) |
//! | 24 | 8 | record size in bytes (4 + payload) |
//! | 32 | 8 | record count (the commit point) |
//! | 40 | 8 | recurrent state size `S` in bytes (0: the records are the whole state) |
//! | 48 | 8 | position the saved recurrent state belongs to |
//! | 56 | 8 | which state area holds it: 0 none, 1 or 2 |
//! | 64 | 2 * S | two recurrent state areas |
//! | 64 + 2S | n * record size | records: token id `u32`, then the payload |
//!
//! Every mutation writes record bytes, syncs them, and only then rewrites the
//! count (and syncs again). Records past the count are garbage by definition
//! and are overwritten by later appends.
//!
//! A model whose sequence state is not only per-position records (linear
//! attention's fixed-size recurrent state) also saves that state, now and
//! then, valid at one position. It is written into the area the header does
//! not point at, synced, and only then made current by one write of the
//! header's position and area fields (one sector, so it lands whole or not
//! at all). Records at or below the saved position are never changed while
//! it is current: a truncation or rewrite below it withdraws it first. With
//! `S > 0` a file loads only up to the saved position (the records after it
//! cannot be used without the state there), so a crash costs what was
//! computed since the last save, never consistency. With `S = 0` the file
//! is byte for byte what it was before these fields existed.
//!
//! All I/O goes through [`KvStorage`] so that a recording layer can capture
//! every write and sync the writer issues and replay the crash states POSIX
//! allows (see [`super::crash`]). Real files are created 0600, whatever the
//! umask: they hold the token ids of private conversations.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::error::KvError;

/// What the state file needs from the storage under it: positioned reads and
/// writes, resizing, and a durability barrier. Implemented by [`File`] and
/// by the in-memory recorder that checks crash consistency.
pub trait KvStorage: Send + std::fmt::Debug {
    /// Current size in bytes.
    fn size(&self) -> std::io::Result<u64>;
    /// Fills `buf` from offset `at` (an error when the file is shorter).
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()>;
    /// Writes all of `buf` at offset `at`, extending the file as needed.
    fn write_all_at(&mut self, buf: &[u8], at: u64) -> std::io::Result<()>;
    /// Cuts or extends (with zeros) the file to `len` bytes.
    fn set_len(&mut self, len: u64) -> std::io::Result<()>;
    /// Returns once every earlier write and resize is durable.
    fn sync(&mut self) -> std::io::Result<()>;
}

impl KvStorage for File {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, at)
    }
    fn write_all_at(&mut self, buf: &[u8], at: u64) -> std::io::Result<()> {
        FileExt::write_all_at(self, buf, at)
    }
    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        File::set_len(self, len)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.sync_data()
    }
}

/// File magic; the trailing NUL keeps it 8 bytes.
pub const MAGIC: [u8; 8] = *b"COLIKVR\0";
/// Bumped whenever the layout above changes.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes before the first record.
pub const HEADER_LEN: u64 = 64;
/// File name of slot 0; slot N appends `.N`.
pub const KV_FILE_NAME: &str = ".coli_kv";
const COUNT_OFFSET: u64 = 32;
const STATE_SIZE_OFFSET: usize = 40;
const STATE_OFFSET: u64 = 48;

/// What a record holds, fixed per model; a file written with another layout is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Hash of everything that shapes the payload (layers, KV dims, dtype, ...).
    pub fingerprint: u64,
    /// Bytes of KV state per position (all layers), after the 4-byte token id.
    pub payload_bytes: usize,
    /// How the payload encodes its values (the engine's KV cache types),
    /// at header offset 12. A file of the same model with another kind is
    /// reported as [`KvLoad::OtherKind`], so the caller can name both.
    pub payload_kind: u32,
    /// Bytes of the sequence's recurrent state, saved whole at one position
    /// ([`KvFile::save_state`]); 0 for a state that is all per-position records.
    pub state_bytes: usize,
}

impl KvLayout {
    /// Bytes of one record: token id plus payload.
    pub fn record_size(&self) -> usize {
        4 + self.payload_bytes
    }

    /// Where the records start: after the header and the two state areas.
    pub fn records_offset(&self) -> u64 {
        HEADER_LEN + 2 * self.state_bytes as u64
    }
}

/// `<dir>/.coli_kv` for slot 0, `<dir>/.coli_kv.N` otherwise (the contract's names).
pub fn slot_path(dir: &Path, slot: usize) -> PathBuf {
    if slot == 0 {
        dir.join(KV_FILE_NAME)
    } else {
        dir.join(format!("{KV_FILE_NAME}.{slot}"))
    }
}

/// What opening a state file found; the caller logs the non-`Loaded` cases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvLoad {
    /// No file yet: a fresh conversation.
    Missing,
    /// The file belongs to another model, format or is damaged; it was ignored
    /// (and will be overwritten by the first write).
    Mismatch { reason: String },
    /// The file is of this model and format but its payload is encoded as
    /// `found` (header offset 12) rather than the layout's kind; it was
    /// ignored like a mismatch (and will be overwritten by the first write).
    OtherKind { found: u32 },
    /// `records` records were read back; `declared` is the header count, larger
    /// only when the file was cut short after its count was written.
    Loaded { records: u64, declared: u64 },
}

/// A batch of records to append, packed back to back as they lie on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvRecords {
    record_size: usize,
    bytes: Vec<u8>,
}

impl KvRecords {
    /// An empty batch for `layout`.
    pub fn new(layout: KvLayout) -> Self {
        KvRecords {
            record_size: layout.record_size(),
            bytes: Vec::new(),
        }
    }

    /// Appends one position; the payload must be exactly `layout.payload_bytes`.
    pub fn push(&mut self, token: u32, payload: &[u8]) -> Result<(), KvError> {
        if payload.len() + 4 != self.record_size {
            return Err(KvError::RecordSize {
                path: PathBuf::new(),
                expected: self.record_size,
                got: payload.len() + 4,
            });
        }
        self.bytes.extend_from_slice(&token.to_le_bytes());
        self.bytes.extend_from_slice(payload);
        Ok(())
    }

    /// Number of records in the batch.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.record_size
    }

    /// True when the batch holds no record.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Record size this batch was built for.
    pub fn record_size(&self) -> usize {
        self.record_size
    }

    /// The packed bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// An empty batch for `layout` with room for `records` records.
    pub fn with_capacity(layout: KvLayout, records: usize) -> Self {
        let record_size = layout.record_size();
        KvRecords {
            record_size,
            bytes: Vec::with_capacity(records.saturating_mul(record_size)),
        }
    }

    /// Bytes of the batch: records × record size.
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// Appends `other`'s records when they have this batch's record size and
    /// the result stays within `max_bytes`; false (and nothing changed)
    /// otherwise. The buffer never grows past `max_bytes`.
    pub(crate) fn extend_within(&mut self, other: &KvRecords, max_bytes: usize) -> bool {
        let needed = self.bytes.len() + other.bytes.len();
        if other.record_size != self.record_size || needed > max_bytes {
            return false;
        }
        if needed > self.bytes.capacity() {
            // Amortised growth, capped at the merge limit.
            let want = (2 * self.bytes.len()).clamp(needed, max_bytes);
            self.bytes.reserve_exact(want - self.bytes.len());
        }
        self.bytes.extend_from_slice(&other.bytes);
        true
    }

    /// Records `from..from + n` as a batch of their own (exact capacity).
    pub(crate) fn slice(&self, from: usize, n: usize) -> KvRecords {
        let rs = self.record_size;
        let start = (from * rs).min(self.bytes.len());
        let end = ((from + n) * rs).min(self.bytes.len());
        KvRecords {
            record_size: rs,
            bytes: self.bytes[start..end].to_vec(),
        }
    }
}

/// An open state file positioned at its committed record count.
#[derive(Debug)]
pub struct KvFile {
    file: Box<dyn KvStorage>,
    path: PathBuf,
    layout: KvLayout,
    count: u64,
    /// False until a header matching `layout` is on disk (new or ignored file).
    header_ok: bool,
    /// The saved recurrent state on disk: its position and area (1 or 2).
    state: Option<(u64, u64)>,
    /// The saved state read back at open, until [`KvFile::take_state`].
    loaded_state: Option<(u64, Vec<u8>)>,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> KvError + 'a {
    move |source| KvError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

impl KvFile {
    /// Opens (creating when absent) the state file at `path` and reads back its
    /// committed records, handing each `(token, payload)` to `visit` in order.
    ///
    /// A file of another model or format is reported as [`KvLoad::Mismatch`] and
    /// treated as empty; it is not modified until the first write.
    ///
    /// A new file is created 0600; an existing one is narrowed to 0600. A new
    /// file's directory entry is synced so the file survives a crash.
    pub fn open(
        path: &Path,
        layout: KvLayout,
        visit: &mut dyn FnMut(u32, &[u8]),
    ) -> Result<(KvFile, KvLoad), KvError> {
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(io_err("opening", path))?;
        // The mode above is filtered by the umask; this is not.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io_err("setting permissions of", path))?;
        if !existed
            && let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && let Ok(d) = File::open(dir)
        {
            // Best effort: some filesystems refuse to sync a directory.
            let _ = d.sync_all();
        }
        Self::open_storage(Box::new(file), path, layout, visit)
    }

    /// [`KvFile::open`] over any storage; `path` only names it in messages.
    /// An empty storage is a new file (a crash right after creating it
    /// leaves one): it gets a fresh header and loads as [`KvLoad::Missing`].
    pub fn open_storage(
        file: Box<dyn KvStorage>,
        path: &Path,
        layout: KvLayout,
        visit: &mut dyn FnMut(u32, &[u8]),
    ) -> Result<(KvFile, KvLoad), KvError> {
        if layout.payload_bytes > (u32::MAX as usize) {
            return Err(KvError::PayloadTooLarge(layout.payload_bytes));
        }
        if layout.state_bytes as u64 > u64::MAX / 4 {
            return Err(KvError::PayloadTooLarge(layout.state_bytes));
        }
        let empty = file.size().map_err(io_err("reading metadata of", path))? == 0;
        let mut kv = KvFile {
            file,
            path: path.to_path_buf(),
            layout,
            count: 0,
            header_ok: false,
            state: None,
            loaded_state: None,
        };
        if empty {
            kv.write_header()?;
            return Ok((kv, KvLoad::Missing));
        }
        let load = kv.read_back(visit)?;
        Ok((kv, load))
    }

    fn read_back(&mut self, visit: &mut dyn FnMut(u32, &[u8])) -> Result<KvLoad, KvError> {
        let file_len = self
            .file
            .size()
            .map_err(io_err("reading metadata of", &self.path))?;
        if file_len < HEADER_LEN {
            return Ok(KvLoad::Mismatch {
                reason: format!("header truncated ({file_len} bytes)"),
            });
        }
        let mut h = [0u8; HEADER_LEN as usize];
        self.file
            .read_exact_at(&mut h, 0)
            .map_err(io_err("reading header of", &self.path))?;
        let want_rs = self.layout.record_size() as u64;
        let reason = if h[..8] != MAGIC {
            Some("not a colibri KV state file (bad magic)".to_string())
        } else if le_u32(&h[8..]) != FORMAT_VERSION {
            Some(format!(
                "format version {} (expected {FORMAT_VERSION})",
                le_u32(&h[8..])
            ))
        } else if le_u64(&h[16..]) != self.layout.fingerprint {
            Some(format!(
                "written by a different model (fingerprint {:#018x}, this model {:#018x})",
                le_u64(&h[16..]),
                self.layout.fingerprint
            ))
        } else if le_u32(&h[12..]) != self.layout.payload_kind {
            // Before the record size: another kind usually has another size
            // too, and the caller can name kinds where it cannot name sizes.
            return Ok(KvLoad::OtherKind {
                found: le_u32(&h[12..]),
            });
        } else if le_u64(&h[24..]) != want_rs {
            Some(format!(
                "record size {} (this model needs {want_rs})",
                le_u64(&h[24..])
            ))
        } else if le_u64(&h[STATE_SIZE_OFFSET..]) != self.layout.state_bytes as u64 {
            Some(format!(
                "recurrent state of {} bytes (this model needs {})",
                le_u64(&h[STATE_SIZE_OFFSET..]),
                self.layout.state_bytes
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            return Ok(KvLoad::Mismatch { reason });
        }
        self.header_ok = true;
        let declared = le_u64(&h[COUNT_OFFSET as usize..]);
        let present = file_len.saturating_sub(self.layout.records_offset()) / want_rs;
        let mut records = declared.min(present);
        if self.layout.state_bytes > 0 {
            // Only what the saved state covers is usable; no state, nothing.
            let at = le_u64(&h[STATE_OFFSET as usize..]);
            let area = le_u64(&h[STATE_OFFSET as usize + 8..]);
            let area_end = HEADER_LEN.saturating_add(area.saturating_mul(self.layout.state_bytes as u64));
            if (area == 1 || area == 2) && at <= records && area_end <= file_len {
                let mut bytes = vec![0u8; self.layout.state_bytes];
                self.file
                    .read_exact_at(&mut bytes, self.state_area(area))
                    .map_err(io_err("reading the recurrent state of", &self.path))?;
                self.state = Some((at, area));
                self.loaded_state = Some((at, bytes));
                records = at;
            } else {
                records = 0;
            }
        }
        // Read in chunks of whole records (about 1 MiB) rather than one by one.
        let per_chunk = ((1u64 << 20) / want_rs).max(1);
        let mut buf = Vec::new();
        let mut done = 0u64;
        while done < records {
            let n = per_chunk.min(records - done);
            buf.resize((n * want_rs) as usize, 0);
            self.file
                .read_exact_at(&mut buf, self.layout.records_offset() + done * want_rs)
                .map_err(io_err("reading records of", &self.path))?;
            for rec in buf.chunks_exact(want_rs as usize) {
                visit(le_u32(rec), &rec[4..]);
            }
            done += n;
        }
        self.count = records;
        Ok(KvLoad::Loaded { records, declared })
    }

    fn write_header(&mut self) -> Result<(), KvError> {
        let mut h = [0u8; HEADER_LEN as usize];
        h[..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&self.layout.payload_kind.to_le_bytes());
        h[16..24].copy_from_slice(&self.layout.fingerprint.to_le_bytes());
        h[24..32].copy_from_slice(&(self.layout.record_size() as u64).to_le_bytes());
        h[STATE_SIZE_OFFSET..STATE_SIZE_OFFSET + 8]
            .copy_from_slice(&(self.layout.state_bytes as u64).to_le_bytes());
        // count stays 0 and no state is saved: a crash right after this
        // leaves an empty, valid file.
        self.file.set_len(0).map_err(io_err("truncating", &self.path))?;
        self.file
            .write_all_at(&h, 0)
            .map_err(io_err("writing header of", &self.path))?;
        self.sync()?;
        self.count = 0;
        self.header_ok = true;
        self.state = None;
        Ok(())
    }

    fn state_area(&self, area: u64) -> u64 {
        HEADER_LEN + (area - 1) * self.layout.state_bytes as u64
    }

    /// Points the header at `state` (`None`: no saved state) and syncs.
    fn commit_state(&mut self, state: Option<(u64, u64)>) -> Result<(), KvError> {
        let (at, area) = state.unwrap_or((0, 0));
        let mut fields = [0u8; 16];
        fields[..8].copy_from_slice(&at.to_le_bytes());
        fields[8..].copy_from_slice(&area.to_le_bytes());
        self.file
            .write_all_at(&fields, STATE_OFFSET)
            .map_err(io_err("writing the recurrent state position of", &self.path))?;
        self.sync()?;
        self.state = state;
        Ok(())
    }

    /// Withdraws the saved state before records at or below its position change.
    fn withdraw_state_above(&mut self, len: u64) -> Result<(), KvError> {
        match self.state {
            Some((at, _)) if at > len => self.commit_state(None),
            _ => Ok(()),
        }
    }

    /// Saves the sequence's recurrent state, valid after the first `at`
    /// records (which must be committed), replacing the one saved before
    /// only once it is durable.
    pub fn save_state(&mut self, at: u64, bytes: &[u8]) -> Result<(), KvError> {
        if bytes.len() != self.layout.state_bytes || bytes.is_empty() {
            return Err(KvError::StateSize {
                path: self.path.clone(),
                expected: self.layout.state_bytes,
                got: bytes.len(),
            });
        }
        if !self.header_ok {
            self.write_header()?;
        }
        if at > self.count {
            return Err(KvError::StateBeyond {
                path: self.path.clone(),
                at,
                count: self.count,
            });
        }
        let area = match self.state {
            Some((_, 1)) => 2,
            _ => 1,
        };
        self.file
            .write_all_at(bytes, self.state_area(area))
            .map_err(io_err("writing the recurrent state of", &self.path))?;
        self.sync()?;
        self.commit_state(Some((at, area)))
    }

    /// The recurrent state read back at open and the position it belongs
    /// to (the loaded records end there); taken once.
    pub fn take_state(&mut self) -> Option<(u64, Vec<u8>)> {
        self.loaded_state.take()
    }

    /// Position of the saved recurrent state on disk, if one is.
    pub fn state_position(&self) -> Option<u64> {
        self.state.map(|(at, _)| at)
    }

    fn sync(&mut self) -> Result<(), KvError> {
        self.file.sync().map_err(io_err("syncing", &self.path))
    }

    fn commit_count(&mut self, count: u64) -> Result<(), KvError> {
        self.file
            .write_all_at(&count.to_le_bytes(), COUNT_OFFSET)
            .map_err(io_err("writing record count of", &self.path))?;
        self.sync()?;
        self.count = count;
        Ok(())
    }

    /// Committed records.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// True when no record is committed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Where this file lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The layout records must have.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// Writes `records` at positions `at..` and commits them.
    ///
    /// `at` below the committed count first drops the tail (prefix reuse after a
    /// diverging prompt); above it is a [`KvError::Gap`].
    pub fn append(&mut self, at: u64, records: &KvRecords) -> Result<(), KvError> {
        let rs = self.layout.record_size();
        if records.record_size() != rs {
            return Err(KvError::RecordSize {
                path: self.path.clone(),
                expected: rs,
                got: records.record_size(),
            });
        }
        if !self.header_ok {
            self.write_header()?;
        }
        if at > self.count {
            return Err(KvError::Gap {
                path: self.path.clone(),
                at,
                count: self.count,
            });
        }
        if at < self.count {
            // Uncommit the positions about to be overwritten before touching them.
            self.withdraw_state_above(at)?;
            self.commit_count(at)?;
        }
        if records.is_empty() {
            return Ok(());
        }
        let offset = self.layout.records_offset() + at * rs as u64;
        self.file
            .write_all_at(records.as_bytes(), offset)
            .map_err(io_err("writing records to", &self.path))?;
        self.sync()?;
        self.commit_count(at + records.len() as u64)
    }

    /// Keeps the first `len` records (longest-common-prefix reuse).
    pub fn truncate(&mut self, len: u64) -> Result<(), KvError> {
        if len > self.count {
            return Err(KvError::TruncateBeyond {
                path: self.path.clone(),
                len,
                count: self.count,
            });
        }
        if !self.header_ok {
            return self.write_header();
        }
        if len < self.count {
            self.withdraw_state_above(len)?;
            self.commit_count(len)?;
        }
        Ok(())
    }

    /// Forgets the conversation and gives the disk space back.
    pub fn reset(&mut self) -> Result<(), KvError> {
        if !self.header_ok {
            return self.write_header();
        }
        if self.state.is_some() {
            self.commit_state(None)?;
        }
        self.commit_count(0)?;
        self.file
            .set_len(HEADER_LEN)
            .map_err(io_err("shrinking", &self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> KvLayout {
        KvLayout {
            fingerprint: 0xfeed,
            payload_bytes: 12,
            payload_kind: 0,
            state_bytes: 0,
        }
    }

    fn batch(from: u32, n: u32) -> KvRecords {
        let mut r = KvRecords::new(layout());
        for t in from..from + n {
            r.push(t, &[t as u8; 12]).unwrap();
        }
        r
    }

    fn reopen(path: &Path, l: KvLayout) -> (KvFile, KvLoad, Vec<(u32, Vec<u8>)>) {
        let mut got = Vec::new();
        let (f, load) = KvFile::open(path, l, &mut |t, p| got.push((t, p.to_vec()))).unwrap();
        (f, load, got)
    }

    #[test]
    fn slot_paths_follow_contract() {
        let d = Path::new("/s");
        assert_eq!(slot_path(d, 0), Path::new("/s/.coli_kv"));
        assert_eq!(slot_path(d, 3), Path::new("/s/.coli_kv.3"));
    }

    #[test]
    fn append_truncate_reload() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".coli_kv");
        let (mut f, load, _) = reopen(&p, layout());
        assert_eq!(load, KvLoad::Missing);
        f.append(0, &batch(0, 5)).unwrap();
        f.append(5, &batch(5, 2)).unwrap();
        f.truncate(4).unwrap();
        f.append(4, &batch(40, 1)).unwrap();
        assert!(matches!(f.append(9, &batch(0, 1)), Err(KvError::Gap { .. })));
        drop(f);
        let (f, load, got) = reopen(&p, layout());
        assert_eq!(
            load,
            KvLoad::Loaded {
                records: 5,
                declared: 5
            }
        );
        assert_eq!(f.len(), 5);
        let toks: Vec<u32> = got.iter().map(|g| g.0).collect();
        assert_eq!(toks, vec![0, 1, 2, 3, 40]);
        assert_eq!(got[4].1, vec![40u8; 12]);
    }

    #[test]
    fn mismatch_is_ignored_then_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".coli_kv");
        let (mut f, _, _) = reopen(&p, layout());
        f.append(0, &batch(0, 3)).unwrap();
        drop(f);
        let other = KvLayout {
            fingerprint: 1,
            payload_bytes: 12,
            payload_kind: 0,
            state_bytes: 0,
        };
        let (mut f, load, got) = reopen(&p, other);
        assert!(matches!(load, KvLoad::Mismatch { ref reason } if reason.contains("different model")));
        assert!(got.is_empty());
        assert_eq!(f.len(), 0);
        let wider = KvLayout {
            fingerprint: 0xfeed,
            payload_bytes: 16,
            payload_kind: 0,
            state_bytes: 0,
        };
        let (_, load, _) = reopen(&p, wider);
        assert!(matches!(load, KvLoad::Mismatch { ref reason } if reason.contains("record size")));
        // The first write under the new layout replaces the file.
        let mut r = KvRecords::new(other);
        r.push(9, &[1; 12]).unwrap();
        f.append(0, &r).unwrap();
        let (_, load, got) = reopen(&p, other);
        assert_eq!(
            load,
            KvLoad::Loaded {
                records: 1,
                declared: 1
            }
        );
        assert_eq!(got[0].0, 9);
    }

    #[test]
    fn another_payload_kind_is_reported_before_the_record_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".coli_kv");
        let (mut f, _, _) = reopen(&p, layout());
        f.append(0, &batch(0, 2)).unwrap();
        drop(f);
        let other = KvLayout {
            payload_kind: 0x0101,
            state_bytes: 0,
            payload_bytes: 6,
            ..layout()
        };
        let (f, load, got) = reopen(&p, other);
        assert_eq!(load, KvLoad::OtherKind { found: 0 });
        assert!(got.is_empty());
        assert_eq!(f.len(), 0);
        // The kind is written in the header and read back.
        let mut r = KvRecords::new(other);
        r.push(3, &[5; 6]).unwrap();
        let mut f = f;
        f.append(0, &r).unwrap();
        drop(f);
        let (_, load, got) = reopen(&p, other);
        assert_eq!(
            load,
            KvLoad::Loaded {
                records: 1,
                declared: 1
            }
        );
        assert_eq!(got, vec![(3, vec![5u8; 6])]);
        let (_, load, _) = reopen(&p, layout());
        assert_eq!(load, KvLoad::OtherKind { found: 0x0101 });
    }

    #[test]
    fn garbage_and_short_files_are_mismatches() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        std::fs::write(&p, b"short").unwrap();
        let (_, load, _) = reopen(&p, layout());
        assert!(matches!(load, KvLoad::Mismatch { .. }));
        std::fs::write(&p, vec![7u8; 200]).unwrap();
        let (_, load, _) = reopen(&p, layout());
        assert!(matches!(load, KvLoad::Mismatch { ref reason } if reason.contains("magic")));
    }

    #[test]
    fn cut_file_loads_complete_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".coli_kv");
        let (mut f, _, _) = reopen(&p, layout());
        f.append(0, &batch(0, 6)).unwrap();
        drop(f);
        let cut = HEADER_LEN + 3 * 16 + 7; // 3 whole records and a partial one
        OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let (mut f, load, got) = reopen(&p, layout());
        assert_eq!(
            load,
            KvLoad::Loaded {
                records: 3,
                declared: 6
            }
        );
        assert_eq!(got.len(), 3);
        f.append(3, &batch(3, 1)).unwrap();
        let (_, load, _) = reopen(&p, layout());
        assert_eq!(
            load,
            KvLoad::Loaded {
                records: 4,
                declared: 4
            }
        );
    }

    #[test]
    fn reset_empties_and_shrinks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".coli_kv.2");
        let (mut f, _, _) = reopen(&p, layout());
        f.append(0, &batch(0, 4)).unwrap();
        f.reset().unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), HEADER_LEN);
        let (_, load, _) = reopen(&p, layout());
        assert_eq!(
            load,
            KvLoad::Loaded {
                records: 0,
                declared: 0
            }
        );
    }

    #[test]
    fn files_are_private_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".coli_kv");
        let (f, _, _) = reopen(&p, layout());
        drop(f);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A file left world-readable by an older version is narrowed.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let _ = reopen(&p, layout());
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn an_empty_file_is_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".coli_kv");
        std::fs::write(&p, b"").unwrap();
        let (_, load, _) = reopen(&p, layout());
        assert_eq!(load, KvLoad::Missing);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), HEADER_LEN);
    }

    #[test]
    fn wrong_payload_size_is_refused() {
        let mut r = KvRecords::new(layout());
        assert!(matches!(r.push(1, &[0; 3]), Err(KvError::RecordSize { .. })));
    }
}
