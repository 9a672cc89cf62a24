//! How much RAM the expert cache may use when the user does not say.
//!
//! The host's `MemAvailable` is not the whole story: a process in a memory
//! cgroup (a container, a `systemd-run --scope -p MemoryMax=`, a batch job)
//! is OOM-killed at the cgroup's limit however much the host has free. So
//! the default budget is the smaller of `MemAvailable` and the headroom of
//! every memory cgroup from the process's own up to the hierarchy's root:
//! limit (v1 `memory.limit_in_bytes`, v2 `memory.max` and `memory.high`)
//! minus what the cgroup holds that it cannot drop (usage minus inactive
//! file pages: clean page cache is reclaimed before anyone is killed).
//!
//! Every path is read under a `root` the caller passes (`/` in production),
//! so tests run the whole discovery on fixture trees.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where a memory figure came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// `/proc/meminfo`'s `MemAvailable`.
    MemAvailable,
    /// A cgroup's limit minus its non-reclaimable usage.
    Cgroup {
        /// "v1" or "v2".
        version: &'static str,
        /// The cgroup directory the limit was read in.
        dir: PathBuf,
        /// The limit file (`memory.limit_in_bytes`, `memory.max`, `memory.high`).
        file: &'static str,
        limit: u64,
        /// Usage that cannot be reclaimed (usage minus inactive file pages).
        used: u64,
    },
}

/// Memory the process may still take, and which limit set it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryHeadroom {
    pub bytes: u64,
    pub source: MemorySource,
    /// `MemAvailable`, when readable (printed beside a cgroup limit).
    pub mem_available: Option<u64>,
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

impl fmt::Display for MemoryHeadroom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            MemorySource::MemAvailable => write!(f, "MemAvailable {:.2} GiB", gib(self.bytes))?,
            MemorySource::Cgroup {
                version,
                dir,
                file,
                limit,
                used,
            } => {
                write!(
                    f,
                    "cgroup {version} {}/{file} {:.2} GiB - {:.2} GiB in use = {:.2} GiB",
                    dir.display(),
                    gib(*limit),
                    gib(*used),
                    gib(self.bytes)
                )?;
                if let Some(m) = self.mem_available {
                    write!(f, " (MemAvailable {:.2} GiB)", gib(m))?;
                }
            }
        }
        Ok(())
    }
}

/// `MemAvailable` from `/proc/meminfo`, in bytes; `None` where unreadable.
pub fn mem_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

fn parse_mem_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut it = line.split_whitespace().skip(1);
    let n: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") | None => n.checked_mul(1024),
        Some(_) => None,
    }
}

/// The memory cgroups of a process, from `/proc/self/cgroup`: the v1
/// `memory` controller's path and the v2 (unified) path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct CgroupPaths {
    v1_memory: Option<String>,
    v2: Option<String>,
}

fn parse_proc_cgroup(text: &str) -> CgroupPaths {
    let mut out = CgroupPaths::default();
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            out.v2 = Some(path.to_string());
        } else if ctrls.split(',').any(|c| c == "memory") {
            out.v1_memory = Some(path.to_string());
        }
    }
    out
}

/// A cgroup filesystem mount from `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CgroupMount {
    /// The path inside the hierarchy that is mounted (usually `/`).
    root: String,
    mount_point: String,
    v2: bool,
}

/// The memory-v1 and v2 mounts. Mountinfo fields: id, parent, dev, root,
/// mount point, options, optional fields up to `-`, fs type, source,
/// super options.
fn parse_mountinfo(text: &str) -> (Option<CgroupMount>, Option<CgroupMount>) {
    let (mut v1, mut v2) = (None, None);
    for line in text.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split_whitespace().collect();
        let post: Vec<&str> = post.split_whitespace().collect();
        let (Some(root), Some(mp), Some(fstype)) = (pre.get(3), pre.get(4), post.first()) else {
            continue;
        };
        let m = |v2| CgroupMount {
            root: unescape_mount(root),
            mount_point: unescape_mount(mp),
            v2,
        };
        match *fstype {
            "cgroup2" if v2.is_none() => v2 = Some(m(true)),
            "cgroup"
                if v1.is_none()
                    && post
                        .get(2)
                        .is_some_and(|opts| opts.split(',').any(|o| o == "memory")) =>
            {
                v1 = Some(m(false))
            }
            _ => {}
        }
    }
    (v1, v2)
}

/// Mountinfo escapes space, tab, newline and backslash as octal `\ooo`.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` joined under `root` (`path` may be absolute).
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// The directories of a cgroup and its ancestors, innermost first, inside
/// the mount (a cgroup path outside the mounted root, as in a namespace
/// whose root is the process's own cgroup, is taken as the root itself).
fn cgroup_dirs(root: &Path, mount: &CgroupMount, cgroup: &str) -> Vec<PathBuf> {
    let base = under(root, &mount.mount_point);
    let rel = if mount.root == "/" {
        cgroup.trim_start_matches('/')
    } else {
        cgroup
            .strip_prefix(mount.root.as_str())
            .unwrap_or("")
            .trim_start_matches('/')
    };
    let mut dirs = Vec::new();
    let mut p = PathBuf::from(rel);
    loop {
        dirs.push(base.join(&p));
        if !p.pop() {
            break;
        }
    }
    dirs.dedup();
    dirs
}

/// A number from a cgroup file; `None` for "max", absent or unparsable.
fn read_u64(path: &Path) -> Option<u64> {
    let t = std::fs::read_to_string(path).ok()?;
    t.trim().parse().ok()
}

/// A `key value` field of a `memory.stat` file.
fn stat_field(dir: &Path, key: &str) -> Option<u64> {
    let t = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    t.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// v1 reports "no limit" as a page-rounded `i64::MAX`; anything at or
/// above this is no limit.
const NO_LIMIT: u64 = 1 << 60;

/// The tightest headroom over `dirs` (a cgroup and its ancestors).
fn tightest(dirs: &[PathBuf], v2: bool) -> Option<(u64, MemorySource)> {
    let mut best: Option<(u64, MemorySource)> = None;
    for dir in dirs {
        let (files, usage, inactive): (&[&'static str], _, _) = if v2 {
            (
                &["memory.max", "memory.high"],
                read_u64(&dir.join("memory.current")),
                stat_field(dir, "inactive_file"),
            )
        } else {
            (
                &["memory.limit_in_bytes"],
                read_u64(&dir.join("memory.usage_in_bytes")),
                // Hierarchical (`total_`) where present: the limit covers children.
                stat_field(dir, "total_inactive_file").or_else(|| stat_field(dir, "inactive_file")),
            )
        };
        let used = usage.unwrap_or(0).saturating_sub(inactive.unwrap_or(0));
        for &file in files {
            let Some(limit) = read_u64(&dir.join(file)).filter(|&l| l < NO_LIMIT) else {
                continue;
            };
            let room = limit.saturating_sub(used);
            if best.as_ref().is_none_or(|(b, _)| room < *b) {
                best = Some((
                    room,
                    MemorySource::Cgroup {
                        version: if v2 { "v2" } else { "v1" },
                        dir: dir.clone(),
                        file,
                        limit,
                        used,
                    },
                ));
            }
        }
    }
    best
}

/// The memory this process may still take: the smaller of `MemAvailable`
/// and the headroom of its memory cgroups (v1 and v2, each level up to the
/// root), all read under `root` (`/` in production). `None` when nothing is
/// readable.
pub fn memory_headroom_at(root: &Path) -> Option<MemoryHeadroom> {
    let mem_available = std::fs::read_to_string(under(root, "proc/meminfo"))
        .ok()
        .and_then(|t| parse_mem_available(&t));
    let mut best: Option<(u64, MemorySource)> = mem_available.map(|m| (m, MemorySource::MemAvailable));
    let cg = std::fs::read_to_string(under(root, "proc/self/cgroup"))
        .map(|t| parse_proc_cgroup(&t))
        .unwrap_or_default();
    let (m1, m2) = std::fs::read_to_string(under(root, "proc/self/mountinfo"))
        .map(|t| parse_mountinfo(&t))
        .unwrap_or((None, None));
    // Without mountinfo, the usual mount points.
    let m1 = m1.or_else(|| {
        Some(CgroupMount {
            root: "/".into(),
            mount_point: "/sys/fs/cgroup/memory".into(),
            v2: false,
        })
    });
    let m2 = m2.or_else(|| {
        Some(CgroupMount {
            root: "/".into(),
            mount_point: "/sys/fs/cgroup".into(),
            v2: true,
        })
    });
    let mut candidates = Vec::new();
    if let (Some(path), Some(m)) = (&cg.v1_memory, &m1) {
        candidates.push(tightest(&cgroup_dirs(root, m, path), false));
    }
    if let (Some(path), Some(m)) = (&cg.v2, &m2) {
        candidates.push(tightest(&cgroup_dirs(root, m, path), m.v2));
    }
    for (room, src) in candidates.into_iter().flatten() {
        if best.as_ref().is_none_or(|(b, _)| room < *b) {
            best = Some((room, src));
        }
    }
    best.map(|(bytes, source)| MemoryHeadroom {
        bytes,
        source,
        mem_available,
    })
}

/// [`memory_headroom_at`] on the real filesystem.
pub fn memory_headroom() -> Option<MemoryHeadroom> {
    memory_headroom_at(Path::new("/"))
}

/// The default cache budget: available memory minus what the model still
/// needs besides the cache (resident weights not yet loaded, KV cache,
/// working set), as the model computes it, minus a 10% safety margin.
/// `ram_gb` (from `--ram-gb`) wins when given: it is the budget for the whole
/// engine, so the cache gets what the rest leaves of it.
pub fn default_ram_budget(ram_gb: Option<f64>, other_needs_bytes: u64) -> Option<u64> {
    let total = match ram_gb {
        Some(g) if g.is_finite() && g > 0.0 => (g * (1u64 << 30) as f64) as u64,
        Some(_) => return None,
        None => memory_headroom()?.bytes / 10 * 9,
    };
    Some(total.saturating_sub(other_needs_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        let t = "MemTotal:       24684084 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_mem_available(t), Some(20_000_000 * 1024));
        assert_eq!(parse_mem_available("MemFree: 1 kB\n"), None);
        assert_eq!(default_ram_budget(Some(1.0), 1 << 29), Some(1 << 29));
        assert_eq!(default_ram_budget(Some(-1.0), 0), None);
        assert!(mem_available_bytes().is_some());
    }

    #[test]
    fn parses_proc_cgroup_and_mountinfo() {
        let cg = "12:pids:/x\n4:memory:/process_api/abc\n1:name=systemd:/\n0::/user.slice/u.scope\n";
        assert_eq!(
            parse_proc_cgroup(cg),
            CgroupPaths {
                v1_memory: Some("/process_api/abc".into()),
                v2: Some("/user.slice/u.scope".into()),
            }
        );
        let mi = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                  34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n\
                  35 31 0:32 /docker/x /sys/fs/cgroup/mem\\040ory rw,relatime shared:9 - cgroup cgroup rw,memory\n\
                  41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let (v1, v2) = parse_mountinfo(mi);
        assert_eq!(
            v1,
            Some(CgroupMount {
                root: "/docker/x".into(),
                mount_point: "/sys/fs/cgroup/mem ory".into(),
                v2: false
            })
        );
        assert_eq!(v2.map(|m| m.mount_point), Some("/sys/fs/cgroup/unified".into()));
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = under(root, rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(p, text).unwrap();
    }

    const MEMINFO_20G: &str = "MemTotal: 24000000 kB\nMemAvailable: 20971520 kB\n";
    const GIB: u64 = 1 << 30;

    #[test]
    fn v1_limit_minus_unreclaimable_usage() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, "proc/meminfo", MEMINFO_20G);
        write(r, "proc/self/cgroup", "4:memory:/jobs/coli\n0::/\n");
        write(
            r,
            "proc/self/mountinfo",
            "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
        );
        let cg = "sys/fs/cgroup/memory/jobs/coli";
        write(
            r,
            &format!("{cg}/memory.limit_in_bytes"),
            &format!("{}\n", 4 * GIB),
        );
        write(
            r,
            &format!("{cg}/memory.usage_in_bytes"),
            &format!("{}\n", 2 * GIB),
        );
        // 1 GiB of the usage is clean page cache: reclaimable.
        write(
            r,
            &format!("{cg}/memory.stat"),
            &format!("cache 5\ninactive_file 7\ntotal_inactive_file {GIB}\n"),
        );
        // The parent has no limit (v1 prints a page-rounded i64::MAX).
        write(
            r,
            "sys/fs/cgroup/memory/jobs/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        let h = memory_headroom_at(r).unwrap();
        assert_eq!(h.bytes, 3 * GIB);
        assert!(matches!(
            &h.source,
            MemorySource::Cgroup { version: "v1", file: "memory.limit_in_bytes", limit, used, .. }
                if *limit == 4 * GIB && *used == GIB
        ));
        assert!(h.to_string().contains("jobs/coli/memory.limit_in_bytes"));
        assert_eq!(h.mem_available, Some(20 * GIB));
    }

    #[test]
    fn v2_takes_tightest_of_max_high_and_ancestors() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, "proc/meminfo", MEMINFO_20G);
        write(r, "proc/self/cgroup", "0::/a/b\n");
        write(
            r,
            "proc/self/mountinfo",
            "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        let b = "sys/fs/cgroup/a/b";
        write(r, &format!("{b}/memory.max"), "max\n");
        write(r, &format!("{b}/memory.high"), &format!("{}\n", 6 * GIB));
        write(r, &format!("{b}/memory.current"), &format!("{GIB}\n"));
        write(r, &format!("{b}/memory.stat"), "anon 1\ninactive_file 0\n");
        // The parent's limit is tighter once its usage counts.
        write(r, "sys/fs/cgroup/a/memory.max", &format!("{}\n", 5 * GIB));
        write(r, "sys/fs/cgroup/a/memory.current", &format!("{}\n", 3 * GIB));
        let h = memory_headroom_at(r).unwrap();
        assert_eq!(h.bytes, 2 * GIB);
        assert!(
            matches!(&h.source, MemorySource::Cgroup { version: "v2", file: "memory.max", dir, .. }
            if dir.ends_with("sys/fs/cgroup/a"))
        );
    }

    #[test]
    fn mem_available_wins_when_smaller_or_alone() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, "proc/meminfo", "MemAvailable: 1048576 kB\n");
        write(r, "proc/self/cgroup", "0::/\n");
        write(r, "sys/fs/cgroup/memory.max", &format!("{}\n", 4 * GIB));
        let h = memory_headroom_at(r).unwrap();
        assert_eq!((h.bytes, h.source), (GIB, MemorySource::MemAvailable));
        // Nothing readable at all.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(memory_headroom_at(empty.path()), None);
    }

    #[test]
    fn namespaced_cgroup_outside_mount_root_reads_the_mount_root() {
        let m = CgroupMount {
            root: "/docker/x".into(),
            mount_point: "/sys/fs/cgroup/memory".into(),
            v2: false,
        };
        let dirs = cgroup_dirs(Path::new("/r"), &m, "/docker/x/inner");
        assert_eq!(
            dirs,
            vec![
                PathBuf::from("/r/sys/fs/cgroup/memory/inner"),
                PathBuf::from("/r/sys/fs/cgroup/memory")
            ]
        );
        assert_eq!(
            cgroup_dirs(Path::new("/r"), &m, "/"),
            vec![PathBuf::from("/r/sys/fs/cgroup/memory")]
        );
    }
}
