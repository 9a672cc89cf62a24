//! Usage history: which experts each layer routes to, kept across runs, and
//! the pins it drives.
//!
//! Counting: [`CountingSource`] wraps the model's expert source; per
//! fetched key it adds one relaxed atomic to a `(layer, expert)` counter
//! and appends the key to the routing trace ([`UsageTap`]); every
//! [`REPIN_EVERY`] token steps the pins are re-evaluated (a scan of the
//! counters, at most one swap per layer).
//!
//! The state directory keeps two files:
//! - [`HISTORY_FILE`]: one decayed count per `(layer, expert)` ([`history`]).
//!   A run starts from the stored counts times [`DECAY_PER_RUN`] and adds
//!   what it fetched;
//! - [`TRACE_FILE`]: the newest [`HISTORY_TRACE_ACCESSES`] fetches in order
//!   (`crate::routing::file`), the earlier runs' followed by this one's.
//!
//! The [`UsageRecorder`] writes the counts from a background thread every
//! [`FLUSH_EVERY`] while they change, the trace every
//! [`TRACE_FLUSH_EVERY`], and both once more when it stops, each
//! crash-safely (temporary file, fsync, rename). A run that fetched nothing
//! writes nothing. Two processes using one state directory at once do not
//! merge: the last writer wins.
//!
//! Pins: at start-up the history's hottest experts of each layer are tried
//! by replaying the recorded trace at this run's cache capacity, and pinned
//! only where the replay says they beat LRU ([`crate::routing::pins`]);
//! without a trace nothing is pinned. Pins change which experts stay
//! resident, never the tokens.

mod history;
mod tap;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use colibri_actors::ExpertSource;

pub use crate::routing::repin::{REPIN_EVERY, REPIN_MAX_CHANGES};
use crate::routing::{PinChoice, RoutingTrace, file as trace_file};
pub use history::UsageHistory;
pub use tap::{CountingSource, TRACE_MAX_ACCESSES, UsageTap, cache_capacity, layer_expert_bytes};

/// The history's file name inside the state directory.
pub const HISTORY_FILE: &str = "usage.hist";
/// The routing trace's file name inside the state directory.
pub const TRACE_FILE: &str = "routing.trace";
/// Fetches the state directory's trace keeps (the newest).
pub const HISTORY_TRACE_ACCESSES: usize = 1 << 20;
/// Each run keeps this share of the counts before it.
pub const DECAY_PER_RUN: f32 = 0.9;
/// How often the recorder writes the history while counts change.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);
/// How often the recorder writes the trace while it grows (it is larger).
pub const TRACE_FLUSH_EVERY: Duration = Duration::from_secs(60);
/// The most of a layer's cache pins may take unless `--pin-share` says
/// otherwise; the replay decides how much of it they do take.
pub const DEFAULT_PIN_SHARE: f64 = 1.0;

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
    #[error(transparent)]
    Trace(#[from] trace_file::TraceFileError),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> UsageError + 'a {
    move |source| UsageError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// `--pin`: where start-up pins come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PinMode {
    Off,
    /// From the model's usage history, when there is one.
    #[default]
    Auto,
    /// From this usage-history file (of the same model), tested on the
    /// routing trace beside it.
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

/// What [`UsageRecorder::start`] found and did, for a start-up line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UsageStart {
    /// Runs in the history found (0: none, or ignored).
    pub history_runs: u64,
    /// Experts pinned at start-up.
    pub pinned: usize,
    /// Why a history or trace file was ignored.
    pub ignored: Option<String>,
    /// The pin choice and the replay behind it (`None`: pins off, or no
    /// history).
    pub choice: Option<PinChoice>,
}

impl UsageStart {
    /// The pins in words: how many, or why none, and what the replay said.
    pub fn pins_line(&self) -> String {
        match &self.choice {
            None => "none".into(),
            Some(c) => match &c.why_none {
                Some(why) => format!("none ({why})"),
                None => format!(
                    "{} (replaying the recorded routing: {} loads with them, {} with LRU alone)",
                    self.pinned, c.pinned.loads, c.lru.loads
                ),
            },
        }
    }
}

/// Keeps one engine's usage history on disk: loads it, starts the pins,
/// and writes the decayed history plus this run's counts and trace from a
/// background thread (see the module docs). [`Self::finish`] writes the
/// final state; dropping it does the same, reporting errors on stderr.
pub struct UsageRecorder {
    stop: Option<crossbeam_channel::Sender<()>>,
    thread: Option<JoinHandle<Result<(), UsageError>>>,
    path: PathBuf,
}

struct Flusher {
    base: UsageHistory,
    /// The trace of the runs before this one.
    earlier: RoutingTrace,
    tap: Arc<UsageTap>,
    path: PathBuf,
    trace_path: PathBuf,
    written: u64,
    trace_written: u64,
    trace_at: Instant,
}

impl Flusher {
    fn flush(&mut self, last: bool) -> Result<(), UsageError> {
        let live = self.tap.snapshot();
        let total: u64 = live.iter().sum();
        if total != self.written {
            let mut h = self.base.clone();
            h.add_counts(&live);
            h.save(&self.path)?;
            self.written = total;
        }
        let due = last || self.trace_at.elapsed() >= TRACE_FLUSH_EVERY;
        if due && total != self.trace_written {
            let mut t = self.earlier.clone();
            t.extend(&self.tap.trace().snapshot());
            trace_file::save(&self.trace_path, &t.tail_within(HISTORY_TRACE_ACCESSES), None)?;
            self.trace_written = total;
            self.trace_at = Instant::now();
        }
        Ok(())
    }
}

/// The trace beside a history file, if it is one of this model's shape;
/// the reason when one is there but unusable.
fn load_trace(dir: &Path, tap: &UsageTap) -> (Option<RoutingTrace>, Option<String>) {
    match trace_file::load(&dir.join(TRACE_FILE)) {
        Ok(None) => (None, None),
        Ok(Some(f)) if (f.trace.layers, f.trace.experts) == (tap.layers(), tap.experts()) => {
            (Some(f.trace), None)
        }
        Ok(Some(f)) => (
            None,
            Some(format!(
                "{} is for {} layers x {} experts, the model has {} x {}",
                dir.join(TRACE_FILE).display(),
                f.trace.layers,
                f.trace.experts,
                tap.layers(),
                tap.experts()
            )),
        ),
        Err(e) => (None, Some(e.to_string())),
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
        let shape = tap.trace().empty();
        let mut info = UsageStart::default();
        let mut history = None;
        let mut earlier = None;
        if let Some(dir) = record_dir {
            match UsageHistory::load_for(&dir.join(HISTORY_FILE), fingerprint, layers, experts) {
                Ok(h) => history = h,
                Err(e @ UsageError::Invalid { .. }) => info.ignored = Some(e.to_string()),
                Err(e) => return Err(e),
            }
            if history.is_some() {
                let (t, why) = load_trace(dir, tap);
                earlier = t;
                if why.is_some() {
                    info.ignored = why;
                }
            }
        }
        info.history_runs = history.as_ref().map_or(0, |h| h.runs);
        let base = history
            .as_ref()
            .map(|h| h.decayed(DECAY_PER_RUN))
            .unwrap_or_else(|| UsageHistory::new(fingerprint, layers, experts));
        let pin_from = match pins {
            PinMode::Off => None,
            PinMode::Auto => history.as_ref().map(|_| (base.clone(), earlier.clone())),
            PinMode::File(p) => match UsageHistory::load_for(p, fingerprint, layers, experts)? {
                Some(h) => {
                    let dir = p.parent().unwrap_or(Path::new("."));
                    let (t, why) = load_trace(dir, tap);
                    if why.is_some() {
                        info.ignored = why;
                    }
                    Some((h, t))
                }
                None => {
                    return Err(UsageError::Io {
                        op: "reading --pin",
                        path: p.clone(),
                        source: std::io::ErrorKind::NotFound.into(),
                    });
                }
            },
        };
        if let Some((h, trace)) = &pin_from {
            let trace = trace.clone().unwrap_or_else(|| shape.clone());
            let choice = tap.start_pins(h, &trace, source);
            info.pinned = choice.count();
            info.choice = Some(choice);
        }
        let Some(dir) = record_dir else {
            return Ok((None, info));
        };
        let mut flusher = Flusher {
            base: UsageHistory {
                runs: base.runs + 1,
                ..base
            },
            earlier: earlier.unwrap_or(shape),
            tap: tap.clone(),
            path: dir.join(HISTORY_FILE),
            trace_path: dir.join(TRACE_FILE),
            written: 0,
            trace_written: 0,
            trace_at: Instant::now(),
        };
        let (stop, stop_rx) = crossbeam_channel::bounded::<()>(1);
        let path = flusher.path.clone();
        let thread = std::thread::Builder::new()
            .name("coli-usage".into())
            .spawn(move || {
                while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(FLUSH_EVERY)
                {
                    if let Err(e) = flusher.flush(false) {
                        // Best effort: a closed stderr must not end the thread.
                        let _ = writeln!(std::io::stderr(), "coli: usage history: {e}");
                    }
                }
                flusher.flush(true)
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
    use super::tap::tests::{Logged, tap};
    use super::*;
    use colibri_actors::{ExpertKey, Tag};

    /// One run: each step fetches `e` on both layers, then advances.
    fn run(dir: &Path, steps: &[u32], pins: &PinMode) -> UsageStart {
        let tap = Arc::new(tap(3));
        let src = CountingSource::new(
            Arc::new(Logged::default()) as Arc<dyn ExpertSource<u32>>,
            tap.clone(),
        );
        let (rec, start) = UsageRecorder::start(&tap, &src, 0xfeed, Some(dir), pins).unwrap();
        for (i, &e) in steps.iter().enumerate() {
            let keys = [ExpertKey::new(0, e), ExpertKey::new(1, e)];
            src.fetch_batch(Tag::new(0, i as u64, 0), &keys, &mut |_| Ok(()))
                .unwrap();
            src.advance(Tag::new(0, i as u64 + 1, 0));
        }
        rec.unwrap().finish().unwrap();
        start
    }

    #[test]
    fn recorder_merges_runs_keeps_the_trace_and_ignores_torn_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let path = dir.join(HISTORY_FILE);
        // Expert 3 hot beside a scan LRU at cap 3 cannot hold.
        let hot: Vec<u32> = (0..200).map(|s| [3, 3, 0, 1, 2][s % 5]).collect();
        let first = run(dir, &hot, &PinMode::Auto);
        assert_eq!((first.history_runs, first.pinned, first.ignored), (0, 0, None));
        assert_eq!(first.choice, None, "no history: no pins tried");
        let trace = trace_file::load(&dir.join(TRACE_FILE)).unwrap().unwrap().trace;
        assert_eq!(trace.steps(), 200);
        let second = run(dir, &hot, &PinMode::Auto);
        assert_eq!(
            (second.history_runs, second.pinned),
            (1, 4),
            "{:?}",
            second.choice
        );
        assert!(second.pins_line().contains("replaying"), "{}", second.pins_line());
        let h = UsageHistory::load(&path).unwrap().unwrap();
        assert_eq!(h.runs, 2);
        let d = DECAY_PER_RUN;
        assert_eq!(h.counts[3], 80.0 * d + 80.0);
        assert_eq!(
            trace_file::load(&dir.join(TRACE_FILE))
                .unwrap()
                .unwrap()
                .trace
                .steps(),
            400,
            "the earlier run's steps, then this one's"
        );
        // A run that fetched nothing leaves both files as they were.
        let before = std::fs::read(dir.join(TRACE_FILE)).unwrap();
        run(dir, &[], &PinMode::Off);
        assert_eq!(UsageHistory::load(&path).unwrap().unwrap(), h);
        assert_eq!(std::fs::read(dir.join(TRACE_FILE)).unwrap(), before);
        // A uniform history: the replay finds no gain, so no pins.
        let other = tempfile::tempdir().unwrap();
        let flat: Vec<u32> = (0..40).map(|s| (s % 4) as u32).collect();
        run(other.path(), &[0, 1, 2, 3], &PinMode::Auto);
        let flat_start = run(other.path(), &flat, &PinMode::Auto);
        assert_eq!(flat_start.pinned, 0);
        assert!(
            flat_start.pins_line().starts_with("none ("),
            "{}",
            flat_start.pins_line()
        );
        // A torn trace is ignored with its reason; the history still counts.
        std::fs::write(dir.join(TRACE_FILE), b"coli-routing-trace 1\nlayers x\n").unwrap();
        let torn_trace = run(dir, &hot, &PinMode::Auto);
        assert!(torn_trace.ignored.unwrap_or_default().contains("line 2"));
        assert_eq!(torn_trace.pinned, 0, "nothing to replay");
        // A torn history: ignored with a reason, then replaced by a good one.
        let bytes = h.encode();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let torn = run(dir, &[0], &PinMode::Auto);
        assert!(torn.ignored.unwrap().contains("torn"));
        let fresh = UsageHistory::load(&path).unwrap().unwrap();
        assert_eq!((fresh.runs, fresh.total()), (1, 2.0));
    }

    #[test]
    fn pin_file_must_be_this_models_history() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let hot: Vec<u32> = (0..200).map(|s| [3, 3, 0, 1, 2][s % 5]).collect();
        run(dir, &hot, &PinMode::Off);
        let path = dir.join(HISTORY_FILE);
        let tap = Arc::new(tap(3));
        let src = Logged::default();
        std::fs::write(dir.join("bad"), b"nope").unwrap();
        assert!(UsageRecorder::start(&tap, &src, 0xfeed, None, &PinMode::File(dir.join("bad"))).is_err());
        assert!(UsageRecorder::start(&tap, &src, 0xbeef, None, &PinMode::File(path.clone())).is_err());
        let (rec, start) = UsageRecorder::start(&tap, &src, 0xfeed, None, &PinMode::File(path)).unwrap();
        assert!(rec.is_none(), "nothing recorded without a directory");
        assert_eq!(
            start.pinned, 4,
            "experts 3 and 0 of each layer, tested on the trace beside the file"
        );
    }

    #[test]
    fn pin_mode_parses() {
        assert_eq!("off".parse::<PinMode>(), Ok(PinMode::Off));
        assert_eq!("auto".parse::<PinMode>(), Ok(PinMode::Auto));
        assert_eq!("h.bin".parse::<PinMode>(), Ok(PinMode::File("h.bin".into())));
        assert!("".parse::<PinMode>().is_err());
    }
}
