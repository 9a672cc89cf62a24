//! Per-sequence attention cache for models with plain (K, V) heads.

/// Keys and values of every past position, per layer, row-major
/// `[position, kv_heads * head_dim]`.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
    kv_dim: usize,
    len: usize,
}

impl KvCache {
    pub fn new(layers: usize, kv_dim: usize) -> Self {
        Self {
            k: vec![Vec::new(); layers],
            v: vec![Vec::new(); layers],
            kv_dim,
            len: 0,
        }
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    pub fn layers(&self) -> usize {
        self.k.len()
    }

    /// Drops positions `len..` (prefix reuse keeps the common prefix).
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.len);
        for l in 0..self.k.len() {
            self.k[l].truncate(len * self.kv_dim);
            self.v[l].truncate(len * self.kv_dim);
        }
        self.len = len;
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Marks `n` positions appended on every layer (after each layer pushed them).
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// One position's state, all layers, as bytes: K then V per layer (the
    /// record payload of a conversation state file).
    pub fn position_bytes(&self, pos: usize) -> Vec<u8> {
        let d = self.kv_dim;
        let mut out = Vec::with_capacity(self.k.len() * 2 * d * 4);
        for l in 0..self.k.len() {
            for v in self.k[l][pos * d..(pos + 1) * d]
                .iter()
                .chain(&self.v[l][pos * d..(pos + 1) * d])
            {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// Bytes of one position record.
    pub fn record_bytes(&self) -> usize {
        self.k.len() * 2 * self.kv_dim * 4
    }

    /// Appends one position from a record written by [`Self::position_bytes`].
    pub fn push_position_bytes(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() != self.record_bytes() {
            return false;
        }
        let d = self.kv_dim;
        let mut vals = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        for l in 0..self.k.len() {
            self.k[l].extend(vals.by_ref().take(d));
            self.v[l].extend(vals.by_ref().take(d));
        }
        self.len += 1;
        true
    }
}
