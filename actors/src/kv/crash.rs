//! Crash states of a state file, for checking crash consistency without
//! crashing anything.
//!
//! [`RecordingStorage`] is an in-memory [`KvStorage`] that logs every write,
//! resize and sync the writer issues. [`CrashStates`] replays a log and
//! yields every file image a crash could leave after each operation, under
//! the POSIX model: what was synced is on disk; each operation issued since
//! the last sync may or may not have reached the disk, in any combination
//! (the kernel writes back in any order). A write is atomic only per
//! [`SECTOR`]-aligned piece, so every piece is kept or lost on its own, and a
//! lost piece that grew the file may leave the file grown with zeros where
//! it was (delayed allocation updates the size before the data).
//!
//! The number of images is exponential in the operations pending at once;
//! the writer syncs after every step, so a handful are pending at a time and
//! every combination is enumerated (up to [`MAX_PENDING_PIECES`] pieces,
//! beyond which the iterator reports the point as too wide to check).

use std::sync::Arc;

use parking_lot::Mutex;

use super::file::KvStorage;

/// The unit a disk writes atomically.
pub const SECTOR: u64 = 512;

/// Pending pieces beyond which a crash point is not enumerated (3^12 images).
pub const MAX_PENDING_PIECES: usize = 12;

/// One operation the writer issued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Write { at: u64, bytes: Vec<u8> },
    SetLen(u64),
    Sync,
}

/// The shared log of a [`RecordingStorage`].
pub type OpLog = Arc<Mutex<Vec<Op>>>;

/// An in-memory file that logs every mutation.
#[derive(Debug)]
pub struct RecordingStorage {
    data: Vec<u8>,
    log: OpLog,
}

impl RecordingStorage {
    /// A storage holding `initial` (as if synced), and the log of what follows.
    pub fn new(initial: Vec<u8>) -> (Self, OpLog) {
        let log = OpLog::default();
        (
            RecordingStorage {
                data: initial,
                log: log.clone(),
            },
            log,
        )
    }
}

fn apply_write(data: &mut Vec<u8>, at: u64, bytes: &[u8]) {
    let end = at as usize + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[at as usize..end].copy_from_slice(bytes);
}

impl KvStorage for RecordingStorage {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.data.len() as u64)
    }
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        let end = (at as usize).checked_add(buf.len());
        match end.and_then(|e| self.data.get(at as usize..e)) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
    fn write_all_at(&mut self, buf: &[u8], at: u64) -> std::io::Result<()> {
        apply_write(&mut self.data, at, buf);
        self.log.lock().push(Op::Write {
            at,
            bytes: buf.to_vec(),
        });
        Ok(())
    }
    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        self.data.resize(len as usize, 0);
        self.log.lock().push(Op::SetLen(len));
        Ok(())
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.log.lock().push(Op::Sync);
        Ok(())
    }
}

/// The image a log leaves when every operation reaches the disk.
pub fn replay(initial: Vec<u8>, ops: &[Op]) -> Vec<u8> {
    let mut img = initial;
    for op in ops {
        match op {
            Op::Write { at, bytes } => apply_write(&mut img, *at, bytes),
            Op::SetLen(n) => img.resize(*n as usize, 0),
            Op::Sync => {}
        }
    }
    img
}

/// An in-memory file without a log, for loading a crash image.
#[derive(Debug)]
pub struct MemStorage(pub Vec<u8>);

impl KvStorage for MemStorage {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.0.len() as u64)
    }
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        let end = (at as usize).checked_add(buf.len());
        match end.and_then(|e| self.0.get(at as usize..e)) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
    fn write_all_at(&mut self, buf: &[u8], at: u64) -> std::io::Result<()> {
        apply_write(&mut self.0, at, buf);
        Ok(())
    }
    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        self.0.resize(len as usize, 0);
        Ok(())
    }
    fn sync(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A pending operation cut to what the disk applies atomically.
#[derive(Clone, Debug)]
enum Piece {
    Write { at: u64, bytes: Vec<u8> },
    SetLen(u64),
}

/// Splits a write at sector boundaries.
fn pieces(op: &Op) -> Vec<Piece> {
    match op {
        Op::Write { at, bytes } => {
            let mut out = Vec::new();
            let mut off = 0usize;
            while off < bytes.len() {
                let pos = at + off as u64;
                let room = (SECTOR - pos % SECTOR) as usize;
                let n = room.min(bytes.len() - off);
                out.push(Piece::Write {
                    at: pos,
                    bytes: bytes[off..off + n].to_vec(),
                });
                off += n;
            }
            out
        }
        Op::SetLen(n) => vec![Piece::SetLen(*n)],
        Op::Sync => Vec::new(),
    }
}

/// The file images a crash can leave at one point of the log.
#[derive(Debug)]
pub enum CrashPoint {
    /// Every image (the first is "nothing pending reached the disk").
    Images(Vec<Vec<u8>>),
    /// More pending pieces than [`MAX_PENDING_PIECES`]: not enumerated.
    TooWide { pending: usize },
}

/// Every crash image after each operation of a log, from an initial image.
pub struct CrashStates {
    durable: Vec<u8>,
    pending: Vec<Piece>,
    ops: std::vec::IntoIter<Op>,
    started: bool,
}

impl CrashStates {
    /// Crash points: before the first operation, then after each one.
    pub fn new(initial: Vec<u8>, ops: Vec<Op>) -> Self {
        CrashStates {
            durable: initial,
            pending: Vec::new(),
            ops: ops.into_iter(),
            started: false,
        }
    }

    fn images(&self) -> CrashPoint {
        let n = self.pending.len();
        if n > MAX_PENDING_PIECES {
            return CrashPoint::TooWide { pending: n };
        }
        // Each piece: 0 lost, 1 kept, 2 lost but the size it implies kept
        // (only meaningful for a write past the durable end).
        let mut out = Vec::new();
        let total = 3usize.pow(n as u32);
        for code in 0..total {
            let mut c = code;
            let mut img = self.durable.clone();
            let mut valid = true;
            for p in &self.pending {
                let choice = c % 3;
                c /= 3;
                match (p, choice) {
                    (_, 0) => {}
                    (Piece::Write { at, bytes }, 1) => apply_write(&mut img, *at, bytes),
                    (Piece::Write { at, bytes }, _) => {
                        let end = *at as usize + bytes.len();
                        if end <= img.len() {
                            valid = false; // same image as "lost"
                        } else {
                            img.resize(end, 0);
                        }
                    }
                    (Piece::SetLen(len), 1) => img.resize(*len as usize, 0),
                    (Piece::SetLen(_), _) => valid = false,
                }
            }
            if valid {
                out.push(img);
            }
        }
        CrashPoint::Images(out)
    }
}

impl Iterator for CrashStates {
    type Item = CrashPoint;

    fn next(&mut self) -> Option<CrashPoint> {
        if !self.started {
            self.started = true;
            return Some(self.images());
        }
        let op = self.ops.next()?;
        match &op {
            Op::Sync => {
                for p in self.pending.drain(..) {
                    match p {
                        Piece::Write { at, bytes } => apply_write(&mut self.durable, at, &bytes),
                        Piece::SetLen(n) => self.durable.resize(n as usize, 0),
                    }
                }
            }
            other => self.pending.extend(pieces(other)),
        }
        Some(self.images())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_writes_give_every_combination() {
        let ops = vec![
            Op::Write {
                at: 0,
                bytes: vec![1; 4],
            },
            Op::Sync,
            Op::Write {
                at: 2,
                bytes: vec![2; 4],
            },
            Op::SetLen(3),
        ];
        let pts: Vec<CrashPoint> = CrashStates::new(Vec::new(), ops).collect();
        assert_eq!(pts.len(), 5);
        let CrashPoint::Images(after_write) = &pts[1] else {
            panic!("narrow")
        };
        // lost, kept, grown with zeros
        assert_eq!(after_write.len(), 3);
        assert!(after_write.contains(&vec![]));
        assert!(after_write.contains(&vec![1; 4]));
        assert!(after_write.contains(&vec![0; 4]));
        let CrashPoint::Images(last) = &pts[4] else {
            panic!("narrow")
        };
        assert!(last.contains(&vec![1, 1, 2, 2, 2, 2]));
        assert!(last.contains(&vec![1, 1, 2]));
        assert!(last.contains(&vec![1, 1, 1]));
        assert!(last.contains(&vec![1; 4]));
    }

    #[test]
    fn writes_tear_at_sector_boundaries() {
        let op = Op::Write {
            at: SECTOR - 2,
            bytes: vec![9; 4],
        };
        assert_eq!(pieces(&op).len(), 2);
    }
}
