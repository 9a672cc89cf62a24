//! Replays of a routing trace through cache policies: the LRU (with pins)
//! the expert cache runs, and the optimal policy no cache can beat.
//!
//! The replays count loads: a fetch of an expert that is not resident
//! reads it once. Prefetching changes when a load happens, not how many
//! there are, so a run's used reads (demand plus used prefetches) can be
//! compared with a replay's loads at the same capacity.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use colibri_actors::ExpertKey;

use super::RoutingTrace;

/// How many experts a cache may hold: per layer (`--cache-cap`, pins
/// included) and in all (the byte budget over one expert's bytes). `None`
/// is no limit of that kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    pub per_layer: Option<usize>,
    pub total: Option<usize>,
}

impl Capacity {
    pub fn per_layer(c: usize) -> Self {
        Self {
            per_layer: Some(c),
            total: None,
        }
    }

    pub fn unlimited(&self) -> bool {
        self.per_layer.is_none() && self.total.is_none()
    }
}

/// What a replay counted over the steps it was asked to count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Expert fetches.
    pub accesses: u64,
    pub hits: u64,
    /// Fetches that had to read the expert.
    pub loads: u64,
    /// Bytes those reads took.
    pub bytes: u64,
}

impl Outcome {
    pub fn hit_rate(&self) -> f64 {
        if self.accesses == 0 {
            0.0
        } else {
            self.hits as f64 / self.accesses as f64
        }
    }

    fn count(&mut self, hit: bool, bytes: u64) {
        self.accesses += 1;
        if hit {
            self.hits += 1;
        } else {
            self.loads += 1;
            self.bytes += bytes;
        }
    }
}

/// The expert cache's policy over `trace`: `pins` (per layer) resident
/// throughout and never evicted, the rest least-recently-used within
/// `cap` (pins count toward both limits; pins beyond a limit are left
/// out). As the cache serves a layer's fetch, the experts of one fetch
/// that are resident are touched before the missing ones are loaded, so a
/// load never evicts an expert the same fetch uses. The cache starts
/// holding only the pins, whose first reads are not counted; only steps
/// from `count_from` on are counted (the earlier ones warm the cache).
pub fn lru(trace: &RoutingTrace, cap: Capacity, pins: &[Vec<u32>], count_from: usize) -> Outcome {
    let mut cache = Lru::new(trace, cap, pins);
    let mut out = Outcome::default();
    let mut order = Vec::new();
    for step in 0..trace.steps() {
        let keys = trace.step(step);
        let mut i = 0;
        while i < keys.len() {
            let layer = keys[i].layer;
            let j = i + keys[i..].iter().take_while(|k| k.layer == layer).count();
            let group = &keys[i..j];
            order.clear();
            order.extend(group.iter().copied().filter(|&k| cache.holds(k)));
            order.extend(group.iter().copied().filter(|&k| !cache.holds(k)));
            for &key in &order {
                let hit = cache.access(key);
                if step >= count_from {
                    out.count(hit, trace.bytes_of(key.layer));
                }
            }
            i = j;
        }
    }
    out
}

/// The state of an [`lru`] replay.
struct Lru {
    cap: Capacity,
    pinned: HashSet<ExpertKey>,
    pinned_in_layer: Vec<usize>,
    tick: u64,
    resident: HashMap<ExpertKey, u64>,
    by_layer: Vec<BTreeMap<u64, u32>>,
    global: BTreeMap<u64, ExpertKey>,
}

impl Lru {
    fn new(trace: &RoutingTrace, cap: Capacity, pins: &[Vec<u32>]) -> Self {
        let mut pinned: HashSet<ExpertKey> = HashSet::new();
        let mut pinned_in_layer = vec![0usize; trace.layers];
        for (l, experts) in pins.iter().enumerate().take(trace.layers) {
            for &e in experts {
                let key = ExpertKey::new(l as u32, e);
                let layer_full = cap.per_layer.is_some_and(|c| pinned_in_layer[l] >= c);
                let total_full = cap.total.is_some_and(|t| pinned.len() >= t);
                if !trace.in_shape(key) || layer_full || total_full || !pinned.insert(key) {
                    continue;
                }
                pinned_in_layer[l] += 1;
            }
        }
        Self {
            cap,
            pinned,
            pinned_in_layer,
            tick: 0,
            resident: HashMap::new(),
            by_layer: vec![BTreeMap::new(); trace.layers],
            global: BTreeMap::new(),
        }
    }

    fn holds(&self, key: ExpertKey) -> bool {
        self.pinned.contains(&key) || self.resident.contains_key(&key)
    }

    fn evict(&mut self, victim: ExpertKey) {
        if let Some(t) = self.resident.remove(&victim) {
            self.by_layer[victim.layer as usize].remove(&t);
            self.global.remove(&t);
        }
    }

    /// One fetch of `key`: whether it was resident.
    fn access(&mut self, key: ExpertKey) -> bool {
        let l = key.layer as usize;
        self.tick += 1;
        let tick = self.tick;
        if self.pinned.contains(&key) {
            return true;
        }
        if let Some(old) = self.resident.insert(key, tick) {
            self.by_layer[l].remove(&old);
            self.by_layer[l].insert(tick, key.expert);
            self.global.remove(&old);
            self.global.insert(tick, key);
            return true;
        }
        self.resident.remove(&key);
        let layer_room = self
            .cap
            .per_layer
            .map(|c| c.saturating_sub(self.pinned_in_layer[l]));
        let total_room = self.cap.total.map(|t| t.saturating_sub(self.pinned.len()));
        if layer_room == Some(0) || total_room == Some(0) {
            return false;
        }
        if let Some(room) = layer_room {
            while self.by_layer[l].len() >= room {
                let Some((_, &e)) = self.by_layer[l].first_key_value() else {
                    break;
                };
                self.evict(ExpertKey::new(key.layer, e));
            }
        }
        if let Some(room) = total_room {
            while self.global.len() >= room {
                let Some((_, &victim)) = self.global.first_key_value() else {
                    break;
                };
                self.evict(victim);
            }
        }
        self.resident.insert(key, tick);
        self.by_layer[l].insert(tick, key.expert);
        self.global.insert(tick, key);
        false
    }
}

/// The fewest loads any policy holding at most `cap` experts could make
/// over the steps from `count_from` on: Belady's rule (on a miss, drop the
/// resident expert needed furthest in the future, or do not keep the new
/// one if it is needed later than all of them), starting from the best
/// possible contents (the experts needed soonest), so neither the warm-up
/// nor the policy's choices before `count_from` can make the bound loose
/// in the run's favour.
///
/// With both limits, each is replayed alone and the larger count is kept:
/// each alone is a lower bound, so both are. Bytes assume one size per
/// layer's experts, as every family stores them.
pub fn optimal(trace: &RoutingTrace, cap: Capacity, count_from: usize) -> Outcome {
    let window = &trace.keys()[trace.key_offset(count_from.min(trace.steps()))..];
    let mut best = Outcome {
        accesses: window.len() as u64,
        hits: window.len() as u64,
        loads: 0,
        bytes: 0,
    };
    let mut keep_larger = |o: Outcome| {
        if o.loads > best.loads || (o.loads == best.loads && o.bytes > best.bytes) {
            best = o;
        }
    };
    if let Some(c) = cap.per_layer {
        let mut all = Outcome::default();
        for l in 0..trace.layers as u32 {
            let seq: Vec<ExpertKey> = window.iter().copied().filter(|k| k.layer == l).collect();
            let o = belady(&seq, c, trace);
            all.accesses += o.accesses;
            all.hits += o.hits;
            all.loads += o.loads;
            all.bytes += o.bytes;
        }
        keep_larger(all);
    }
    if let Some(t) = cap.total {
        keep_larger(belady(window, t, trace));
    }
    best
}

fn belady(seq: &[ExpertKey], cap: usize, trace: &RoutingTrace) -> Outcome {
    const NEVER: usize = usize::MAX;
    let mut next = vec![NEVER; seq.len()];
    let mut first: HashMap<ExpertKey, usize> = HashMap::new();
    for (i, &k) in seq.iter().enumerate().rev() {
        if let Some(j) = first.insert(k, i) {
            next[i] = j;
        }
    }
    // The best start: the `cap` experts needed soonest.
    let mut firsts: Vec<(usize, ExpertKey)> = first.iter().map(|(&k, &i)| (i, k)).collect();
    firsts.sort_unstable();
    let order = |k: ExpertKey| (k.layer, k.expert);
    let mut by_next: BTreeSet<(usize, (u32, u32))> = BTreeSet::new();
    let mut resident: HashMap<ExpertKey, usize> = HashMap::new();
    for &(i, k) in firsts.iter().take(cap) {
        by_next.insert((i, order(k)));
        resident.insert(k, i);
    }
    let mut out = Outcome::default();
    for (i, &k) in seq.iter().enumerate() {
        let hit = match resident.get_mut(&k) {
            Some(n) => {
                by_next.remove(&(*n, order(k)));
                *n = next[i];
                by_next.insert((next[i], order(k)));
                true
            }
            None => {
                if cap > 0 {
                    if resident.len() < cap {
                        resident.insert(k, next[i]);
                        by_next.insert((next[i], order(k)));
                    } else if let Some(&(far, (vl, ve))) = by_next.last()
                        && next[i] < far
                    {
                        by_next.remove(&(far, (vl, ve)));
                        resident.remove(&ExpertKey::new(vl, ve));
                        resident.insert(k, next[i]);
                        by_next.insert((next[i], order(k)));
                    }
                }
                false
            }
        };
        out.count(hit, trace.bytes_of(k.layer));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace_of(layers: usize, experts: usize, steps: &[&[(u32, u32)]]) -> RoutingTrace {
        let mut t = RoutingTrace::new(layers, experts, 1, vec![10; layers]);
        for s in steps {
            let keys: Vec<ExpertKey> = s.iter().map(|&(l, e)| ExpertKey::new(l, e)).collect();
            t.push_step(&keys);
        }
        t
    }

    /// Every policy of `cap` slots over `seq` (one layer, experts < 4),
    /// enumerated: the fewest loads any of them makes, any start allowed.
    fn brute_force(seq: &[u32], cap: usize) -> u64 {
        fn go(seq: &[u32], cap: usize, cache: u8) -> u64 {
            let Some((&x, rest)) = seq.split_first() else {
                return 0;
            };
            let bit = 1u8 << x;
            if cache & bit != 0 {
                return go(rest, cap, cache);
            }
            // A miss: keep the cache, or put x in place of any subset member.
            let mut best = 1 + go(rest, cap, cache);
            if (cache.count_ones() as usize) < cap {
                best = best.min(1 + go(rest, cap, cache | bit));
            }
            for v in 0..4 {
                if cache & (1 << v) != 0 {
                    best = best.min(1 + go(rest, cap, (cache & !(1 << v)) | bit));
                }
            }
            best
        }
        (0u8..16)
            .filter(|c| c.count_ones() as usize <= cap)
            .map(|c| go(seq, cap, c))
            .min()
            .unwrap_or(0)
    }

    #[test]
    fn optimal_equals_exhaustive_search_and_never_exceeds_lru() {
        let mut rng = crate::synth::WyRand::new(7);
        for round in 0..300 {
            let len = 1 + (rng.next_u64() % 14) as usize;
            let seq: Vec<u32> = (0..len).map(|_| (rng.next_u64() % 4) as u32).collect();
            let cap = (round % 4) as usize;
            let steps: Vec<Vec<(u32, u32)>> = seq.iter().map(|&e| vec![(0, e)]).collect();
            let refs: Vec<&[(u32, u32)]> = steps.iter().map(Vec::as_slice).collect();
            let t = trace_of(1, 4, &refs);
            let opt = optimal(&t, Capacity::per_layer(cap), 0);
            assert_eq!(opt.loads, brute_force(&seq, cap), "{seq:?} cap {cap}");
            let total = optimal(
                &t,
                Capacity {
                    per_layer: None,
                    total: Some(cap),
                },
                0,
            );
            assert_eq!(total.loads, opt.loads, "one layer: both limits are one");
            // LRU starts empty, so it may only do worse.
            assert!(lru(&t, Capacity::per_layer(cap), &[], 0).loads >= opt.loads);
            assert_eq!(opt.accesses, len as u64);
            assert_eq!(opt.bytes, opt.loads * 10);
        }
    }

    /// A plain per-layer LRU: a list per layer, most recent last.
    fn simple_lru(t: &RoutingTrace, cap: usize, pins: &[u32], from: usize) -> u64 {
        let mut lists: Vec<Vec<u32>> = vec![Vec::new(); t.layers];
        let room = cap.saturating_sub(pins.len());
        let mut loads = 0;
        for s in 0..t.steps() {
            // Each layer's resident experts first, then its missing ones.
            let mut keys: Vec<ExpertKey> = t.step(s).to_vec();
            keys.sort_by_key(|k| {
                let held = pins.contains(&k.expert) || lists[k.layer as usize].contains(&k.expert);
                (k.layer, !held)
            });
            for k in &keys {
                if pins.contains(&k.expert) {
                    continue;
                }
                let list = &mut lists[k.layer as usize];
                if let Some(i) = list.iter().position(|&e| e == k.expert) {
                    list.remove(i);
                } else {
                    loads += u64::from(s >= from);
                    if list.len() >= room && !list.is_empty() {
                        list.remove(0);
                    }
                }
                if room > 0 {
                    list.push(k.expert);
                }
            }
        }
        loads
    }

    #[test]
    fn lru_matches_a_plain_model() {
        let mut rng = crate::synth::WyRand::new(11);
        for round in 0..200 {
            let (layers, experts) = (1 + round % 3, 2 + round % 7);
            let mut t = RoutingTrace::new(layers, experts, 2, vec![1; layers]);
            for _ in 0..(rng.next_u64() % 60) {
                let keys: Vec<ExpertKey> = (0..layers as u32)
                    .flat_map(|l| {
                        let a = (rng.next_u64() % experts as u64) as u32;
                        let b = (a + 1 + (rng.next_u64() % (experts as u64 - 1)) as u32) % experts as u32;
                        [ExpertKey::new(l, a), ExpertKey::new(l, b)]
                    })
                    .collect();
                t.push_step(&keys);
            }
            let cap = (rng.next_u64() % 6) as usize;
            let pin = (rng.next_u64() % experts as u64) as u32;
            let from = t.steps() / 2;
            let pins_every = vec![vec![pin]; layers];
            assert_eq!(
                lru(&t, Capacity::per_layer(cap), &[], from).loads,
                simple_lru(&t, cap, &[], from)
            );
            if cap > 0 {
                assert_eq!(
                    lru(&t, Capacity::per_layer(cap), &pins_every, from).loads,
                    simple_lru(&t, cap, &[pin], from),
                    "round {round}"
                );
            }
        }
    }

    #[test]
    fn lru_evicts_the_oldest_and_keeps_pins() {
        // cap 2: a b c a -> a evicted by c, so the second a loads.
        let t = trace_of(1, 4, &[&[(0, 0)], &[(0, 1)], &[(0, 2)], &[(0, 0)]]);
        assert_eq!(lru(&t, Capacity::per_layer(2), &[], 0).loads, 4);
        // a pinned: only b and c load (a's start-up read is not counted).
        let pinned = lru(&t, Capacity::per_layer(2), &[vec![0]], 0);
        assert_eq!((pinned.loads, pinned.hits), (2, 2));
        // Counting from step 3 only: the replay still warms on 0..3.
        assert_eq!(
            lru(&t, Capacity::per_layer(3), &[], 3),
            Outcome {
                accesses: 1,
                hits: 1,
                loads: 0,
                bytes: 0
            }
        );
        // A total limit evicts across layers.
        let t = trace_of(2, 2, &[&[(0, 0)], &[(1, 0)], &[(0, 0)]]);
        let one = Capacity {
            per_layer: None,
            total: Some(1),
        };
        assert_eq!(lru(&t, one, &[], 0).loads, 3);
        assert_eq!(
            optimal(&t, one, 0).loads,
            1,
            "the best start holds layer 0's expert"
        );
        assert_eq!(optimal(&t, Capacity::default(), 0).loads, 0);
    }
}
