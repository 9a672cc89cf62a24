//! O_DIRECT reads: bypass the page cache so a benchmark measures the disk and
//! the cache budget is the only cache.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::pread::drop_pages;
use super::{Storage, fill_from, no_such_file, open_all, range_end};
use crate::buffer::{AlignedBuf, BUF_ALIGN};
use crate::error::SourceError;
use crate::expert::FileId;

/// One file: a buffered descriptor (the fallback) and, where the filesystem
/// allows, an O_DIRECT one.
struct DirectFile {
    buffered: File,
    direct: Option<File>,
    /// Set once the filesystem refused an O_DIRECT read with EINVAL; local to
    /// this file, never reset.
    refused: AtomicBool,
}

/// Reads the block-aligned superset of each request with O_DIRECT into an
/// aligned bounce buffer and copies the requested slice out.
pub struct DirectStorage {
    files: Vec<DirectFile>,
    paths: Vec<PathBuf>,
    drop_cache: bool,
}

impl DirectStorage {
    pub fn open(paths: &[PathBuf], drop_cache: bool) -> Result<Self, SourceError> {
        let buffered = open_all(paths)?;
        let files = buffered
            .into_iter()
            .zip(paths)
            .map(|(buffered, p)| {
                let direct = match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(p) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        tracing::warn!(path = %p.display(), error = %e, "O_DIRECT refused; using buffered reads");
                        None
                    }
                };
                DirectFile {
                    buffered,
                    direct,
                    refused: AtomicBool::new(false),
                }
            })
            .collect();
        Ok(Self {
            files,
            paths: paths.to_vec(),
            drop_cache,
        })
    }

    /// True when reads of `file` really bypass the page cache.
    pub fn is_direct(&self, file: FileId) -> bool {
        self.files
            .get(file as usize)
            .is_some_and(|f| f.direct.is_some() && !f.refused.load(Ordering::Relaxed))
    }

    fn buffered_read(&self, f: &DirectFile, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = fill_from(&f.buffered, offset, buf)?;
        if self.drop_cache {
            drop_pages(&f.buffered, offset, n);
        }
        Ok(n)
    }
}

/// Reads `[start, start + bounce.capacity())` with O_DIRECT, repeating on
/// partial block reads; returns the bytes read (short only at end of file).
fn direct_fill(file: &File, start: u64, bounce: &mut AlignedBuf) -> std::io::Result<usize> {
    direct_fill_slice(file, start, bounce.full_capacity_mut())
}

/// [`direct_fill`] into `dst`, which starts on a block boundary and spans
/// whole blocks.
fn direct_fill_slice(file: &File, start: u64, dst: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0usize;
    while done < dst.len() {
        match file.read_at(&mut dst[done..], start + done as u64) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                // A read that ends off a block boundary can only be the end
                // of the file.
                if !done.is_multiple_of(BUF_ALIGN) {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

impl Storage for DirectStorage {
    fn read_at(&self, file: FileId, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let f = self.files.get(file as usize).ok_or_else(|| no_such_file(file))?;
        let Some(direct) = f.direct.as_ref().filter(|_| !f.refused.load(Ordering::Relaxed)) else {
            return self.buffered_read(f, offset, buf);
        };
        if buf.is_empty() {
            return Ok(0);
        }
        let align = BUF_ALIGN as u64;
        let start = offset / align * align;
        let head = (offset - start) as usize;
        let span = (head + buf.len()).div_ceil(BUF_ALIGN) * BUF_ALIGN;
        let mut bounce = AlignedBuf::zeroed(span);
        match direct_fill(direct, start, &mut bounce) {
            Ok(got) => {
                let n = got.saturating_sub(head).min(buf.len());
                buf[..n].copy_from_slice(&bounce.full_capacity_mut()[head..head + n]);
                Ok(n)
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                if !f.refused.swap(true, Ordering::Relaxed) {
                    let path = self.paths.get(file as usize).map(|p| p.display().to_string());
                    tracing::warn!(
                        path,
                        "O_DIRECT read refused (EINVAL); falling back to buffered reads"
                    );
                }
                self.buffered_read(f, offset, buf)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads straight into `buf` when the request starts on a block
    /// boundary of both the file and the buffer and the buffer's capacity
    /// covers the request rounded up to whole blocks (a converted
    /// container's experts always are): no bounce buffer, no copy.
    fn read_into(
        &self,
        file: FileId,
        offset: u64,
        buf: &mut AlignedBuf,
        at: usize,
        len: usize,
    ) -> std::io::Result<usize> {
        let f = self.files.get(file as usize).ok_or_else(|| no_such_file(file))?;
        let end = range_end(buf, at, len)?;
        let span = len.div_ceil(BUF_ALIGN) * BUF_ALIGN;
        let in_place = offset.is_multiple_of(BUF_ALIGN as u64)
            && at.is_multiple_of(BUF_ALIGN)
            && at + span <= buf.capacity()
            && len > 0;
        let direct = f.direct.as_ref().filter(|_| !f.refused.load(Ordering::Relaxed));
        let (Some(direct), true) = (direct, in_place) else {
            return self.read_at(file, offset, &mut buf.as_mut_slice()[at..end]);
        };
        match direct_fill_slice(direct, offset, &mut buf.full_capacity_mut()[at..at + span]) {
            Ok(got) => Ok(got.min(len)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // Let `read_at` note the refusal and fall back.
                self.read_at(file, offset, &mut buf.as_mut_slice()[at..end])
            }
            Err(e) => Err(e),
        }
    }

    fn path(&self, file: FileId) -> Option<&Path> {
        self.paths.get(file as usize).map(PathBuf::as_path)
    }

    fn kind(&self) -> &'static str {
        "direct"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn check_reads(dir: &Path) -> DirectStorage {
        let data = pattern(3 * BUF_ALIGN + 123);
        let p = dir.join("f.bin");
        std::fs::write(&p, &data).unwrap();
        let s = DirectStorage::open(&[p], false).unwrap();
        for (off, len) in [
            (0usize, 10usize),
            (1, 4096),
            (4095, 2),
            (5000, 4000),
            (0, data.len()),
            (12000, 500),
        ] {
            let mut buf = vec![0u8; len];
            let n = s.read_at(0, off as u64, &mut buf).unwrap();
            let want = len.min(data.len().saturating_sub(off));
            assert_eq!(n, want, "off {off} len {len}");
            assert_eq!(&buf[..n], &data[off..off + n]);
        }
        s
    }

    #[test]
    fn unaligned_ranges_read_correctly() {
        let dir = tempfile::tempdir().unwrap();
        check_reads(dir.path());
    }

    #[test]
    fn reads_into_pooled_buffers_in_place_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let s = check_reads(dir.path());
        let data = std::fs::read(dir.path().join("f.bin")).unwrap();
        // (offset, where in the buffer, length): aligned ones go straight
        // into the buffer, the rest through the bounce path.
        for (off, at, len) in [
            (0, 0, 5000),
            (4096, 0, 4096),
            (8192, 4096, 100),
            (100, 0, 3000),
            (4096, 10, 700),
        ] {
            let mut buf = crate::buffer::AlignedBuf::zeroed(at + len);
            let n = s.read_into(0, off as u64, &mut buf, at, len).unwrap();
            let want = len.min(data.len().saturating_sub(off));
            assert_eq!(n, want, "off {off} at {at} len {len}");
            assert_eq!(&buf.as_slice()[at..at + n], &data[off..off + n]);
        }
        // A range past the buffer is an error, not a panic.
        let mut small = crate::buffer::AlignedBuf::zeroed(10);
        assert!(s.read_into(0, 0, &mut small, 5, 10).is_err());
    }

    #[test]
    fn tmpfs_falls_back_to_buffered() {
        // tmpfs refuses O_DIRECT; the reads must still be right.
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        let Ok(dir) = tempfile::tempdir_in(shm) else {
            return;
        };
        check_reads(dir.path());
    }
}
