//! Shared, immutable byte storage for packed weights.

use std::sync::Arc;

/// A range of bytes owned by something shared: an mmap, an expert buffer
/// delivered by an I/O worker, or a plain vector. Lets a matrix point into the
/// buffer it was read into instead of copying it.
#[derive(Clone)]
pub struct ByteStore {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl ByteStore {
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        Self {
            owner: Arc::new(v),
            start: 0,
            len,
        }
    }

    /// A sub-range of a shared owner; `None` when the range is outside it.
    pub fn slice_of(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, start: usize, len: usize) -> Option<Self> {
        let total = (*owner).as_ref().len();
        let end = start.checked_add(len)?;
        (end <= total).then_some(Self { owner, start, len })
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for ByteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ByteStore({} bytes)", self.len)
    }
}
