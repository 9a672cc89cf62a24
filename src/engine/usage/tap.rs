//! What one engine's fetches feed: per-expert counters, the routing trace,
//! and the pins they drive; and the source wrapper that feeds them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use colibri_actors::{
    ExpertBatchSink, ExpertKey, ExpertMap, ExpertSink, ExpertSource, PipelineProfile, SourceError,
    SourceStats, Tag,
};

use super::UsageHistory;
use crate::engine::Placement;
use crate::routing::repin::REPIN_EVERY;
use crate::routing::{Capacity, PinChoice, Pinner, RoutingTrace, TraceRecorder, choose_pins, pins};

/// Keys the in-memory trace keeps (the newest; 8 bytes each).
pub const TRACE_MAX_ACCESSES: usize = 1 << 21;

/// How many experts the cache of a run holds: `--cache-cap` per layer,
/// and the byte budget over the largest expert in all; nothing for the
/// mapped placement (every expert is resident there).
pub fn cache_capacity(
    placement: Placement,
    cache_cap: Option<usize>,
    budget: Option<u64>,
    map: &ExpertMap,
) -> Option<Capacity> {
    if placement == Placement::Mapped || map.layers == 0 {
        return None;
    }
    let total = budget.map(|b| (b / map.max_expert_bytes().max(1)) as usize);
    Some(Capacity {
        per_layer: cache_cap,
        total,
    })
}

/// Bytes one expert of each layer reads (0 for layers without routed
/// experts), for traces.
pub fn layer_expert_bytes(map: &ExpertMap) -> Vec<u64> {
    (0..map.layers)
        .map(|l| {
            map.extents[l * map.experts_per_layer..(l + 1) * map.experts_per_layer]
                .iter()
                .map(|e| e.bytes())
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// The counters one engine's fetches feed, and the pins they drive.
pub struct UsageTap {
    layers: usize,
    experts: usize,
    counts: Vec<AtomicU64>,
    steps: AtomicU64,
    trace: TraceRecorder,
    /// The cache's capacity (`None`: everything resident, no pins).
    capacity: Option<Capacity>,
    /// The most of a layer's cache pins may take (`--pin-share`).
    pin_share: f64,
    pinner: Mutex<Option<Pinner>>,
}

impl UsageTap {
    /// `shape`: the model's shape as an empty trace.
    pub fn new(shape: RoutingTrace, capacity: Option<Capacity>, pin_share: f64) -> Self {
        Self {
            layers: shape.layers,
            experts: shape.experts,
            counts: (0..shape.layers * shape.experts)
                .map(|_| AtomicU64::new(0))
                .collect(),
            steps: AtomicU64::new(0),
            trace: TraceRecorder::new(shape, TRACE_MAX_ACCESSES),
            capacity,
            pin_share,
            pinner: Mutex::new(None),
        }
    }

    pub fn layers(&self) -> usize {
        self.layers
    }

    pub fn experts(&self) -> usize {
        self.experts
    }

    pub fn capacity(&self) -> Option<Capacity> {
        self.capacity
    }

    /// The routing this engine has fetched (the newest
    /// [`TRACE_MAX_ACCESSES`] keys).
    pub fn trace(&self) -> &TraceRecorder {
        &self.trace
    }

    #[inline]
    fn record(&self, keys: &[ExpertKey]) {
        for key in keys {
            let (l, e) = (key.layer as usize, key.expert as usize);
            if l < self.layers
                && e < self.experts
                && let Some(c) = self.counts.get(l * self.experts + e)
            {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.trace.record(keys);
    }

    /// This run's fetch counts so far (layer-major).
    pub fn snapshot(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    /// The experts pinned now, per layer (empty without pins).
    pub fn pinned(&self) -> Vec<Vec<u32>> {
        match self.pinner.lock() {
            Ok(g) => g.as_ref().map(|p| p.pinned.clone()).unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// Chooses pins from `base` (decayed history counts) by replaying
    /// `recorded` (the history's routing) at this run's capacity
    /// ([`choose_pins`]), pins them through `source`, and keeps them
    /// following the counts from then on.
    pub fn start_pins<T>(
        &self,
        base: &UsageHistory,
        recorded: &RoutingTrace,
        source: &dyn ExpertSource<T>,
    ) -> PinChoice {
        let shape_ok = (base.layers, base.experts) == (self.layers, self.experts)
            && (recorded.layers, recorded.experts) == (self.layers, self.experts);
        let Some(capacity) = self.capacity.filter(|_| shape_ok) else {
            return PinChoice {
                why_none: Some(if shape_ok {
                    "every expert is resident".into()
                } else {
                    "the history is of another shape".into()
                }),
                ..PinChoice::default()
            };
        };
        let ranking = pins::ranking(&base.counts, self.layers, self.experts);
        let choice = choose_pins(recorded, &ranking, capacity, self.pin_share);
        if choice.count() > 0 {
            let pinner = Pinner::new(
                base.counts.clone(),
                self.layers,
                self.experts,
                choice.pins.clone(),
            );
            source.pin(&pinner.keys());
            if let Ok(mut g) = self.pinner.lock() {
                *g = Some(pinner);
            }
        }
        choice
    }

    /// One token step: closes the trace's step, and every [`REPIN_EVERY`]
    /// steps the pins follow the counts.
    fn on_step<T>(&self, source: &dyn ExpertSource<T>) {
        self.trace.end_step();
        let n = self.steps.fetch_add(1, Ordering::Relaxed) + 1;
        if !n.is_multiple_of(REPIN_EVERY) {
            return;
        }
        let Ok(mut g) = self.pinner.try_lock() else { return };
        let Some(p) = g.as_mut() else { return };
        let (pin, unpin) = p.reevaluate(&self.snapshot());
        if !unpin.is_empty() {
            source.unpin(&unpin);
        }
        if !pin.is_empty() {
            source.pin(&pin);
        }
    }
}

/// An [`ExpertSource`] that counts every fetched key into a [`UsageTap`]
/// and forwards everything to the source it wraps.
pub struct CountingSource<T> {
    inner: Arc<dyn ExpertSource<T>>,
    tap: Arc<UsageTap>,
}

impl<T> CountingSource<T> {
    pub fn new(inner: Arc<dyn ExpertSource<T>>, tap: Arc<UsageTap>) -> Self {
        Self { inner, tap }
    }
}

impl<T: Send + Sync> ExpertSource<T> for CountingSource<T> {
    fn fetch_batch(
        &self,
        tag: Tag,
        keys: &[ExpertKey],
        sink: &mut ExpertBatchSink<'_, T>,
    ) -> Result<(), SourceError> {
        self.tap.record(keys);
        self.inner.fetch_batch(tag, keys, sink)
    }

    fn fetch(&self, tag: Tag, keys: &[ExpertKey], sink: &mut ExpertSink<'_, T>) -> Result<(), SourceError> {
        self.tap.record(keys);
        self.inner.fetch(tag, keys, sink)
    }

    fn pilot(&self, tag: Tag, residual: &[f32]) {
        self.inner.pilot(tag, residual);
    }

    fn advance(&self, tag: Tag) {
        self.inner.advance(tag);
        self.tap.on_step(self.inner.as_ref());
    }

    fn pin(&self, keys: &[ExpertKey]) {
        self.inner.pin(keys);
    }

    fn unpin(&self, keys: &[ExpertKey]) {
        self.inner.unpin(keys);
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }

    fn profile(&self) -> Option<PipelineProfile> {
        self.inner.profile()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A tap over 2 layers x 4 experts, top-1, `cap` experts a layer.
    pub fn tap(cap: usize) -> UsageTap {
        UsageTap::new(
            RoutingTrace::new(2, 4, 1, vec![100, 100]),
            Some(Capacity::per_layer(cap)),
            1.0,
        )
    }

    #[test]
    fn capacity_of_the_cache() {
        let mut map = ExpertMap::new(Vec::new(), 4, 8);
        for l in 0..4 {
            for e in 0..8 {
                let ext = colibri_actors::ExpertExtent {
                    pieces: vec![colibri_actors::Piece {
                        file: 0,
                        offset: 0,
                        len: 100,
                    }],
                };
                map.set_extent(ExpertKey::new(l, e), ext).unwrap();
            }
        }
        assert_eq!(
            cache_capacity(Placement::Streamed, Some(3), Some(1650), &map),
            Some(Capacity {
                per_layer: Some(3),
                total: Some(16)
            })
        );
        assert_eq!(cache_capacity(Placement::Mapped, Some(3), None, &map), None);
        assert_eq!(layer_expert_bytes(&map), vec![100; 4]);
    }

    /// A source that delivers the expert id and logs pin calls.
    #[derive(Default)]
    pub struct Logged {
        pub calls: Mutex<Vec<(bool, Vec<ExpertKey>)>>,
    }

    impl ExpertSource<u32> for Logged {
        fn fetch_batch(
            &self,
            _tag: Tag,
            keys: &[ExpertKey],
            sink: &mut ExpertBatchSink<'_, u32>,
        ) -> Result<(), SourceError> {
            let group: Vec<(usize, Arc<u32>)> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| (i, Arc::new(k.expert)))
                .collect();
            if group.is_empty() { Ok(()) } else { sink(&group) }
        }
        fn pin(&self, keys: &[ExpertKey]) {
            self.calls.lock().unwrap().push((true, keys.to_vec()));
        }
        fn unpin(&self, keys: &[ExpertKey]) {
            self.calls.lock().unwrap().push((false, keys.to_vec()));
        }
        fn stats(&self) -> SourceStats {
            SourceStats::default()
        }
    }

    #[test]
    fn counting_source_counts_traces_and_repins_every_k_steps() {
        let inner = Arc::new(Logged::default());
        let tap = Arc::new(tap(3));
        let src = CountingSource::new(inner.clone() as Arc<dyn ExpertSource<u32>>, tap.clone());
        // A history where expert 3 of each layer is hot beside a scan of
        // the others, which LRU at cap 3 keeps evicting: pins pay.
        let mut history = RoutingTrace::new(2, 4, 1, vec![100, 100]);
        for s in 0..200usize {
            let e = [3, 3, 0, 1, 2][s % 5];
            history.push_step(&[ExpertKey::new(0, e), ExpertKey::new(1, e)]);
        }
        let mut base = UsageHistory::new(0, 2, 4);
        base.counts = pins::counts_of(&history);
        let choice = tap.start_pins(&base, &history, &src);
        assert_eq!(choice.pins, vec![vec![3, 0], vec![3, 0]], "{choice:?}");
        assert!(choice.pinned.loads < choice.lru.loads);
        assert_eq!(tap.pinned(), choice.pins);
        let key = ExpertKey::new(0, 1);
        for step in 0..50u64 {
            let mut got = Vec::new();
            src.fetch_batch(Tag::new(0, step, 0), &[key, ExpertKey::new(1, 3)], &mut |g| {
                got.extend(g.iter().map(|(i, e)| (*i, **e)));
                Ok(())
            })
            .unwrap();
            assert_eq!(got, vec![(0, 1), (1, 3)], "delivered unchanged");
            if step + 1 < REPIN_EVERY {
                src.advance(Tag::new(0, step + 1, 0));
            }
        }
        let snap = tap.snapshot();
        assert_eq!((snap[1], snap[4 + 3], snap.iter().sum::<u64>()), (50, 50, 100));
        let trace = tap.trace().snapshot();
        assert_eq!(
            trace.steps(),
            REPIN_EVERY as usize,
            "31 closed steps and the open one"
        );
        assert_eq!(trace.step(0), &[key, ExpertKey::new(1, 3)]);
        assert_eq!(
            inner.calls.lock().unwrap().len(),
            1,
            "only the start-up pins so far"
        );
        src.advance(Tag::new(0, REPIN_EVERY, 0));
        let calls = inner.calls.lock().unwrap().clone();
        assert_eq!(
            calls[1..],
            [
                (false, vec![ExpertKey::new(0, 0)]),
                (true, vec![ExpertKey::new(0, 1)])
            ]
        );
        assert_eq!(tap.pinned(), vec![vec![3, 1], vec![3, 0]]);
    }
}
