//! The interface through which a model asks for routed experts.
//!
//! A model never opens expert files itself: it names `(layer, expert)` keys and
//! receives decoded experts. Which ones are resident, what is read, in which
//! order and on which thread is the source's business, so the same model code
//! runs on the simple [`BlockingSource`] and on the actor pipeline.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::buffer::{AlignedBuf, SharedBytes};
use crate::error::SourceError;
use crate::expert::{ExpertKey, ExpertMap};
use crate::tag::Tag;

/// Largest gap between two pieces of one expert that is read through instead
/// of splitting the read (covers the 4096-byte alignment padding of a
/// converted container).
pub const MAX_READ_GAP: u64 = 64 * 1024;

/// Turns an expert's raw bytes into the form compute uses. Implemented by the
/// model crate; runs on whichever thread delivered the bytes.
pub trait ExpertDecoder<T>: Send + Sync {
    /// `piece_at[i]` is where piece `i` of the expert's extent starts in
    /// `bytes`. The decoded value may keep `bytes` alive and point into it
    /// (no copy): `bytes` is a private read buffer for streamed experts and
    /// the container's read-only mapping for mapped ones.
    fn decode(&self, key: ExpertKey, bytes: SharedBytes, piece_at: &[usize]) -> Result<T, String>;

    /// Bytes the decoded expert keeps in memory (the cache budget unit).
    fn resident_bytes(&self, value: &T) -> usize;
}

/// Counters a source keeps about its deliveries.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SourceStats {
    pub hits: u64,
    pub misses: u64,
    pub bytes_read: u64,
    /// Predicted experts that were then routed (pilot recall numerator).
    pub pilot_hits: u64,
    /// Routed experts on layers the pilot predicted for (recall denominator).
    pub pilot_routed: u64,
}

impl SourceStats {
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }

    pub fn pilot_recall(&self) -> Option<f64> {
        (self.pilot_routed > 0).then(|| self.pilot_hits as f64 / self.pilot_routed as f64)
    }
}

/// A callback that receives `(index into keys, expert)`.
pub type ExpertSink<'a, T> = dyn FnMut(usize, Arc<T>) -> Result<(), SourceError> + 'a;

/// A callback that receives a group of `(index into keys, expert)` at once:
/// everything available when it is called (all resident experts of a layer
/// in one call), so compute can spread one group over its threads instead
/// of waking up once per expert.
pub type ExpertBatchSink<'a, T> = dyn FnMut(&[(usize, Arc<T>)]) -> Result<(), SourceError> + 'a;

/// Delivers routed experts to layer compute.
pub trait ExpertSource<T>: Send + Sync {
    /// Delivers every expert in `keys` to `sink`, each once, with its index in
    /// `keys`, in groups of whatever is available (never an empty group).
    /// Order is unspecified (resident experts first is typical), so a
    /// caller that wants deterministic numbers must combine results by index,
    /// not by arrival. Returns when all were delivered or one failed.
    fn fetch_batch(
        &self,
        tag: Tag,
        keys: &[ExpertKey],
        sink: &mut ExpertBatchSink<'_, T>,
    ) -> Result<(), SourceError>;

    /// [`ExpertSource::fetch_batch`], one expert per call.
    fn fetch(&self, tag: Tag, keys: &[ExpertKey], sink: &mut ExpertSink<'_, T>) -> Result<(), SourceError> {
        self.fetch_batch(tag, keys, &mut |group| {
            for (i, e) in group {
                sink(*i, e.clone())?;
            }
            Ok(())
        })
    }

    /// The residual after `tag.layer - 1`'s attention, offered so a pilot can
    /// predict `tag.layer`'s experts. Sources without a pilot ignore it.
    fn pilot(&self, _tag: Tag, _residual: &[f32]) {}

    /// Announces the token step `tag` starts; older work becomes stale.
    fn advance(&self, _tag: Tag) {}

    /// Keeps `keys` resident until unpinned (loading them in the
    /// background), within the source's own limits. Sources that keep
    /// everything resident, or nothing, ignore it.
    fn pin(&self, _keys: &[ExpertKey]) {}

    /// Returns pinned experts to the ordinary cache policy.
    fn unpin(&self, _keys: &[ExpertKey]) {}

    /// Snapshot of the counters.
    fn stats(&self) -> SourceStats;

    /// Detailed timing and I/O counters, for sources that keep them
    /// (`--profile`, `coli bench`).
    fn profile(&self) -> Option<crate::pipeline::PipelineProfile> {
        None
    }
}

/// Reads experts on the caller's thread with positioned reads, keeps nothing.
/// The reference behaviour every smarter source must match token for token.
pub struct BlockingSource<T> {
    map: ExpertMap,
    files: Vec<File>,
    decoder: Box<dyn ExpertDecoder<T>>,
    misses: AtomicU64,
    bytes_read: AtomicU64,
}

impl<T: Send + Sync> BlockingSource<T> {
    pub fn open(map: ExpertMap, decoder: Box<dyn ExpertDecoder<T>>) -> Result<Self, SourceError> {
        let files = map
            .files
            .iter()
            .map(|p| {
                File::open(p).map_err(|source| SourceError::Open {
                    path: p.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            map,
            files,
            decoder,
            misses: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
        })
    }

    pub fn map(&self) -> &ExpertMap {
        &self.map
    }

    /// Reads and decodes one expert.
    pub fn load(&self, key: ExpertKey) -> Result<T, SourceError> {
        let (buf, piece_at) = read_expert(&self.map, &self.files, key)?;
        self.bytes_read.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.decoder
            .decode(key, Arc::new(buf), &piece_at)
            .map_err(|reason| SourceError::Decode { key, reason })
    }
}

/// Reads one expert's extent into a fresh aligned buffer with positioned reads.
pub fn read_expert(
    map: &ExpertMap,
    files: &[File],
    key: ExpertKey,
) -> Result<(AlignedBuf, Vec<usize>), SourceError> {
    let extent = map.extent(key)?;
    let (spans, piece_at) = extent.plan_reads(MAX_READ_GAP);
    let total: u64 = spans.iter().map(|s| s.len).sum();
    let mut buf = AlignedBuf::zeroed(total as usize);
    let mut at = 0usize;
    for s in &spans {
        let path = map.files.get(s.file as usize).cloned().unwrap_or_default();
        let file = files.get(s.file as usize).ok_or_else(|| SourceError::Read {
            key,
            path: path.clone(),
            source: std::io::Error::other("file id out of range"),
        })?;
        let dst = &mut buf.as_mut_slice()[at..at + s.len as usize];
        file.read_exact_at(dst, s.offset)
            .map_err(|source| SourceError::Read { key, path, source })?;
        at += s.len as usize;
    }
    Ok((buf, piece_at))
}

impl<T: Send + Sync> ExpertSource<T> for BlockingSource<T> {
    fn fetch_batch(
        &self,
        _tag: Tag,
        keys: &[ExpertKey],
        sink: &mut ExpertBatchSink<'_, T>,
    ) -> Result<(), SourceError> {
        for (i, &key) in keys.iter().enumerate() {
            let expert = self.load(key)?;
            self.misses.fetch_add(1, Ordering::Relaxed);
            sink(&[(i, Arc::new(expert))])?;
        }
        Ok(())
    }

    fn stats(&self) -> SourceStats {
        SourceStats {
            misses: self.misses.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            ..SourceStats::default()
        }
    }
}
