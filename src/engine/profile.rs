//! The `--profile` report: where a run's time went and how the expert cache
//! and pilot did, from the pipeline's counters.

use colibri_actors::PipelineProfile;

use super::GenStats;

/// Formats the breakdown of one generation. `before`/`after` are pipeline
/// snapshots taken around it.
pub fn report(stats: &GenStats, before: &PipelineProfile, after: &PipelineProfile) -> String {
    let p = after.since(before);
    let wall = stats.prefill_secs + stats.decode_secs;
    let secs = |ns: u64| ns as f64 / 1e9;
    let wait = secs(p.wait_ns);
    let expert_compute = secs(p.sink_ns);
    let other = (wall - secs(p.fetch_ns)).max(0.0);
    let pct = |x: f64| if wall > 0.0 { 100.0 * x / wall } else { 0.0 };
    let tokens = stats.generated.len().max(1) as f64;
    let total = p.hits + p.misses;
    let hit = if total > 0 {
        100.0 * p.hits as f64 / total as f64
    } else {
        0.0
    };
    let pct_or_na = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{:.1}%", 100.0 * v));
    let recall = pct_or_na(p.pilot_recall());
    let precision = pct_or_na(p.pilot_precision());
    let mut out = String::new();
    out.push_str(&format!(
        "profile: {:.3}s total (prefill {:.3}s, decode {:.3}s, {} tokens)\n",
        wall,
        stats.prefill_secs,
        stats.decode_secs,
        stats.generated.len()
    ));
    let budget = match after.cache_budget {
        Some(b) => format!("{:.2} GB budget", b as f64 / 1e9),
        None => "no budget".to_string(),
    };
    out.push_str(&format!(
        "  placement: {} ({budget}, {:.2} GB of experts resident)\n",
        match after.placement {
            "mapped" => "mapped (experts served in place from the container's mapping, zero-copy)",
            "streamed" => "streamed (private expert cache fed by the I/O workers and the pilot)",
            other => other,
        },
        after.cache_bytes as f64 / 1e9
    ));
    out.push_str(&format!("  disk wait       {:>8.3}s {:>5.1}%\n", wait, pct(wait)));
    out.push_str(&format!(
        "  expert compute  {:>8.3}s {:>5.1}%\n",
        expert_compute,
        pct(expert_compute)
    ));
    out.push_str(&format!(
        "  other (attention, router, lm_head, sampling) {:>8.3}s {:>5.1}%\n",
        other,
        pct(other)
    ));
    out.push_str(&format!(
        "  experts: hit rate {hit:.1}% ({} hits, {} misses), {} prefetch loads\n",
        p.hits, p.misses, p.prefetch_loads
    ));
    out.push_str(&format!(
        "  pilot: recall {recall}, precision {precision}, recall of the predictions that arrived (late too) {} ({} routings unpredicted, {} predictions late, {} residuals dropped, {} stale)\n",
        pct_or_na(p.pilot_recall_untimed()),
        p.pilot_unpredicted,
        p.pilot_late,
        p.pilot_dropped,
        p.pilot_stale
    ));
    let mb = |b: u64| b as f64 / 1e6;
    out.push_str(&format!(
        "  disk: {:.1} MB read in {} reads via {}; per token {:.2} MB needed (demand {:.2} + used prefetch {:.2}), {:.2} MB prefetched unused\n",
        mb(p.bytes_read),
        p.reads,
        p.storage,
        mb(p.needed_bytes()) / tokens,
        mb(p.demand_bytes) / tokens,
        mb(p.prefetch_used_bytes) / tokens,
        mb(p.prefetch_wasted_bytes) / tokens
    ));
    if after.placement == "mapped" {
        out.push_str(&match after.readahead_ns {
            0 => "  read-ahead of the mapped experts still running\n".to_string(),
            ns => format!(
                "  read-ahead of the mapped experts took {:.2}s\n",
                ns as f64 / 1e9
            ),
        });
    }
    if p.buffers_allocated + p.buffers_reused + p.buffers_prefaulted > 0 {
        out.push_str(&format!(
            "  read buffers: {} allocated on the read, {} faulted in ahead, {} reused from evicted experts\n",
            p.buffers_allocated, p.buffers_prefaulted, p.buffers_reused
        ));
    }
    out
}

/// The memory lines of `--profile`: the plan and the peak RSS against it.
pub fn memory_report(plan: &super::MemoryPlan, peak_rss: Option<u64>) -> String {
    let mut out = format!("  {plan}\n");
    if let Some(rss) = peak_rss {
        let g = rss as f64 / (1u64 << 30) as f64;
        match plan.engine_total() {
            Some(t) if t > 0 => out.push_str(&format!(
                "  peak RSS {g:.2} GiB = {:.3} x the budget\n",
                rss as f64 / t as f64
            )),
            _ => out.push_str(&format!("  peak RSS {g:.2} GiB\n")),
        }
    }
    out
}
