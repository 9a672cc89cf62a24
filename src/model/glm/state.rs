//! The per-sequence MLA state: per layer and position only the normalised KV
//! latent `[kv_lora_rank]`, the rotated shared key `[qk_rope_head_dim]`, and
//! on DSA "full" layers the rotated indexer key `[index_head_dim]`; plus the
//! MTP layer's own cache.

use crate::model::lm::SequenceState;

/// One layer's cached positions, row-major `[position, dim]`.
#[derive(Clone, Debug, Default)]
pub struct LayerCache {
    pub latent: Vec<f32>,
    pub k_rope: Vec<f32>,
    pub index_k: Vec<f32>,
}

impl LayerCache {
    fn truncate(&mut self, n: usize, dims: Dims, indexed: bool) {
        self.latent.truncate(n * dims.latent);
        self.k_rope.truncate(n * dims.rope);
        if indexed {
            self.index_k.truncate(n * dims.index);
        }
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
    pub fn new(indexed: Vec<bool>, dims: Dims, mtp_indexed: bool, hidden: usize) -> Self {
        Self {
            layers: vec![LayerCache::default(); indexed.len()],
            indexed,
            dims,
            len: 0,
            mtp: MtpCache::default(),
            mtp_indexed,
            pending: Pending::default(),
            hidden,
        }
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

    fn truncate(&mut self, n: usize) {
        let n = n.min(self.len);
        for (c, &ix) in self.layers.iter_mut().zip(&self.indexed) {
            c.truncate(n, self.dims, ix);
        }
        self.len = n;
        self.truncate_mtp(n);
        self.pending.truncate(n, self.hidden);
    }

    fn record_bytes(&self) -> usize {
        let d = self.dims;
        self.indexed
            .iter()
            .map(|&ix| (d.latent + d.rope + if ix { d.index } else { 0 }) * 4)
            .sum()
    }

    /// Latent, rope key, and indexer key (full layers) per layer. The MTP
    /// cache is not recorded: a restored sequence refills it as it goes.
    fn position_bytes(&self, pos: usize) -> Vec<u8> {
        let d = self.dims;
        let mut out = Vec::with_capacity(self.record_bytes());
        for (c, &ix) in self.layers.iter().zip(&self.indexed) {
            let parts: [&[f32]; 3] = [
                &c.latent[pos * d.latent..(pos + 1) * d.latent],
                &c.k_rope[pos * d.rope..(pos + 1) * d.rope],
                if ix {
                    &c.index_k[pos * d.index..(pos + 1) * d.index]
                } else {
                    &[]
                },
            ];
            for v in parts.into_iter().flatten() {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    fn push_position_bytes(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() != self.record_bytes() {
            return false;
        }
        let d = self.dims;
        let mut vals = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        for (c, &ix) in self.layers.iter_mut().zip(&self.indexed) {
            c.latent.extend(vals.by_ref().take(d.latent));
            c.k_rope.extend(vals.by_ref().take(d.rope));
            if ix {
                c.index_k.extend(vals.by_ref().take(d.index));
            }
        }
        self.len += 1;
        // The MTP cache has no record: it restarts after the restored prefix.
        self.mtp = MtpCache::default();
        self.pending = Pending::default();
        true
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
        let mut s = GlmState::new(vec![true, false], dims, false, 4);
        for p in 0..3 {
            for (l, c) in s.layers.iter_mut().enumerate() {
                let v = (p * 10 + l) as f32;
                c.latent.extend([v; 3]);
                c.k_rope.extend([v + 0.5; 2]);
                if l == 0 {
                    c.index_k.extend([v + 0.25; 4]);
                }
            }
            s.len += 1;
        }
        assert_eq!(s.record_bytes(), (3 + 2 + 4 + 3 + 2) * 4);
        let mut t = GlmState::new(vec![true, false], dims, false, 4);
        for p in 0..3 {
            assert!(t.push_position_bytes(&s.position_bytes(p)));
        }
        assert_eq!(t.layers[0].index_k, s.layers[0].index_k);
        assert_eq!(t.layers[1].latent, s.layers[1].latent);
        assert!(!t.push_position_bytes(&[0u8; 3]));
        s.truncate(1);
        assert_eq!(s.len(), 1);
        assert_eq!(s.layers[0].index_k.len(), 4);
        assert_eq!(s.layers[1].k_rope.len(), 2);
        assert_eq!(s.position_bytes(0), t.position_bytes(0));
    }
}
