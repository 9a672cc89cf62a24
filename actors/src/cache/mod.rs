//! The expert cache: which decoded experts stay resident.
//!
//! Owned by exactly one thread (the pipeline coordinator), so it needs no
//! locks. Entries are `Arc<T>`: evicting one only drops the cache's reference,
//! so weights a running matmul still holds are never freed under it.
//!
//! Policy: a per-layer LRU with an optional per-layer capacity, a global byte
//! budget enforced by evicting the least recently used unpinned entry of any
//! layer, and a pinned set that is never evicted (pinned entries count toward
//! the byte budget and toward their layer's capacity: a layer with `p` pins
//! and capacity `c` keeps at most `c - p` unpinned entries).

mod budget;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub use budget::{
    MemoryHeadroom, MemorySource, default_ram_budget, mem_available_bytes, memory_headroom,
    memory_headroom_at,
};

use crate::expert::ExpertKey;

struct Entry<T> {
    value: Arc<T>,
    bytes: u64,
    tick: u64,
    pinned: bool,
    /// Bytes a prefetch read for this entry that no fetch has used yet:
    /// counted as used on the first delivery, as wasted if evicted first.
    unused_read: u64,
}

/// Limits of an [`ExpertCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheLimits {
    /// Experts kept per layer, pinned ones included; `Some(0)` disables
    /// caching (pins are still kept).
    pub per_layer: Option<usize>,
    /// Bytes (by `ExpertDecoder::resident_bytes`) the cache may hold.
    pub bytes: Option<u64>,
}

/// Per-layer counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerCounters {
    pub hits: Vec<u64>,
    pub misses: Vec<u64>,
}

/// See the module docs.
pub struct ExpertCache<T> {
    limits: CacheLimits,
    entries: HashMap<ExpertKey, Entry<T>>,
    /// Per layer: tick of last use -> expert, unpinned entries only.
    lru: Vec<BTreeMap<u64, u32>>,
    tick: u64,
    bytes: u64,
    pinned_bytes: u64,
    /// Pinned entries per layer.
    pinned_in_layer: Vec<usize>,
    counters: LayerCounters,
    /// Prefetched bytes later delivered to compute, and prefetched bytes
    /// evicted or discarded before any use (monotonic totals).
    prefetch_used: u64,
    prefetch_wasted: u64,
}

impl<T> ExpertCache<T> {
    pub fn new(layers: usize, limits: CacheLimits) -> Self {
        Self {
            limits,
            entries: HashMap::new(),
            lru: (0..layers).map(|_| BTreeMap::new()).collect(),
            tick: 0,
            bytes: 0,
            pinned_bytes: 0,
            pinned_in_layer: vec![0; layers],
            counters: LayerCounters {
                hits: vec![0; layers],
                misses: vec![0; layers],
            },
            prefetch_used: 0,
            prefetch_wasted: 0,
        }
    }

    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn lru_mut(&mut self, layer: u32) -> Option<&mut BTreeMap<u64, u32>> {
        self.lru.get_mut(layer as usize)
    }

    /// Marks `key` recently used; true when resident.
    pub fn touch(&mut self, key: ExpertKey) -> bool {
        let t = self.next_tick();
        let Some(e) = self.entries.get_mut(&key) else {
            return false;
        };
        let (old, pinned) = (e.tick, e.pinned);
        e.tick = t;
        if !pinned && let Some(l) = self.lru_mut(key.layer) {
            l.remove(&old);
            l.insert(t, key.expert);
        }
        true
    }

    /// The resident expert (touching it) for delivery to compute, without
    /// counting a hit or miss; a prefetched entry's read becomes used.
    pub fn peek(&mut self, key: ExpertKey) -> Option<Arc<T>> {
        if !self.touch(key) {
            return None;
        }
        let e = self.entries.get_mut(&key)?;
        self.prefetch_used += std::mem::take(&mut e.unused_read);
        Some(e.value.clone())
    }

    /// Records that the resident `key` was loaded by a prefetch that read
    /// `read_bytes` and that nobody has used yet.
    pub fn mark_prefetched(&mut self, key: ExpertKey, read_bytes: u64) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.unused_read = read_bytes;
        }
    }

    /// Counts prefetched bytes used straight from the load (a fetch was
    /// already waiting for it).
    pub fn count_prefetch_used(&mut self, bytes: u64) {
        self.prefetch_used += bytes;
    }

    /// Counts prefetched bytes discarded without being cached or used.
    pub fn count_prefetch_wasted(&mut self, bytes: u64) {
        self.prefetch_wasted += bytes;
    }

    /// Prefetched bytes that were delivered to compute (total so far).
    pub fn prefetch_used_bytes(&self) -> u64 {
        self.prefetch_used
    }

    /// Prefetched bytes evicted or discarded before any use (total so far).
    pub fn prefetch_wasted_bytes(&self) -> u64 {
        self.prefetch_wasted
    }

    /// A lookup by compute: counts a hit or a miss for the layer.
    pub fn lookup(&mut self, key: ExpertKey) -> Option<Arc<T>> {
        let found = self.peek(key);
        let l = key.layer as usize;
        let c = if found.is_some() {
            &mut self.counters.hits
        } else {
            &mut self.counters.misses
        };
        if let Some(x) = c.get_mut(l) {
            *x += 1;
        }
        found
    }

    pub fn contains(&self, key: ExpertKey) -> bool {
        self.entries.contains_key(&key)
    }

    fn remove(&mut self, key: ExpertKey) -> Option<Entry<T>> {
        let e = self.entries.remove(&key)?;
        self.bytes -= e.bytes;
        self.prefetch_wasted += e.unused_read;
        if e.pinned {
            self.pinned_bytes -= e.bytes;
            self.count_pin(key.layer, false);
        } else if let Some(l) = self.lru_mut(key.layer) {
            l.remove(&e.tick);
        }
        Some(e)
    }

    /// The least recently used unpinned entry of any layer.
    fn global_victim(&self) -> Option<ExpertKey> {
        self.lru
            .iter()
            .enumerate()
            .filter_map(|(layer, m)| {
                m.first_key_value()
                    .map(|(&t, &e)| (t, ExpertKey::new(layer as u32, e)))
            })
            .min_by_key(|&(t, _)| t)
            .map(|(_, k)| k)
    }

    /// Offers a loaded expert. Evicts as the limits require; returns false
    /// (and keeps nothing) when it cannot fit. An already resident key is
    /// only touched (and pinned if asked).
    pub fn insert(&mut self, key: ExpertKey, value: Arc<T>, bytes: u64, pin: bool) -> bool {
        if self.contains(key) {
            if pin {
                self.pin_resident(key);
            }
            return self.touch(key);
        }
        let Some(layer_lru_len) = self.lru.get(key.layer as usize).map(BTreeMap::len) else {
            return false;
        };
        let pinned_here = self.pinned_in_layer.get(key.layer as usize).copied().unwrap_or(0);
        if !pin && self.limits.per_layer.is_some_and(|cap| pinned_here >= cap) {
            return false;
        }
        if let Some(budget) = self.limits.bytes
            && self.pinned_bytes + bytes > budget
        {
            return false;
        }
        if let Some(cap) = self.limits.per_layer {
            // Room in the layer: its oldest unpinned entries go (a pin may
            // take the place of every unpinned one).
            let mut unpinned = layer_lru_len;
            while unpinned > 0 && unpinned + pinned_here >= cap {
                let victim = self.lru[key.layer as usize].first_key_value().map(|(_, &e)| e);
                let Some(e) = victim else { break };
                self.remove(ExpertKey::new(key.layer, e));
                unpinned -= 1;
            }
        }
        if let Some(budget) = self.limits.bytes {
            while self.bytes + bytes > budget {
                match self.global_victim() {
                    Some(v) => {
                        self.remove(v);
                    }
                    None => return false,
                }
            }
        }
        let tick = self.next_tick();
        if pin {
            self.pinned_bytes += bytes;
            self.count_pin(key.layer, true);
        } else if let Some(l) = self.lru_mut(key.layer) {
            l.insert(tick, key.expert);
        }
        self.bytes += bytes;
        debug_assert!(self.limits.bytes.is_none_or(|b| self.bytes <= b));
        self.entries.insert(
            key,
            Entry {
                value,
                bytes,
                tick,
                pinned: pin,
                unused_read: 0,
            },
        );
        true
    }

    /// Pins a resident expert; false when it is not resident.
    pub fn pin_resident(&mut self, key: ExpertKey) -> bool {
        let Some(e) = self.entries.get_mut(&key) else {
            return false;
        };
        if !e.pinned {
            e.pinned = true;
            let (tick, bytes) = (e.tick, e.bytes);
            self.pinned_bytes += bytes;
            self.count_pin(key.layer, true);
            if let Some(l) = self.lru_mut(key.layer) {
                l.remove(&tick);
            }
        }
        true
    }

    /// Returns a pinned expert to the LRU (it may then be evicted).
    pub fn unpin(&mut self, key: ExpertKey) {
        let Some(e) = self.entries.get_mut(&key) else {
            return;
        };
        if e.pinned {
            e.pinned = false;
            let (tick, bytes) = (e.tick, e.bytes);
            self.pinned_bytes -= bytes;
            self.count_pin(key.layer, false);
            if let Some(l) = self.lru_mut(key.layer) {
                l.insert(tick, key.expert);
            }
            // The layer may now hold more than its capacity: its oldest
            // unpinned entries go.
            if let Some(cap) = self.limits.per_layer {
                let layer = key.layer as usize;
                let pinned_here = self.pinned_in_layer.get(layer).copied().unwrap_or(0);
                while self.lru.get(layer).map_or(0, BTreeMap::len) + pinned_here > cap {
                    let victim = self.lru[layer].first_key_value().map(|(_, &e)| e);
                    let Some(e) = victim else { break };
                    self.remove(ExpertKey::new(key.layer, e));
                }
            }
        }
    }

    fn count_pin(&mut self, layer: u32, pinned: bool) {
        if let Some(n) = self.pinned_in_layer.get_mut(layer as usize) {
            if pinned {
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
            }
        }
    }

    /// Pinned entries of one layer.
    pub fn pinned_in_layer(&self, layer: u32) -> usize {
        self.pinned_in_layer.get(layer as usize).copied().unwrap_or(0)
    }

    /// Bytes held now (never above the byte budget).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn pinned_bytes(&self) -> u64 {
        self.pinned_bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn counters(&self) -> &LayerCounters {
        &self.counters
    }

    /// Resident experts of one layer (unpinned ones in LRU order, oldest
    /// first), for tests and diagnostics.
    pub fn resident_in_layer(&self, layer: u32) -> Vec<u32> {
        self.lru
            .get(layer as usize)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(l: u32, e: u32) -> ExpertKey {
        ExpertKey::new(l, e)
    }

    #[test]
    fn per_layer_lru() {
        let mut c = ExpertCache::new(
            2,
            CacheLimits {
                per_layer: Some(2),
                bytes: None,
            },
        );
        assert!(c.insert(k(0, 1), Arc::new(1), 10, false));
        assert!(c.insert(k(0, 2), Arc::new(2), 10, false));
        assert!(c.insert(k(1, 1), Arc::new(3), 10, false));
        assert!(c.lookup(k(0, 1)).is_some()); // 0/2 is now the LRU of layer 0
        assert!(c.insert(k(0, 3), Arc::new(4), 10, false));
        assert!(!c.contains(k(0, 2)));
        assert!(c.contains(k(0, 1)) && c.contains(k(1, 1)));
        assert_eq!(c.resident_in_layer(0), vec![1, 3]);
        assert!(c.lookup(k(0, 2)).is_none());
        assert_eq!(c.counters().hits, vec![1, 0]);
        assert_eq!(c.counters().misses, vec![1, 0]);
    }

    #[test]
    fn byte_budget_and_pins() {
        let mut c = ExpertCache::new(
            3,
            CacheLimits {
                per_layer: None,
                bytes: Some(100),
            },
        );
        assert!(c.insert(k(0, 0), Arc::new(0), 40, true));
        assert!(c.insert(k(1, 0), Arc::new(1), 30, false));
        assert!(c.insert(k(2, 0), Arc::new(2), 30, false));
        assert_eq!(c.bytes(), 100);
        // Evicts the global LRU (1/0), never the pinned 0/0.
        assert!(c.insert(k(2, 1), Arc::new(3), 30, false));
        assert!(!c.contains(k(1, 0)) && c.contains(k(0, 0)));
        assert!(c.bytes() <= 100);
        // Too big to ever fit next to the pin: refused, nothing evicted.
        assert!(!c.insert(k(1, 5), Arc::new(4), 61, false));
        assert!(c.contains(k(2, 0)) && c.contains(k(2, 1)));
        c.unpin(k(0, 0));
        assert!(c.insert(k(1, 5), Arc::new(4), 61, false));
        assert!(c.bytes() <= 100);
        assert!(!c.contains(k(0, 0)));
    }

    #[test]
    fn pins_take_their_place_within_the_layer_capacity() {
        let mut c = ExpertCache::new(
            2,
            CacheLimits {
                per_layer: Some(3),
                bytes: None,
            },
        );
        for e in 0..3 {
            assert!(c.insert(k(0, e), Arc::new(e), 10, false));
        }
        // A pin in a full layer evicts its oldest unpinned entry.
        assert!(c.insert(k(0, 7), Arc::new(7), 10, true));
        assert_eq!(c.resident_in_layer(0), vec![1, 2]);
        assert!(c.pin_resident(k(0, 2)));
        assert_eq!(c.pinned_in_layer(0), 2);
        // One unpinned slot left: new entries replace each other there.
        assert!(c.insert(k(0, 4), Arc::new(4), 10, false));
        assert_eq!(c.resident_in_layer(0), vec![4]);
        assert!(c.insert(k(0, 5), Arc::new(5), 10, false));
        assert_eq!(c.resident_in_layer(0), vec![5]);
        assert_eq!(c.len(), 3, "pins + LRU never above the capacity");
        // The other layer is untouched by layer 0's pins.
        for e in 0..3 {
            assert!(c.insert(k(1, e), Arc::new(e), 10, false));
        }
        assert_eq!(c.resident_in_layer(1).len(), 3);
        // Pins fill the layer: unpinned entries are refused, pins still kept.
        assert!(c.pin_resident(k(0, 5)));
        assert!(!c.insert(k(0, 6), Arc::new(6), 10, false));
        assert!(c.insert(k(0, 6), Arc::new(6), 10, true));
        assert_eq!(c.pinned_in_layer(0), 4);
        // Unpinning returns entries to the LRU, trimmed to the capacity.
        c.unpin(k(0, 7));
        c.unpin(k(0, 6));
        assert_eq!(c.pinned_in_layer(0), 2);
        assert_eq!(c.resident_in_layer(0).len() + c.pinned_in_layer(0), 3);
        assert!(c.contains(k(0, 2)) && c.contains(k(0, 5)));
    }

    #[test]
    fn prefetched_bytes_used_or_wasted() {
        let mut c = ExpertCache::new(
            1,
            CacheLimits {
                per_layer: Some(2),
                bytes: None,
            },
        );
        c.insert(k(0, 0), Arc::new(0), 10, false);
        c.mark_prefetched(k(0, 0), 100);
        c.insert(k(0, 1), Arc::new(1), 10, false);
        c.mark_prefetched(k(0, 1), 200);
        assert!(c.lookup(k(0, 0)).is_some());
        assert!(c.lookup(k(0, 0)).is_some()); // counted once
        assert!(c.touch(k(0, 1))); // a pilot touch is no use
        assert_eq!((c.prefetch_used_bytes(), c.prefetch_wasted_bytes()), (100, 0));
        c.insert(k(0, 2), Arc::new(2), 10, false); // evicts 0/0 (used): nothing wasted
        c.insert(k(0, 3), Arc::new(3), 10, false); // evicts 0/1, never used
        assert_eq!((c.prefetch_used_bytes(), c.prefetch_wasted_bytes()), (100, 200));
        c.count_prefetch_used(5);
        c.count_prefetch_wasted(7);
        assert_eq!((c.prefetch_used_bytes(), c.prefetch_wasted_bytes()), (105, 207));
    }

    #[test]
    fn eviction_keeps_borrowed_values_alive() {
        let mut c = ExpertCache::new(
            1,
            CacheLimits {
                per_layer: Some(1),
                bytes: None,
            },
        );
        c.insert(k(0, 0), Arc::new(vec![7u8; 4]), 4, false);
        let held = c.lookup(k(0, 0)).unwrap();
        c.insert(k(0, 1), Arc::new(vec![8u8; 4]), 4, false);
        assert!(!c.contains(k(0, 0)));
        assert_eq!(*held, vec![7u8; 4]);
        let mut none = ExpertCache::new(
            1,
            CacheLimits {
                per_layer: Some(0),
                bytes: None,
            },
        );
        assert!(!none.insert(k(0, 0), Arc::new(vec![1u8]), 1, false));
        assert!(none.is_empty());
    }
}
