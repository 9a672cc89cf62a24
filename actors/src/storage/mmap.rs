//! Reads served by copying out of a read-only memory map.

use std::path::{Path, PathBuf};

use memmap2::{Mmap, UncheckedAdvice};

/// The page size the mapping's advice works in.
const PAGE: usize = 4096;

use super::pread::drop_pages;
use super::{Storage, no_such_file, open_all};
use crate::error::SourceError;
use crate::expert::FileId;

/// Maps every file once and copies requested ranges out, so the buffers the
/// workers hand on are owned like every other backend's.
pub struct MmapStorage {
    /// `None` for empty files, which cannot be mapped.
    maps: Vec<Option<Mmap>>,
    /// Kept for `posix_fadvise` when `drop_cache` is set.
    files: Vec<std::fs::File>,
    paths: Vec<PathBuf>,
    drop_cache: bool,
}

impl MmapStorage {
    /// `drop_cache`: after each copy, drop the range from the page cache.
    pub fn open(paths: &[PathBuf], drop_cache: bool) -> Result<Self, SourceError> {
        let files = open_all(paths)?;
        let mut maps = Vec::with_capacity(files.len());
        for (f, p) in files.iter().zip(paths) {
            let len = f
                .metadata()
                .map_err(|source| SourceError::Open {
                    path: p.clone(),
                    source,
                })?
                .len();
            if len == 0 {
                maps.push(None);
                continue;
            }
            // SAFETY: the map is read-only; expert files are not modified while
            // the engine runs (a truncation underneath would be a user error
            // that the OS reports as SIGBUS, as with any mmap reader).
            let m = unsafe { Mmap::map(f) }.map_err(|source| SourceError::Open {
                path: p.clone(),
                source,
            })?;
            maps.push(Some(m));
        }
        Ok(Self {
            maps,
            files,
            paths: paths.to_vec(),
            drop_cache,
        })
    }
}

impl Storage for MmapStorage {
    fn read_at(&self, file: FileId, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let map = self.maps.get(file as usize).ok_or_else(|| no_such_file(file))?;
        let Some(map) = map else { return Ok(0) };
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(map.len());
        let n = buf.len().min(map.len() - start);
        buf[..n].copy_from_slice(&map[start..start + n]);
        // The copy is what the cache keeps; the mapped pages would stay in
        // this process's RSS (and count against a memory cgroup) until the
        // kernel reclaimed them, so drop their page-table entries now. The
        // page cache keeps the data. Only whole pages inside the range.
        let lo = start.next_multiple_of(PAGE);
        let hi = (start + n) / PAGE * PAGE;
        if hi > lo {
            // SAFETY: the map is a read-only shared file mapping: dropping
            // its PTEs loses no data (later reads fault the file's pages
            // back in), and the copy above no longer borrows the range.
            let r = unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, lo, hi - lo) };
            if let Err(e) = r {
                tracing::debug!(error = %e, "madvise(DONTNEED) after a copy failed");
            }
        }
        if self.drop_cache
            && let Some(f) = self.files.get(file as usize)
        {
            drop_pages(f, start as u64, n);
        }
        Ok(n)
    }

    fn path(&self, file: FileId) -> Option<&Path> {
        self.paths.get(file as usize).map(PathBuf::as_path)
    }

    fn kind(&self) -> &'static str {
        "mmap"
    }
}
