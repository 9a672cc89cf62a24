//! What the HTTP layer counts itself (the decode loop counts the rest):
//! prompts tokenized or refused from their length alone, connections, and
//! timeouts. Shown by `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// One counter or gauge.
#[derive(Default, Debug)]
pub struct Count(AtomicU64);

impl Count {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Default, Debug)]
pub struct Counters {
    /// Prompts that went through the tokenizer.
    pub tokenized: Count,
    /// Prompts refused because their length alone shows they exceed the context.
    pub refused_by_length: Count,
    /// Connections accepted since start.
    pub connections: Count,
    /// Connections open now.
    pub open: Count,
    /// Connections closed because a request head did not arrive in time.
    pub header_timeouts: Count,
    /// Requests answered 408 because their body did not arrive in time.
    pub body_timeouts: Count,
}

impl Counters {
    /// The exposition lines of these counters.
    pub fn render(&self, out: &mut String) {
        let rows: [(&str, &str, &str, &Count); 6] = [
            (
                "colibri_http_prompts_tokenized_total",
                "counter",
                "Prompts the HTTP server tokenized.",
                &self.tokenized,
            ),
            (
                "colibri_http_prompts_refused_by_length_total",
                "counter",
                "Prompts refused without tokenizing: their length alone shows they exceed the context.",
                &self.refused_by_length,
            ),
            (
                "colibri_http_connections_total",
                "counter",
                "Connections accepted.",
                &self.connections,
            ),
            (
                "colibri_http_connections_open",
                "gauge",
                "Connections open (at most --max-connections).",
                &self.open,
            ),
            (
                "colibri_http_header_timeouts_total",
                "counter",
                "Connections closed because a request head did not arrive within --header-timeout-s.",
                &self.header_timeouts,
            ),
            (
                "colibri_http_body_timeouts_total",
                "counter",
                "Requests answered 408 because the body did not arrive within --body-timeout-s.",
                &self.body_timeouts,
            ),
        ];
        for (name, kind, help, c) in rows {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {}", c.get());
        }
    }
}
