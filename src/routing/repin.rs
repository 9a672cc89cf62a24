//! Pins that follow the run's own routing between re-evaluations.

use colibri_actors::ExpertKey;

/// Token steps between two re-evaluations of the pins.
pub const REPIN_EVERY: u64 = 32;
/// Pins swapped per layer at most per re-evaluation.
pub const REPIN_MAX_CHANGES: usize = 1;

/// Pins that follow the run: each layer keeps as many pins as
/// [`super::pins::choose`] gave it, and every [`REPIN_EVERY`] steps the
/// weakest may be swapped for an expert that now scores clearly higher
/// (history plus this run's counts), at most [`REPIN_MAX_CHANGES`] per
/// layer per re-evaluation.
#[derive(Clone, Debug)]
pub struct Pinner {
    base: Vec<f32>,
    layers: usize,
    experts: usize,
    /// Per layer, how many pins it keeps.
    room: Vec<usize>,
    /// Per layer, the pinned experts.
    pub pinned: Vec<Vec<u32>>,
}

impl Pinner {
    /// Starts from the chosen `pins` (per layer); `base`: the decayed
    /// history's counts, layer-major.
    pub fn new(base: Vec<f32>, layers: usize, experts: usize, pins: Vec<Vec<u32>>) -> Self {
        let mut pinned = pins;
        pinned.resize(layers, Vec::new());
        Self {
            base,
            layers,
            experts,
            room: pinned.iter().map(Vec::len).collect(),
            pinned,
        }
    }

    /// Every pinned key.
    pub fn keys(&self) -> Vec<ExpertKey> {
        self.pinned
            .iter()
            .enumerate()
            .flat_map(|(l, es)| es.iter().map(move |&e| ExpertKey::new(l as u32, e)))
            .collect()
    }

    /// A layer's experts by score, best first (ties: lower expert id), only
    /// those ever used.
    fn ranked(&self, layer: usize, live: &[u64]) -> Vec<(u32, f32)> {
        let mut v: Vec<(u32, f32)> = (0..self.experts)
            .map(|e| {
                let i = layer * self.experts + e;
                let s = self.base.get(i).copied().unwrap_or(0.0) + live.get(i).copied().unwrap_or(0) as f32;
                (e as u32, s)
            })
            .filter(|&(_, s)| s > 0.0)
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// Moves the pins toward the current top experts; returns `(pin, unpin)`.
    /// An expert replaces the weakest pin only when it scores more than
    /// 1.25x it plus one fetch, so two near-equal experts do not flap.
    pub fn reevaluate(&mut self, live: &[u64]) -> (Vec<ExpertKey>, Vec<ExpertKey>) {
        let (mut pin, mut unpin) = (Vec::new(), Vec::new());
        for l in 0..self.layers {
            if self.room[l] == 0 {
                continue;
            }
            let ranked = self.ranked(l, live);
            let score = |e: u32| ranked.iter().find(|r| r.0 == e).map_or(0.0, |r| r.1);
            let mut changes = 0;
            for &(cand, s) in &ranked {
                if changes >= REPIN_MAX_CHANGES {
                    break;
                }
                if self.pinned[l].contains(&cand) {
                    continue;
                }
                let key = |e: u32| ExpertKey::new(l as u32, e);
                if self.pinned[l].len() < self.room[l] {
                    self.pinned[l].push(cand);
                    pin.push(key(cand));
                    changes += 1;
                    continue;
                }
                let Some((wi, &weakest)) = self.pinned[l]
                    .iter()
                    .enumerate()
                    .min_by(|a, b| score(*a.1).total_cmp(&score(*b.1)).then(b.1.cmp(a.1)))
                else {
                    break;
                };
                if s > score(weakest) * 1.25 + 1.0 {
                    self.pinned[l][wi] = cand;
                    unpin.push(key(weakest));
                    pin.push(key(cand));
                    changes += 1;
                } else {
                    // Ranked best first: no later candidate beats it either.
                    break;
                }
            }
        }
        (pin, unpin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_follow_with_bounded_churn() {
        let base = vec![5.0, 0.0, 1.5, 9.0, 0.0, 2.0, 2.0, 7.0];
        let mut p = Pinner::new(base, 2, 4, vec![vec![3, 0], vec![3, 1]]);
        assert_eq!(p.keys().len(), 4);
        // Nothing changed: no churn.
        assert_eq!(p.reevaluate(&[0; 8]), (vec![], vec![]));
        // Layer 0's expert 2 becomes hottest: it replaces the weakest pin
        // (0), one swap per evaluation even though layer 1 also shifted.
        let live = [0, 0, 40, 0, 0, 0, 30, 30];
        let (pin, unpin) = p.reevaluate(&live);
        assert_eq!(pin, vec![ExpertKey::new(0, 2), ExpertKey::new(1, 2)]);
        assert_eq!(unpin, vec![ExpertKey::new(0, 0), ExpertKey::new(1, 1)]);
        for l in &p.pinned {
            assert_eq!(l.len(), 2, "never more than the room");
        }
        // Near-equal scores do not flap.
        assert_eq!(p.reevaluate(&live), (vec![], vec![]));
        // A layer the choice gave no pins never gains any.
        let mut q = Pinner::new(vec![1.0; 8], 2, 4, vec![vec![], vec![0]]);
        let (pin, _) = q.reevaluate(&[50, 50, 50, 50, 0, 0, 0, 0]);
        assert!(pin.iter().all(|k| k.layer == 1), "{pin:?}");
        assert!(q.pinned[0].is_empty());
    }
}
