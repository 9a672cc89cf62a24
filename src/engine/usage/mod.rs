//! Usage history: which experts each layer routes to, kept across runs, and
//! the pins it drives.
//!
//! Counting: [`CountingSource`] wraps the model's expert source and adds one
//! relaxed atomic per fetched key to a `(layer, expert)` counter
//! ([`UsageTap`]); nothing else happens on the decode path, except that every
//! [`REPIN_EVERY`] token steps the pins are re-evaluated (a scan of the
//! counters, at most [`REPIN_MAX_CHANGES`] swaps per layer).
//!
//! The history file ([`HISTORY_FILE`] in the state directory) holds one
//! decayed count per `(layer, expert)`. Decay is per run: a run starts from
//! the stored counts times [`DECAY_PER_RUN`] and adds what it fetched; the
//! [`UsageRecorder`] writes that sum from a background thread every
//! [`FLUSH_EVERY`] while counts change and once more when it stops, each time
//! crash-safely (temp file, fsync, rename). A run that fetched nothing writes
//! nothing. Two processes using one state directory at once do not merge:
//! the last writer wins.
//!
//! Pins: at start-up the hottest experts of each layer by the history are
//! pinned, at most [`pin_room`] per layer (`--pin-share`, by default three quarters,
//! of `--cache-cap` and of the byte budget), and the rest of the cache stays LRU. Pins change
//! which experts stay resident, never the tokens.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use colibri_actors::{
    ExpertBatchSink, ExpertKey, ExpertMap, ExpertSink, ExpertSource, PipelineProfile, SourceError,
    SourceStats, Tag,
};

use super::Placement;
use super::state::Fnv;

/// The history's file name inside the state directory.
pub const HISTORY_FILE: &str = "usage.hist";
/// Each run keeps this share of the counts before it.
pub const DECAY_PER_RUN: f32 = 0.9;
/// How often the recorder writes the history while counts change.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);
/// Token steps between two re-evaluations of the pins.
pub const REPIN_EVERY: u64 = 32;
/// Share of the cache per layer pins take unless `--pin-share` says otherwise.
pub const DEFAULT_PIN_SHARE: f64 = 0.75;
/// Pins swapped per layer at most per re-evaluation.
pub const REPIN_MAX_CHANGES: usize = 1;

const MAGIC: &[u8; 8] = b"COLIUSE1";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 40;
/// Largest `layers * experts` a history may hold (a guard against a header
/// that would make the reader allocate without bound).
const MAX_CELLS: usize = 1 << 24;

/// Why a history could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a usable usage history: {why}")]
    Invalid { path: PathBuf, why: String },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> UsageError + 'a {
    move |source| UsageError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

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

/// `--pin`: where start-up pins come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PinMode {
    Off,
    /// From the model's usage history, when there is one.
    #[default]
    Auto,
    /// From this usage-history file (of the same model).
    File(PathBuf),
}

impl std::str::FromStr for PinMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Self::Off),
            "auto" => Ok(Self::Auto),
            "" => Err("expected off, auto or a usage-history file".into()),
            f => Ok(Self::File(PathBuf::from(f))),
        }
    }
}

/// Experts per layer that may be pinned: `share` (in (0, 1]) of what the
/// cache holds per layer (`--cache-cap`, and the byte budget divided by the
/// largest expert), rounded down; none for the mapped placement (everything
/// is resident there).
pub fn pin_room(
    placement: Placement,
    cache_cap: Option<usize>,
    budget: Option<u64>,
    map: &ExpertMap,
    share: f64,
) -> usize {
    if placement == Placement::Mapped || map.layers == 0 || share.is_nan() || share <= 0.0 {
        return 0;
    }
    let share = share.min(1.0);
    let part = |n: f64| (n * share).floor() as usize;
    let mut room = part(map.experts_per_layer as f64);
    if let Some(c) = cache_cap {
        room = room.min(part(c as f64));
    }
    if let Some(b) = budget {
        let per_layer = b as f64 / map.max_expert_bytes().max(1) as f64 / map.layers as f64;
        room = room.min(part(per_layer));
    }
    room
}

/// The counters one engine's fetches feed, and the pins they drive.
pub struct UsageTap {
    layers: usize,
    experts: usize,
    counts: Vec<AtomicU64>,
    steps: AtomicU64,
    pin_room: usize,
    pinner: Mutex<Option<Pinner>>,
}

impl UsageTap {
    pub fn new(layers: usize, experts: usize, pin_room: usize) -> Self {
        Self {
            layers,
            experts,
            counts: (0..layers * experts).map(|_| AtomicU64::new(0)).collect(),
            steps: AtomicU64::new(0),
            pin_room,
            pinner: Mutex::new(None),
        }
    }

    pub fn layers(&self) -> usize {
        self.layers
    }

    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Experts per layer the pins may take ([`pin_room`]).
    pub fn pin_room(&self) -> usize {
        self.pin_room
    }

    #[inline]
    fn record(&self, key: ExpertKey) {
        let (l, e) = (key.layer as usize, key.expert as usize);
        if l < self.layers
            && e < self.experts
            && let Some(c) = self.counts.get(l * self.experts + e)
        {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// This run's fetch counts so far (layer-major).
    pub fn snapshot(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    /// The experts pinned now, per layer (empty without pins).
    pub fn pinned(&self) -> Vec<Vec<u32>> {
        match self.pinner.lock() {
            Ok(g) => g.as_ref().map(|p| p.pinned.clone()).unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// Starts pinning from `base` (decayed history counts): pins the
    /// hottest experts of each layer through `source` and keeps them
    /// following the counts from then on. Returns how many were pinned.
    pub fn start_pins<T>(&self, base: &UsageHistory, source: &dyn ExpertSource<T>) -> usize {
        if self.pin_room == 0 || (base.layers, base.experts) != (self.layers, self.experts) {
            return 0;
        }
        let mut pinner = Pinner::new(base.counts.clone(), self.layers, self.experts, self.pin_room);
        let keys = pinner.initial();
        source.pin(&keys);
        if let Ok(mut g) = self.pinner.lock() {
            *g = Some(pinner);
        }
        keys.len()
    }

    /// One token step: every [`REPIN_EVERY`] steps the pins follow the counts.
    fn on_step<T>(&self, source: &dyn ExpertSource<T>) {
        let n = self.steps.fetch_add(1, Ordering::Relaxed) + 1;
        if !n.is_multiple_of(REPIN_EVERY) {
            return;
        }
        let Ok(mut g) = self.pinner.try_lock() else { return };
        let Some(p) = g.as_mut() else { return };
        let (pin, unpin) = p.reevaluate(&self.snapshot());
        if !unpin.is_empty() {
            source.unpin(&unpin);
        }
        if !pin.is_empty() {
            source.pin(&pin);
        }
    }
}

/// The pin policy: per layer the `room` experts with the highest score
/// (history + this run's counts), swapped with hysteresis and at most
/// [`REPIN_MAX_CHANGES`] per layer per re-evaluation.
#[derive(Clone, Debug)]
pub struct Pinner {
    base: Vec<f32>,
    layers: usize,
    experts: usize,
    room: usize,
    /// Per layer, the pinned experts.
    pub pinned: Vec<Vec<u32>>,
}

impl Pinner {
    pub fn new(base: Vec<f32>, layers: usize, experts: usize, room: usize) -> Self {
        Self {
            base,
            layers,
            experts,
            room: room.min(experts),
            pinned: vec![Vec::new(); layers],
        }
    }

    /// A layer's experts by score, best first (ties: lower expert id), only
    /// those ever used.
    fn ranked(&self, layer: usize, live: &[u64]) -> Vec<(u32, f32)> {
        let mut v: Vec<(u32, f32)> = (0..self.experts)
            .map(|e| {
                let i = layer * self.experts + e;
                let s = self.base.get(i).copied().unwrap_or(0.0) + live.get(i).copied().unwrap_or(0) as f32;
                (e as u32, s)
            })
            .filter(|&(_, s)| s > 0.0)
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// The start-up pins: the top `room` of every layer by the history.
    pub fn initial(&mut self) -> Vec<ExpertKey> {
        let mut keys = Vec::new();
        for l in 0..self.layers {
            let top: Vec<u32> = self
                .ranked(l, &[])
                .into_iter()
                .take(self.room)
                .map(|(e, _)| e)
                .collect();
            keys.extend(top.iter().map(|&e| ExpertKey::new(l as u32, e)));
            self.pinned[l] = top;
        }
        keys
    }

    /// Moves the pins toward the current top experts; returns `(pin, unpin)`.
    /// An expert replaces the weakest pin only when it scores more than
    /// 1.25x it plus one fetch, so two near-equal experts do not flap.
    pub fn reevaluate(&mut self, live: &[u64]) -> (Vec<ExpertKey>, Vec<ExpertKey>) {
        let (mut pin, mut unpin) = (Vec::new(), Vec::new());
        for l in 0..self.layers {
            let ranked = self.ranked(l, live);
            let score = |e: u32| ranked.iter().find(|r| r.0 == e).map_or(0.0, |r| r.1);
            let mut changes = 0;
            for &(cand, s) in &ranked {
                if changes >= REPIN_MAX_CHANGES {
                    break;
                }
                if self.pinned[l].contains(&cand) {
                    continue;
                }
                let key = |e: u32| ExpertKey::new(l as u32, e);
                if self.pinned[l].len() < self.room {
                    self.pinned[l].push(cand);
                    pin.push(key(cand));
                    changes += 1;
                    continue;
                }
                let Some((wi, &weakest)) = self.pinned[l]
                    .iter()
                    .enumerate()
                    .min_by(|a, b| score(*a.1).total_cmp(&score(*b.1)).then(b.1.cmp(a.1)))
                else {
                    break;
                };
                if s > score(weakest) * 1.25 + 1.0 {
                    self.pinned[l][wi] = cand;
                    unpin.push(key(weakest));
                    pin.push(key(cand));
                    changes += 1;
                } else {
                    // Ranked best first: no later candidate beats it either.
                    break;
                }
            }
        }
        (pin, unpin)
    }
}

/// An [`ExpertSource`] that counts every fetched key into a [`UsageTap`]
/// and forwards everything to the source it wraps.
pub struct CountingSource<T> {
    inner: Arc<dyn ExpertSource<T>>,
    tap: Arc<UsageTap>,
}

impl<T> CountingSource<T> {
    pub fn new(inner: Arc<dyn ExpertSource<T>>, tap: Arc<UsageTap>) -> Self {
        Self { inner, tap }
    }
}

impl<T: Send + Sync> ExpertSource<T> for CountingSource<T> {
    fn fetch_batch(
        &self,
        tag: Tag,
        keys: &[ExpertKey],
        sink: &mut ExpertBatchSink<'_, T>,
    ) -> Result<(), SourceError> {
        for &k in keys {
            self.tap.record(k);
        }
        self.inner.fetch_batch(tag, keys, sink)
    }

    fn fetch(&self, tag: Tag, keys: &[ExpertKey], sink: &mut ExpertSink<'_, T>) -> Result<(), SourceError> {
        for &k in keys {
            self.tap.record(k);
        }
        self.inner.fetch(tag, keys, sink)
    }

    fn pilot(&self, tag: Tag, residual: &[f32]) {
        self.inner.pilot(tag, residual);
    }

    fn advance(&self, tag: Tag) {
        self.inner.advance(tag);
        self.tap.on_step(self.inner.as_ref());
    }

    fn pin(&self, keys: &[ExpertKey]) {
        self.inner.pin(keys);
    }

    fn unpin(&self, keys: &[ExpertKey]) {
        self.inner.unpin(keys);
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }

    fn profile(&self) -> Option<PipelineProfile> {
        self.inner.profile()
    }
}

/// What [`UsageRecorder::start`] found and did, for a start-up line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UsageStart {
    /// Runs in the history found (0: none, or ignored).
    pub history_runs: u64,
    /// Experts pinned at start-up.
    pub pinned: usize,
    /// Why a history file was ignored.
    pub ignored: Option<String>,
}

/// Keeps one engine's usage history on disk: loads it, starts the pins,
/// and writes the decayed history plus this run's counts from a
/// background thread (see the module docs). [`Self::finish`] writes the
/// final counts; dropping it does the same, reporting errors on stderr.
pub struct UsageRecorder {
    stop: Option<crossbeam_channel::Sender<()>>,
    thread: Option<JoinHandle<Result<(), UsageError>>>,
    path: PathBuf,
}

struct Flusher {
    base: UsageHistory,
    tap: Arc<UsageTap>,
    path: PathBuf,
    written: u64,
}

impl Flusher {
    fn flush(&mut self) -> Result<(), UsageError> {
        let live = self.tap.snapshot();
        let total: u64 = live.iter().sum();
        if total == self.written {
            return Ok(());
        }
        let mut h = self.base.clone();
        h.add_counts(&live);
        h.save(&self.path)?;
        self.written = total;
        Ok(())
    }
}

impl UsageRecorder {
    /// `record_dir`: the state directory to keep the history in (`None`:
    /// record nothing). `pins`: where start-up pins come from; `--pin FILE`
    /// must be a valid history of this model, a history in `record_dir`
    /// that is not is ignored with the reason in [`UsageStart::ignored`].
    pub fn start<T>(
        tap: &Arc<UsageTap>,
        source: &dyn ExpertSource<T>,
        fingerprint: u64,
        record_dir: Option<&Path>,
        pins: &PinMode,
    ) -> Result<(Option<Self>, UsageStart), UsageError> {
        let (layers, experts) = (tap.layers(), tap.experts());
        let mut info = UsageStart::default();
        let mut history = None;
        if let Some(dir) = record_dir {
            match UsageHistory::load_for(&dir.join(HISTORY_FILE), fingerprint, layers, experts) {
                Ok(h) => history = h,
                Err(e @ UsageError::Invalid { .. }) => info.ignored = Some(e.to_string()),
                Err(e) => return Err(e),
            }
        }
        info.history_runs = history.as_ref().map_or(0, |h| h.runs);
        let base = history
            .as_ref()
            .map(|h| h.decayed(DECAY_PER_RUN))
            .unwrap_or_else(|| UsageHistory::new(fingerprint, layers, experts));
        let pin_from = match pins {
            PinMode::Off => None,
            PinMode::Auto => history.as_ref().map(|_| base.clone()),
            PinMode::File(p) => match UsageHistory::load_for(p, fingerprint, layers, experts)? {
                Some(h) => Some(h),
                None => {
                    return Err(UsageError::Io {
                        op: "reading --pin",
                        path: p.clone(),
                        source: std::io::ErrorKind::NotFound.into(),
                    });
                }
            },
        };
        if let Some(h) = &pin_from {
            info.pinned = tap.start_pins(h, source);
        }
        let Some(dir) = record_dir else {
            return Ok((None, info));
        };
        let mut flusher = Flusher {
            base: UsageHistory {
                runs: base.runs + 1,
                ..base
            },
            tap: tap.clone(),
            path: dir.join(HISTORY_FILE),
            written: 0,
        };
        let (stop, stop_rx) = crossbeam_channel::bounded::<()>(1);
        let path = flusher.path.clone();
        let thread = std::thread::Builder::new()
            .name("coli-usage".into())
            .spawn(move || {
                while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(FLUSH_EVERY)
                {
                    if let Err(e) = flusher.flush() {
                        // Best effort: a closed stderr must not end the thread.
                        let _ = writeln!(std::io::stderr(), "coli: usage history: {e}");
                    }
                }
                flusher.flush()
            })
            .map_err(io_err("starting the usage recorder for", dir))?;
        Ok((
            Some(Self {
                stop: Some(stop),
                thread: Some(thread),
                path,
            }),
            info,
        ))
    }

    /// The history file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops the background thread and writes the final counts.
    pub fn finish(mut self) -> Result<(), UsageError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), UsageError> {
        drop(self.stop.take());
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(UsageError::Invalid {
                path: self.path.clone(),
                why: "the usage recorder thread panicked".into(),
            }),
            None => Ok(()),
        }
    }
}

impl Drop for UsageRecorder {
    fn drop(&mut self) {
        if let Err(e) = self.stop_and_join() {
            let _ = writeln!(std::io::stderr(), "coli: usage history: {e}");
        }
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
        let p = tmp.path().join(HISTORY_FILE);
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

    #[test]
    fn pins_start_hot_and_follow_with_bounded_churn() {
        let h = hist();
        let mut p = Pinner::new(h.counts.clone(), 2, 4, 2);
        let keys = p.initial();
        assert_eq!(p.pinned, vec![vec![3, 0], vec![3, 1]]);
        assert_eq!(keys.len(), 4);
        // Nothing changed: no churn.
        assert_eq!(p.reevaluate(&[0; 8]), (vec![], vec![]));
        // Layer 0's expert 2 becomes hottest: it replaces the weakest pin
        // (0), one swap per evaluation even though layer 1 also shifted.
        let live = [0, 0, 40, 0, 0, 0, 30, 30];
        let (pin, unpin) = p.reevaluate(&live);
        assert_eq!(pin, vec![ExpertKey::new(0, 2), ExpertKey::new(1, 2)]);
        assert_eq!(unpin, vec![ExpertKey::new(0, 0), ExpertKey::new(1, 1)]);
        for l in &p.pinned {
            assert_eq!(l.len(), 2, "never more than the room");
        }
        // Near-equal scores do not flap.
        let live2 = [0, 0, 40, 0, 0, 0, 30, 30];
        assert_eq!(p.reevaluate(&live2), (vec![], vec![]));
    }

    #[test]
    fn pin_room_is_half_the_cache() {
        let mut map = ExpertMap::new(Vec::new(), 4, 8);
        for l in 0..4 {
            for e in 0..8 {
                let ext = colibri_actors::ExpertExtent {
                    pieces: vec![colibri_actors::Piece {
                        file: 0,
                        offset: 0,
                        len: 100,
                    }],
                };
                map.set_extent(ExpertKey::new(l, e), ext).unwrap();
            }
        }
        let room = |cap, budget, share| pin_room(Placement::Streamed, cap, budget, &map, share);
        assert_eq!(room(None, None, 0.5), 4);
        assert_eq!(room(Some(2), None, 0.5), 1);
        assert_eq!(room(Some(5), None, 0.5), 2);
        assert_eq!(room(Some(1), None, 0.5), 0);
        assert_eq!(room(Some(3), None, 0.75), 2);
        assert_eq!(room(Some(3), None, 1.0), 3);
        // 1600 bytes: half is 800, 200 per layer, two 100-byte experts.
        assert_eq!(room(None, Some(1600), 0.5), 2);
        assert_eq!(pin_room(Placement::Mapped, Some(6), None, &map, 1.0), 0);
    }

    /// A source that delivers the expert id and logs pin calls.
    #[derive(Default)]
    struct Logged {
        calls: Mutex<Vec<(bool, Vec<ExpertKey>)>>,
    }

    impl ExpertSource<u32> for Logged {
        fn fetch_batch(
            &self,
            _tag: Tag,
            keys: &[ExpertKey],
            sink: &mut ExpertBatchSink<'_, u32>,
        ) -> Result<(), SourceError> {
            let group: Vec<(usize, Arc<u32>)> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| (i, Arc::new(k.expert)))
                .collect();
            if group.is_empty() { Ok(()) } else { sink(&group) }
        }
        fn pin(&self, keys: &[ExpertKey]) {
            self.calls.lock().unwrap().push((true, keys.to_vec()));
        }
        fn unpin(&self, keys: &[ExpertKey]) {
            self.calls.lock().unwrap().push((false, keys.to_vec()));
        }
        fn stats(&self) -> SourceStats {
            SourceStats::default()
        }
    }

    #[test]
    fn counting_source_counts_fetches_and_repins_every_k_steps() {
        let inner = Arc::new(Logged::default());
        let tap = Arc::new(UsageTap::new(2, 4, 1));
        let src = CountingSource::new(inner.clone() as Arc<dyn ExpertSource<u32>>, tap.clone());
        assert_eq!(tap.start_pins(&hist(), &src), 2);
        assert_eq!(tap.pinned(), vec![vec![3], vec![3]]);
        let key = ExpertKey::new(0, 1);
        for _ in 0..50 {
            let mut got = Vec::new();
            src.fetch_batch(Tag::new(0, 0, 0), &[key, ExpertKey::new(1, 3)], &mut |g| {
                got.extend(g.iter().map(|(i, e)| (*i, **e)));
                Ok(())
            })
            .unwrap();
            assert_eq!(got, vec![(0, 1), (1, 3)], "delivered unchanged");
        }
        let snap = tap.snapshot();
        assert_eq!((snap[1], snap[4 + 3], snap.iter().sum::<u64>()), (50, 50, 100));
        for step in 1..REPIN_EVERY {
            src.advance(Tag::new(0, step, 0));
        }
        assert_eq!(
            inner.calls.lock().unwrap().len(),
            1,
            "only the start-up pins so far"
        );
        src.advance(Tag::new(0, REPIN_EVERY, 0));
        let calls = inner.calls.lock().unwrap().clone();
        assert_eq!(
            calls[1..],
            [
                (false, vec![ExpertKey::new(0, 3)]),
                (true, vec![ExpertKey::new(0, 1)])
            ]
        );
        assert_eq!(tap.pinned(), vec![vec![1], vec![3]]);
    }

    #[test]
    fn recorder_merges_runs_and_ignores_a_torn_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let path = dir.join(HISTORY_FILE);
        let run = |fetches: &[(u32, u32)], pins: &PinMode| {
            let tap = Arc::new(UsageTap::new(2, 4, 1));
            let src = CountingSource::new(
                Arc::new(Logged::default()) as Arc<dyn ExpertSource<u32>>,
                tap.clone(),
            );
            let (rec, start) = UsageRecorder::start(&tap, &src, 0xfeed, Some(dir), pins).unwrap();
            for &(l, e) in fetches {
                src.fetch_batch(Tag::new(0, 0, 0), &[ExpertKey::new(l, e)], &mut |_| Ok(()))
                    .unwrap();
            }
            rec.unwrap().finish().unwrap();
            start
        };
        let first = run(&[(0, 1), (0, 1), (1, 2)], &PinMode::Auto);
        assert_eq!((first.history_runs, first.pinned, first.ignored), (0, 0, None));
        let second = run(&[(0, 1), (1, 0)], &PinMode::Auto);
        assert_eq!((second.history_runs, second.pinned), (1, 2));
        let h = UsageHistory::load(&path).unwrap().unwrap();
        assert_eq!(h.runs, 2);
        let d = DECAY_PER_RUN;
        assert_eq!(h.counts, vec![0.0, 2.0 * d + 1.0, 0.0, 0.0, 1.0, 0.0, d, 0.0]);
        // A run that fetched nothing leaves the file as it was.
        run(&[], &PinMode::Off);
        assert_eq!(UsageHistory::load(&path).unwrap().unwrap(), h);
        // A torn file: ignored with a reason, then replaced by a good one.
        let bytes = h.encode();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let torn = run(&[(0, 0)], &PinMode::Auto);
        assert!(torn.ignored.unwrap().contains("torn"));
        let fresh = UsageHistory::load(&path).unwrap().unwrap();
        assert_eq!((fresh.runs, fresh.total()), (1, 1.0));
        // `--pin FILE` must be a history of this model.
        let tap = Arc::new(UsageTap::new(2, 4, 1));
        let src = Logged::default();
        std::fs::write(dir.join("bad"), b"nope").unwrap();
        assert!(UsageRecorder::start(&tap, &src, 0xfeed, None, &PinMode::File(dir.join("bad"))).is_err());
        assert!(UsageRecorder::start(&tap, &src, 0xbeef, None, &PinMode::File(path.clone())).is_err());
        let (rec, start) = UsageRecorder::start(&tap, &src, 0xfeed, None, &PinMode::File(path)).unwrap();
        assert!(rec.is_none(), "nothing recorded without a directory");
        assert_eq!(start.pinned, 1, "layer 0's one used expert");
    }

    #[test]
    fn pin_mode_parses() {
        assert_eq!("off".parse::<PinMode>(), Ok(PinMode::Off));
        assert_eq!("auto".parse::<PinMode>(), Ok(PinMode::Auto));
        assert_eq!("h.bin".parse::<PinMode>(), Ok(PinMode::File("h.bin".into())));
        assert!("".parse::<PinMode>().is_err());
    }
}
