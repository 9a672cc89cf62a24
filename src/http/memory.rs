//! Giving freed memory back to the system after a large request.
//!
//! glibc's allocator keeps what a thread frees in that thread's arena for
//! reuse, and once a block of several megabytes has been freed it stops
//! mapping blocks that size separately (its mmap threshold rises to it), so
//! the next ones come from the arenas too. An 8 MB body, its parsed JSON and
//! the rendered prompt thus stay resident after the request, in the arena
//! of whichever async or preparation thread touched them: hundreds of
//! megabytes after a few such requests, never returned. `malloc_trim(0)`
//! hands every arena's free pages back (`madvise`), except the free top
//! of an arena other than the main one (the main thread's), which only
//! that arena's own `free` trims, and only above a threshold that grows
//! with the blocks seen. Hence:
//! - a large body is read into its own anonymous mapping ([`super::body`]),
//!   returned to the system when dropped whatever the allocator does;
//! - large requests are parsed and rendered on the main thread
//!   ([`super::server::serve`]), so their big strings come from the main
//!   arena, whose top `malloc_trim` does return;
//! - after each large request, once its memory is freed, `malloc_trim(0)`
//!   runs there (it takes a few milliseconds, so only then).

/// Returns the allocator's free pages to the system (a no-op where the
/// allocator is not glibc's).
pub fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and only walks glibc's own
    // arenas, each under its lock, so any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
