//! [`MappedSource`]: routed experts served in place from a read-only
//! mapping of the container, for models whose experts fit the memory budget.
//!
//! When every expert fits, streaming them through private buffers only adds
//! work: each miss allocates, zero-fills and copies bytes that the page
//! cache already holds, and the I/O workers, coordinator and pilot cost
//! thread hand-offs on every layer. Here a fetch is a table lookup on the
//! caller's thread: the first use of an expert decodes it once (its matrices
//! point into the mapping, so nothing is copied) and every later use is a
//! hit. One background thread asks the kernel to read the expert region
//! ahead and map it (`madvise(WILLNEED)`, then `MADV_POPULATE_READ`), so
//! compute neither waits for the disk one page at a time on a cold start
//! nor takes a page fault per 4 KiB on first use.
//!
//! An expert whose pieces span several files (a sharded checkpoint) is
//! copied into an owned buffer once instead; it is still decoded only once.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use memmap2::{Advice, Mmap};

use crate::buffer::{AlignedBuf, SharedBytes};
use crate::error::SourceError;
use crate::expert::{ExpertKey, ExpertMap};
use crate::pipeline::PipelineProfile;
use crate::source::{ExpertBatchSink, ExpertDecoder, ExpertSource, SourceStats};
use crate::tag::Tag;

/// A read-only mapping of one container file.
struct MappedFile(Mmap);

impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Largest range one `madvise(WILLNEED)` call covers, so the read-ahead
/// thread notices a shutdown between calls.
const ADVISE_CHUNK: usize = 64 << 20;

/// See the module docs.
pub struct MappedSource<T> {
    map: Arc<ExpertMap>,
    /// `None` for empty files, which cannot be mapped.
    files: Vec<Option<Arc<MappedFile>>>,
    decoder: Box<dyn ExpertDecoder<T>>,
    /// One slot per (layer, expert), filled on first use.
    slots: Vec<OnceLock<Arc<T>>>,
    budget: Option<u64>,
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_touched: AtomicU64,
    /// Decoding on first use (page faults included): this placement's
    /// "disk wait".
    decode_ns: AtomicU64,
    fetch_ns: AtomicU64,
    sink_ns: AtomicU64,
    fetches: AtomicU64,
    resident: AtomicU64,
    started: Instant,
    stop_readahead: Arc<AtomicBool>,
    readahead: Option<JoinHandle<()>>,
    /// How long the read-ahead pass took (0 while it runs).
    readahead_ns: Arc<AtomicU64>,
}

/// Reads `ranges` ahead and maps their pages, a chunk at a time, until done
/// or `stop` is set.
fn populate(ranges: &[(Arc<MappedFile>, usize, usize)], stop: &AtomicBool) {
    for (f, start, end) in ranges {
        // madvise wants a page-aligned start.
        let mut at = start / 4096 * 4096;
        while at < *end && !stop.load(Ordering::Relaxed) {
            let len = ADVISE_CHUNK.min(end - at);
            if let Err(e) = f.0.advise_range(Advice::WillNeed, at, len) {
                tracing::debug!(error = %e, "madvise(WILLNEED) failed; read-ahead stops");
                return;
            }
            // Page-table entries too, so compute does not take a minor
            // fault per 4 KiB on first use (Linux 5.14+; older kernels
            // refuse it, which only costs speed).
            #[cfg(target_os = "linux")]
            if let Err(e) = f.0.advise_range(Advice::PopulateRead, at, len) {
                tracing::debug!(error = %e, "madvise(POPULATE_READ) failed");
            }
            at += len;
        }
    }
}

/// The share of `map[start..end]`'s pages in the page cache (`mincore`);
/// 0 when it cannot be told.
fn resident_share(map: &Mmap, start: usize, end: usize) -> f64 {
    let page = 4096usize;
    let lo = start / page * page;
    let end = end.min(map.len());
    if lo >= end {
        return 1.0;
    }
    let pages = (end - lo).div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `lo` is page-aligned and inside the mapping, `end - lo` bytes
    // from it are mapped, and `vec` holds one byte per page of that range
    // as mincore requires; mincore only writes into `vec`.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr().add(lo) as *mut libc::c_void,
            end - lo,
            vec.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return 0.0;
    }
    vec.iter().filter(|&&b| b & 1 == 1).count() as f64 / pages as f64
}

/// Runs its closure when dropped (on every way out of a scope).
struct Defer<F: FnMut()>(F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

impl<T: Send + Sync + 'static> MappedSource<T> {
    /// Maps every file of `map`. `budget` is only reported (the caller chose
    /// this source because the experts fit it); `readahead` starts the
    /// background `madvise(WILLNEED)` pass over each file's expert bytes.
    pub fn open(
        map: ExpertMap,
        decoder: Box<dyn ExpertDecoder<T>>,
        budget: Option<u64>,
        readahead: bool,
    ) -> Result<Self, SourceError> {
        let mut files = Vec::with_capacity(map.files.len());
        for p in &map.files {
            let open_err = |source| SourceError::Open {
                path: p.clone(),
                source,
            };
            let f = std::fs::File::open(p).map_err(open_err)?;
            if f.metadata().map_err(open_err)?.len() == 0 {
                files.push(None);
                continue;
            }
            // SAFETY: the map is read-only and the container is not modified
            // while the engine runs (a truncation underneath is a user error
            // the OS reports as SIGBUS, as for any mmap reader).
            let m = unsafe { Mmap::map(&f) }.map_err(open_err)?;
            files.push(Some(Arc::new(MappedFile(m))));
        }
        let slots = (0..map.extents.len()).map(|_| OnceLock::new()).collect();
        let stop_readahead = Arc::new(AtomicBool::new(false));
        let mut me = Self {
            map: Arc::new(map),
            files,
            decoder,
            slots,
            budget,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            bytes_touched: AtomicU64::new(0),
            decode_ns: AtomicU64::new(0),
            fetch_ns: AtomicU64::new(0),
            sink_ns: AtomicU64::new(0),
            fetches: AtomicU64::new(0),
            resident: AtomicU64::new(0),
            started: Instant::now(),
            stop_readahead,
            readahead: None,
            readahead_ns: Arc::new(AtomicU64::new(0)),
        };
        if readahead {
            let ranges = me.expert_ranges();
            if ranges
                .iter()
                .all(|(f, start, end)| resident_share(&f.0, *start, *end) >= 0.95)
            {
                // Already in the page cache: mapping it takes a fraction of
                // a second, better spent now than racing the first tokens'
                // compute for the cores.
                let t0 = Instant::now();
                populate(&ranges, &me.stop_readahead);
                me.readahead_ns
                    .store(t0.elapsed().as_nanos().max(1) as u64, Ordering::Relaxed);
            } else {
                me.readahead = me.spawn_readahead();
            }
        }
        Ok(me)
    }

    /// Each file's byte range that holds experts, in file order.
    fn expert_ranges(&self) -> Vec<(Arc<MappedFile>, usize, usize)> {
        let mut lo = vec![u64::MAX; self.files.len()];
        let mut hi = vec![0u64; self.files.len()];
        for p in self.map.extents.iter().flat_map(|e| &e.pieces) {
            if let (Some(l), Some(h)) = (lo.get_mut(p.file as usize), hi.get_mut(p.file as usize)) {
                *l = (*l).min(p.offset);
                *h = (*h).max(p.offset.saturating_add(p.len));
            }
        }
        self.files
            .iter()
            .enumerate()
            .filter_map(|(i, f)| {
                let f = f.as_ref()?;
                let end = (hi[i] as usize).min(f.0.len());
                let start = (lo[i] as usize).min(end);
                (start < end).then(|| (f.clone(), start, end))
            })
            .collect()
    }

    fn spawn_readahead(&self) -> Option<JoinHandle<()>> {
        let ranges = self.expert_ranges();
        let stop = self.stop_readahead.clone();
        let done_ns = self.readahead_ns.clone();
        std::thread::Builder::new()
            .name("coli-readahead".into())
            .spawn(move || {
                let t0 = Instant::now();
                let _record =
                    Defer(move || done_ns.store(t0.elapsed().as_nanos().max(1) as u64, Ordering::Relaxed));
                populate(&ranges, &stop);
            })
            .ok()
    }

    /// Decodes `key` from the mapping (or a one-off copy when its pieces
    /// span files).
    fn load(&self, key: ExpertKey) -> Result<T, SourceError> {
        let extent = self.map.extent(key)?;
        let t0 = Instant::now();
        let single = extent.pieces.first().map(|p| p.file);
        let in_one_file = single.is_some_and(|f| extent.pieces.iter().all(|p| p.file == f));
        let (bytes, piece_at): (SharedBytes, Vec<usize>) = match single {
            Some(f) if in_one_file => {
                let Some(Some(m)) = self.files.get(f as usize) else {
                    return Err(self.read_error(key, f, "the file is empty or unknown"));
                };
                let len = m.0.len() as u64;
                let mut at = Vec::with_capacity(extent.pieces.len());
                for p in &extent.pieces {
                    if p.offset.checked_add(p.len).is_none_or(|end| end > len) {
                        return Err(self.read_error(key, f, "a piece lies past the end of the file"));
                    }
                    at.push(p.offset as usize);
                }
                (m.clone(), at)
            }
            _ => self.copy_pieces(key)?,
        };
        let v = self
            .decoder
            .decode(key, bytes, &piece_at)
            .map_err(|reason| SourceError::Decode { key, reason })?;
        self.decode_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.bytes_touched.fetch_add(extent.bytes(), Ordering::Relaxed);
        Ok(v)
    }

    /// The pieces of `key` copied into one owned buffer, back to back.
    fn copy_pieces(&self, key: ExpertKey) -> Result<(SharedBytes, Vec<usize>), SourceError> {
        let extent = self.map.extent(key)?;
        let mut buf = AlignedBuf::zeroed(extent.bytes() as usize);
        let mut at = Vec::with_capacity(extent.pieces.len());
        let mut pos = 0usize;
        for p in &extent.pieces {
            let Some(Some(m)) = self.files.get(p.file as usize) else {
                return Err(self.read_error(key, p.file, "the file is empty or unknown"));
            };
            let src = usize::try_from(p.offset)
                .ok()
                .zip(usize::try_from(p.len).ok())
                .and_then(|(o, l)| m.0.get(o..o.checked_add(l)?));
            let Some(src) = src else {
                return Err(self.read_error(key, p.file, "a piece lies past the end of the file"));
            };
            buf.as_mut_slice()[pos..pos + src.len()].copy_from_slice(src);
            at.push(pos);
            pos += src.len();
        }
        Ok((Arc::new(buf), at))
    }

    fn read_error(&self, key: ExpertKey, file: u32, why: &str) -> SourceError {
        SourceError::Read {
            key,
            path: self
                .map
                .files
                .get(file as usize)
                .cloned()
                .unwrap_or_else(PathBuf::new),
            source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, why.to_string()),
        }
    }

    fn slot(&self, key: ExpertKey) -> Result<&OnceLock<Arc<T>>, SourceError> {
        let i = key.layer as usize * self.map.experts_per_layer + key.expert as usize;
        let valid =
            (key.layer as usize) < self.map.layers && (key.expert as usize) < self.map.experts_per_layer;
        self.slots
            .get(i)
            .filter(|_| valid)
            .ok_or(SourceError::UnknownExpert { key })
    }

    /// The expert for `key`, decoding it on first use.
    fn get(&self, key: ExpertKey) -> Result<Arc<T>, SourceError> {
        let slot = self.slot(key)?;
        if let Some(v) = slot.get() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(v.clone());
        }
        let v = Arc::new(self.load(key)?);
        let v = match slot.set(v.clone()) {
            Ok(()) => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                self.resident
                    .fetch_add(self.decoder.resident_bytes(&v) as u64, Ordering::Relaxed);
                v
            }
            // Another thread decoded it meanwhile: use theirs.
            Err(_) => slot.get().cloned().unwrap_or(v),
        };
        Ok(v)
    }

    /// Total payload bytes of every expert: what this placement keeps
    /// mapped once the run has touched them all.
    pub fn expert_bytes(map: &ExpertMap) -> u64 {
        map.extents.iter().map(|e| e.bytes()).sum()
    }

    /// A profile in the pipeline's terms (hits, misses, bytes), so
    /// `--profile` and `coli bench` report either placement the same way.
    pub fn profile(&self) -> PipelineProfile {
        let hits = self.hits.load(Ordering::Relaxed);
        let misses = self.misses.load(Ordering::Relaxed);
        PipelineProfile {
            hits,
            misses,
            bytes_read: self.bytes_touched.load(Ordering::Relaxed),
            // Every first use is a demand read of the mapping.
            demand_bytes: self.bytes_touched.load(Ordering::Relaxed),
            reads: misses,
            read_ns: self.decode_ns.load(Ordering::Relaxed),
            wait_ns: self.decode_ns.load(Ordering::Relaxed),
            fetch_ns: self.fetch_ns.load(Ordering::Relaxed),
            sink_ns: self.sink_ns.load(Ordering::Relaxed),
            fetches: self.fetches.load(Ordering::Relaxed),
            demand_loads: misses,
            cache_bytes: self.resident.load(Ordering::Relaxed),
            cache_entries: misses,
            elapsed_ns: self.started.elapsed().as_nanos() as u64,
            cache_budget: self.budget,
            storage: "mapped",
            placement: "mapped",
            readahead_ns: self.readahead_ns.load(Ordering::Relaxed),
            ..PipelineProfile::default()
        }
    }
}

impl<T: Send + Sync + 'static> ExpertSource<T> for MappedSource<T> {
    fn fetch_batch(
        &self,
        _tag: Tag,
        keys: &[ExpertKey],
        sink: &mut ExpertBatchSink<'_, T>,
    ) -> Result<(), SourceError> {
        if keys.is_empty() {
            return Ok(());
        }
        let t0 = Instant::now();
        let group = keys
            .iter()
            .enumerate()
            .map(|(i, &k)| Ok((i, self.get(k)?)))
            .collect::<Result<Vec<_>, SourceError>>()?;
        let t1 = Instant::now();
        let r = sink(&group);
        let add =
            |c: &AtomicU64, since: Instant| c.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
        add(&self.sink_ns, t1);
        add(&self.fetch_ns, t0);
        self.fetches.fetch_add(1, Ordering::Relaxed);
        r
    }

    fn stats(&self) -> SourceStats {
        self.profile().source_stats()
    }

    fn profile(&self) -> Option<PipelineProfile> {
        Some(MappedSource::profile(self))
    }
}

impl<T> Drop for MappedSource<T> {
    fn drop(&mut self) {
        self.stop_readahead.store(true, Ordering::Relaxed);
        if let Some(h) = self.readahead.take() {
            let _ = h.join();
        }
    }
}
