//! A simulated slow, jittery, faulty disk in front of a real backend.
//!
//! Time is simulated by really sleeping, so reads on several worker threads
//! overlap with compute exactly as they would on a slow device. Bandwidth is
//! one shared timeline (concurrent requests queue for it, as on a real disk);
//! latency, jitter and spikes are per request and overlap freely.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::rng::{SplitMix64, mix};
use super::{SimSpec, Storage};
use crate::expert::FileId;

/// Wraps another [`Storage`]; see the module docs.
pub struct SimDisk {
    inner: Arc<dyn Storage>,
    spec: SimSpec,
    /// Origin of the bandwidth timeline.
    origin: Instant,
    /// Nanoseconds after `origin` when the simulated device is next free.
    busy_until: AtomicU64,
    /// Requests so far; each request draws its own generator from
    /// `(seed, request number)`, so no generator state is shared.
    requests: AtomicU64,
}

impl SimDisk {
    pub fn new(inner: Arc<dyn Storage>, spec: SimSpec) -> Self {
        Self {
            inner,
            spec,
            origin: Instant::now(),
            busy_until: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }
    }

    pub fn spec(&self) -> &SimSpec {
        &self.spec
    }

    /// Reserves `transfer` on the bandwidth timeline no earlier than `ready`
    /// and returns when the transfer ends (nanoseconds after `origin`).
    fn reserve(&self, ready: u64, transfer: u64) -> u64 {
        let mut cur = self.busy_until.load(Ordering::Relaxed);
        loop {
            let end = cur.max(ready).saturating_add(transfer);
            match self
                .busy_until
                .compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return end,
                Err(now) => cur = now,
            }
        }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl Storage for SimDisk {
    fn read_at(&self, file: FileId, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        let mut rng = SplitMix64::new(mix(self.spec.seed ^ mix(n.wrapping_add(1))));
        let s = &self.spec;
        let mut latency = s.latency;
        if !s.jitter.is_zero() {
            latency += Duration::from_nanos(rng.below(s.jitter.as_nanos() as u64 + 1));
        }
        if let Some(spike) = s.spike
            && rng.chance(spike.probability)
        {
            latency += spike.duration;
        }
        let fail = rng.chance(s.fail);
        let short = rng.chance(s.short);
        let transfer = match s.bandwidth {
            Some(bw) if !fail => (buf.len() as u128 * 1_000_000_000 / u128::from(bw.max(1))) as u64,
            _ => 0,
        };
        let now = self.now_ns();
        let ready = now.saturating_add(latency.as_nanos() as u64);
        let end = if transfer > 0 {
            self.reserve(ready, transfer)
        } else {
            ready
        };
        if end > now {
            std::thread::sleep(Duration::from_nanos(end - now));
        }
        if fail {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        let got = self.inner.read_at(file, offset, buf)?;
        if short && got > 0 {
            return Ok(rng.below(got as u64) as usize);
        }
        Ok(got)
    }

    fn path(&self, file: FileId) -> Option<&Path> {
        self.inner.path(file)
    }

    fn kind(&self) -> &'static str {
        "sim"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::PreadStorage;

    fn disk(spec: &str) -> (tempfile::TempDir, SimDisk) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.bin");
        std::fs::write(&p, (0..10_000u32).map(|i| i as u8).collect::<Vec<_>>()).unwrap();
        let inner = Arc::new(PreadStorage::open(&[p], false).unwrap());
        (dir, SimDisk::new(inner, spec.parse().unwrap()))
    }

    #[test]
    fn faults_follow_the_probabilities() {
        let (_d, sim) = disk("fail=0.3,short=0.3,seed=9");
        let (mut fails, mut shorts) = (0, 0);
        for _ in 0..1000 {
            let mut b = vec![0u8; 100];
            match sim.read_at(0, 5, &mut b) {
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EIO));
                    fails += 1
                }
                Ok(n) if n < 100 => shorts += 1,
                Ok(_) => assert_eq!(b[0], 5),
            }
        }
        assert!((200..400).contains(&fails), "{fails}");
        assert!((120..300).contains(&shorts), "{shorts}");
    }

    #[test]
    fn clean_disk_reads_everything() {
        let (_d, sim) = disk("bw=1GB/s,lat=10us,jitter=10us,spike=0.1:20us");
        let mut b = vec![0u8; 300];
        assert_eq!(sim.read_at(0, 9_800, &mut b).unwrap(), 200);
        assert_eq!(b[0], (9_800u32 % 256) as u8);
    }
}
