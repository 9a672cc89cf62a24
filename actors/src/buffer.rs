//! Owned, aligned byte buffers: what an I/O worker hands to compute.
//!
//! O_DIRECT reads need the destination aligned to the device block size, and
//! SIMD kernels prefer aligned rows, so every expert buffer is 4096-aligned.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, bounded, never};

/// Bytes an expert is decoded from, shared with the matrices that point
/// into them: an [`AlignedBuf`] a worker read into, or a read-only mapping
/// of the container.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Alignment of every expert buffer (the page size and the O_DIRECT block).
pub const BUF_ALIGN: usize = 4096;

/// Blocks at least this large are mapped straight from the kernel: its
/// fresh pages read as zeros already, whereas an over-aligned heap
/// allocation is cleared by `memset` after the kernel cleared the pages
/// once when the `memset` faulted them in.
const MAP_MIN: usize = 64 * 1024;

/// One aligned allocation; freed when dropped.
struct Block {
    ptr: NonNull<u8>,
    cap: usize,
    /// An anonymous mapping (else a heap allocation).
    mapped: bool,
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

    fn capacity_for(len: usize) -> usize {
        len.div_ceil(BUF_ALIGN).max(1) * BUF_ALIGN
    }

    /// A zeroed block of at least `len` bytes, rounded up to the alignment
    /// so O_DIRECT may read whole blocks into it. A large one is a fresh
    /// mapping whose pages the kernel clears when they are first touched
    /// (by whoever touches them: the read, or [`Self::prefault`]).
    fn zeroed(len: usize) -> Self {
        let cap = Self::capacity_for(len);
        if cap >= MAP_MIN
            && let Some(b) = Self::map(cap)
        {
            return b;
        }
        let layout = Self::layout(cap);
        // SAFETY: layout has non-zero size (cap >= BUF_ALIGN) and a valid
        // power-of-two alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        Self {
            ptr,
            cap,
            mapped: false,
        }
    }

    /// An anonymous private mapping of `cap` bytes, or `None` if the kernel
    /// refuses (out of mappings, `vm.max_map_count`: the heap serves then).
    /// No `MADV_HUGEPAGE`: on the VM measured (benchmarks-glm.md, cold
    /// start) huge pages made the kernel's clearing most of the CPU time.
    #[cfg(target_os = "linux")]
    fn map(cap: usize) -> Option<Self> {
        // SAFETY: a new anonymous private mapping: no file, no fixed
        // address, so it aliases nothing; checked against MAP_FAILED.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        NonNull::new(raw.cast()).map(|ptr| Self {
            ptr,
            cap,
            mapped: true,
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn map(_cap: usize) -> Option<Self> {
        None
    }

    /// Faults every page in now, so that the thread that later reads into
    /// the block does not wait for the kernel to clear them. Only called on
    /// a fresh (all-zero) block.
    fn prefault(&mut self) {
        if !self.mapped {
            // The heap path's memset touched every page already.
            return;
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: populating the block's own mapping, writable, which
            // only faults its (zero) pages in. Fails with EINVAL before
            // Linux 5.14; the pages are touched one by one then.
            let r = unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.cap, libc::MADV_POPULATE_WRITE) };
            if r == 0 {
                return;
            }
        }
        for off in (0..self.cap).step_by(BUF_ALIGN) {
            // SAFETY: off < cap, inside this exclusively owned block; the
            // page is fresh, so writing a zero leaves its contents as they
            // are, and the volatile write is not optimised away.
            unsafe { self.ptr.as_ptr().add(off).write_volatile(0) };
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.mapped {
            #[cfg(target_os = "linux")]
            // SAFETY: the mapping made in `Block::map` with this length,
            // unmapped once; nothing borrows it any more.
            unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.cap);
            }
            return;
        }
        // SAFETY: allocated in `Block::zeroed` with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

/// Where a pooled buffer's block goes back to.
struct Home {
    free: Sender<Block>,
    stats: Arc<PoolStats>,
}

/// A buffer (on the heap, or its own mapping when large) whose start is
/// aligned to [`BUF_ALIGN`]. One taken from a
/// [`BufPool`] goes back to it when dropped.
pub struct AlignedBuf {
    /// Always `Some` until `drop` moves it out.
    block: Option<Block>,
    len: usize,
    home: Option<Home>,
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
            if let Err(e) = home.free.try_send(block) {
                home.stats.release(&e.into_inner());
            }
        }
    }
}

/// Recycles expert buffers. A streamed expert's buffer lives as long as the
/// cache keeps the expert (and compute still uses it); when it is evicted,
/// its allocation comes back here and the next read lands in it, so steady
/// decode neither allocates, nor has the kernel clear fresh pages, nor
/// faults them in. Live buffers are bounded by the cache's byte budget; the
/// pool itself keeps at most `slots` idle ones.
///
/// While the cache fills there is nothing to recycle; a pool made by
/// [`BufPool::with_prefault`] then hands out blocks a low-priority
/// [`Prefaulter`] thread faulted in ahead of need, so the kernel clears
/// their pages off the read and compute threads.
#[derive(Clone)]
pub struct BufPool {
    free: Sender<Block>,
    take: Receiver<Block>,
    /// Blocks the prefaulter made ready ([`never`] without one).
    ready: Receiver<Block>,
    /// Asks the prefaulter to top its reserve up.
    fill: Option<Sender<FillMsg>>,
    stats: Arc<PoolStats>,
}

/// How the pool's buffers were come by, and its live bytes.
#[derive(Default)]
struct PoolStats {
    allocated: AtomicU64,
    reused: AtomicU64,
    prefaulted: AtomicU64,
    /// Blocks the prefaulter faulted in (taken or still in its reserve).
    made_ahead: AtomicU64,
    /// Bytes of the pool's blocks not freed yet: live buffers, idle ones,
    /// and the prefaulter's reserve.
    live_bytes: AtomicU64,
    /// The prefaulter stopped because `live_bytes` reached its limit.
    filler_done: AtomicBool,
}

impl PoolStats {
    fn allocate(&self, cap: usize) -> Block {
        self.live_bytes.fetch_add(cap as u64, Ordering::Relaxed);
        Block::zeroed(cap)
    }

    /// Forgets a block that is freed rather than kept.
    fn release(&self, block: &Block) {
        self.live_bytes.fetch_sub(block.cap as u64, Ordering::Relaxed);
    }
}

/// A snapshot of a pool's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolCounts {
    /// Buffers allocated on the taker's thread (first-touch faults there).
    pub allocated: u64,
    /// Buffers recycled from evicted experts.
    pub reused: u64,
    /// Buffers taken from the prefaulter's reserve.
    pub prefaulted: u64,
    /// Blocks the prefaulter faulted in so far.
    pub made_ahead: u64,
    /// Bytes of blocks the pool has not freed.
    pub live_bytes: u64,
    /// The prefaulter has stopped at its byte limit.
    pub prefaulter_done: bool,
}

/// Settings of a [`Prefaulter`].
#[derive(Clone, Copy, Debug)]
pub struct PrefaultConfig {
    /// Faulted-in blocks kept ready at most.
    pub reserve: usize,
    /// The prefaulter stops for good once the pool's live bytes would pass
    /// this (the cache's budget: from then on evicted buffers are recycled).
    pub limit_bytes: u64,
}

enum FillMsg {
    /// A block of this capacity was taken that was not recycled: top the
    /// reserve up with blocks of it.
    Want(usize),
    /// Reply once every earlier message is handled.
    Settle(Sender<()>),
    Stop,
}

impl BufPool {
    /// A pool keeping up to `slots` idle buffers.
    pub fn new(slots: usize) -> Self {
        let (free, take) = bounded(slots.max(1));
        Self {
            free,
            take,
            ready: never(),
            fill: None,
            stats: Arc::default(),
        }
    }

    /// A pool like [`Self::new`] with a [`Prefaulter`] thread beside it,
    /// which runs until the returned handle is dropped or its limit is
    /// reached.
    pub fn with_prefault(slots: usize, config: PrefaultConfig) -> std::io::Result<(Self, Prefaulter)> {
        let mut pool = Self::new(slots);
        let reserve = config.reserve.max(1);
        let (ready_tx, ready_rx) = bounded(reserve);
        // Requests beyond the bound are dropped: one pending top-up is as
        // good as many.
        let (fill_tx, fill_rx) = bounded(2 * reserve + 2);
        let filler = Filler {
            rx: fill_rx,
            ready: ready_tx,
            reserve,
            limit_bytes: config.limit_bytes,
            stats: pool.stats.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("coli-prefault".into())
            .spawn(move || filler.run())?;
        pool.ready = ready_rx;
        pool.fill = Some(fill_tx.clone());
        Ok((
            pool,
            Prefaulter {
                tx: fill_tx,
                thread: Some(thread),
            },
        ))
    }

    /// A block that fits `want` bytes (not far larger) from `rx`; misfits
    /// (GLM's int8 MTP layer among int4 ones, say) are freed.
    fn pick(&self, rx: &Receiver<Block>, want: usize) -> Option<Block> {
        for _ in 0..rx.len() {
            let Ok(block) = rx.try_recv() else { break };
            if block.cap >= want && block.cap <= want + want / 4 {
                return Some(block);
            }
            self.stats.release(&block);
        }
        None
    }

    /// A buffer of `len` bytes: a recycled one of about that size (its
    /// contents are whatever it held before; callers overwrite them), else
    /// a faulted-in zeroed one from the prefaulter's reserve, else a new
    /// zeroed one.
    pub fn take(&self, len: usize) -> AlignedBuf {
        let want = Block::capacity_for(len);
        let block = if let Some(b) = self.pick(&self.take, want) {
            self.stats.reused.fetch_add(1, Ordering::Relaxed);
            b
        } else {
            let b = match self.pick(&self.ready, want) {
                Some(b) => {
                    self.stats.prefaulted.fetch_add(1, Ordering::Relaxed);
                    b
                }
                None => {
                    self.stats.allocated.fetch_add(1, Ordering::Relaxed);
                    self.stats.allocate(want)
                }
            };
            if let Some(fill) = self
                .fill
                .as_ref()
                .filter(|_| !self.stats.filler_done.load(Ordering::Relaxed))
            {
                let _ = fill.try_send(FillMsg::Want(want));
            }
            b
        };
        AlignedBuf {
            block: Some(block),
            len,
            home: Some(Home {
                free: self.free.clone(),
                stats: self.stats.clone(),
            }),
        }
    }

    pub fn counts(&self) -> PoolCounts {
        let s = &self.stats;
        PoolCounts {
            allocated: s.allocated.load(Ordering::Relaxed),
            reused: s.reused.load(Ordering::Relaxed),
            prefaulted: s.prefaulted.load(Ordering::Relaxed),
            made_ahead: s.made_ahead.load(Ordering::Relaxed),
            live_bytes: s.live_bytes.load(Ordering::Relaxed),
            prefaulter_done: s.filler_done.load(Ordering::Relaxed),
        }
    }
}

/// The handle of a pool's prefaulting thread; dropping it stops the thread
/// (after the top-up under way, at most a reserve of blocks) and joins it. Buffers and
/// pools outlive it: they then just stop finding ready blocks.
pub struct Prefaulter {
    tx: Sender<FillMsg>,
    thread: Option<JoinHandle<()>>,
}

impl Prefaulter {
    /// Waits until the thread has handled every request made so far, so a
    /// caller (a test, a benchmark's warm-up) sees its reserve topped up.
    pub fn settle(&self) {
        let (tx, rx) = bounded(1);
        if self.tx.send(FillMsg::Settle(tx)).is_ok() {
            // An error means the thread has stopped: nothing to wait for.
            let _ = rx.recv();
        }
    }
}

impl Drop for Prefaulter {
    fn drop(&mut self) {
        // The thread only ever waits on this channel, so the send returns
        // once it has drained the requests ahead (or fails if it stopped).
        let _ = self.tx.send(FillMsg::Stop);
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

/// The prefaulting actor: on each request it tops the reserve up to
/// `reserve` blocks, each faulted in on this thread.
struct Filler {
    rx: Receiver<FillMsg>,
    ready: Sender<Block>,
    reserve: usize,
    limit_bytes: u64,
    stats: Arc<PoolStats>,
}

impl Filler {
    fn run(self) {
        lower_priority();
        let mut done = false;
        // Past the limit the thread stays (idle, blocked here) until the
        // handle stops it, so that `settle` is always answered.
        while let Ok(msg) = self.rx.recv() {
            match msg {
                FillMsg::Want(cap) if !done => {
                    if !self.top_up(cap) {
                        done = true;
                        self.stats.filler_done.store(true, Ordering::Relaxed);
                    }
                }
                FillMsg::Want(_) => {}
                FillMsg::Settle(ack) => {
                    let _ = ack.send(());
                }
                FillMsg::Stop => break,
            }
        }
    }

    /// `false` once the limit is reached.
    fn top_up(&self, cap: usize) -> bool {
        while self.ready.len() < self.reserve {
            let live = self.stats.live_bytes.load(Ordering::Relaxed);
            if live.saturating_add(cap as u64) > self.limit_bytes {
                return false;
            }
            let mut block = self.stats.allocate(cap);
            block.prefault();
            self.stats.made_ahead.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.ready.try_send(block) {
                // Only this thread sends, so this is unreachable in practice;
                // free the block rather than hold more than the reserve.
                self.stats.release(&e.into_inner());
                break;
            }
        }
        true
    }
}

/// Puts the calling thread at the lowest CPU priority: prefaulting ahead
/// is worth doing only with time compute leaves idle (while it waits on
/// the disk, or on spare cores).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: changes only the calling thread's nice value (Linux applies
    // PRIO_PROCESS with id 0 to the calling thread); failure is harmless.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
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
        assert_eq!((pool.counts().allocated, pool.counts().reused), (1, 1));
        drop(b);
        // Far larger: a new block; the small one is freed, not kept.
        let c = pool.take(100_000);
        assert_eq!((pool.counts().allocated, pool.counts().reused), (2, 1));
        assert_eq!(c.capacity(), 102_400);
        drop(c);
        // Idle blocks beyond the pool's slots are freed.
        let many: Vec<_> = (0..5).map(|_| pool.take(100_000)).collect();
        drop(many);
        assert!(pool.take.len() <= 2);
        // Freed blocks leave the live bytes: one idle 100 KB block per slot.
        assert_eq!(pool.counts().live_bytes, pool.take.len() as u64 * 102_400);
    }

    #[test]
    fn large_blocks_are_mapped_zeroed_and_aligned() {
        // Above MAP_MIN and above a huge page: mapped, not memset.
        for len in [MAP_MIN + 1, 3 << 20] {
            let mut b = AlignedBuf::zeroed(len);
            assert!(b.block.as_ref().is_some_and(|b| b.mapped) || cfg!(not(target_os = "linux")));
            assert_eq!(b.as_slice().as_ptr() as usize % BUF_ALIGN, 0);
            assert!(b.full_capacity_mut().iter().all(|&x| x == 0));
            b.as_mut_slice()[len - 1] = 9;
            assert_eq!(b.as_slice()[len - 1], 9);
        }
        // Small ones stay on the heap.
        assert!(
            AlignedBuf::zeroed(MAP_MIN - BUF_ALIGN)
                .block
                .as_ref()
                .is_some_and(|b| !b.mapped)
        );
        // Prefaulting a fresh block keeps it zeroed.
        let mut block = Block::zeroed(5 * BUF_ALIGN + MAP_MIN);
        block.prefault();
        let buf = AlignedBuf {
            len: block.cap,
            block: Some(block),
            home: None,
        };
        assert!(buf.as_slice().iter().all(|&x| x == 0));
    }

    const LEN: usize = 100_000;
    const CAP: u64 = 102_400;

    #[test]
    fn prefaulter_keeps_a_bounded_reserve_of_faulted_blocks() {
        let config = PrefaultConfig {
            reserve: 3,
            limit_bytes: u64::MAX,
        };
        let (pool, filler) = BufPool::with_prefault(2, config).unwrap();
        // Nothing asked for yet: nothing made.
        filler.settle();
        assert_eq!(pool.counts().made_ahead, 0);
        // The first read of the size allocates on the reader's thread and
        // asks for a reserve of blocks of its size.
        let first = pool.take(LEN);
        filler.settle();
        let c = pool.counts();
        assert_eq!((c.allocated, c.prefaulted, c.made_ahead), (1, 0, 3));
        assert_eq!(pool.ready.len(), 3);
        assert_eq!(c.live_bytes, 4 * CAP);
        // The next reads find faulted-in blocks, zeroed, as long as the
        // reserve lasts (the filler only ever adds to it meanwhile).
        let taken: Vec<_> = (0..3).map(|_| pool.take(LEN)).collect();
        assert!(
            taken
                .iter()
                .all(|b| b.as_slice().iter().all(|&x| x == 0) && b.capacity() == CAP as usize)
        );
        let c = pool.counts();
        assert_eq!((c.allocated, c.prefaulted), (1, 3));
        // Topped up again, never past the reserve.
        filler.settle();
        let c = pool.counts();
        assert_eq!(pool.ready.len(), 3);
        assert_eq!(c.made_ahead, 6);
        assert_eq!(c.live_bytes, 7 * CAP);
        // Recycled buffers come first and ask for nothing more.
        drop(first);
        let made = c.made_ahead;
        let again = pool.take(LEN);
        filler.settle();
        let c = pool.counts();
        assert_eq!((c.reused, c.made_ahead), (1, made));
        assert!(!c.prefaulter_done);
        // Shutting down with buffers and the pool still alive returns.
        drop(filler);
        drop((taken, again));
        assert_eq!(pool.counts().allocated, 1);
    }

    #[test]
    fn prefaulter_stops_at_its_byte_limit() {
        let config = PrefaultConfig {
            reserve: 4,
            limit_bytes: 3 * CAP,
        };
        let (pool, filler) = BufPool::with_prefault(8, config).unwrap();
        let a = pool.take(LEN);
        filler.settle();
        // Room for two more blocks under the limit, not four.
        let c = pool.counts();
        assert_eq!((c.made_ahead, c.live_bytes), (2, 3 * CAP));
        assert!(c.prefaulter_done);
        let b = pool.take(LEN);
        let c2 = pool.take(LEN);
        // Stopped: the next one is allocated on the reader's thread, and
        // nothing more is made.
        let d = pool.take(LEN);
        filler.settle();
        let c = pool.counts();
        assert_eq!((c.allocated, c.prefaulted, c.made_ahead), (2, 2, 2));
        // Evicted buffers carry on from here.
        drop((a, b, c2, d));
        let _e = pool.take(LEN);
        assert_eq!(pool.counts().reused, 1);
        drop(filler);
    }

    #[test]
    fn a_prefaulter_whose_pool_is_gone_shuts_down() {
        let config = PrefaultConfig {
            reserve: 2,
            limit_bytes: u64::MAX,
        };
        let (pool, filler) = BufPool::with_prefault(2, config).unwrap();
        let buf = pool.take(LEN);
        drop(pool);
        filler.settle();
        drop(filler);
        // The buffer outlives both and is freed on its own.
        assert_eq!(buf.len(), LEN);
    }
}
