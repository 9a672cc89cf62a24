//! Pilot recall and precision: of the experts a layer really routed to, how
//! many had been predicted in time; of the experts predicted, how many were
//! routed.
//!
//! A prediction only helps if it reaches the coordinator before the layer's
//! fetch does (that is when its prefetch can start). So a routing is
//! settled when it arrives: against the prediction if one is there, else as
//! all-missed (the residual was dropped from a full pilot inbox, went stale,
//! or the pilot is still working on it). A prediction arriving after its
//! routing is counted as late, and scored apart (what it would have caught)
//! as the pilot's accuracy with timing left out. Counting only the pairs that met would flatter the pilot
//! exactly when it falls behind.

use std::collections::{BTreeMap, BTreeSet};

use crate::tag::Tag;

#[derive(Default)]
struct Record {
    predicted: Option<Vec<u32>>,
    /// The routed experts, kept to score a late prediction.
    routed: Vec<u32>,
    /// The routing arrived and was counted (a second fetch of the same
    /// layer and step counts nothing).
    settled: bool,
}

/// Bound on remembered (step, layer) records, for callers that never
/// announce new steps.
const MAX_RECORDS: usize = 4096;

/// Owned by the coordinator.
#[derive(Default)]
pub(crate) struct RecallTracker {
    records: BTreeMap<(u64, u64, u32), Record>,
    /// Layers that have received a prediction at least once. Routings of
    /// other layers are not counted: the model never offers the pilot a
    /// residual for them (OLMoE's layer 0, which has no layer before it).
    predicted_layers: BTreeSet<u32>,
    /// Routed experts that had been predicted in time.
    pub hits: u64,
    /// Routed experts on predicted layers (recall denominator).
    pub routed: u64,
    /// Experts in predictions that reached their routing in time
    /// (precision denominator).
    pub predicted: u64,
    /// Routings that found no prediction, and their routed experts.
    pub unpredicted: u64,
    pub unpredicted_routed: u64,
    /// Predictions that arrived after their routing, how many of the routed
    /// experts they would have caught, and of how many: the pilot's
    /// accuracy with timing left out.
    pub late: u64,
    pub late_hits: u64,
    pub late_routed: u64,
}

fn key(tag: Tag) -> (u64, u64, u32) {
    (tag.generation, tag.step, tag.layer)
}

impl RecallTracker {
    pub fn predicted(&mut self, tag: Tag, experts: &[u32]) {
        self.predicted_layers.insert(tag.layer);
        let r = self.records.entry(key(tag)).or_default();
        if let Some(p) = &mut r.predicted {
            // A refined prediction for the same layer and step (from a later
            // residual) adds its new experts while the routing is still to
            // come; after it, nothing more can be prefetched in time.
            if !r.settled {
                for &e in experts {
                    if !p.contains(&e) {
                        p.push(e);
                    }
                }
            }
            return;
        }
        r.predicted = Some(experts.to_vec());
        if r.settled {
            self.late += 1;
            self.late_hits += r.routed.iter().filter(|e| experts.contains(e)).count() as u64;
            self.late_routed += r.routed.len() as u64;
        }
        self.bound();
    }

    pub fn routed(&mut self, tag: Tag, experts: &[u32]) {
        if !self.predicted_layers.contains(&tag.layer) {
            return;
        }
        let mut v = experts.to_vec();
        v.sort_unstable();
        v.dedup();
        let r = self.records.entry(key(tag)).or_default();
        if r.settled {
            return;
        }
        r.settled = true;
        self.routed += v.len() as u64;
        match &r.predicted {
            Some(p) => {
                self.hits += v.iter().filter(|e| p.contains(e)).count() as u64;
                self.predicted += p.len() as u64;
            }
            None => {
                self.unpredicted += 1;
                self.unpredicted_routed += v.len() as u64;
                r.routed = v;
            }
        }
        self.bound();
    }

    fn bound(&mut self) {
        while self.records.len() > MAX_RECORDS {
            self.records.pop_first();
        }
    }

    /// Forgets records of steps before `current`.
    pub fn prune(&mut self, current: Tag) {
        self.records = self.records.split_off(&(current.generation, current.step, 0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refined_prediction_adds_its_new_experts_until_the_routing() {
        let mut r = RecallTracker::default();
        let t = Tag::new(1, 2, 3);
        r.predicted(t, &[1, 2]);
        r.predicted(t, &[2, 5]);
        r.routed(t, &[5, 1]);
        // Both routed experts were predicted, by one guess or the other;
        // three experts were predicted in all.
        assert_eq!((r.hits, r.routed, r.predicted), (2, 2, 3));
        // After the routing, a further guess changes nothing.
        r.predicted(t, &[7]);
        assert_eq!((r.hits, r.routed, r.predicted, r.late), (2, 2, 3, 0));
        // A late first guess is scored once, whatever follows it (layer 4
        // was predicted at an earlier step, so its routings count).
        r.predicted(Tag::new(1, 1, 4), &[]);
        let u = t.at_layer(4);
        r.routed(u, &[4]);
        r.predicted(u, &[4]);
        r.predicted(u, &[6]);
        assert_eq!((r.late, r.late_hits, r.late_routed), (1, 1, 1));
    }

    #[test]
    fn timely_late_and_missing_predictions() {
        let mut r = RecallTracker::default();
        // Layers 3..=5 have been predicted before (an earlier step).
        for l in 3..=5 {
            r.predicted(Tag::new(1, 1, l), &[]);
        }
        let t = Tag::new(1, 2, 3);
        r.predicted(t, &[1, 2, 3, 4]);
        r.routed(t, &[2, 4, 9, 9]);
        assert_eq!((r.hits, r.routed, r.predicted), (2, 3, 4));
        // Routed before its prediction arrived: all missed, prediction late.
        let u = t.at_layer(4);
        r.routed(u, &[5]);
        assert_eq!((r.hits, r.routed, r.unpredicted), (2, 4, 1));
        r.predicted(u, &[5, 6]);
        assert_eq!((r.hits, r.routed, r.predicted, r.late), (2, 4, 4, 1));
        assert_eq!((r.late_hits, r.late_routed), (1, 1));
        // A routing whose prediction never comes (dropped): a miss.
        r.routed(t.at_layer(5), &[1, 7]);
        assert_eq!((r.hits, r.routed, r.unpredicted), (2, 6, 2));
        // A layer never predicted (OLMoE's layer 0) is not counted.
        r.routed(t.at_layer(0), &[1]);
        assert_eq!(r.routed, 6);
        // A second fetch of a settled layer counts nothing.
        r.routed(t, &[2]);
        r.predicted(t, &[2]);
        assert_eq!((r.hits, r.routed, r.predicted, r.late), (2, 6, 4, 1));
        assert_eq!(r.unpredicted_routed, 3);
        r.prune(Tag::new(1, 3, 0));
        assert!(r.records.is_empty());
    }
}
