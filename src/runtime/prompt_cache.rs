//! The prompt cache: sequence state of conversations that lost their slot,
//! kept in RAM under a byte budget and keyed by token content, so that
//! clients who outnumber `--kv-slots` still compute only their new tokens.
//!
//! The cache is a trie of blocks. A block holds up to [`BLOCK`] consecutive
//! positions (their tokens and the bytes `SequenceState::position_bytes`
//! gives for them); its place in the trie is the whole token prefix before
//! it, so a block stands for "these positions after exactly these tokens",
//! and a prefix that many conversations share (a system prompt, a template
//! header) is stored once. Blocks start at multiples of [`BLOCK`]; a
//! sequence's last block may be shorter (a partial leaf), and is replaced
//! when a longer version of it arrives.
//!
//! Restoring is exact: a position's state depends only on the tokens up to
//! it (and batching never changes numbers), so the bytes of a block equal
//! what recomputing its tokens after the same prefix gives.
//!
//! A conversation restored into a slot leaves the cache (the blocks of it
//! that no other cached sequence continues): the slot holds it now, and it
//! comes back when the slot is next overwritten. So the cache holds the
//! conversations that lost their slot and the prefixes they share, not
//! copies of what the slots hold.
//!
//! A state with recurrent layers (Qwen3-Next / Qwen3.5's linear
//! attention) is not the sum of its records: its blocks carry the records
//! of its attention layers, and a block whose end is one of the state's
//! checkpoints also carries that checkpoint's snapshot (the recurrent
//! part there). A sequence is then restored up to the deepest snapshot on
//! its path, records and snapshot together, and stored only up to its
//! last snapshot. Since blocks end at multiples of [`BLOCK`], the decode
//! loop asks a state for a checkpoint at the block boundary where its
//! prompt branches off what the cache or another slot holds, so that the
//! shared part (a system prompt and tool list) ends on a snapshot once the
//! branching sequence is stored. Evicting a leaf also evicts the blocks
//! above it that are left as snapshot-less leaves, which nothing could be
//! restored from.
//!
//! Eviction is least recently used, leaves first: a lookup or an insert
//! marks every block on its path with one new tick, so a block is never
//! older than its children; ordering by (tick, deeper first) puts a leaf
//! first, and the trie loses its sequences' ends before their prefixes.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use crate::model::lm::SequenceState;

/// Positions per block. Shorter blocks share more (a prefix is stored once
/// down to this granularity) at the price of more trie nodes.
pub const BLOCK: usize = 32;

/// Bytes a block costs besides its positions (node, links, LRU entry).
const NODE_OVERHEAD: u64 = 128;

type NodeId = usize;

/// The sentinel every first block hangs from.
const ROOT: NodeId = 0;

struct Node {
    parent: NodeId,
    depth: u32,
    tokens: Vec<u32>,
    /// `tokens.len()` records of the state's record size, in order.
    bytes: Vec<u8>,
    /// The recurrent part after this block's last position (recurrent
    /// states only; empty when none was stored).
    snapshot: Vec<u8>,
    children: Vec<NodeId>,
    tick: u64,
}

impl Node {
    fn cost(&self) -> u64 {
        (self.bytes.len() + self.snapshot.len()) as u64 + 4 * self.tokens.len() as u64 + NODE_OVERHEAD
    }
}

/// What the cache did since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Positions copied into the cache.
    pub stored: u64,
    /// Positions copied out of it into a conversation.
    pub restored: u64,
    /// Blocks dropped to stay within the budget.
    pub evicted_blocks: u64,
}

/// The cache (see the module documentation). Owned by the decode loop.
pub struct PromptCache {
    budget: u64,
    used: u64,
    record_bytes: usize,
    /// Bytes of a snapshot of the states it keeps; 0 for positional ones.
    snapshot_bytes: usize,
    nodes: Vec<Option<Node>>,
    free: Vec<NodeId>,
    /// Every block but the root, oldest (and, at equal age, deepest) first.
    lru: BTreeSet<(u64, Reverse<u32>, NodeId)>,
    tick: u64,
    stats: CacheStats,
}

impl PromptCache {
    /// A cache of at most `budget` bytes for states whose positions take
    /// `record_bytes` each; a budget of 0 turns it off.
    pub fn new(budget: u64, record_bytes: usize) -> Self {
        Self::with_snapshots(budget, record_bytes, 0)
    }

    /// A cache for states with a recurrent part of `snapshot_bytes` (see
    /// the module documentation); 0 makes it [`Self::new`]'s.
    pub fn with_snapshots(budget: u64, record_bytes: usize, snapshot_bytes: usize) -> Self {
        let root = Node {
            parent: ROOT,
            depth: 0,
            tokens: Vec::new(),
            bytes: Vec::new(),
            snapshot: Vec::new(),
            children: Vec::new(),
            tick: 0,
        };
        Self {
            budget,
            used: 0,
            record_bytes,
            snapshot_bytes,
            nodes: vec![Some(root)],
            free: Vec::new(),
            lru: BTreeSet::new(),
            tick: 0,
            stats: CacheStats::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.budget > 0 && self.record_bytes > 0
    }

    /// Whether `state` is of the kind and sizes this cache keeps.
    fn fits(&self, state: &dyn SequenceState) -> bool {
        self.enabled()
            && state.record_bytes() == self.record_bytes
            && state.positional() == (self.snapshot_bytes == 0)
            && state.snapshot_bytes() == self.snapshot_bytes
    }

    fn recurrent(&self) -> bool {
        self.snapshot_bytes > 0
    }

    /// Bytes the cache holds now (never above its budget).
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    fn node(&self, id: NodeId) -> &Node {
        match self.nodes.get(id) {
            Some(Some(n)) => n,
            // Ids come only from the trie's own links.
            _ => unreachable!("prompt cache: dangling node id {id}"),
        }
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        match self.nodes.get_mut(id) {
            Some(Some(n)) => n,
            _ => unreachable!("prompt cache: dangling node id {id}"),
        }
    }

    /// Marks `path` (root first) as used now, in one tick.
    fn touch(&mut self, path: &[NodeId]) {
        self.tick += 1;
        let tick = self.tick;
        for &id in path {
            let n = self.node_mut(id);
            let old = (n.tick, Reverse(n.depth), id);
            n.tick = tick;
            let new = (tick, Reverse(n.depth), id);
            self.lru.remove(&old);
            self.lru.insert(new);
        }
    }

    /// Drops leaf `id`.
    fn remove_leaf(&mut self, id: NodeId) {
        let Some(n) = self.nodes.get_mut(id).and_then(Option::take) else {
            return;
        };
        debug_assert!(n.children.is_empty(), "only leaves are removed");
        self.lru.remove(&(n.tick, Reverse(n.depth), id));
        self.used -= n.cost();
        self.node_mut(n.parent).children.retain(|&c| c != id);
        self.free.push(id);
    }

    /// Evicts old blocks until `need` more bytes fit; false when only blocks
    /// of the current tick (the path being written) are left to evict.
    fn make_room(&mut self, need: u64) -> bool {
        while self.used + need > self.budget {
            let Some(&(tick, _, id)) = self.lru.first() else {
                return false;
            };
            if tick == self.tick {
                return false;
            }
            let mut parent = self.node(id).parent;
            self.remove_leaf(id);
            self.stats.evicted_blocks += 1;
            // A recurrent state's records restore nothing without a
            // snapshot at or after them: leaves left without one go too
            // (not those of the path being written).
            while self.recurrent() && parent != ROOT {
                let p = self.node(parent);
                if !p.children.is_empty() || !p.snapshot.is_empty() || p.tick == self.tick {
                    break;
                }
                let up = p.parent;
                self.remove_leaf(parent);
                self.stats.evicted_blocks += 1;
                parent = up;
            }
        }
        true
    }

    /// Stores the snapshot `take` gives (the state after the last position
    /// of block `id`) in it when it has none and the budget allows; the
    /// block's path is already marked with the current tick. The snapshot
    /// is taken only once there is room for it: it is the size of the whole
    /// recurrent state.
    fn attach_snapshot(&mut self, id: NodeId, take: impl FnOnce() -> Option<Vec<u8>>) {
        if !self.node(id).snapshot.is_empty() || !self.make_room(self.snapshot_bytes as u64) {
            return;
        }
        let Some(snap) = take().filter(|s| s.len() == self.snapshot_bytes) else {
            return;
        };
        self.used += snap.len() as u64;
        self.node_mut(id).snapshot = snap;
    }

    /// The child of `parent` whose tokens share the most leading tokens
    /// with `want`, and how many.
    fn best_child(&self, parent: NodeId, want: &[u32]) -> Option<(NodeId, usize)> {
        self.node(parent)
            .children
            .iter()
            .map(|&c| (c, common_prefix(&self.node(c).tokens, want)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(_, n)| n)
    }

    /// Stores the first `tokens.len()` positions of `state` (which must hold
    /// at least that many, computed after exactly these tokens). Blocks the
    /// cache already has are only marked used; the rest are copied in while
    /// the budget allows, evicting older blocks. Returns positions copied.
    /// A recurrent state is stored up to its last snapshot position within
    /// `tokens`, with a snapshot at every block end that is one.
    pub fn insert(&mut self, tokens: &[u32], state: &dyn SequenceState) -> usize {
        if !self.fits(state) {
            return 0;
        }
        let mut end = tokens.len().min(state.len());
        let snaps = match self.recurrent() {
            true => state.snapshot_positions(),
            false => Vec::new(),
        };
        if self.recurrent() {
            end = snaps.iter().copied().filter(|&p| p <= end).max().unwrap_or(0);
        }
        let tokens = &tokens[..end];
        let snapshot_at = |end: usize| snaps.contains(&end).then_some(move || state.snapshot(end));
        let mut path = Vec::new();
        let (mut parent, mut pos, mut copied) = (ROOT, 0, 0);
        // Set once the path carries the current tick, which protects it
        // from eviction while it grows.
        let mut touched = false;
        while pos < tokens.len() {
            let chunk = &tokens[pos..tokens.len().min(pos + BLOCK)];
            let children = self.node(parent).children.clone();
            // Already held: this chunk itself, or (for a short last chunk) a
            // longer block that starts with it.
            let held = children.iter().copied().find(|&c| {
                let t = &self.node(c).tokens;
                t.as_slice() == chunk || (chunk.len() < BLOCK && t.starts_with(chunk))
            });
            if let Some(same) = held {
                path.push(same);
                touched = false;
                if self.node(same).tokens.len() != chunk.len() {
                    break;
                }
                if self.recurrent()
                    && self.node(same).snapshot.is_empty()
                    && let Some(take) = snapshot_at(pos + chunk.len())
                {
                    self.touch(&path);
                    touched = true;
                    self.attach_snapshot(same, take);
                }
                parent = same;
                pos += chunk.len();
                continue;
            }
            // A shorter leaf this chunk extends is replaced by it.
            for c in children {
                let n = self.node(c);
                if n.children.is_empty() && n.tokens.len() < chunk.len() && chunk.starts_with(&n.tokens) {
                    self.remove_leaf(c);
                }
            }
            if !touched {
                self.touch(&path);
                touched = true;
            }
            let bytes_len = chunk.len() * self.record_bytes;
            let cost = bytes_len as u64 + 4 * chunk.len() as u64 + NODE_OVERHEAD;
            if !self.make_room(cost) {
                break;
            }
            let mut bytes = Vec::with_capacity(bytes_len);
            for p in pos..pos + chunk.len() {
                bytes.extend_from_slice(&state.position_bytes(p));
            }
            if bytes.len() != bytes_len {
                break;
            }
            let depth = self.node(parent).depth + 1;
            let node = Node {
                parent,
                depth,
                tokens: chunk.to_vec(),
                bytes,
                snapshot: Vec::new(),
                children: Vec::new(),
                tick: self.tick,
            };
            let id = match self.free.pop() {
                Some(id) => {
                    self.nodes[id] = Some(node);
                    id
                }
                None => {
                    self.nodes.push(Some(node));
                    self.nodes.len() - 1
                }
            };
            self.used += cost;
            self.lru.insert((self.tick, Reverse(depth), id));
            self.node_mut(parent).children.push(id);
            path.push(id);
            copied += chunk.len();
            pos += chunk.len();
            parent = id;
            if let Some(take) = snapshot_at(pos) {
                self.attach_snapshot(id, take);
            }
        }
        if !touched {
            self.touch(&path);
        }
        self.stats.stored += copied as u64;
        copied
    }

    /// How many leading positions of `tokens` the cache can restore
    /// (without marking anything used): every matching one for positional
    /// states, up to the deepest snapshot for recurrent ones.
    pub fn longest(&self, tokens: &[u32]) -> usize {
        let (path, matched) = self.walk(tokens);
        match self.recurrent() {
            true => self.deepest_snapshot(&path, 0).map_or(0, |(end, _)| end),
            false => matched,
        }
    }

    /// How many leading tokens of `tokens` the cache holds records of,
    /// restorable or not: where a prompt branches off what is cached.
    pub fn matched(&self, tokens: &[u32]) -> usize {
        self.walk(tokens).1
    }

    /// The end and block of the deepest whole block of `path` (a walk's)
    /// that ends past `have` and holds a snapshot.
    fn deepest_snapshot(&self, path: &[(NodeId, usize)], have: usize) -> Option<(usize, NodeId)> {
        let mut end = 0;
        let mut best = None;
        for &(id, n) in path {
            end += n;
            let node = self.node(id);
            if n == node.tokens.len() && !node.snapshot.is_empty() && end > have {
                best = Some((end, id));
            }
        }
        best
    }

    /// The path of blocks matching `tokens` (each with the positions of it
    /// that match) and the total matched.
    fn walk(&self, tokens: &[u32]) -> (Vec<(NodeId, usize)>, usize) {
        let mut path = Vec::new();
        let (mut parent, mut pos) = (ROOT, 0);
        if !self.enabled() {
            return (path, 0);
        }
        while pos < tokens.len() {
            let Some((c, n)) = self.best_child(parent, &tokens[pos..]) else {
                break;
            };
            path.push((c, n));
            pos += n;
            if n < self.node(c).tokens.len() {
                break;
            }
            parent = c;
        }
        (path, pos)
    }

    /// Extends `state`, which holds the positions of `tokens[..state.len()]`,
    /// with the cached positions that follow, up to `tokens.len()`. Returns
    /// the positions added (0 when the cache holds no longer prefix).
    /// A recurrent state is extended up to the deepest snapshot, which
    /// then becomes its recurrent part.
    pub fn restore(&mut self, tokens: &[u32], state: &mut dyn SequenceState) -> usize {
        if !self.fits(state) || state.len() > tokens.len() {
            return 0;
        }
        let have = state.len();
        let (path, matched) = self.walk(tokens);
        let (target, snapshot_node) = match self.recurrent() {
            true => match self.deepest_snapshot(&path, have) {
                Some((end, id)) => (end, Some(id)),
                None => return 0,
            },
            false => (matched, None),
        };
        if target <= have {
            return 0;
        }
        let ids: Vec<NodeId> = path.iter().map(|&(id, _)| id).collect();
        self.touch(&ids);
        let rec = self.record_bytes;
        let (mut start, mut added) = (0, 0);
        // Blocks the state now holds whole, deepest last.
        let mut held = Vec::new();
        'copy: for &(id, n) in &path {
            if start >= target {
                break;
            }
            let n = n.min(target - start);
            let end = start + n;
            if end > have {
                let from = have.max(start) - start;
                let node = self.node(id);
                for rel in from..n {
                    if !state.push_position_bytes(&node.bytes[rel * rec..(rel + 1) * rec]) {
                        break 'copy;
                    }
                    added += 1;
                }
            }
            if n == self.node(id).tokens.len() {
                held.push(id);
            }
            start = end;
        }
        if let Some(id) = snapshot_node
            && (added != target - have || !state.restore_snapshot(&self.node(id).snapshot))
        {
            // Records without their snapshot are no state: back to where
            // it was.
            state.truncate(have);
            return 0;
        }
        self.stats.restored += added as u64;
        if added > 0 {
            self.release(&held);
        }
        added
    }

    /// Drops the blocks of `held` (a path, root side first, each held whole
    /// by a slot now) that no other cached sequence continues.
    fn release(&mut self, held: &[NodeId]) {
        for &id in held.iter().rev() {
            if !self.node(id).children.is_empty() {
                return;
            }
            self.remove_leaf(id);
        }
    }
}

/// Length of the common prefix of two token lists.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_state::{
        FakeRecurrent, FakeState, RECORD, SNAPSHOT, computed, computed_recurrent,
    };

    fn cache(blocks: u64) -> PromptCache {
        PromptCache::new(
            blocks * (BLOCK as u64 * (RECORD as u64 + 4) + NODE_OVERHEAD),
            RECORD,
        )
    }

    #[test]
    fn a_stored_conversation_comes_back_exactly_and_leaves_the_cache() {
        let mut c = cache(16);
        let toks: Vec<u32> = (0..100).collect();
        let s = computed(&toks);
        assert_eq!(c.insert(&toks, &s), 100);
        // A later turn: the stored prefix and then new tokens.
        let mut next = toks.clone();
        next.extend([500, 501, 502]);
        let mut fresh = FakeState::default();
        assert_eq!(c.restore(&next, &mut fresh), 100);
        assert_eq!(fresh, s);
        assert_eq!(c.stats().restored, 100);
        // The slot holds it now; it comes back when the slot is overwritten.
        assert_eq!(c.used_bytes(), 0);
        assert_eq!(c.restore(&next, &mut FakeState::default()), 0);
        assert_eq!(c.insert(&next, &computed(&next)), 103);
    }

    #[test]
    fn restoring_continues_a_states_own_prefix_and_stops_where_tokens_differ() {
        let mut c = cache(16);
        let toks: Vec<u32> = (0..80).collect();
        c.insert(&toks, &computed(&toks));
        // The slot already holds 10 positions; the prompt leaves the cached
        // history in the middle of its second block.
        let mut prompt: Vec<u32> = (0..45).collect();
        prompt.extend([900, 901]);
        assert_eq!(c.longest(&prompt), 45);
        let mut s = computed(&prompt[..10]);
        assert_eq!(c.restore(&prompt, &mut s), 35);
        assert_eq!(s, computed(&prompt[..45]));
        // The blocks that go on past the prompt stay.
        assert_eq!(c.longest(&toks), 80);
    }

    #[test]
    fn a_shared_prefix_is_stored_once_and_stays_while_it_is_continued() {
        let mut c = cache(64);
        let system: Vec<u32> = (0..64).collect();
        let mut a = system.clone();
        a.extend(1000..1040);
        let mut b = system.clone();
        b.extend(2000..2040);
        assert_eq!(c.insert(&a, &computed(&a)), 104);
        // b's first two blocks are a's: only b's own 40 positions are new.
        assert_eq!(c.insert(&b, &computed(&b)), 40);
        let mut s = FakeState::default();
        assert_eq!(c.restore(&b, &mut s), 104);
        assert_eq!(s, computed(&b));
        assert_eq!(c.longest(&a), 104);
        assert_eq!(c.longest(&b), 64);
    }

    #[test]
    fn a_grown_history_replaces_its_short_last_block() {
        let mut c = cache(16);
        let t1: Vec<u32> = (0..40).collect();
        c.insert(&t1, &computed(&t1));
        let used = c.used_bytes();
        let t2: Vec<u32> = (0..50).collect();
        // 10 positions are new, but the 8-position leaf is rewritten as 18.
        assert_eq!(c.insert(&t2, &computed(&t2)), 18);
        assert_eq!(c.used_bytes(), used + 10 * (RECORD as u64 + 4));
        // A shorter version of a block held is held already.
        assert_eq!(c.insert(&t1, &computed(&t1)), 0);
        assert_eq!(c.longest(&t2), 50);
    }

    #[test]
    fn the_budget_holds_and_the_least_recently_used_leaves_go_first() {
        let mut c = cache(4);
        let a: Vec<u32> = (0..64).collect();
        let b: Vec<u32> = (100..164).collect();
        c.insert(&a, &computed(&a));
        c.insert(&b, &computed(&b));
        assert_eq!(c.used_bytes(), c.budget_bytes());
        // Storing a again makes b the oldest: a new sequence pushes out b's
        // end first, then its start.
        assert_eq!(c.insert(&a, &computed(&a)), 0);
        let d: Vec<u32> = (200..232).collect();
        assert_eq!(c.insert(&d, &computed(&d)), 32);
        assert!(c.used_bytes() <= c.budget_bytes());
        assert_eq!(c.longest(&b), 32);
        assert_eq!(c.longest(&a), 64);
        let e: Vec<u32> = (300..332).collect();
        c.insert(&e, &computed(&e));
        assert_eq!(c.longest(&b), 0);
        assert_eq!(c.longest(&a), 64);
        assert_eq!(c.stats().evicted_blocks, 2);
    }

    #[test]
    fn a_sequence_larger_than_the_budget_keeps_its_prefix() {
        let mut c = cache(2);
        let a: Vec<u32> = (0..200).collect();
        assert_eq!(c.insert(&a, &computed(&a)), 64);
        assert_eq!(c.longest(&a), 64);
        assert!(c.used_bytes() <= c.budget_bytes());
    }

    #[test]
    fn off_stores_nothing() {
        let mut c = PromptCache::new(0, RECORD);
        let a: Vec<u32> = (0..50).collect();
        assert_eq!(c.insert(&a, &computed(&a)), 0);
        assert_eq!(c.restore(&a, &mut FakeState::default()), 0);
        assert_eq!(c.used_bytes(), 0);
    }

    fn recurrent_cache(bytes: u64) -> PromptCache {
        PromptCache::with_snapshots(bytes, RECORD, SNAPSHOT)
    }

    #[test]
    fn a_recurrent_state_is_restored_to_its_deepest_snapshot_and_stored_to_its_last() {
        let mut c = recurrent_cache(1 << 20);
        let a: Vec<u32> = (0..100).collect();
        // Checkpoints at 64 (a block end) and 70 (not one); the end is 100.
        assert_eq!(c.insert(&a, &computed_recurrent(&a, &[64, 70])), 100);
        // A prompt leaving `a` at 80 goes back to the snapshot at 64.
        let mut p: Vec<u32> = (0..80).collect();
        p.extend([900, 901]);
        assert_eq!(c.longest(&p), 64);
        assert_eq!(c.matched(&p), 80);
        let mut s = FakeRecurrent::default();
        assert_eq!(c.restore(&p, &mut s), 64);
        assert!(s.consistent());
        assert_eq!(s.records, computed(&p[..64]));
        // `a`'s next turn restores it whole, to its end's snapshot.
        let mut next = a.clone();
        next.extend([7, 8]);
        let mut s = FakeRecurrent::default();
        assert_eq!(c.restore(&next, &mut s), 100);
        assert!(s.consistent());
        assert_eq!(s.records, computed(&a));
        // Records past the last snapshot restore nothing and are not stored.
        // (Storing 90 of its 100 positions: the snapshot at 100 is past them.)
        let mut c = recurrent_cache(1 << 20);
        assert_eq!(c.insert(&a[..90], &computed_recurrent(&a, &[40])), 40);
        assert_eq!(c.matched(&a), 40);
        assert_eq!(c.longest(&a), 40, "a partial last block ends on its snapshot");
    }

    #[test]
    fn a_branch_point_checkpoint_makes_a_shared_prefix_restorable() {
        let mut c = recurrent_cache(1 << 20);
        let system: Vec<u32> = (0..70).collect();
        let conv = |tail: u32| -> Vec<u32> {
            let mut t = system.clone();
            t.extend(tail..tail + 30);
            t
        };
        let (a, b, d) = (conv(1000), conv(2000), conv(3000));
        c.insert(&a, &computed_recurrent(&a, &[]));
        // `b` shares 70 positions with `a`, but `a`'s only snapshot is at
        // its end: nothing to restore; the loop asks `b` for a checkpoint
        // at the block boundary 64.
        assert_eq!(c.longest(&b), 0);
        assert_eq!(c.matched(&b) / BLOCK * BLOCK, 64);
        c.insert(&b, &computed_recurrent(&b, &[64]));
        // Now a third conversation starts from the shared snapshot.
        let mut s = FakeRecurrent::default();
        assert_eq!(c.restore(&d, &mut s), 64);
        assert!(s.consistent());
        assert_eq!(s.records, computed(&d[..64]));
        assert_eq!(c.longest(&a), 100);
        assert_eq!(c.longest(&b), 100);
    }

    #[test]
    fn evicting_a_recurrent_leaf_takes_the_snapshot_less_blocks_above_it() {
        let per_block = BLOCK as u64 * (RECORD as u64 + 4) + NODE_OVERHEAD;
        // Room for four blocks and two snapshots.
        let mut c = recurrent_cache(4 * per_block + 2 * SNAPSHOT as u64);
        let a: Vec<u32> = (0..64).collect();
        let b: Vec<u32> = (100..164).collect();
        c.insert(&a, &computed_recurrent(&a, &[]));
        c.insert(&b, &computed_recurrent(&b, &[]));
        assert_eq!(c.longest(&a), 64);
        let d: Vec<u32> = (200..232).collect();
        assert_eq!(c.insert(&d, &computed_recurrent(&d, &[])), 32);
        // `a`'s leaf went, and with it its first block (no snapshot there).
        assert_eq!(c.matched(&a), 0);
        assert_eq!(c.stats().evicted_blocks, 2);
        assert_eq!(c.longest(&b), 64);
        assert!(c.used_bytes() <= c.budget_bytes());
    }

    #[test]
    fn states_of_the_other_kind_are_neither_stored_nor_restored() {
        let a: Vec<u32> = (0..50).collect();
        let mut rc = recurrent_cache(1 << 20);
        assert_eq!(rc.insert(&a, &computed(&a)), 0);
        let mut pc = cache(16);
        assert_eq!(pc.insert(&a, &computed_recurrent(&a, &[])), 0);
        pc.insert(&a, &computed(&a));
        let mut s = FakeRecurrent::default();
        assert_eq!(pc.restore(&a, &mut s), 0);
        assert!(s.is_empty());
    }
}
