//! The disk side of a benchmark: the bandwidth the I/O bound divides by.
//!
//! The bound must use the storage the decode run used, so the probe reads
//! the model's own expert extents, in file order, with the same settings
//! (O_DIRECT or buffered), or takes the simulated bandwidth from
//! `--disk-sim bw=...` when the disk is simulated.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use colibri_actors::{AlignedBuf, ExpertKey, ExpertMap};

/// Why the disk could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--disk-sim {spec:?}: bad bandwidth {value:?} (expected e.g. bw=200MB/s)")]
    Bandwidth { spec: String, value: String },
    #[error("the model has no expert extents to read")]
    NoExperts,
}

/// The `bw=` of a `--disk-sim` spec in bytes per second, if it has one.
/// Units: B, KB, MB, GB (powers of 1000) and KiB, MiB, GiB, with or
/// without `/s`.
pub fn sim_bandwidth(spec: &str) -> Result<Option<f64>, DiskError> {
    let Some(value) = spec
        .split(',')
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| k.trim() == "bw")
        .map(|(_, v)| v.trim())
    else {
        return Ok(None);
    };
    let bad = || DiskError::Bandwidth {
        spec: spec.to_string(),
        value: value.to_string(),
    };
    let v = value.strip_suffix("/s").unwrap_or(value);
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let num: f64 = num.parse().map_err(|_| bad())?;
    let mult = match unit.trim() {
        "" | "B" => 1.0,
        "KB" | "kB" | "K" | "k" => 1e3,
        "MB" | "M" => 1e6,
        "GB" | "G" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(bad()),
    };
    let bw = num * mult;
    if bw.is_finite() && bw > 0.0 {
        Ok(Some(bw))
    } else {
        Err(bad())
    }
}

/// A measured sequential read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bandwidth {
    pub bytes: u64,
    pub secs: f64,
    /// Whether O_DIRECT was in effect (it can be refused by the filesystem).
    pub direct: bool,
}

impl Bandwidth {
    pub fn bytes_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 / self.secs
        } else {
            0.0
        }
    }
}

const BLOCK: u64 = 4096;

fn open(path: &Path, direct: bool) -> Result<(File, bool), DiskError> {
    let io = |source| DiskError::Io {
        path: path.to_path_buf(),
        source,
    };
    if direct {
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(io(e)),
        }
    }
    File::open(path).map(|f| (f, false)).map_err(io)
}

/// Reads whole experts in file order (layer-major, as a container stores
/// them), at most `max_bytes`, one read per expert as the I/O workers do,
/// and times it.
pub fn read_bandwidth(map: &ExpertMap, direct: bool, max_bytes: u64) -> Result<Bandwidth, DiskError> {
    let mut files = Vec::with_capacity(map.files.len());
    let mut all_direct = true;
    for p in &map.files {
        let (f, d) = open(p, direct)?;
        all_direct &= d;
        files.push(f);
    }
    let mut buf = AlignedBuf::zeroed((map.max_expert_bytes() + 2 * BLOCK) as usize);
    let (mut bytes, t0) = (0u64, Instant::now());
    'outer: for l in 0..map.layers {
        for e in 0..map.experts_per_layer {
            let key = ExpertKey::new(l as u32, e as u32);
            let Ok(extent) = map.extent(key) else { continue };
            let Some(first) = extent.pieces.first() else {
                continue;
            };
            let start = extent
                .pieces
                .iter()
                .map(|p| p.offset)
                .min()
                .unwrap_or(first.offset);
            let end = extent
                .pieces
                .iter()
                .map(|p| p.offset + p.len)
                .max()
                .unwrap_or(start);
            // Whole blocks, as O_DIRECT requires (harmless when buffered).
            let (lo, hi) = (start / BLOCK * BLOCK, end.next_multiple_of(BLOCK));
            let path = map.files.get(first.file as usize).cloned().unwrap_or_default();
            let file = files.get(first.file as usize).ok_or_else(|| DiskError::Io {
                path: path.clone(),
                source: std::io::Error::other("file id out of range"),
            })?;
            let want = (hi - lo) as usize;
            if buf.capacity() < want {
                buf = AlignedBuf::zeroed(want);
            }
            let dst = &mut buf.full_capacity_mut()[..want];
            let n = read_at_most(file, dst, lo).map_err(|source| DiskError::Io { path, source })?;
            bytes += n as u64;
            if bytes >= max_bytes {
                break 'outer;
            }
        }
    }
    if bytes == 0 {
        return Err(DiskError::NoExperts);
    }
    Ok(Bandwidth {
        bytes,
        secs: t0.elapsed().as_secs_f64(),
        direct: direct && all_direct,
    })
}

/// Reads until `dst` is full or the file ends (the last block of a file
/// may be short).
fn read_at_most(file: &File, dst: &mut [u8], mut offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < dst.len() {
        match file.read_at(&mut dst[done..], offset) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sim_bandwidth() {
        assert_eq!(sim_bandwidth("bw=200MB/s").unwrap(), Some(200e6));
        assert_eq!(sim_bandwidth("lat=2ms, bw=1GB/s ,seed=3").unwrap(), Some(1e9));
        assert_eq!(
            sim_bandwidth("bw=1.5GiB").unwrap(),
            Some(1.5 * 1024.0 * 1024.0 * 1024.0)
        );
        assert_eq!(sim_bandwidth("lat=2ms").unwrap(), None);
        assert!(sim_bandwidth("bw=fast").is_err());
        assert!(sim_bandwidth("bw=0MB/s").is_err());
        assert!(sim_bandwidth("bw=3XB/s").is_err());
    }
}
