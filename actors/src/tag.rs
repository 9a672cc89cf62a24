//! Generation tags: every message about work for a token carries one, so work
//! that belongs to a cancelled request or a passed token step can be recognised
//! and dropped by whoever holds it, without locks on shared state.
//!
//! [`TagClock`] publishes the newest announced token step to the threads that
//! drop stale work; it is the only notion of "now" the pipeline has.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Identifies the token step and layer a piece of work belongs to.
///
/// `generation` changes when a request is cancelled or finished; `step` counts
/// forward passes within a generation. A tag is stale when a newer
/// `(generation, step)` has been announced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag {
    pub generation: u64,
    pub step: u64,
    pub layer: u32,
}

impl Tag {
    pub fn new(generation: u64, step: u64, layer: u32) -> Self {
        Self {
            generation,
            step,
            layer,
        }
    }

    /// The same token step at another layer.
    pub fn at_layer(self, layer: u32) -> Self {
        Self { layer, ..self }
    }

    /// True when `self` belongs to an older token step than `current`.
    pub fn is_stale_against(self, current: Tag) -> bool {
        (self.generation, self.step) < (current.generation, current.step)
    }
}

/// The two cells behind a [`TagClock`].
#[derive(Debug, Default)]
struct ClockCells {
    generation: AtomicU64,
    step: AtomicU64,
}

impl ClockCells {
    fn now(&self) -> Tag {
        // Generation first: see `TagClock` for why this order never reads a
        // step that is ahead of what was announced.
        let generation = self.generation.load(Ordering::Acquire);
        let step = self.step.load(Ordering::Acquire);
        Tag::new(generation, step, 0)
    }
}

/// The newest announced `(generation, step)`: written by one owner (the
/// pipeline coordinator, on `advance`), read by any number of
/// [`TagClockReader`]s (the I/O workers and the pilot) without locks.
///
/// Layout: two `AtomicU64`s, one for the generation and one for the step, so
/// both keep their full `u64` range (no packing, nothing to overflow); the
/// layer is not stored and [`TagClock::now`] reports layer 0.
///
/// Consistency, and its limit: the two cells cannot be read as one value, so
/// a reader that runs during an advance may see a mix of the old and the new
/// `(generation, step)`. The writer orders its stores so that any mix is at
/// most the tag being announced, never above it: an advance to a new
/// generation first sets the step to 0, then the generation, then the new
/// step; a reader loads the generation first (acquire), so a new generation
/// comes with the step 0 or later. A read may therefore *lag* an advance in
/// progress (and two reads on one thread may even see it step back while it
/// runs), but it never *leads* one, so whatever a reader judges stale really
/// is: lagging only keeps a stale item one check longer. The owner reads its
/// own writes and always sees the exact value.
///
/// The type enforces a single writer: `TagClock` is not `Clone` and
/// [`TagClock::advance`] takes `&mut self`; everyone else holds a reader.
#[derive(Debug, Default)]
pub struct TagClock {
    cells: Arc<ClockCells>,
}

impl TagClock {
    /// A clock at `(0, 0)`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current `(generation, step)`, at layer 0.
    pub fn now(&self) -> Tag {
        self.cells.now()
    }

    /// Moves the clock to `tag`'s `(generation, step)` when that is newer
    /// than the current one; returns whether it moved. An older or equal tag
    /// leaves it alone: the clock only moves forward.
    pub fn advance(&mut self, tag: Tag) -> bool {
        let cur = self.now();
        if !cur.is_stale_against(tag) {
            return false;
        }
        let c = &self.cells;
        if tag.generation != cur.generation {
            // Step back to 0 before the new generation shows, so no reader
            // pairs the new generation with the old generation's step.
            c.step.store(0, Ordering::Release);
            c.generation.store(tag.generation, Ordering::Release);
        }
        c.step.store(tag.step, Ordering::Release);
        true
    }

    /// A handle that reads this clock.
    pub fn reader(&self) -> TagClockReader {
        TagClockReader {
            cells: self.cells.clone(),
        }
    }
}

/// Read access to a [`TagClock`]; cheap to clone, one per thread that drops
/// stale work.
#[derive(Clone, Debug)]
pub struct TagClockReader {
    cells: Arc<ClockCells>,
}

impl TagClockReader {
    /// The current `(generation, step)`, at layer 0; may lag an advance in
    /// progress, never leads it (see [`TagClock`]).
    pub fn now(&self) -> Tag {
        self.cells.now()
    }

    /// True when `tag` belongs to an older token step than the clock's.
    pub fn is_stale(&self, tag: Tag) -> bool {
        tag.is_stale_against(self.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    #[test]
    fn staleness_ignores_the_layer() {
        let t = Tag::new(2, 5, 7);
        assert!(!t.is_stale_against(Tag::new(2, 5, 0)));
        assert!(!t.is_stale_against(Tag::new(2, 4, 9)));
        assert!(t.is_stale_against(Tag::new(2, 6, 0)));
        assert!(t.is_stale_against(Tag::new(3, 0, 0)));
        assert!(!t.is_stale_against(Tag::new(1, u64::MAX, 0)));
    }

    #[test]
    fn the_clock_only_moves_forward() {
        let mut clock = TagClock::new();
        let reader = clock.reader();
        assert_eq!(clock.now(), Tag::default());
        assert!(clock.advance(Tag::new(0, 3, 9)));
        assert_eq!(clock.now(), Tag::new(0, 3, 0), "the layer is not kept");
        assert!(!clock.advance(Tag::new(0, 3, 1)), "same step");
        assert!(!clock.advance(Tag::new(0, 2, 0)), "older step");
        // A new generation restarts steps: (1, 0) is newer than (0, 3).
        assert!(clock.advance(Tag::new(1, 0, 0)));
        assert!(!clock.advance(Tag::new(0, 99, 0)), "older generation");
        assert!(clock.advance(Tag::new(u64::MAX, u64::MAX, 0)), "full range");
        assert_eq!(reader.now(), Tag::new(u64::MAX, u64::MAX, 0));
        assert!(reader.is_stale(Tag::new(u64::MAX, u64::MAX - 1, 3)));
        assert!(!reader.is_stale(Tag::new(u64::MAX, u64::MAX, 3)));
    }

    /// Whatever the interleaving, a reader never sees a `(generation, step)`
    /// newer than what has been announced, even across generations whose
    /// steps restart below the previous generation's.
    #[test]
    fn readers_never_see_a_tag_ahead_of_the_announced_one() {
        // (0, 1001), (0, 1002), (0, 1003), (1, 0), (1, 1001), ...
        let targets: Vec<Tag> = (1..20_000u64)
            .map(|i| Tag::new(i / 4, if i % 4 == 0 { 0 } else { 1_000 + i % 4 }, 0))
            .collect();
        assert!(targets.windows(2).all(|w| w[0].is_stale_against(w[1])));
        let mut clock = TagClock::new();
        let announced = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let start = Arc::new(Barrier::new(3));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (reader, announced, done) = (clock.reader(), announced.clone(), done.clone());
                let (targets, start) = (targets.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let mut reads = 0u64;
                    while !done.load(Ordering::SeqCst) || reads == 0 {
                        let seen = reader.now();
                        // Announced before the clock moved, so read after it.
                        let bound = targets[announced.load(Ordering::SeqCst)];
                        assert!(!bound.is_stale_against(seen), "read {seen:?} above {bound:?}");
                        reads += 1;
                    }
                })
            })
            .collect();
        start.wait();
        for (i, &t) in targets.iter().enumerate() {
            announced.store(i, Ordering::SeqCst);
            assert!(clock.advance(t));
        }
        done.store(true, Ordering::SeqCst);
        for r in readers {
            r.join().expect("reader");
        }
        assert_eq!(clock.now(), targets[targets.len() - 1]);
    }
}
