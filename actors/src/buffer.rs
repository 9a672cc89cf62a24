//! Owned, aligned byte buffers: what an I/O worker hands to compute.
//!
//! O_DIRECT reads need the destination aligned to the device block size, and
//! SIMD kernels prefer aligned rows, so every expert buffer is 4096-aligned.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Receiver, Sender, bounded};

/// Bytes an expert is decoded from, shared with the matrices that point
/// into them: an [`AlignedBuf`] a worker read into, or a read-only mapping
/// of the container.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Alignment of every expert buffer (the page size and the O_DIRECT block).
pub const BUF_ALIGN: usize = 4096;

/// One aligned allocation; freed when dropped.
struct Block {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: a Block owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for Block {}

impl Block {
    fn layout(cap: usize) -> Layout {
        match Layout::from_size_align(cap, BUF_ALIGN) {
            Ok(l) => l,
            // cap is a multiple of BUF_ALIGN below isize::MAX for any buffer
            // that could be allocated at all.
            Err(_) => std::alloc::handle_alloc_error(Layout::new::<u8>()),
        }
    }

    /// A zeroed block of at least `len` bytes, rounded up to the alignment
    /// so O_DIRECT may read whole blocks into it.
    fn zeroed(len: usize) -> Self {
        let cap = len.div_ceil(BUF_ALIGN).max(1) * BUF_ALIGN;
        let layout = Self::layout(cap);
        // SAFETY: layout has non-zero size (cap >= BUF_ALIGN) and a valid
        // power-of-two alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        Self { ptr, cap }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated in `Block::zeroed` with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

/// A heap buffer whose start is aligned to [`BUF_ALIGN`]. One taken from a
/// [`BufPool`] goes back to it when dropped.
pub struct AlignedBuf {
    /// Always `Some` until `drop` moves it out.
    block: Option<Block>,
    len: usize,
    home: Option<Sender<Block>>,
}

// SAFETY: shared references only give out &[u8]; no interior mutability.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes; its capacity is rounded up to the
    /// alignment so O_DIRECT may read whole blocks into it.
    pub fn zeroed(len: usize) -> Self {
        Self {
            block: Some(Block::zeroed(len)),
            len,
            home: None,
        }
    }

    /// Copies `bytes` into a new aligned buffer.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut b = Self::zeroed(bytes.len());
        b.as_mut_slice().copy_from_slice(bytes);
        b
    }

    fn raw(&self) -> (*mut u8, usize) {
        match &self.block {
            Some(b) => (b.ptr.as_ptr(), b.cap),
            None => (NonNull::dangling().as_ptr(), 0),
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
        self.raw().1
    }

    /// Shrinks the logical length (after a short read, say).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// The whole capacity, for reads that must cover whole blocks.
    pub fn full_capacity_mut(&mut self) -> &mut [u8] {
        let (ptr, cap) = self.raw();
        // SAFETY: ptr is valid for cap initialised bytes (zeroed at
        // allocation, written only through this type since), exclusively
        // borrowed.
        unsafe { std::slice::from_raw_parts_mut(ptr, cap) }
    }

    pub fn as_slice(&self) -> &[u8] {
        let (ptr, _) = self.raw();
        // SAFETY: ptr is valid for len <= cap initialised bytes.
        unsafe { std::slice::from_raw_parts(ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let (ptr, _) = self.raw();
        // SAFETY: ptr is valid for len <= cap initialised bytes, exclusively
        // borrowed.
        unsafe { std::slice::from_raw_parts_mut(ptr, self.len) }
    }

    /// Sets the logical length up to the capacity (after a block read).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let (Some(block), Some(home)) = (self.block.take(), &self.home) {
            // A full pool hands the block back and it is freed here.
            let _ = home.try_send(block);
        }
    }
}

/// Recycles expert buffers. A streamed expert's buffer lives as long as the
/// cache keeps the expert (and compute still uses it); when it is evicted,
/// its allocation comes back here and the next read lands in it, so steady
/// decode neither allocates, nor has the kernel clear fresh pages, nor
/// faults them in. Live buffers are bounded by the cache's byte budget; the
/// pool itself keeps at most `slots` idle ones.
#[derive(Clone)]
pub struct BufPool {
    free: Sender<Block>,
    take: Receiver<Block>,
    stats: Arc<PoolStats>,
}

/// How often a buffer was allocated rather than reused.
#[derive(Default)]
struct PoolStats {
    allocated: AtomicU64,
    reused: AtomicU64,
}

impl BufPool {
    /// A pool keeping up to `slots` idle buffers.
    pub fn new(slots: usize) -> Self {
        let (free, take) = bounded(slots.max(1));
        Self {
            free,
            take,
            stats: Arc::default(),
        }
    }

    /// A buffer of `len` bytes: a recycled one of about that size (its
    /// contents are whatever it held before; callers overwrite them), else
    /// a new zeroed one.
    pub fn take(&self, len: usize) -> AlignedBuf {
        let want = len.div_ceil(BUF_ALIGN).max(1) * BUF_ALIGN;
        // A block from another layout (GLM's int8 MTP layer among int4
        // ones, say) that is too small or far too large is freed instead.
        for _ in 0..self.take.len() {
            let Ok(block) = self.take.try_recv() else { break };
            if block.cap >= want && block.cap <= want + want / 4 {
                self.stats.reused.fetch_add(1, Ordering::Relaxed);
                return AlignedBuf {
                    block: Some(block),
                    len,
                    home: Some(self.free.clone()),
                };
            }
        }
        self.stats.allocated.fetch_add(1, Ordering::Relaxed);
        AlignedBuf {
            block: Some(Block::zeroed(len)),
            len,
            home: Some(self.free.clone()),
        }
    }

    /// `(allocated, reused)` buffers so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.stats.allocated.load(Ordering::Relaxed),
            self.stats.reused.load(Ordering::Relaxed),
        )
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

    #[test]
    fn pool_recycles_blocks_of_about_the_same_size() {
        let pool = BufPool::new(2);
        let mut a = pool.take(10_000);
        a.as_mut_slice()[0] = 7;
        let ptr = a.as_slice().as_ptr();
        drop(a);
        // Same rounded size: the same block, contents kept (no zero-fill).
        let b = pool.take(9_000);
        assert_eq!(b.as_slice().as_ptr(), ptr);
        assert_eq!(b.as_slice()[0], 7);
        assert_eq!(b.len(), 9_000);
        assert_eq!(pool.counts(), (1, 1));
        drop(b);
        // Far larger: a new block; the small one is freed, not kept.
        let c = pool.take(100_000);
        assert_eq!(pool.counts(), (2, 1));
        assert_eq!(c.capacity(), 102_400);
        drop(c);
        // Idle blocks beyond the pool's slots are freed.
        let many: Vec<_> = (0..5).map(|_| pool.take(100_000)).collect();
        drop(many);
        assert!(pool.take.len() <= 2);
    }
}
