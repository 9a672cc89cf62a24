//! The disk probe: what the disk gives the access pattern decode uses,
//! measured apart from any decode run.
//!
//! Decode reads whole experts at random places in the file, one read per
//! expert (per span of nearby pieces), with as many reads in flight as
//! there are I/O workers. The probe does the same: a seeded random sample
//! of the model's own expert extents, planned and read as the workers read
//! them (`read_into` a block-aligned buffer, in place under O_DIRECT),
//! through the storage backend the run uses, with one reader per worker, repeated on fresh samples so the
//! spread shows. Before each repeat the cached pages of that repeat's
//! sample are dropped (`posix_fadvise(DONTNEED)` on its ranges, which needs
//! no privileges and drops only clean pages nobody maps) and the share of
//! the sample still cached afterwards is measured (`mincore`), so a reader
//! can tell a disk figure from a page-cache figure. Only the sample is
//! dropped, and reading it (through the page cache) brings it back, so
//! the passes after the probe find the page cache as the probe found it:
//! a model served from RAM is measured from RAM, not from a disk the probe
//! had emptied the cache onto. A simulated disk (`--disk-sim bw=...`) is
//! not probed: its bandwidth is given.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use colibri_actors::expert::ReadSpan;
use colibri_actors::source::MAX_READ_GAP;
use colibri_actors::{AlignedBuf, ExpertKey, ExpertMap, SimSpec, SourceError, Storage, StorageOptions};

use crate::synth::WyRand;

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

/// What the probe is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeOptions {
    /// Bytes read per repeat (at least one expert).
    pub bytes: u64,
    pub repeats: usize,
    /// Readers in parallel: the I/O workers' count.
    pub queue_depth: usize,
    /// The backend: O_DIRECT, mmap or pread, as the run reads.
    pub storage: StorageOptions,
    /// Drop the sample's cached pages before each repeat.
    pub drop_cache: bool,
    pub seed: u64,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            bytes: 256 << 20,
            repeats: 3,
            queue_depth: 4,
            storage: StorageOptions::default(),
            drop_cache: true,
            seed: 0x6469_736b,
        }
    }
}

/// One repeat of the probe.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Repeat {
    pub bytes: u64,
    pub secs: f64,
    /// Share of the sampled bytes that were in the page cache when the
    /// repeat started (after the drop); `None` when it could not be seen.
    pub cached_before: Option<f64>,
}

impl Repeat {
    pub fn bytes_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 / self.secs
        } else {
            0.0
        }
    }
}

/// The probe's measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct DiskProbe {
    pub repeats: Vec<Repeat>,
    /// Mean bytes of one read (one expert, block-aligned).
    pub read_bytes: u64,
    pub queue_depth: usize,
    /// The storage backend that read ("pread", "direct", "mmap").
    pub kind: &'static str,
    /// How the page cache was treated.
    pub cache: CacheTreatment,
}

/// What the probe did about the page cache.
#[derive(Clone, Debug, PartialEq)]
pub enum CacheTreatment {
    /// O_DIRECT reads bypass it.
    Bypassed,
    /// Dropped before each repeat.
    Dropped,
    /// Left as it was (asked, or the drop failed: the reason).
    Kept(String),
}

impl DiskProbe {
    fn rates(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self.repeats.iter().map(Repeat::bytes_per_sec).collect();
        v.sort_by(f64::total_cmp);
        v
    }

    pub fn median(&self) -> f64 {
        let v = self.rates();
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    pub fn min(&self) -> f64 {
        self.rates().first().copied().unwrap_or(0.0)
    }

    pub fn max(&self) -> f64 {
        self.rates().last().copied().unwrap_or(0.0)
    }

    /// The largest share of a repeat's sample found cached at its start.
    pub fn most_cached(&self) -> Option<f64> {
        self.repeats
            .iter()
            .filter_map(|r| r.cached_before)
            .max_by(f64::total_cmp)
    }

    /// One line: median, range, what was read and how.
    pub fn describe(&self) -> String {
        let mb = |b: f64| b / 1e6;
        let cache = match &self.cache {
            CacheTreatment::Bypassed => "O_DIRECT, no page cache".to_string(),
            CacheTreatment::Dropped => match self.most_cached() {
                Some(c) if c > 0.0 => format!(
                    "sample's cached pages dropped before each repeat, at most {:.0}% of a sample still cached",
                    c * 100.0
                ),
                Some(_) => {
                    "sample's cached pages dropped before each repeat (none of the samples cached)".into()
                }
                None => "sample's cached pages dropped before each repeat".into(),
            },
            CacheTreatment::Kept(why) => format!("page cache kept: {why}"),
        };
        format!(
            "{:.1} MB/s median, {:.1}-{:.1} over {} repeats of {:.0} MB: random {:.2} MB expert reads, {} in flight, via {}; {cache}",
            mb(self.median()),
            mb(self.min()),
            mb(self.max()),
            self.repeats.len(),
            self.repeats.first().map_or(0.0, |r| mb(r.bytes as f64)),
            mb(self.read_bytes as f64),
            self.queue_depth,
            self.kind,
        )
    }
}

const BLOCK: u64 = 4096;

/// One expert's reads as the I/O workers plan them (pieces closer than
/// the workers' gap merged into one span).
type ExpertReads = Vec<ReadSpan>;

/// Every routed expert's reads.
fn expert_reads(map: &ExpertMap) -> Vec<ExpertReads> {
    let mut reads = Vec::new();
    for l in 0..map.layers {
        for e in 0..map.experts_per_layer {
            let Ok(extent) = map.extent(ExpertKey::new(l as u32, e as u32)) else {
                continue;
            };
            let (spans, _) = extent.plan_reads(MAX_READ_GAP);
            if !spans.is_empty() {
                reads.push(spans);
            }
        }
    }
    reads
}

fn bytes_of(r: &ExpertReads) -> u64 {
    r.iter().map(|s| s.len).sum()
}

/// Runs the probe over `map`'s expert extents (see the module docs).
pub fn probe(map: &ExpertMap, opts: &ProbeOptions) -> Result<DiskProbe, DiskError> {
    let all = expert_reads(map);
    if all.is_empty() {
        return Err(DiskError::NoExperts);
    }
    let storage: Arc<dyn Storage> = colibri_actors::storage::open_storage(&map.files, &opts.storage)?;
    let direct = storage.kind() == "direct";
    let mut cache = if direct {
        CacheTreatment::Bypassed
    } else if opts.drop_cache {
        CacheTreatment::Dropped
    } else {
        CacheTreatment::Kept("asked (--probe-keep-cache)".into())
    };
    let mut rng = WyRand::new(opts.seed);
    let mut repeats = Vec::new();
    let mut read_total = (0u64, 0u64);
    for _ in 0..opts.repeats.max(1) {
        let sample = sample(&all, opts.bytes, &mut rng);
        if matches!(cache, CacheTreatment::Dropped)
            && let Err(why) = drop_cached(&map.files, &sample)
        {
            cache = CacheTreatment::Kept(why);
        }
        let cached_before = (!direct).then(|| cached_share(&map.files, &sample)).flatten();
        let threads = opts.queue_depth.clamp(1, sample.len());
        let t0 = Instant::now();
        let bytes = read_all(&storage, &sample, threads)?;
        repeats.push(Repeat {
            bytes,
            secs: t0.elapsed().as_secs_f64(),
            cached_before,
        });
        read_total.0 += sample.iter().map(bytes_of).sum::<u64>();
        read_total.1 += sample.len() as u64;
    }
    Ok(DiskProbe {
        repeats,
        read_bytes: read_total.0 / read_total.1.max(1),
        queue_depth: opts.queue_depth.max(1),
        kind: storage.kind(),
        cache,
    })
}

/// A random sample of `reads` (without repeats) totalling at least
/// `bytes`, or all of them.
fn sample(reads: &[ExpertReads], bytes: u64, rng: &mut WyRand) -> Vec<ExpertReads> {
    let mut order: Vec<usize> = (0..reads.len()).collect();
    let mut out = Vec::new();
    let mut total = 0u64;
    for i in 0..order.len() {
        if total >= bytes.max(1) {
            break;
        }
        let j = i + (rng.next_u64() % (order.len() - i) as u64) as usize;
        order.swap(i, j);
        let r = reads[order[i]].clone();
        total += bytes_of(&r);
        out.push(r);
    }
    out
}

/// Reads every sampled expert as an I/O worker does: each span into one
/// block-aligned buffer with `read_into` (in place under O_DIRECT), the
/// experts shared round-robin among `threads` readers.
fn read_all(storage: &Arc<dyn Storage>, reads: &[ExpertReads], threads: usize) -> Result<u64, DiskError> {
    let results: Vec<Result<u64, DiskError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let storage = storage.clone();
                scope.spawn(move || -> Result<u64, DiskError> {
                    let mut buf = AlignedBuf::zeroed(BLOCK as usize);
                    let mut bytes = 0u64;
                    for expert in reads.iter().skip(t).step_by(threads) {
                        let total = bytes_of(expert) as usize;
                        // Room for the last span's block rounding, as the
                        // workers' pool gives.
                        let room = total.next_multiple_of(BLOCK as usize) + BLOCK as usize;
                        if buf.capacity() < room {
                            buf = AlignedBuf::zeroed(room);
                        }
                        buf.set_len(total);
                        let mut at = 0usize;
                        for s in expert {
                            let n = storage
                                .read_into(s.file, s.offset, &mut buf, at, s.len as usize)
                                .map_err(|source| DiskError::Io {
                                    path: storage.path(s.file).map(PathBuf::from).unwrap_or_default(),
                                    source,
                                })?;
                            bytes += n as u64;
                            at += s.len as usize;
                        }
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
    let mut bytes = 0;
    for r in results {
        bytes += r?;
    }
    Ok(bytes)
}

/// Asks the kernel to drop the cached pages of `sample`'s ranges of
/// `files`; the reason when it could not.
fn drop_cached(files: &[PathBuf], sample: &[ExpertReads]) -> Result<(), String> {
    let mut open = Vec::with_capacity(files.len());
    for f in files {
        open.push(std::fs::File::open(f).map_err(|e| format!("opening {}: {e}", f.display()))?);
    }
    for span in sample.iter().flatten() {
        let (Some(file), Some(len)) = (open.get(span.file as usize), std::num::NonZeroU64::new(span.len))
        else {
            continue;
        };
        rustix::fs::fadvise(file, span.offset, Some(len), rustix::fs::Advice::DontNeed).map_err(|e| {
            let path = files
                .get(span.file as usize)
                .map_or_else(String::new, |p| p.display().to_string());
            format!("posix_fadvise on {path}: {e}")
        })?;
    }
    Ok(())
}

/// Share of the sampled bytes resident in the page cache, by `mincore`
/// over a read-only mapping of each file; `None` when a file cannot be
/// mapped.
fn cached_share(files: &[PathBuf], sample: &[ExpertReads]) -> Option<f64> {
    let maps: Vec<memmap2::Mmap> = files.iter().map(|f| map_file(f)).collect::<Option<_>>()?;
    let page = rustix::param::page_size() as u64;
    let (mut cached, mut total) = (0u64, 0u64);
    for span in sample.iter().flatten() {
        let (file, off, len) = (span.file, span.offset, span.len);
        let m = maps.get(file as usize)?;
        let lo = (off / page * page).min(m.len() as u64);
        let hi = (off + len).min(m.len() as u64);
        if hi <= lo {
            continue;
        }
        let pages = (hi - lo).div_ceil(page) as usize;
        let mut vec = vec![0u8; pages];
        // SAFETY: `lo` is page-aligned and `lo..hi` lies inside the live
        // mapping `m`; `vec` has one byte for each page of that range, as
        // mincore(2) writes.
        let rc = unsafe {
            libc::mincore(
                m.as_ptr().add(lo as usize) as *mut libc::c_void,
                (hi - lo) as usize,
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return None;
        }
        cached += vec.iter().filter(|&&b| b & 1 == 1).count() as u64 * page;
        total += pages as u64 * page;
    }
    (total > 0).then(|| cached as f64 / total as f64)
}

fn map_file(path: &Path) -> Option<memmap2::Mmap> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a read-only mapping used only to ask which pages are
    // resident; its bytes are never read, so a concurrent writer cannot
    // make this code observe torn data.
    unsafe { memmap2::Mmap::map(&file) }.ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use colibri_actors::{ExpertExtent, Piece};

    #[test]
    fn probes_random_expert_reads_with_a_spread() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("experts.bin");
        std::fs::write(&path, vec![7u8; 64 * 8192]).unwrap();
        let mut map = ExpertMap::new(vec![path], 2, 32);
        for l in 0..2u32 {
            for e in 0..32u32 {
                let offset = (l as u64 * 32 + e as u64) * 8192;
                let extent = ExpertExtent {
                    pieces: vec![Piece {
                        file: 0,
                        offset,
                        len: 8192,
                    }],
                };
                map.set_extent(ExpertKey::new(l, e), extent).unwrap();
            }
        }
        let opts = ProbeOptions {
            bytes: 10 * 8192,
            repeats: 3,
            queue_depth: 2,
            ..ProbeOptions::default()
        };
        let p = probe(&map, &opts).unwrap();
        assert_eq!(p.repeats.len(), 3);
        assert!(p.repeats.iter().all(|r| r.bytes == 10 * 8192), "{p:?}");
        assert_eq!(p.read_bytes, 8192);
        assert!(p.min() <= p.median() && p.median() <= p.max());
        assert!(p.describe().contains("3 repeats"), "{}", p.describe());
        // Samples are drawn without repeats and cover at most the file.
        let all = expert_reads(&map);
        let mut rng = WyRand::new(1);
        let s = sample(&all, u64::MAX, &mut rng);
        assert_eq!(s.len(), 64);
        let mut offsets: Vec<u64> = s.iter().map(|r| r[0].offset).collect();
        offsets.sort_unstable();
        offsets.dedup();
        assert_eq!(offsets.len(), 64);
        assert!(matches!(
            probe(&ExpertMap::new(vec![], 1, 1), &opts),
            Err(DiskError::NoExperts)
        ));
    }

    #[test]
    fn the_probe_leaves_the_page_cache_as_it_found_it() {
        // A model the page cache holds: after the probe, every expert is
        // still cached (only the sample was dropped, and reading it cached
        // it again), so the passes after it measure RAM, not the disk.
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("experts.bin");
        let file = std::fs::File::create(&path).unwrap();
        std::io::Write::write_all(&mut &file, &vec![3u8; 64 * 16384]).unwrap();
        // Clean pages only: dirty ones are not dropped.
        file.sync_all().unwrap();
        let _ = std::fs::read(&path).unwrap();
        let mut map = ExpertMap::new(vec![path.clone()], 1, 64);
        for e in 0..64u32 {
            let extent = ExpertExtent {
                pieces: vec![Piece {
                    file: 0,
                    offset: e as u64 * 16384,
                    len: 16384,
                }],
            };
            map.set_extent(ExpertKey::new(0, e), extent).unwrap();
        }
        let all = expert_reads(&map);
        let before = cached_share(std::slice::from_ref(&path), &all);
        let opts = ProbeOptions {
            bytes: 8 * 16384,
            repeats: 2,
            queue_depth: 2,
            ..ProbeOptions::default()
        };
        let p = probe(&map, &opts).unwrap();
        assert!(matches!(p.cache, CacheTreatment::Dropped), "{}", p.describe());
        let after = cached_share(std::slice::from_ref(&path), &all);
        assert_eq!(
            after, before,
            "cached share of the model before and after the probe"
        );
    }

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
