//! The pin policy: which experts stay resident whatever LRU would do.
//!
//! Candidates are the usage history's hottest experts of each layer. How
//! many are pinned is decided by replaying the recorded routing through the
//! cache at this run's capacity, held out: the candidates of the replay are
//! ranked on the first half of the trace only, and judged on the second
//! half (the cache warmed on the first), so a pin set that only fits the
//! steps it was ranked on (chance in a flat routing) does not pass. Each
//! count from none up to one short of the layer's share of the cache is
//! tried, and pins are taken only where they save at least [`MIN_GAIN`] of
//! LRU's loads and more than chance would ([`NOISE_SIGMAS`]); the pins then taken are that many of the history's hottest.
//! A cache that holds no more than one token's experts per layer
//! (`cap <= top-k`) pins nothing: every slot is needed for the current
//! token.

use colibri_actors::ExpertKey;

use super::RoutingTrace;
use super::replay::{self, Capacity, Outcome};

/// Share of LRU's loads pins must save to be taken.
pub const MIN_GAIN: f64 = 0.02;
/// And at least this many times the square root of LRU's loads: a count
/// of `n` loads varies by about `sqrt(n)` between two stretches of the same
/// routing, so a smaller saving can be chance (a flat routing's replay
/// finds one about half the time).
pub const NOISE_SIGMAS: f64 = 3.0;

/// What [`choose`] decided, with the replays behind it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PinChoice {
    /// Per layer, the experts to pin (empty: none).
    pub pins: Vec<Vec<u32>>,
    /// The held-out half of the replay with LRU alone.
    pub lru: Outcome,
    /// The held-out half with the pins (ranked on the first half).
    pub pinned: Outcome,
    /// Why no pins were taken, when none were.
    pub why_none: Option<String>,
}

impl PinChoice {
    pub fn count(&self) -> usize {
        self.pins.iter().map(Vec::len).sum()
    }

    fn none(layers: usize, lru: Outcome, why: String) -> Self {
        Self {
            pins: vec![Vec::new(); layers],
            lru,
            pinned: lru,
            why_none: Some(why),
        }
    }
}

/// Pins for a cache of `cap` from `ranking` (per layer, experts by usage,
/// hottest first), tested on `trace`. `max_share` (in (0, 1]) caps the
/// share of a layer's cache pins may take.
pub fn choose(trace: &RoutingTrace, ranking: &[Vec<u32>], cap: Capacity, max_share: f64) -> PinChoice {
    let layers = trace.layers;
    if trace.accesses() == 0 {
        return PinChoice::none(layers, Outcome::default(), "no recorded routing to replay".into());
    }
    if cap.unlimited() {
        return PinChoice::none(layers, Outcome::default(), "the cache holds every expert".into());
    }
    let share = if max_share.is_nan() {
        0.0
    } else {
        max_share.clamp(0.0, 1.0)
    };
    // A total that holds every layer's per-layer share does not bind:
    // layers then do not compete for room.
    let routed = trace.routed_layers().max(1);
    match (cap.total, cap.per_layer) {
        (Some(total), Some(c)) if total >= c.saturating_mul(routed) => per_layer(trace, ranking, cap, share),
        (Some(total), _) => uniform(trace, ranking, cap, total, share),
        (None, _) => per_layer(trace, ranking, cap, share),
    }
}

/// The most pins a layer whose cache holds `c` experts may take.
fn most_pins(c: usize, top_k: usize, share: f64) -> usize {
    if c <= top_k {
        return 0;
    }
    ((c as f64 * share).floor() as usize).min(c - 1)
}

fn gain_enough(lru: &Outcome, pinned: &Outcome) -> bool {
    let saved = lru.loads as f64 - pinned.loads as f64;
    let need = (lru.loads as f64 * MIN_GAIN).max(NOISE_SIGMAS * (lru.loads as f64).sqrt());
    saved > 0.0 && saved >= need
}

/// The half of a trace the replay ranks on, and the held-out half it
/// judges (as the step the count starts from).
fn halves(trace: &RoutingTrace) -> (Vec<Vec<u32>>, usize) {
    let split = trace.steps() / 2;
    let train = trace.slice(0..split);
    (ranking(&counts_of(&train), trace.layers, trace.experts), split)
}

/// Only a per-layer limit: layers do not share room, so each layer's pin
/// count is chosen on its own routing.
fn per_layer(trace: &RoutingTrace, ranking: &[Vec<u32>], cap: Capacity, share: f64) -> PinChoice {
    let c = cap.per_layer.unwrap_or(0);
    let (train_rank, split) = halves(trace);
    let full_lru = replay::lru(trace, cap, &[], split);
    if c <= trace.top_k {
        return PinChoice::none(
            trace.layers,
            full_lru,
            format!(
                "--cache-cap {c} holds no more than one token's top-{} experts per layer",
                trace.top_k
            ),
        );
    }
    let mut choice = PinChoice {
        pins: vec![Vec::new(); trace.layers],
        lru: full_lru,
        pinned: Outcome::default(),
        why_none: None,
    };
    for l in 0..trace.layers {
        let layer_trace = one_layer(trace, l);
        let lru = replay::lru(&layer_trace, cap, &[], split);
        let mut best = (lru, 0usize);
        let tried = train_rank.get(l).map_or(&[][..], Vec::as_slice);
        let candidates = ranking.get(l).map_or(&[][..], Vec::as_slice);
        let most = most_pins(c, trace.top_k, share)
            .min(tried.len())
            .min(candidates.len());
        for p in 1..=most {
            let o = replay::lru(&layer_trace, cap, &[tried[..p].to_vec()], split);
            if o.loads < best.0.loads {
                best = (o, p);
            }
        }
        let (o, p) = if gain_enough(&lru, &best.0) {
            best
        } else {
            (lru, 0)
        };
        choice.pins[l] = candidates[..p].to_vec();
        choice.pinned.accesses += o.accesses;
        choice.pinned.hits += o.hits;
        choice.pinned.loads += o.loads;
        choice.pinned.bytes += o.bytes;
    }
    if choice.count() == 0 {
        choice.pinned = choice.lru;
        choice.why_none = Some(no_gain(trace, split));
    }
    choice
}

fn no_gain(trace: &RoutingTrace, split: usize) -> String {
    format!(
        "ranked on {split} recorded steps and replayed on the next {}, no pin set saved more than LRU's loads vary by chance",
        trace.steps() - split
    )
}

/// A byte budget shared by all layers: one pin count for every layer,
/// chosen on a replay of the whole trace.
fn uniform(trace: &RoutingTrace, ranking: &[Vec<u32>], cap: Capacity, total: usize, share: f64) -> PinChoice {
    let (train_rank, split) = halves(trace);
    let lru = replay::lru(trace, cap, &[], split);
    let routed = trace.routed_layers().max(1);
    let mut c = total / routed;
    if let Some(pl) = cap.per_layer {
        c = c.min(pl);
    }
    if c <= trace.top_k {
        return PinChoice::none(
            trace.layers,
            lru,
            format!(
                "the cache holds {c} experts a layer, no more than one token's top-{}",
                trace.top_k
            ),
        );
    }
    let top = |rank: &[Vec<u32>], p: usize| -> Vec<Vec<u32>> {
        (0..trace.layers)
            .map(|l| rank.get(l).map_or(Vec::new(), |r| r[..p.min(r.len())].to_vec()))
            .collect()
    };
    let mut best: Option<(Outcome, usize)> = None;
    for p in 1..=most_pins(c, trace.top_k, share) {
        let o = replay::lru(trace, cap, &top(&train_rank, p), split);
        if best.as_ref().is_none_or(|b| o.loads < b.0.loads) {
            best = Some((o, p));
        }
    }
    match best {
        Some((o, p)) if gain_enough(&lru, &o) => PinChoice {
            pins: top(ranking, p),
            lru,
            pinned: o,
            why_none: None,
        },
        _ => PinChoice::none(trace.layers, lru, no_gain(trace, split)),
    }
}

/// Layer `l`'s fetches as a trace of one layer.
fn one_layer(trace: &RoutingTrace, l: usize) -> RoutingTrace {
    let mut t = RoutingTrace::new(1, trace.experts, trace.top_k, vec![trace.bytes_of(l as u32)]);
    let mut keys = Vec::new();
    for s in 0..trace.steps() {
        keys.clear();
        keys.extend(
            trace
                .step(s)
                .iter()
                .filter(|k| k.layer as usize == l)
                .map(|k| ExpertKey::new(0, k.expert)),
        );
        t.push_step(&keys);
    }
    t
}

/// Per layer, the experts of `counts` (layer-major, `experts` a layer) by
/// count, highest first, ties by lower id; never-used experts left out.
pub fn ranking(counts: &[f32], layers: usize, experts: usize) -> Vec<Vec<u32>> {
    (0..layers)
        .map(|l| {
            let mut v: Vec<(u32, f32)> = (0..experts)
                .filter_map(|e| {
                    let c = counts.get(l * experts + e).copied().unwrap_or(0.0);
                    (c > 0.0).then_some((e as u32, c))
                })
                .collect();
            v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            v.into_iter().map(|(e, _)| e).collect()
        })
        .collect()
}

/// Fetch counts per `(layer, expert)` of a trace, layer-major.
pub fn counts_of(trace: &RoutingTrace) -> Vec<f32> {
    let mut c = vec![0f32; trace.layers * trace.experts];
    for k in trace.keys() {
        if let Some(x) = c.get_mut(k.layer as usize * trace.experts + k.expert as usize) {
            *x += 1.0;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::WyRand;

    /// One layer, `experts` experts, top-2 picks per step from `pick`.
    fn trace(experts: usize, steps: usize, mut pick: impl FnMut(usize) -> [u32; 2]) -> RoutingTrace {
        let mut t = RoutingTrace::new(1, experts, 2, vec![100]);
        for s in 0..steps {
            let [a, b] = pick(s);
            t.push_step(&[ExpertKey::new(0, a), ExpertKey::new(0, b)]);
        }
        t
    }

    #[test]
    fn no_pins_where_pinning_cannot_help() {
        // Uniform routing: no expert is hotter than another, so a pinned
        // expert is as likely to be needed as any LRU slot's.
        let mut rng = WyRand::new(3);
        let uniform = trace(16, 2000, |_| {
            let a = (rng.next_u64() % 16) as u32;
            [a, (a + 1 + (rng.next_u64() % 15) as u32) % 16]
        });
        let rank = ranking(&counts_of(&uniform), 1, 16);
        for cap in 2..=16 {
            let c = choose(&uniform, &rank, Capacity::per_layer(cap), 1.0);
            assert_eq!(c.count(), 0, "cap {cap}: {c:?}");
            assert!(c.why_none.is_some());
            assert_eq!(c.pinned, c.lru);
        }
        // cap <= top-k: nothing pinned, whatever the skew.
        let skewed = trace(16, 200, |s| [0, 1 + (s % 15) as u32]);
        let c = choose(
            &skewed,
            &ranking(&counts_of(&skewed), 1, 16),
            Capacity::per_layer(2),
            1.0,
        );
        assert_eq!(c.count(), 0);
        assert!(c.why_none.as_deref().unwrap_or("").contains("top-2"), "{c:?}");
    }

    #[test]
    fn pins_where_a_hot_expert_is_evicted_by_a_scan() {
        // Expert 0 every third step beside a scan of fresh experts: at
        // cap 3 LRU evicts 0 before it comes back, a pin keeps it.
        let scan = trace(16, 300, |s| {
            let x = 1 + (2 * s % 15) as u32;
            let y = 1 + ((2 * s + 1) % 15) as u32;
            if s % 3 == 0 { [0, x] } else { [x, y] }
        });
        let rank = ranking(&counts_of(&scan), 1, 16);
        assert_eq!(rank[0][0], 0, "expert 0 is the hottest");
        let c = choose(&scan, &rank, Capacity::per_layer(3), 1.0);
        assert!(c.pins[0].contains(&0), "{c:?}");
        assert!(c.pinned.loads < c.lru.loads);
        // The share caps the count: none may be taken at share 0.
        assert_eq!(choose(&scan, &rank, Capacity::per_layer(3), 0.0).count(), 0);
        // A shared budget picks one count for every layer.
        let total = Capacity {
            per_layer: None,
            total: Some(3),
        };
        let both = choose(&scan, &rank, total, 1.0);
        assert!(both.pins[0].contains(&0), "{both:?}");
        // Never worse than LRU on the trace it was chosen on.
        for cap in 2..=16 {
            let c = choose(&scan, &rank, Capacity::per_layer(cap), 1.0);
            assert!(c.pinned.loads <= c.lru.loads, "cap {cap}");
        }
    }
}
