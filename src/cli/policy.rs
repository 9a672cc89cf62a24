//! `coli policy`: a recorded routing trace replayed through the cache
//! policies offline, over a range of cache sizes: LRU alone, LRU with the
//! pins the pin policy would take, and the optimal policy.
//!
//! With `--history`, pins are chosen on one trace (the usage history) and
//! judged on another (held-out text), as a run would use them; without
//! it they are chosen and judged on the same trace, which flatters them.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::routing::{Capacity, RoutingTrace, choose_pins, file, pins, replay};

#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// The trace to judge the policies on (`coli bench --trace-out`, or a
    /// state directory's routing.trace). Replays count its window when it
    /// marks one (the steps before it warm the cache), else every step.
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// The trace pins are chosen on (default: --trace itself).
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
    /// Per-layer cache sizes to replay: `N`, `A-B` or a comma list.
    #[arg(long, default_value = "2-16", value_name = "CAPS")]
    pub caps: String,
    /// The most of a layer's cache pins may take, in (0, 1].
    #[arg(long, default_value_t = crate::engine::usage::DEFAULT_PIN_SHARE, value_name = "F")]
    pub pin_share: f64,
}

/// `2-16`, `4`, `2,3,8`: the caps, each at least 1.
fn parse_caps(s: &str) -> anyhow::Result<Vec<usize>> {
    let num = |t: &str| -> anyhow::Result<usize> {
        t.trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| (1..=1 << 16).contains(&n))
            .ok_or_else(|| super::usage(format!("--caps: {t:?} is not a cache size from 1 to 65536")))
    };
    let mut caps = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(super::usage(format!("--caps: {part:?} runs backwards")));
                }
                caps.extend(a..=b);
            }
            None => caps.push(num(part)?),
        }
    }
    Ok(caps)
}

fn load(path: &std::path::Path, what: &str) -> anyhow::Result<file::TraceFile> {
    file::load(path)
        .with_context(|| format!("{what} {}", path.display()))?
        .ok_or_else(|| anyhow::anyhow!("{what} {}: no such file", path.display()))
}

pub fn run(args: PolicyArgs) -> anyhow::Result<()> {
    let caps = parse_caps(&args.caps)?;
    if !(args.pin_share > 0.0 && args.pin_share <= 1.0) {
        return Err(super::usage(format!(
            "--pin-share {} is not in (0, 1]",
            args.pin_share
        )));
    }
    let judged = load(&args.trace, "--trace")?;
    let history: RoutingTrace = match &args.history {
        Some(p) => {
            let h = load(p, "--history")?.trace;
            if !h.same_shape(&judged.trace) {
                anyhow::bail!(
                    "--history {} is for {} layers x {} experts top-{}, --trace for {} x {} top-{}",
                    p.display(),
                    h.layers,
                    h.experts,
                    h.top_k,
                    judged.trace.layers,
                    judged.trace.experts,
                    judged.trace.top_k
                );
            }
            h
        }
        None => judged.trace.clone(),
    };
    let t = &judged.trace;
    let (from, to) = judged.window.unwrap_or((0, t.steps()));
    // Steps after the window are not part of what is judged.
    let t = t.slice(0..to);
    let ranking = pins::ranking(&pins::counts_of(&history), history.layers, history.experts);
    let mut out = super::output::stdout();
    writeln!(
        out,
        "trace {}: {} layers, {} experts top-{}, steps {from}..{to} judged ({} fetches){}",
        args.trace.display(),
        t.layers,
        t.experts,
        t.top_k,
        t.slice(from..to).accesses(),
        match &args.history {
            Some(p) => format!(", pins chosen on {} ({} steps)", p.display(), history.steps()),
            None => ", pins chosen on the same trace (in-sample)".into(),
        }
    )?;
    writeln!(
        out,
        "{:>4} {:>9} {:>5} {:>9} {:>9} {:>10} {:>10} {:>10}",
        "cap", "LRU", "pins", "pinned", "optimal", "LRU loads", "pin loads", "opt loads"
    )?;
    for cap in caps {
        let capacity = Capacity::per_layer(cap);
        let choice = choose_pins(&history, &ranking, capacity, args.pin_share);
        let lru = replay::lru(&t, capacity, &[], from);
        let pinned = replay::lru(&t, capacity, &choice.pins, from);
        let opt = replay::optimal(&t, capacity, from);
        let pct = |o: &crate::routing::Outcome| format!("{:.1}%", o.hit_rate() * 100.0);
        writeln!(
            out,
            "{cap:>4} {:>9} {:>5} {:>9} {:>9} {:>10} {:>10} {:>10}",
            pct(&lru),
            choice.count(),
            pct(&pinned),
            pct(&opt),
            lru.loads,
            pinned.loads,
            opt.loads
        )?;
    }
    writeln!(
        out,
        "(per-layer caches, pins included in the cap; LRU and pinned warm on the steps before the window, optimal starts from the best contents)"
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_parse() {
        assert_eq!(parse_caps("2-4").unwrap(), vec![2, 3, 4]);
        assert_eq!(parse_caps("3, 8").unwrap(), vec![3, 8]);
        assert!(parse_caps("4-2").is_err());
        assert!(parse_caps("0").is_err());
        assert!(parse_caps("x").is_err());
    }
}
