//! `GET /metrics`: the decode loop's counters and the expert source's, in
//! Prometheus' text exposition format 0.0.4 (names in docs/http-api.md).

use std::fmt::Write;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use colibri_actors::SourceStats;

use super::state::Shared;
use crate::runtime::MetricsSnapshot;

/// Prometheus' content type for this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics`.
pub async fn metrics(State(st): State<Shared>) -> Response {
    let mut body = render(
        &st.handle.metrics(),
        &st.handle.source_stats(),
        st.handle.info().slots,
    );
    st.counters.render(&mut body);
    let mut r = body.into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    r
}

struct Out(String);

impl Out {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.head(name, kind, help);
        let _ = writeln!(self.0, "{name} {value}");
    }
}

/// The exposition text.
pub fn render(m: &MetricsSnapshot, s: &SourceStats, slots: usize) -> String {
    let mut o = Out(String::new());
    o.one(
        "colibri_requests_received_total",
        "counter",
        "Generation requests submitted to the decode loop.",
        m.requests,
    );
    o.head(
        "colibri_requests_total",
        "counter",
        "Generation requests by outcome (rejected: refused because the admission queue was full).",
    );
    for (outcome, n) in [
        ("completed", m.completed),
        ("cancelled", m.cancelled),
        ("failed", m.failed),
        ("rejected", m.rejected),
    ] {
        let _ = writeln!(o.0, "colibri_requests_total{{outcome=\"{outcome}\"}} {n}");
    }
    o.one(
        "colibri_prompt_tokens_total",
        "counter",
        "Prompt tokens of admitted requests.",
        m.prompt_tokens,
    );
    o.one(
        "colibri_prefilled_tokens_total",
        "counter",
        "Prompt tokens computed (the rest were reused from a slot's history, another slot or the prompt cache).",
        m.prefilled_tokens,
    );
    o.one(
        "colibri_prompt_cache_restored_tokens_total",
        "counter",
        "Prompt positions copied from another slot or the prompt cache instead of computed.",
        m.restored_tokens,
    );
    o.one(
        "colibri_prompt_cache_bytes",
        "gauge",
        "Bytes the prompt cache holds.",
        m.prompt_cache_bytes,
    );
    o.one(
        "colibri_generated_tokens_total",
        "counter",
        "Tokens generated.",
        m.generated_tokens,
    );
    o.one(
        "colibri_draft_tokens_total",
        "counter",
        "Speculative decoding: draft tokens verified.",
        m.draft_proposed,
    );
    o.one(
        "colibri_draft_accepted_tokens_total",
        "counter",
        "Speculative decoding: draft tokens the model agreed with (emitted without a step of their own).",
        m.draft_accepted,
    );
    o.one(
        "colibri_draft_verifications_total",
        "counter",
        "Speculative decoding: sequences whose step verified a draft.",
        m.draft_verifies,
    );
    o.one(
        "colibri_decode_steps_total",
        "counter",
        "Batched forward steps.",
        m.steps,
    );
    o.one(
        "colibri_decode_step_seconds_total",
        "counter",
        "Seconds spent in forward steps.",
        m.step_secs,
    );
    o.one(
        "colibri_recent_tokens_per_second",
        "gauge",
        "Generated tokens per second over the last steps.",
        m.recent_tok_per_s,
    );
    o.one(
        "colibri_queue_depth",
        "gauge",
        "Requests waiting for a slot.",
        m.queue_depth,
    );
    o.one(
        "colibri_active_sessions",
        "gauge",
        "Requests holding a slot (prefilling or decoding).",
        m.active,
    );
    o.one(
        "colibri_slots",
        "gauge",
        "Conversation slots (concurrent requests).",
        slots,
    );
    o.one(
        "colibri_expert_cache_hits_total",
        "counter",
        "Routed experts found in memory.",
        s.hits,
    );
    o.one(
        "colibri_expert_cache_misses_total",
        "counter",
        "Routed experts that had to be read.",
        s.misses,
    );
    o.one(
        "colibri_expert_cache_hit_ratio",
        "gauge",
        "Hits over hits plus misses since start (0 before any).",
        s.hit_rate(),
    );
    o.one(
        "colibri_expert_bytes_read_total",
        "counter",
        "Bytes of expert weights read from storage.",
        s.bytes_read,
    );
    o.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_has_help_and_type() {
        let m = MetricsSnapshot {
            requests: 3,
            completed: 2,
            rejected: 1,
            active: 1,
            ..MetricsSnapshot::default()
        };
        let s = SourceStats {
            hits: 3,
            misses: 1,
            ..SourceStats::default()
        };
        let text = render(&m, &s, 4);
        assert!(text.contains("colibri_requests_total{outcome=\"rejected\"} 1\n"));
        assert!(text.contains("colibri_expert_cache_hit_ratio 0.75\n"));
        assert!(text.contains("colibri_slots 4\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
            assert!(text.contains(&format!("# HELP {name} ")), "{name}");
            let value = line.rsplit(' ').next().unwrap_or("");
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
