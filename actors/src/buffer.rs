//! Owned, aligned byte buffers: what an I/O worker hands to compute.
//!
//! O_DIRECT reads need the destination aligned to the device block size, and
//! SIMD kernels prefer aligned rows, so every expert buffer is 4096-aligned.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;

/// Bytes an expert is decoded from, shared with the matrices that point
/// into them: an [`AlignedBuf`] a worker read into, or a read-only mapping
/// of the container.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Alignment of every expert buffer (the page size and the O_DIRECT block).
pub const BUF_ALIGN: usize = 4096;

/// A heap buffer whose start is aligned to [`BUF_ALIGN`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out &[u8]; no interior mutability.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes; its capacity is rounded up to the
    /// alignment so O_DIRECT may read whole blocks into it.
    pub fn zeroed(len: usize) -> Self {
        let cap = len.div_ceil(BUF_ALIGN).max(1) * BUF_ALIGN;
        let layout = Self::layout(cap);
        // SAFETY: layout has non-zero size (cap >= BUF_ALIGN) and a valid
        // power-of-two alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        Self { ptr, len, cap }
    }

    /// Copies `bytes` into a new aligned buffer.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut b = Self::zeroed(bytes.len());
        b.as_mut_slice().copy_from_slice(bytes);
        b
    }

    fn layout(cap: usize) -> Layout {
        match Layout::from_size_align(cap, BUF_ALIGN) {
            Ok(l) => l,
            // cap is a multiple of BUF_ALIGN below isize::MAX for any buffer
            // that could be allocated at all.
            Err(_) => std::alloc::handle_alloc_error(Layout::new::<u8>()),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allocated bytes (what the cache budget counts).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Shrinks the logical length (after a short read, say).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// The whole capacity, for reads that must cover whole blocks.
    pub fn full_capacity_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for cap bytes, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len <= cap initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len <= cap bytes, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Sets the logical length up to the capacity (after a block read).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.cap);
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let b = AlignedBuf::zeroed(10);
        assert_eq!(b.as_slice().as_ptr() as usize % BUF_ALIGN, 0);
        assert_eq!(b.len(), 10);
        assert_eq!(b.capacity(), BUF_ALIGN);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        let c = AlignedBuf::from_slice(&[1, 2, 3]);
        assert_eq!(c.as_slice(), &[1, 2, 3]);
    }
}
