//! Pilot recall: of the experts a layer really routed to, how many had been
//! predicted. Predictions and routings may arrive in either order; the pair
//! is counted once both are known.

use std::collections::BTreeMap;

use crate::tag::Tag;

#[derive(Default)]
struct Record {
    predicted: Option<Vec<u32>>,
    routed: Option<Vec<u32>>,
}

/// Bound on remembered (step, layer) records, for callers that never
/// announce new steps.
const MAX_RECORDS: usize = 4096;

/// Owned by the coordinator.
#[derive(Default)]
pub(crate) struct RecallTracker {
    records: BTreeMap<(u64, u64, u32), Record>,
    pub hits: u64,
    pub routed: u64,
}

fn key(tag: Tag) -> (u64, u64, u32) {
    (tag.generation, tag.step, tag.layer)
}

impl RecallTracker {
    pub fn predicted(&mut self, tag: Tag, experts: &[u32]) {
        let r = self.records.entry(key(tag)).or_default();
        if r.predicted.is_none() {
            r.predicted = Some(experts.to_vec());
        }
        self.settle(tag);
    }

    pub fn routed(&mut self, tag: Tag, experts: &[u32]) {
        let r = self.records.entry(key(tag)).or_default();
        if r.routed.is_none() {
            let mut v = experts.to_vec();
            v.sort_unstable();
            v.dedup();
            r.routed = Some(v);
        }
        self.settle(tag);
    }

    fn settle(&mut self, tag: Tag) {
        let k = key(tag);
        if let Some(Record {
            predicted: Some(p),
            routed: Some(r),
        }) = self.records.get(&k)
        {
            self.hits += r.iter().filter(|e| p.contains(e)).count() as u64;
            self.routed += r.len() as u64;
            self.records.remove(&k);
        }
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
    fn counts_in_either_order() {
        let mut r = RecallTracker::default();
        let t = Tag::new(1, 2, 3);
        r.predicted(t, &[1, 2, 3, 4]);
        r.routed(t, &[2, 4, 9, 9]);
        assert_eq!((r.hits, r.routed), (2, 3));
        let u = t.at_layer(4);
        r.routed(u, &[5]);
        r.predicted(u, &[5]);
        assert_eq!((r.hits, r.routed), (3, 4));
        r.routed(t.at_layer(5), &[1]);
        r.prune(Tag::new(1, 3, 0));
        assert!(r.records.is_empty());
    }
}
