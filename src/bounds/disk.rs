//! The disk side of a benchmark: the bandwidth the I/O bound divides by.
//!
//! The bound must use the storage the decode run used, so the probe reads
//! the model's own expert extents, in file order, with the same settings
//! (O_DIRECT or buffered), or takes the simulated bandwidth from
//! `--disk-sim bw=...` when the disk is simulated.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use colibri_actors::{AlignedBuf, ExpertKey, ExpertMap, SimSpec, SourceError, Storage, StorageOptions};

/// Why the disk could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Open(#[from] SourceError),
    #[error("--disk-sim: {0}")]
    Spec(String),
    #[error("disk probe: {0}")]
    Probe(String),
    #[error("the model has no expert extents to read")]
    NoExperts,
}

/// The `bw=` of a `--disk-sim` spec in bytes per second, if it has one
/// (parsed by the runtime's own parser, so both agree on units).
pub fn sim_bandwidth(spec: &str) -> Result<Option<f64>, DiskError> {
    let spec: SimSpec = spec
        .parse()
        .map_err(|e: colibri_actors::SimSpecError| DiskError::Spec(e.to_string()))?;
    Ok(spec.bandwidth.map(|b| b as f64))
}

/// A measured sequential read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bandwidth {
    pub bytes: u64,
    pub secs: f64,
    /// The storage backend that read ("pread", "direct", "mmap").
    pub kind: &'static str,
    /// Parallel readers.
    pub threads: usize,
}

impl Bandwidth {
    pub fn bytes_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 / self.secs
        } else {
            0.0
        }
    }
}

const BLOCK: u64 = 4096;

/// Reads whole experts in file order (layer-major, as a container stores
/// them), at most `max_bytes`, one block-aligned read per expert as the I/O
/// workers do, with `threads` readers in parallel (the workers' queue depth),
/// through the storage backend `opts` selects (O_DIRECT, mmap or pread; the
/// simulated disk is the caller's to leave out), and times it.
pub fn read_bandwidth(
    map: &ExpertMap,
    opts: &StorageOptions,
    max_bytes: u64,
    threads: usize,
) -> Result<Bandwidth, DiskError> {
    let storage: Arc<dyn Storage> = colibri_actors::storage::open_storage(&map.files, opts)?;
    // (file, block-aligned offset, length) of every expert, in file order.
    let mut reads = Vec::new();
    for l in 0..map.layers {
        for e in 0..map.experts_per_layer {
            let Ok(extent) = map.extent(ExpertKey::new(l as u32, e as u32)) else {
                continue;
            };
            let Some(first) = extent.pieces.first() else {
                continue;
            };
            let start = extent
                .pieces
                .iter()
                .map(|p| p.offset)
                .min()
                .unwrap_or(first.offset);
            let end = extent
                .pieces
                .iter()
                .map(|p| p.offset + p.len)
                .max()
                .unwrap_or(start);
            // Whole blocks, as O_DIRECT requires (harmless otherwise).
            let lo = start / BLOCK * BLOCK;
            reads.push((first.file, lo, end.next_multiple_of(BLOCK) - lo));
        }
    }
    let mut total = 0u64;
    let count = reads
        .iter()
        .take_while(|r| {
            let go = total < max_bytes;
            total += r.2;
            go
        })
        .count();
    let reads = &reads[..count];
    if reads.is_empty() {
        return Err(DiskError::NoExperts);
    }
    let threads = threads.clamp(1, reads.len());
    let t0 = Instant::now();
    let results: Vec<Result<u64, DiskError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let storage = storage.clone();
                scope.spawn(move || -> Result<u64, DiskError> {
                    let mut buf = AlignedBuf::zeroed(BLOCK as usize);
                    let mut bytes = 0u64;
                    for &(file, off, len) in reads.iter().skip(t).step_by(threads) {
                        let len = len as usize;
                        if buf.capacity() < len {
                            buf = AlignedBuf::zeroed(len);
                        }
                        let dst = &mut buf.full_capacity_mut()[..len];
                        let n = storage.read_at(file, off, dst).map_err(|source| DiskError::Io {
                            path: storage.path(file).map(PathBuf::from).unwrap_or_default(),
                            source,
                        })?;
                        bytes += n as u64;
                    }
                    Ok(bytes)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(DiskError::Probe("a reader thread panicked".into())))
            })
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let mut bytes = 0;
    for r in results {
        bytes += r?;
    }
    Ok(Bandwidth {
        bytes,
        secs,
        kind: storage.kind(),
        threads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sim_bandwidth() {
        assert_eq!(sim_bandwidth("bw=200MB/s").unwrap(), Some(200e6));
        assert_eq!(sim_bandwidth("lat=2ms, bw=1GB/s ,seed=3").unwrap(), Some(1e9));
        assert_eq!(
            sim_bandwidth("bw=1.5GiB").unwrap(),
            Some(1.5 * 1024.0 * 1024.0 * 1024.0)
        );
        assert_eq!(sim_bandwidth("lat=2ms").unwrap(), None);
        assert!(sim_bandwidth("bw=fast").is_err());
    }
}
