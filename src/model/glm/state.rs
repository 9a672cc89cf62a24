//! The per-sequence MLA state: per layer and position only the normalised KV
//! latent `[kv_lora_rank]`, the rotated shared key `[qk_rope_head_dim]`, and
//! on DSA "full" layers the rotated indexer key `[index_head_dim]`; plus the
//! MTP layer's own cache.

use crate::model::kv_cache::{KvRows, KvType, KvTypes};
use crate::model::lm::SequenceState;

/// One layer's cached positions, row-major `[position, dim]`, all three in
/// one [`KvType`] (the latent is both the keys and the values of MLA, so
/// the state follows the key type, as llama.cpp's MLA cache does).
#[derive(Clone, Debug)]
pub struct LayerCache {
    pub latent: KvRows,
    pub k_rope: KvRows,
    pub index_k: KvRows,
}

impl Default for LayerCache {
    fn default() -> Self {
        Self::new(KvType::F32)
    }
}

impl LayerCache {
    pub fn new(t: KvType) -> Self {
        Self {
            latent: KvRows::new(t),
            k_rope: KvRows::new(t),
            index_k: KvRows::new(t),
        }
    }

    pub fn kind(&self) -> KvType {
        self.latent.kind()
    }

    fn truncate(&mut self, n: usize, dims: Dims, indexed: bool) {
        self.latent.truncate(n, dims.latent);
        self.k_rope.truncate(n, dims.rope);
        if indexed {
            self.index_k.truncate(n, dims.index);
        }
    }

    /// Bytes one position takes (indexer key only on an indexed layer).
    fn record_bytes(&self, dims: Dims, indexed: bool) -> usize {
        let t = self.kind();
        t.row_bytes(dims.latent) + t.row_bytes(dims.rope) + if indexed { t.row_bytes(dims.index) } else { 0 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub latent: usize,
    pub rope: usize,
    pub index: usize,
}

/// The MTP layer's cache covers positions `base..base + len` only: it is
/// filled from the first verified hidden state on, never by the prompt's
/// earlier positions.
#[derive(Clone, Debug, Default)]
pub struct MtpCache {
    pub cache: LayerCache,
    pub base: usize,
    pub len: usize,
}

impl MtpCache {
    pub fn new(t: KvType) -> Self {
        Self {
            cache: LayerCache::new(t),
            base: 0,
            len: 0,
        }
    }

    /// Keeps positions `< end`.
    pub fn truncate_to(&mut self, end: usize, dims: Dims, indexed: bool) {
        let keep = end.saturating_sub(self.base).min(self.len);
        self.cache.truncate(keep, dims, indexed);
        self.len = keep;
    }
}

/// Final-normed main-model hidden states (and their tokens) of positions
/// `start..start + tokens.len()` that the MTP head has not absorbed yet.
#[derive(Clone, Debug, Default)]
pub struct Pending {
    pub start: usize,
    pub tokens: Vec<u32>,
    pub hidden: Vec<f32>,
}

impl Pending {
    pub fn first(&self) -> Option<usize> {
        (!self.tokens.is_empty()).then_some(self.start)
    }

    pub fn end(&self) -> usize {
        self.start + self.tokens.len()
    }

    /// Appends rows for positions `at..`; a gap restarts the buffer, and
    /// beyond `max` rows the oldest are dropped.
    pub fn push(&mut self, at: usize, tokens: &[u32], rows: &[f32], hidden: usize, max: usize) {
        if self.tokens.is_empty() || self.end() != at {
            self.tokens.clear();
            self.hidden.clear();
            self.start = at;
        }
        self.tokens.extend_from_slice(tokens);
        self.hidden.extend_from_slice(rows);
        if self.tokens.len() > max {
            let p = self.end() - max;
            self.drop_before(p, hidden);
        }
    }

    /// Hidden rows of positions `from..to` and the tokens at `from + 1..to + 1`
    /// (as many as are known).
    pub fn rows(&self, from: usize, to: usize, hidden: usize) -> (Vec<f32>, Vec<u32>) {
        let (a, b) = (from - self.start, to - self.start);
        let h = self.hidden[a * hidden..b * hidden].to_vec();
        let t = self.tokens[(a + 1).min(self.tokens.len())..(b + 1).min(self.tokens.len())].to_vec();
        (h, t)
    }

    /// Forgets positions before `p`.
    pub fn drop_before(&mut self, p: usize, hidden: usize) {
        let k = p.saturating_sub(self.start).min(self.tokens.len());
        self.tokens.drain(..k);
        self.hidden.drain(..k * hidden);
        self.start += k;
    }

    /// Keeps positions `< n`.
    pub fn truncate(&mut self, n: usize, hidden: usize) {
        let keep = n.saturating_sub(self.start).min(self.tokens.len());
        self.tokens.truncate(keep);
        self.hidden.truncate(keep * hidden);
    }
}

/// A GLM / DeepSeek-V3 sequence state.
#[derive(Clone, Debug)]
pub struct GlmState {
    pub layers: Vec<LayerCache>,
    /// Which layers cache indexer keys.
    pub indexed: Vec<bool>,
    pub dims: Dims,
    pub len: usize,
    pub mtp: MtpCache,
    pub mtp_indexed: bool,
    /// Rows for the MTP head (kept only by models that have one).
    pub pending: Pending,
    pub hidden: usize,
}

impl GlmState {
    /// An empty state storing its latents, rope keys and indexer keys as `kv`.
    pub fn new(indexed: Vec<bool>, dims: Dims, mtp_indexed: bool, hidden: usize, kv: KvType) -> Self {
        Self {
            layers: vec![LayerCache::new(kv); indexed.len()],
            indexed,
            dims,
            len: 0,
            mtp: MtpCache::new(kv),
            mtp_indexed,
            pending: Pending::default(),
            hidden,
        }
    }

    /// How the latents and keys are stored.
    pub fn kind(&self) -> KvType {
        self.layers
            .first()
            .map_or(self.mtp.cache.kind(), LayerCache::kind)
    }

    /// Drops the MTP cache entries that depend on positions `n..` (entry `p`
    /// was built from the token at `p + 1`).
    fn truncate_mtp(&mut self, n: usize) {
        self.mtp
            .truncate_to(n.saturating_sub(1), self.dims, self.mtp_indexed);
    }
}

impl SequenceState for GlmState {
    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, n: usize) -> usize {
        let n = n.min(self.len);
        for (c, &ix) in self.layers.iter_mut().zip(&self.indexed) {
            c.truncate(n, self.dims, ix);
        }
        self.len = n;
        self.truncate_mtp(n);
        self.pending.truncate(n, self.hidden);
        n
    }

    fn record_bytes(&self) -> usize {
        self.layers
            .iter()
            .zip(&self.indexed)
            .map(|(c, &ix)| c.record_bytes(self.dims, ix))
            .sum()
    }

    /// Latent, rope key, and indexer key (full layers) per layer, each row
    /// in the state's type (for f32 the bytes the format had before types).
    /// The MTP cache is not recorded: a restored sequence refills it.
    fn position_bytes(&self, pos: usize) -> Vec<u8> {
        let d = self.dims;
        let mut out = Vec::with_capacity(self.record_bytes());
        for (c, &ix) in self.layers.iter().zip(&self.indexed) {
            c.latent.row_bytes_into(pos, d.latent, &mut out);
            c.k_rope.row_bytes_into(pos, d.rope, &mut out);
            if ix {
                c.index_k.row_bytes_into(pos, d.index, &mut out);
            }
        }
        out
    }

    fn push_position_bytes(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() != self.record_bytes() {
            return false;
        }
        let d = self.dims;
        let mut rest = bytes;
        let mut take = |n: usize| {
            let (a, b) = rest.split_at(n);
            rest = b;
            a
        };
        for (c, &ix) in self.layers.iter_mut().zip(&self.indexed) {
            let t = c.kind();
            c.latent.push_row_bytes(take(t.row_bytes(d.latent)));
            c.k_rope.push_row_bytes(take(t.row_bytes(d.rope)));
            if ix {
                c.index_k.push_row_bytes(take(t.row_bytes(d.index)));
            }
        }
        self.len += 1;
        // The MTP cache has no record: it restarts after the restored prefix.
        self.mtp = MtpCache::new(self.kind());
        self.pending = Pending::default();
        true
    }

    fn payload_kind(&self) -> u32 {
        KvTypes::both(self.kind()).header_code()
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_truncate() {
        let dims = Dims {
            latent: 3,
            rope: 2,
            index: 4,
        };
        for t in KvType::ALL {
            let mut s = GlmState::new(vec![true, false], dims, false, 4, t);
            for p in 0..3 {
                for (l, c) in s.layers.iter_mut().enumerate() {
                    let v = (p * 10 + l) as f32;
                    c.latent.push_rows(&[v; 3], 3);
                    c.k_rope.push_rows(&[v + 0.5; 2], 2);
                    if l == 0 {
                        c.index_k.push_rows(&[v + 0.25; 4], 4);
                    }
                }
                s.len += 1;
            }
            let (r3, r2, r4) = (t.row_bytes(3), t.row_bytes(2), t.row_bytes(4));
            assert_eq!(s.record_bytes(), r3 + r2 + r4 + r3 + r2, "{t}");
            assert_eq!(s.payload_kind(), KvTypes::both(t).header_code());
            let mut u = GlmState::new(vec![true, false], dims, false, 4, t);
            for p in 0..3 {
                assert!(u.push_position_bytes(&s.position_bytes(p)));
            }
            for p in 0..3 {
                assert_eq!(u.position_bytes(p), s.position_bytes(p), "{t} position {p}");
            }
            assert_eq!(u.layers[0].index_k.rows(4), 3);
            assert!(!u.push_position_bytes(&[0u8; 3]));
            s.truncate(1);
            assert_eq!(s.len(), 1);
            assert_eq!(s.layers[0].index_k.rows(4), 1);
            assert_eq!(s.layers[1].k_rope.rows(2), 1);
            assert_eq!(s.position_bytes(0), u.position_bytes(0));
            // A record of another type's size is refused, not misread.
            if t != KvType::F32 {
                let f = GlmState::new(vec![true, false], dims, false, 4, KvType::F32);
                let mut g = GlmState::new(vec![true, false], dims, false, 4, t);
                let mut full = f.clone();
                for c in full.layers.iter_mut() {
                    c.latent.push_rows(&[1.0; 3], 3);
                    c.k_rope.push_rows(&[1.0; 2], 2);
                }
                full.layers[0].index_k.push_rows(&[1.0; 4], 4);
                full.len = 1;
                assert!(!g.push_position_bytes(&full.position_bytes(0)));
            }
        }
    }
}
