//! Counters the decode loop keeps for `/metrics` and front ends: written by
//! the loop only, read by anyone (relaxed atomics, no locks).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub rejected: AtomicU64,
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    pub completed: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub prefilled_tokens: AtomicU64,
    /// Prompt positions copied from another slot or the prompt cache
    /// instead of computed (part of the prompt tokens not prefilled).
    pub restored_tokens: AtomicU64,
    /// Bytes the prompt cache holds (gauge).
    pub prompt_cache_bytes: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub steps: AtomicU64,
    /// Sequences summed over steps (mean batch = this / steps).
    pub step_rows: AtomicU64,
    pub step_micros: AtomicU64,
    pub queue_depth: AtomicU64,
    pub active: AtomicU64,
    /// Generated tokens per second over the last steps (f64 bits).
    pub recent_tok_per_s: AtomicU64,
    /// Speculative decoding: draft tokens verified, and of those accepted.
    pub draft_proposed: AtomicU64,
    pub draft_accepted: AtomicU64,
    /// Sequences of steps that verified a draft.
    pub draft_verifies: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MetricsSnapshot {
    pub requests: u64,
    pub rejected: u64,
    pub cancelled: u64,
    pub failed: u64,
    pub completed: u64,
    pub prompt_tokens: u64,
    pub prefilled_tokens: u64,
    pub restored_tokens: u64,
    pub prompt_cache_bytes: u64,
    pub generated_tokens: u64,
    pub steps: u64,
    pub step_rows: u64,
    pub step_secs: f64,
    pub queue_depth: u64,
    pub active: u64,
    pub recent_tok_per_s: f64,
    pub draft_proposed: u64,
    pub draft_accepted: u64,
    pub draft_verifies: u64,
}

impl Metrics {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn set(c: &AtomicU64, n: u64) {
        c.store(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            requests: g(&self.requests),
            rejected: g(&self.rejected),
            cancelled: g(&self.cancelled),
            failed: g(&self.failed),
            completed: g(&self.completed),
            prompt_tokens: g(&self.prompt_tokens),
            prefilled_tokens: g(&self.prefilled_tokens),
            restored_tokens: g(&self.restored_tokens),
            prompt_cache_bytes: g(&self.prompt_cache_bytes),
            generated_tokens: g(&self.generated_tokens),
            steps: g(&self.steps),
            step_rows: g(&self.step_rows),
            step_secs: g(&self.step_micros) as f64 / 1e6,
            queue_depth: g(&self.queue_depth),
            active: g(&self.active),
            recent_tok_per_s: f64::from_bits(g(&self.recent_tok_per_s)),
            draft_proposed: g(&self.draft_proposed),
            draft_accepted: g(&self.draft_accepted),
            draft_verifies: g(&self.draft_verifies),
        }
    }
}
