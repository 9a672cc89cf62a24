//! Plain positioned reads through the page cache.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::{Storage, fill_from, no_such_file, open_all};
use crate::error::SourceError;
use crate::expert::FileId;

/// `pread` on ordinary file descriptors; the default backend.
pub struct PreadStorage {
    files: Vec<File>,
    paths: Vec<PathBuf>,
    drop_cache: bool,
}

impl PreadStorage {
    pub fn open(paths: &[PathBuf], drop_cache: bool) -> Result<Self, SourceError> {
        Ok(Self {
            files: open_all(paths)?,
            paths: paths.to_vec(),
            drop_cache,
        })
    }
}

/// Asks the kernel to forget the cached pages of a range (best effort: the
/// advice failing only means the next read may be warm).
pub(crate) fn drop_pages(file: &File, offset: u64, len: usize) {
    // SAFETY: posix_fadvise only reads its integer arguments; the fd is valid
    // for the lifetime of `file`.
    let rc = unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    if rc != 0 {
        tracing::debug!(rc, "posix_fadvise(DONTNEED) failed");
    }
}

impl Storage for PreadStorage {
    fn read_at(&self, file: FileId, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let f = self.files.get(file as usize).ok_or_else(|| no_such_file(file))?;
        let n = fill_from(f, offset, buf)?;
        if self.drop_cache {
            drop_pages(f, offset, n);
        }
        Ok(n)
    }

    fn path(&self, file: FileId) -> Option<&Path> {
        self.paths.get(file as usize).map(PathBuf::as_path)
    }

    fn kind(&self) -> &'static str {
        "pread"
    }
}
