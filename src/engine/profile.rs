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
    let recall = if p.pilot_routed > 0 {
        format!("{:.1}%", 100.0 * p.pilot_hits as f64 / p.pilot_routed as f64)
    } else {
        "n/a".to_string()
    };
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
        "  experts: hit rate {hit:.1}% ({} hits, {} misses), pilot recall {recall}, {} prefetch loads\n",
        p.hits, p.misses, p.prefetch_loads
    ));
    out.push_str(&format!(
        "  disk: {:.1} MB read in {} reads via {}, {:.2} MB missed per token\n",
        p.bytes_read as f64 / 1e6,
        p.reads,
        p.storage,
        p.bytes_read as f64 / 1e6 / tokens
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
    if p.buffers_allocated + p.buffers_reused > 0 {
        out.push_str(&format!(
            "  read buffers: {} allocated, {} reused from evicted experts\n",
            p.buffers_allocated, p.buffers_reused
        ));
    }
    out
}
