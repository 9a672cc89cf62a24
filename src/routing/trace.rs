//! The routing trace and its recorder.

use std::collections::VecDeque;
use std::ops::Range;

use colibri_actors::ExpertKey;
use parking_lot::Mutex;

/// What the routers fetched, one step (one forward pass) at a time, in the
/// order the layers asked. Prefill steps hold every expert the batch
/// routed to; decode steps hold one token's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingTrace {
    pub layers: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Bytes one expert of each layer reads from the file (0: a layer
    /// without routed experts).
    pub expert_bytes: Vec<u64>,
    keys: Vec<ExpertKey>,
    /// `step_ends[i]`: one past the last key of step `i`.
    step_ends: Vec<usize>,
}

impl RoutingTrace {
    pub fn new(layers: usize, experts: usize, top_k: usize, expert_bytes: Vec<u64>) -> Self {
        let mut expert_bytes = expert_bytes;
        expert_bytes.resize(layers, 0);
        Self {
            layers,
            experts,
            top_k,
            expert_bytes,
            keys: Vec::new(),
            step_ends: Vec::new(),
        }
    }

    /// The same shape with no steps.
    pub fn empty_like(&self) -> Self {
        Self::new(self.layers, self.experts, self.top_k, self.expert_bytes.clone())
    }

    /// Whether `key` names an expert of this shape.
    pub fn in_shape(&self, key: ExpertKey) -> bool {
        fits(self.layers, self.experts, key)
    }

    /// Appends one step; keys outside the shape are left out (a source
    /// never fetches them, and a replay could not place them).
    pub fn push_step(&mut self, keys: &[ExpertKey]) {
        let (layers, experts) = (self.layers, self.experts);
        self.keys
            .extend(keys.iter().copied().filter(|&k| fits(layers, experts, k)));
        self.step_ends.push(self.keys.len());
    }

    pub fn steps(&self) -> usize {
        self.step_ends.len()
    }

    /// Expert fetches in all steps.
    pub fn accesses(&self) -> usize {
        self.keys.len()
    }

    /// The keys of step `i` (empty past the end).
    pub fn step(&self, i: usize) -> &[ExpertKey] {
        let Some(&end) = self.step_ends.get(i) else {
            return &[];
        };
        let start = if i == 0 { 0 } else { self.step_ends[i - 1] };
        &self.keys[start..end]
    }

    /// Index into [`Self::keys`] of the first key of step `i`.
    pub fn key_offset(&self, step: usize) -> usize {
        match step {
            0 => 0,
            s => self.step_ends.get(s - 1).copied().unwrap_or(self.keys.len()),
        }
    }

    /// Every key in order.
    pub fn keys(&self) -> &[ExpertKey] {
        &self.keys
    }

    /// The steps in `range` as a trace of their own.
    pub fn slice(&self, range: Range<usize>) -> Self {
        let mut t = self.empty_like();
        for i in range.start.min(self.steps())..range.end.min(self.steps()) {
            t.push_step(self.step(i));
        }
        t
    }

    /// The steps of `other` after these (shapes must agree; see
    /// [`Self::same_shape`]).
    pub fn extend(&mut self, other: &Self) {
        for i in 0..other.steps() {
            self.push_step(other.step(i));
        }
    }

    /// The last steps that hold at most `max_accesses` keys together.
    pub fn tail_within(&self, max_accesses: usize) -> Self {
        let mut first = self.steps();
        while first > 0 && self.accesses() - self.key_offset(first - 1) <= max_accesses {
            first -= 1;
        }
        self.slice(first..self.steps())
    }

    /// Whether two traces describe the same model (layers, experts, top-k).
    pub fn same_shape(&self, other: &Self) -> bool {
        (self.layers, self.experts, self.top_k) == (other.layers, other.experts, other.top_k)
    }

    /// Layers with routed experts (those whose experts read any bytes).
    pub fn routed_layers(&self) -> usize {
        self.expert_bytes.iter().filter(|&&b| b > 0).count()
    }

    /// Bytes of one expert of `layer`.
    pub fn bytes_of(&self, layer: u32) -> u64 {
        self.expert_bytes.get(layer as usize).copied().unwrap_or(0)
    }
}

fn fits(layers: usize, experts: usize, key: ExpertKey) -> bool {
    (key.layer as usize) < layers && (key.expert as usize) < experts
}

/// The steps a run has fetched, fed by its expert source: each fetch adds
/// its keys to the open step, each `advance` closes it. Keeps the newest
/// steps within `max_accesses` keys, so a server that runs for days holds
/// a bounded window.
///
/// The lock is taken once per layer fetch by the one thread that computes,
/// and by whoever asks for a snapshot; it is never contended on the decode
/// path.
pub struct TraceRecorder {
    shape: RoutingTrace,
    max_accesses: usize,
    inner: Mutex<Recording>,
}

#[derive(Default)]
struct Recording {
    open: Vec<ExpertKey>,
    steps: VecDeque<Box<[ExpertKey]>>,
    held: usize,
    /// Steps closed since the recorder started, dropped ones included.
    closed: u64,
}

impl TraceRecorder {
    /// `shape`: a trace with no steps giving the model's shape.
    pub fn new(shape: RoutingTrace, max_accesses: usize) -> Self {
        Self {
            shape: shape.empty_like(),
            max_accesses,
            inner: Mutex::new(Recording::default()),
        }
    }

    /// The model's shape as a trace with no steps.
    pub fn empty(&self) -> RoutingTrace {
        self.shape.empty_like()
    }

    pub fn record(&self, keys: &[ExpertKey]) {
        let mut r = self.inner.lock();
        r.open
            .extend(keys.iter().copied().filter(|&k| self.shape.in_shape(k)));
    }

    /// Closes the open step (nothing when it fetched nothing).
    pub fn end_step(&self) {
        let mut r = self.inner.lock();
        if r.open.is_empty() {
            return;
        }
        let step: Box<[ExpertKey]> = std::mem::take(&mut r.open).into_boxed_slice();
        r.held += step.len();
        r.steps.push_back(step);
        r.closed += 1;
        while r.held > self.max_accesses {
            match r.steps.pop_front() {
                Some(s) => r.held -= s.len(),
                None => break,
            }
        }
    }

    /// Steps begun so far (dropped ones included, the open one too when
    /// it has fetched): a mark for [`Self::since`] that leaves out every
    /// step up to now.
    pub fn mark(&self) -> u64 {
        let r = self.inner.lock();
        r.closed + u64::from(!r.open.is_empty())
    }

    /// The steps begun after the mark `since`, the open one included (a
    /// forward pass closes its step when the next one starts), as many as
    /// are still held, and how many of them were dropped for room.
    pub fn since(&self, since: u64) -> (RoutingTrace, u64) {
        let r = self.inner.lock();
        let open = u64::from(!r.open.is_empty());
        let wanted = (r.closed + open).saturating_sub(since) as usize;
        let closed_wanted = wanted.saturating_sub(open as usize);
        let held = closed_wanted.min(r.steps.len());
        let mut t = self.shape.empty_like();
        for s in r.steps.iter().skip(r.steps.len() - held) {
            t.push_step(s);
        }
        if open == 1 && wanted > 0 {
            t.push_step(&r.open);
        }
        (t, (closed_wanted - held) as u64)
    }

    /// Every step held.
    pub fn snapshot(&self) -> RoutingTrace {
        self.since(0).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(l: u32, e: u32) -> ExpertKey {
        ExpertKey::new(l, e)
    }

    #[test]
    fn steps_slices_and_tails() {
        let mut t = RoutingTrace::new(2, 4, 1, vec![10, 20]);
        t.push_step(&[k(0, 1), k(1, 2)]);
        t.push_step(&[k(0, 3), k(9, 0), k(1, 9)]);
        t.push_step(&[k(1, 0)]);
        assert_eq!(t.steps(), 3);
        assert_eq!(t.step(1), &[k(0, 3)], "keys outside the shape are left out");
        assert_eq!(t.step(7), &[] as &[ExpertKey]);
        assert_eq!(t.slice(1..3).keys(), &[k(0, 3), k(1, 0)]);
        assert_eq!(t.tail_within(2).steps(), 2);
        assert_eq!(t.tail_within(1).keys(), &[k(1, 0)]);
        assert_eq!(t.tail_within(0).steps(), 0);
        assert_eq!(t.bytes_of(1), 20);
    }

    #[test]
    fn recorder_keeps_the_newest_steps_within_its_bound() {
        let rec = TraceRecorder::new(RoutingTrace::new(1, 8, 2, vec![1]), 4);
        rec.end_step();
        assert_eq!(rec.mark(), 0, "an empty step is not a step");
        for e in 0..5u32 {
            rec.end_step();
            rec.record(&[k(0, e), k(0, (e + 1) % 8)]);
        }
        // Four closed steps and an open one.
        assert_eq!(rec.mark(), 5);
        let (t, dropped) = rec.since(1);
        assert_eq!(
            (t.steps(), dropped),
            (3, 1),
            "three closed steps wanted, two held"
        );
        assert_eq!(t.step(1), &[k(0, 3), k(0, 4)]);
        assert_eq!(t.step(2), &[k(0, 4), k(0, 5)], "the open step comes last");
        assert_eq!(rec.since(5).0.steps(), 0);
        assert_eq!(rec.snapshot().steps(), 3);
    }
}
