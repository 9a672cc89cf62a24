//! `coli bench`'s report: the passes side by side, then the bounds they
//! are judged by (src/bounds) and what the run used of each.

use std::io::Write;
use std::path::Path;

use super::bench::{BenchArgs, Optimal, Pass, Workload};
use crate::bounds::{ComputeBound, DiskFigure, IoBound, MemoryBound};
use crate::engine::EngineOptions;
use crate::synth::ModelShape;

pub(super) struct Report<'a> {
    pub dir: &'a Path,
    pub cfg: &'a ModelShape,
    pub opts: &'a EngineOptions,
    pub args: &'a BenchArgs,
    pub work: &'a Workload,
    pub passes: &'a [Pass],
    pub disk: &'a DiskFigure,
    pub optimal: Option<&'a Optimal>,
    pub io_bound: &'a IoBound,
    pub compute: &'a ComputeBound,
    pub memory_bound: Option<&'a MemoryBound>,
}

impl Report<'_> {
    pub fn print(&self, out: &mut dyn Write) -> std::io::Result<()> {
        self.passes_table(out)?;
        self.bounds(out)?;
        self.memory(out)
    }

    fn passes_table(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let mb = |b: f64| b / 1e6;
        writeln!(
            out,
            "model {}: {} layers, {} experts top-{}, hidden {}",
            self.dir.display(),
            self.cfg.num_hidden_layers,
            self.cfg.num_experts,
            self.cfg.num_experts_per_tok,
            self.cfg.hidden_size
        )?;
        writeln!(
            out,
            "options: cache-cap {} | ram-gb {} | disk-sim {} | pilot {} | io-workers {} | direct {} | overlap {}",
            self.opts.cache_cap.map_or("default".into(), |c| c.to_string()),
            self.opts.ram_gb.map_or("default".into(), |g| g.to_string()),
            self.opts.disk_sim.as_deref().unwrap_or("off"),
            if self.opts.pilot { "on" } else { "off" },
            self.opts.io_workers,
            self.opts.direct,
            self.opts.overlap
        )?;
        if let Some(u) = self.passes.first().and_then(|p| p.usage.as_ref()) {
            writeln!(
                out,
                "usage history: {} run(s) before this one; pins at start-up: {} (--pin {})",
                u.history_runs,
                u.pins_line(),
                match &self.args.usage.pin {
                    crate::engine::usage::PinMode::Off => "off".to_string(),
                    crate::engine::usage::PinMode::Auto => "auto".to_string(),
                    crate::engine::usage::PinMode::File(p) => p.display().to_string(),
                }
            )?;
        }
        writeln!(
            out,
            "prompt {} tok, warm-up {} tok, measured {} tok, {}",
            self.work.prompt.len(),
            self.args.warmup,
            self.args.tokens,
            match &self.args.replay {
                Some(p) => format!("forced from --replay {}", p.display()),
                None => "greedy".into(),
            }
        )?;
        writeln!(out)?;
        writeln!(
            out,
            "{:<14} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>9} {:>10} {:>9}",
            "pass",
            "tok/s",
            "hit rate",
            "read MB/t",
            "need MB/t",
            "waste MB/t",
            "recall",
            "precision",
            "prefill s",
            "load s"
        )?;
        let pct = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{:.1}%", v * 100.0));
        for p in self.passes {
            let r = &p.result;
            let prof = r.profile.as_ref();
            writeln!(
                out,
                "{:<14} {:>9.3} {:>8.1}% {:>10.2} {:>10.2} {:>10.2} {:>8} {:>9} {:>10.2} {:>9.2}",
                p.name,
                r.tok_per_s(),
                r.window.hit_rate() * 100.0,
                mb(r.missed_bytes_per_token()),
                mb(r.needed_bytes_per_token()),
                mb(r.wasted_bytes_per_token()),
                pct(prof.and_then(|p| p.pilot_recall())),
                pct(prof.and_then(|p| p.pilot_precision())),
                r.prefill_secs,
                p.load_secs
            )?;
        }
        writeln!(out)?;
        Ok(())
    }

    fn bounds(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let mb = |b: f64| b / 1e6;
        let measured = &self.passes[0].result;
        let tokens = measured.measured.max(1) as f64;
        match (&self.disk.probe, self.disk.simulated) {
            (_, Some(bw)) => writeln!(
                out,
                "disk                {:>10.1} MB/s  (simulated: --disk-sim bw)",
                mb(bw)
            )?,
            (Some(p), None) => writeln!(
                out,
                "disk probe          {:>10.1} MB/s  ({}; before the passes)",
                mb(p.median()),
                p.describe()
            )?,
            (None, None) => {}
        }
        writeln!(
            out,
            "disk bandwidth      {:>10.1} MB/s  (what the I/O bound divides: {})",
            mb(self.disk.bandwidth()),
            self.disk.source()
        )?;
        let first = &self.passes[0];
        if let Some(o) = self.optimal {
            let cap = match (o.capacity.per_layer, o.capacity.total) {
                (Some(c), Some(t)) => format!("{c} a layer, {t} in all"),
                (Some(c), None) => format!("{c} a layer"),
                (None, Some(t)) => format!("{t} experts in all"),
                (None, None) => "unlimited".into(),
            };
            let opt = &o.outcome;
            writeln!(
                out,
                "optimal policy      {:>10.2} MB/t  (Belady's rule on the window's own routing, {} fetches, cache of {cap}, best start: hit rate {:.1}% against the measured {:.1}%)",
                mb(opt.bytes as f64 / tokens),
                opt.accesses,
                opt.hit_rate() * 100.0,
                measured.window.hit_rate() * 100.0
            )?;
            if let Some(e) = self.io_bound.efficiency() {
                writeln!(
                    out,
                    "policy efficiency   {:>10.3}       (bytes read / optimal bytes: {:.2} / {:.2} MB/t; demand + used prefetches alone {:.3})",
                    e,
                    mb(measured.window.bytes_read as f64 / tokens),
                    mb(opt.bytes as f64 / tokens),
                    measured.needed_bytes_per_token() * tokens / opt.bytes.max(1) as f64
                )?;
            }
            if first.trace_dropped > 0 {
                writeln!(
                    out,
                    "note: the routing trace dropped {} of the pass's first steps for room; the window's replay is whole when the window is shorter than that",
                    first.trace_dropped
                )?;
            }
        }
        let io_bound = self.io_bound.tok_per_s();
        writeln!(
            out,
            "I/O bound           {io_bound:>10.3} tok/s  (disk bandwidth / the optimal policy's {:.2} MB a token{})",
            mb(self.io_bound.bytes_per_token()),
            if self.io_bound.run_below_optimal() {
                "; the run read less than the replay's capacity allows, so its own bytes are used"
            } else {
                ""
            }
        )?;
        if let Some(p) = &measured.profile
            && p.reads > 0
            && measured.decode_secs > 0.0
        {
            let per_tok = |n: u64| n as f64 / measured.measured.max(1) as f64;
            writeln!(
                out,
                "I/O activity        reads busy {:.1}% of the window per worker ({} workers); per token {:.2} demand loads, {:.2} prefetch loads, {:.2} prefetches dropped unread when their layer's routing skipped them, {:.2} cancelled by the next step",
                p.read_ns as f64 / 1e9 / measured.decode_secs / self.opts.io_workers.max(1) as f64 * 100.0,
                self.opts.io_workers,
                per_tok(p.demand_loads),
                per_tok(p.prefetch_loads),
                per_tok(p.prefetch_dropped_unread),
                per_tok(p.loads_cancelled)
            )?;
        }
        let mut bound = io_bound;
        if let Some(cb) = self.compute.tok_per_s() {
            let resident = match self.passes.iter().find(|p| p.name == "all resident") {
                Some(c) if c.result.window.misses == 0 => "every routed expert resident".to_string(),
                Some(c) => format!(
                    "NOT fully resident: {} misses in the window",
                    c.result.window.misses
                ),
                None => "no all-resident pass".into(),
            };
            let own = self.compute.measured_compute.map_or(String::new(), |m| {
                format!("; the measured pass computed at {m:.3} tok/s between waits")
            });
            writeln!(
                out,
                "compute bound       {cb:>10.3} tok/s  (the faster of the all-resident pass, {resident}{own})"
            )?;
            bound = bound.min(cb);
        }
        if bound.is_finite() && bound > 0.0 {
            writeln!(
                out,
                "measured / bound    {:>10.3}       (measured tok/s / min(I/O bound, compute bound); at most 1 by construction)",
                measured.tok_per_s() / bound
            )?;
        }
        Ok(())
    }

    fn memory(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let measured = &self.passes[0].result;
        let pct = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{:.1}%", v * 100.0));
        if let Some(strict) = self.passes.iter().find(|p| p.name == "no-overlap") {
            let s = strict.result.tok_per_s();
            if s > 0.0 {
                writeln!(
                    out,
                    "overlap / strict   {:>10.3}       (measured tok/s / no-overlap tok/s)",
                    measured.tok_per_s() / s
                )?;
            }
        }
        if let Some(p) = &measured.profile
            && p.pilot_routed > 0
        {
            writeln!(
                out,
                "pilot               recall {} precision {}; recall of the predictions that arrived, late ones too: {}  ({} routings unpredicted, {} predictions late, {} residuals dropped, {} stale; dropped, stale and late count as misses)",
                pct(p.pilot_recall()),
                pct(p.pilot_precision()),
                pct(p.pilot_recall_untimed()),
                p.pilot_unpredicted,
                p.pilot_late,
                p.pilot_dropped,
                p.pilot_stale
            )?;
        }
        let first = &self.passes[0];
        writeln!(out, "{}", first.memory)?;
        if let (Some(rss), Some(total)) = (first.peak_rss, first.memory.engine_total()) {
            writeln!(
                out,
                "peak RSS            {:>10.2} GiB = {:.3} x the budget (after the measured pass)",
                rss as f64 / (1u64 << 30) as f64,
                rss as f64 / total as f64
            )?;
        }
        if let Some(m) = self.memory_bound {
            let mb = |b: f64| b / 1e6;
            writeln!(
                out,
                "memory read         {:>10.1} MB/s  (same run, {} threads, best of 5 passes over 512 MB)",
                mb(m.read_bw),
                m.threads
            )?;
            writeln!(
                out,
                "memory bound        {:>10.3} tok/s  (memory read / {:.2} MB a token reads with every expert resident: dense step + {:.2} experts x {:.2} MB)",
                m.tok_per_s(),
                mb(m.bytes_per_token),
                m.experts_per_token,
                mb(m.expert_bytes)
            )?;
            if let Some(c) = self.passes.iter().find(|p| p.name == "all resident") {
                writeln!(
                    out,
                    "resident / memory   {:>10.3}       (all-resident decode tok/s / memory bound: the share of RAM bandwidth decode uses)",
                    c.result.tok_per_s() / m.tok_per_s()
                )?;
            }
        }
        Ok(())
    }
}
