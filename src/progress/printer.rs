//! The command line's progress printer: what `coli convert`, `coli synth`
//! and every command that loads a model show on stderr while the long part
//! of their work runs.
//!
//! On a terminal it is a live bar, cleared when the job ends. Anywhere else
//! (a log file, a pipe, a front end reading stderr) it is plain lines, a
//! bounded number per job: one at the start, one each time another tenth of
//! the work is done, one at the end, so a log holds a handful of lines
//! instead of a redrawn bar's thousands of escape sequences. Jobs smaller
//! than the printer's threshold print nothing: a model load of a few
//! hundred MB is over before a line would help.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::Progress;

/// Loads of fewer dense bytes than this show no progress: below it a load
/// takes seconds at most.
pub const LOAD_MIN_BYTES: u64 = 2 << 30;

/// A job's plain-line mode prints one line per this share of the work.
const STEPS: u64 = 10;

/// The most plain lines one job prints: the start, one per step passed
/// short of the end, the end.
pub const MAX_LINES_PER_JOB: usize = STEPS as usize + 1;

/// Shows jobs of at least `min_bytes` on stderr (or another writer).
pub struct ProgressPrinter {
    min_bytes: u64,
    state: Mutex<State>,
}

enum Sink {
    /// A live bar on stderr.
    Terminal,
    /// Plain lines.
    Lines(Box<dyn Write + Send>),
}

struct State {
    sink: Sink,
    /// The job being shown (none: no job started, it was too small, or it
    /// finished).
    shown: Option<Shown>,
}

struct Shown {
    phase: String,
    total: u64,
    /// Steps of [`STEPS`] already printed.
    step: u64,
    started: Instant,
    bar: Option<ProgressBar>,
}

impl ProgressPrinter {
    /// A bar when stderr is a terminal, plain lines on stderr otherwise.
    pub fn stderr(min_bytes: u64) -> Self {
        let sink = if std::io::stderr().is_terminal() {
            Sink::Terminal
        } else {
            Sink::Lines(Box::new(std::io::stderr()))
        };
        Self::with_sink(sink, min_bytes)
    }

    /// Plain lines on `out`, whatever it is.
    pub fn lines(out: Box<dyn Write + Send>, min_bytes: u64) -> Self {
        Self::with_sink(Sink::Lines(out), min_bytes)
    }

    fn with_sink(sink: Sink, min_bytes: u64) -> Self {
        Self {
            min_bytes,
            state: Mutex::new(State { sink, shown: None }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while printing leaves nothing half-updated that matters.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// Progress is a courtesy: a stderr that cannot be written to must not
    /// fail the job it reports on, so write errors are dropped.
    fn line(&mut self, text: std::fmt::Arguments<'_>) {
        if let Sink::Lines(out) = &mut self.sink {
            let _ = writeln!(out, "coli: {text}");
            let _ = out.flush();
        }
    }

    fn clear_bar(&mut self) {
        if let Some(bar) = self.shown.as_mut().and_then(|s| s.bar.take()) {
            bar.finish_and_clear();
        }
    }
}

fn bar(phase: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let template = "{prefix} {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}";
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.set_prefix(phase.to_string());
    bar
}

impl Progress for ProgressPrinter {
    fn start(&self, phase: &str, total: u64) {
        let mut st = self.state();
        st.clear_bar();
        st.shown = None;
        if total < self.min_bytes {
            return;
        }
        let bar = match st.sink {
            Sink::Terminal => Some(bar(phase, total)),
            Sink::Lines(_) => {
                st.line(format_args!("{phase}: 0% of {}", HumanBytes(total)));
                None
            }
        };
        st.shown = Some(Shown {
            phase: phase.to_string(),
            total,
            step: 0,
            started: Instant::now(),
            bar,
        });
    }

    fn advance(&self, done: u64) {
        let mut st = self.state();
        let Some(shown) = st.shown.as_mut() else {
            return;
        };
        let done = done.min(shown.total);
        if let Some(bar) = &shown.bar {
            bar.set_position(done);
            return;
        }
        if shown.total == 0 {
            return;
        }
        let step = (done as u128 * STEPS as u128 / shown.total as u128) as u64;
        // The last step is the end's line, printed by `finish`.
        if step <= shown.step || step >= STEPS {
            return;
        }
        shown.step = step;
        let (phase, total) = (shown.phase.clone(), shown.total);
        st.line(format_args!(
            "{phase}: {}% ({} of {})",
            step * 100 / STEPS,
            HumanBytes(done),
            HumanBytes(total)
        ));
    }

    fn finish(&self) {
        let mut st = self.state();
        st.clear_bar();
        if let Some(shown) = st.shown.take() {
            st.line(format_args!(
                "{}: done, {} in {:.1}s",
                shown.phase,
                HumanBytes(shown.total),
                shown.started.elapsed().as_secs_f64()
            ));
        }
    }
}

impl Drop for ProgressPrinter {
    /// A job that failed leaves its bar; clear it so the error message that
    /// follows starts on a clean line.
    fn drop(&mut self) {
        self.state().clear_bar();
    }
}

/// What the commands that load a model hand
/// [`crate::engine::Engine::load_with_progress`]: the load's progress on
/// stderr when the dense weights are [`LOAD_MIN_BYTES`] or more.
pub fn load_progress() -> Option<Arc<dyn Progress>> {
    Some(Arc::new(ProgressPrinter::stderr(LOAD_MIN_BYTES)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose bytes the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect()
        }
    }

    fn printer(min_bytes: u64) -> (ProgressPrinter, Captured) {
        let out = Captured::default();
        (ProgressPrinter::lines(Box::new(out.clone()), min_bytes), out)
    }

    #[test]
    fn a_job_below_the_threshold_prints_nothing() {
        let (p, out) = printer(1000);
        p.start("loading", 999);
        for done in 0..=999 {
            p.advance(done);
        }
        p.finish();
        assert!(out.lines().is_empty(), "{:?}", out.lines());
    }

    #[test]
    fn a_job_at_the_threshold_prints_a_bounded_number_of_lines() {
        let total = 1_000_000;
        let (p, out) = printer(total);
        p.start("converting", total);
        // Many more reports than lines: once per thousand bytes.
        for done in (0..=total).step_by(1000) {
            p.advance(done);
        }
        p.finish();
        let lines = out.lines();
        assert_eq!(lines.len(), MAX_LINES_PER_JOB, "{lines:?}");
        assert!(
            lines.iter().all(|l| l.starts_with("coli: converting: ")),
            "{lines:?}"
        );
        assert_eq!(lines[0], "coli: converting: 0% of 976.56 KiB");
        assert_eq!(lines[1], "coli: converting: 10% (97.66 KiB of 976.56 KiB)");
        assert_eq!(lines[9], "coli: converting: 90% (878.91 KiB of 976.56 KiB)");
        assert!(
            lines[10].starts_with("coli: converting: done, 976.56 KiB in "),
            "{lines:?}"
        );
    }

    #[test]
    fn big_jumps_print_only_the_step_reached_and_overshoot_is_clamped() {
        let (p, out) = printer(0);
        p.start("loading dense weights", 100);
        p.advance(35);
        p.advance(35);
        p.advance(500);
        p.finish();
        let lines = out.lines();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[0], "coli: loading dense weights: 0% of 100 B");
        assert_eq!(lines[1], "coli: loading dense weights: 30% (35 B of 100 B)");
        assert!(
            lines[2].starts_with("coli: loading dense weights: done, 100 B in "),
            "{lines:?}"
        );
    }

    #[test]
    fn a_failed_job_prints_no_end_and_the_next_job_starts_afresh() {
        let (p, out) = printer(10);
        p.start("generating", 100);
        p.advance(50);
        // No finish: the job failed. A later job is shown from its start.
        p.start("generating", 200);
        p.finish();
        // A report after the end is ignored.
        p.advance(200);
        let lines = out.lines();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert_eq!(lines[1], "coli: generating: 50% (50 B of 100 B)");
        assert_eq!(lines[2], "coli: generating: 0% of 200 B");
        assert!(lines[3].starts_with("coli: generating: done, 200 B in "));
    }

    #[test]
    fn an_empty_job_prints_its_start_and_end() {
        let (p, out) = printer(0);
        p.start("converting", 0);
        p.advance(0);
        p.finish();
        assert_eq!(out.lines().len(), 2, "{:?}", out.lines());
    }
}
