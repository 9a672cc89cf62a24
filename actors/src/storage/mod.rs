//! Where expert bytes come from.
//!
//! The I/O workers only know [`Storage::read_at`]; whether that is a plain
//! `pread`, an O_DIRECT read that bypasses the page cache, a copy out of an
//! mmap, or a simulated slow and faulty disk is chosen once at start-up. That
//! keeps every placement experiment (and every fault) behind one seam.

mod direct;
mod mmap;
mod pread;
mod rng;
mod sim;
mod spec;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use direct::DirectStorage;
pub use mmap::MmapStorage;
pub use pread::PreadStorage;
pub use rng::SplitMix64;
pub use sim::SimDisk;
pub use spec::{SimSpec, SimSpecError, Spike};

use crate::buffer::AlignedBuf;
use crate::error::SourceError;
use crate::expert::FileId;

/// Positioned reads from a fixed set of files.
///
/// `read_at` has `pread` semantics: it fills as much of `buf` as it can from
/// `offset` and returns the count. Real backends only come up short at end of
/// file; a simulated disk may come up short on purpose. Callers that need the
/// whole buffer must check the count (the I/O workers treat a short read as a
/// failed attempt).
pub trait Storage: Send + Sync {
    fn read_at(&self, file: FileId, offset: u64, buf: &mut [u8]) -> std::io::Result<usize>;

    /// Reads `len` bytes at `offset` into `buf[at..at + len]`, with
    /// [`Storage::read_at`]'s semantics. A backend may use the buffer's
    /// alignment and spare capacity to read in place (O_DIRECT without a
    /// bounce buffer); bytes of the capacity past `at + len` may then be
    /// overwritten.
    fn read_into(
        &self,
        file: FileId,
        offset: u64,
        buf: &mut AlignedBuf,
        at: usize,
        len: usize,
    ) -> std::io::Result<usize> {
        let end = range_end(buf, at, len)?;
        self.read_at(file, offset, &mut buf.as_mut_slice()[at..end])
    }

    /// The file's path, for error messages.
    fn path(&self, file: FileId) -> Option<&Path>;

    /// A short name for logs and profiles ("pread", "direct", ...).
    fn kind(&self) -> &'static str;
}

/// `at + len` when `buf[at..at + len]` exists, else the error
/// [`Storage::read_into`] returns for a range past the buffer.
pub(crate) fn range_end(buf: &AlignedBuf, at: usize, len: usize) -> std::io::Result<usize> {
    at.checked_add(len).filter(|&e| e <= buf.len()).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("read of {len} bytes at {at} past a buffer of {}", buf.len()),
        )
    })
}

/// Which backend to build and how.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StorageOptions {
    /// O_DIRECT reads (bypass the page cache); falls back to pread per file
    /// where the filesystem refuses.
    pub direct: bool,
    /// Copy experts out of a read-only mmap instead of reading.
    pub mmap: bool,
    /// After each buffered read, tell the kernel to drop those pages
    /// (`posix_fadvise(DONTNEED)`), so cold-cache benchmarks stay cold.
    pub drop_cache: bool,
    /// Wrap the backend in a simulated disk.
    pub disk_sim: Option<SimSpec>,
}

/// Opens `files` with the backend `opts` asks for.
pub fn open_storage(files: &[PathBuf], opts: &StorageOptions) -> Result<Arc<dyn Storage>, SourceError> {
    let base: Arc<dyn Storage> = if opts.mmap {
        Arc::new(MmapStorage::open(files, opts.drop_cache)?)
    } else if opts.direct {
        Arc::new(DirectStorage::open(files, opts.drop_cache)?)
    } else {
        Arc::new(PreadStorage::open(files, opts.drop_cache)?)
    };
    Ok(match &opts.disk_sim {
        Some(spec) => Arc::new(SimDisk::new(base, spec.clone())),
        None => base,
    })
}

/// Fills `buf` from `file` with repeated `read_at` until it is full or the
/// file ends; what every real backend does inside one call.
pub(crate) fn fill_from(file: &std::fs::File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0usize;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

pub(crate) fn open_all(files: &[PathBuf]) -> Result<Vec<std::fs::File>, SourceError> {
    files
        .iter()
        .map(|p| {
            std::fs::File::open(p).map_err(|source| SourceError::Open {
                path: p.clone(),
                source,
            })
        })
        .collect()
}

pub(crate) fn no_such_file(file: FileId) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!("file id {file} is not in the expert map"),
    )
}
