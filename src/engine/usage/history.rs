//! The usage history's file: decayed fetch counts per `(layer, expert)`.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::{UsageError, io_err};
use crate::engine::state::Fnv;

const MAGIC: &[u8; 8] = b"COLIUSE1";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 40;
/// Largest `layers * experts` a history may hold (a guard against a header
/// that would make the reader allocate without bound).
const MAX_CELLS: usize = 1 << 24;
/// Decayed routing counts per `(layer, expert)` of one model.
#[derive(Clone, Debug, PartialEq)]
pub struct UsageHistory {
    /// The model's state fingerprint (`Engine::state_fingerprint`).
    pub fingerprint: u64,
    pub layers: usize,
    pub experts: usize,
    /// Runs merged into the counts.
    pub runs: u64,
    /// Layer-major: `counts[layer * experts + expert]`.
    pub counts: Vec<f32>,
}

impl UsageHistory {
    pub fn new(fingerprint: u64, layers: usize, experts: usize) -> Self {
        Self {
            fingerprint,
            layers,
            experts,
            runs: 0,
            counts: vec![0.0; layers * experts],
        }
    }

    /// The file's bytes: magic, version, layers, experts, a zero word,
    /// fingerprint, runs, the counts as little-endian f32, and an FNV-1a
    /// checksum of everything before it.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_LEN + 4 * self.counts.len() + 8);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.layers as u32).to_le_bytes());
        b.extend_from_slice(&(self.experts as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.fingerprint.to_le_bytes());
        b.extend_from_slice(&self.runs.to_le_bytes());
        for c in &self.counts {
            b.extend_from_slice(&c.to_le_bytes());
        }
        let mut h = Fnv::new();
        h.bytes(&b);
        b.extend_from_slice(&h.0.to_le_bytes());
        b
    }

    /// Parses [`Self::encode`]'s bytes; the reason when they are not such a file.
    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() < HEADER_LEN + 8 {
            return Err(format!(
                "{} bytes, shorter than a header (torn or truncated)",
                b.len()
            ));
        }
        if &b[..8] != MAGIC {
            return Err("no usage-history magic".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let version = u32_at(8);
        if version != VERSION {
            return Err(format!("format version {version}, this build reads {VERSION}"));
        }
        let (layers, experts) = (u32_at(12) as usize, u32_at(16) as usize);
        let cells = layers
            .checked_mul(experts)
            .filter(|&c| c <= MAX_CELLS)
            .ok_or_else(|| format!("{layers} layers x {experts} experts is too large"))?;
        let want = HEADER_LEN + 4 * cells + 8;
        if b.len() != want {
            return Err(format!("{} bytes, expected {want} (torn or truncated)", b.len()));
        }
        let body = &b[..want - 8];
        let mut h = Fnv::new();
        h.bytes(body);
        if h.0 != u64_at(want - 8) {
            return Err("checksum mismatch (torn or corrupted)".into());
        }
        let counts: Vec<f32> = body[HEADER_LEN..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if counts.iter().any(|c| !(c.is_finite() && *c >= 0.0)) {
            return Err("a count is negative or not finite".into());
        }
        Ok(Self {
            fingerprint: u64_at(24),
            layers,
            experts,
            runs: u64_at(32),
            counts,
        })
    }

    /// Reads `path`: `None` when there is no file, [`UsageError::Invalid`]
    /// when it is not a history (torn, truncated, another format).
    pub fn load(path: &Path) -> Result<Option<Self>, UsageError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("reading", path)(e)),
        };
        Self::decode(&bytes).map(Some).map_err(|why| UsageError::Invalid {
            path: path.to_path_buf(),
            why,
        })
    }

    /// Reads the history of the model `(fingerprint, layers, experts)`:
    /// a history of another model or shape is [`UsageError::Invalid`].
    pub fn load_for(
        path: &Path,
        fingerprint: u64,
        layers: usize,
        experts: usize,
    ) -> Result<Option<Self>, UsageError> {
        let Some(h) = Self::load(path)? else {
            return Ok(None);
        };
        let invalid = |why: String| UsageError::Invalid {
            path: path.to_path_buf(),
            why,
        };
        if (h.layers, h.experts) != (layers, experts) {
            return Err(invalid(format!(
                "it is for {} layers x {} experts, the model has {layers} x {experts}",
                h.layers, h.experts
            )));
        }
        if h.fingerprint != fingerprint {
            return Err(invalid(format!(
                "it belongs to model {:016x}, not {fingerprint:016x}",
                h.fingerprint
            )));
        }
        Ok(Some(h))
    }

    /// Writes the history crash-safely: a temporary file in the same
    /// directory (0600), fsync, rename over `path`, fsync of the directory.
    /// A crash leaves either the old file or the new one.
    pub fn save(&self, path: &Path) -> Result<(), UsageError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
        let write = || -> Result<(), UsageError> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(io_err("creating", &tmp))?;
            f.write_all(&self.encode()).map_err(io_err("writing", &tmp))?;
            f.sync_all().map_err(io_err("syncing", &tmp))?;
            std::fs::rename(&tmp, path).map_err(io_err("renaming into place", path))?;
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err("syncing", dir))
        };
        let r = write();
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r
    }

    /// Every count times `factor`.
    pub fn decayed(&self, factor: f32) -> Self {
        Self {
            counts: self.counts.iter().map(|c| c * factor).collect(),
            ..self.clone()
        }
    }

    /// Adds a run's raw counts (layer-major, same shape).
    pub fn add_counts(&mut self, counts: &[u64]) {
        for (c, &n) in self.counts.iter_mut().zip(counts) {
            *c += n as f32;
        }
    }

    /// Sum of every count.
    pub fn total(&self) -> f64 {
        self.counts.iter().map(|&c| c as f64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist() -> UsageHistory {
        let mut h = UsageHistory::new(0xfeed, 2, 4);
        h.runs = 3;
        h.counts = vec![5.0, 0.0, 1.5, 9.0, 0.0, 2.0, 2.0, 7.0];
        h
    }

    #[test]
    fn file_round_trip_and_crash_safety() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join(super::super::HISTORY_FILE);
        assert_eq!(UsageHistory::load(&p).unwrap(), None, "no file: no history");
        let h = hist();
        h.save(&p).unwrap();
        assert_eq!(UsageHistory::load(&p).unwrap(), Some(h.clone()));
        assert_eq!(UsageHistory::load_for(&p, 0xfeed, 2, 4).unwrap(), Some(h.clone()));
        // No temporary files left next to it.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
        // Every truncation, and a flipped byte, is refused with a reason.
        let bytes = h.encode();
        for n in 0..bytes.len() {
            std::fs::write(&p, &bytes[..n]).unwrap();
            let e = UsageHistory::load(&p).unwrap_err();
            assert!(matches!(e, UsageError::Invalid { .. }), "{n}: {e}");
        }
        let mut flipped = bytes.clone();
        flipped[HEADER_LEN + 3] ^= 0x40;
        std::fs::write(&p, &flipped).unwrap();
        assert!(
            UsageHistory::load(&p)
                .unwrap_err()
                .to_string()
                .contains("checksum")
        );
        std::fs::write(&p, b"{\"not\": \"a history\"}").unwrap();
        assert!(UsageHistory::load(&p).is_err());
        // Another model's or shape's history is refused too.
        h.save(&p).unwrap();
        assert!(UsageHistory::load_for(&p, 0xbeef, 2, 4).is_err());
        assert!(UsageHistory::load_for(&p, 0xfeed, 4, 2).is_err());
        // A header claiming a huge shape is refused before allocating.
        let mut huge = bytes;
        huge[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(UsageHistory::decode(&huge).unwrap_err().contains("too large"));
    }

    #[test]
    fn decay_then_add() {
        let mut h = hist().decayed(0.5);
        assert_eq!(h.counts, vec![2.5, 0.0, 0.75, 4.5, 0.0, 1.0, 1.0, 3.5]);
        h.add_counts(&[1, 0, 0, 0, 0, 0, 0, 2]);
        assert_eq!(h.counts[0], 3.5);
        assert_eq!(h.counts[7], 5.5);
        assert_eq!(h.runs, 3, "decay alone does not count a run");
    }
}
