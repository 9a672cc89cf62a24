//! The I/O and compute bounds of a streamed decode, built so that the
//! measured speed cannot exceed them.
//!
//! I/O: a token cannot be faster than the disk's bandwidth over the bytes
//! a token must read. Both terms are taken in the run's disfavour:
//! - the bandwidth is the larger of the probe ([`super::disk`]) and the
//!   highest read throughput any pass achieved (its window's bytes over its
//!   window's seconds), so a probe that undersells the disk cannot lower
//!   the bound below what the run itself showed;
//! - the bytes are what Belady's optimal policy reads for the run's own
//!   routing at the run's cache capacity (`routing::replay::optimal`), not
//!   the run's own reads, so a policy that evicts what it needs again
//!   cannot raise its own bound. When the run read fewer bytes than that
//!   (its cache held more than the capacity model assumed), its own bytes
//!   are used and the report says so.
//!
//! Then `measured <= bandwidth_pass / (read_bytes / tokens) <= bound`:
//! the run's window throughput is at most the bandwidth, and its bytes at
//! least the bytes the bound divides by.
//!
//! Compute: the larger of the all-resident pass's speed and the measured
//! pass's own tokens over the time it did not spend waiting for experts.

use colibri_actors::ExpertMap;

use super::disk::DiskProbe;

/// The disk figure the I/O bound divides, and where it came from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DiskFigure {
    pub probe: Option<DiskProbe>,
    /// `--disk-sim bw=...`, bytes a second.
    pub simulated: Option<f64>,
    /// Each streamed pass's window read throughput: bytes read over the
    /// window's seconds.
    pub passes: Vec<(String, f64)>,
}

impl DiskFigure {
    fn given(&self) -> f64 {
        match (&self.simulated, &self.probe) {
            (Some(s), _) => *s,
            (None, Some(p)) => p.max(),
            (None, None) => 0.0,
        }
    }

    fn best_pass(&self) -> Option<&(String, f64)> {
        self.passes.iter().max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// Bytes a second: the larger of the given figure (the probe's best
    /// repeat, or the simulated bandwidth) and the best pass.
    pub fn bandwidth(&self) -> f64 {
        self.best_pass().map_or(0.0, |p| p.1).max(self.given())
    }

    /// What set [`Self::bandwidth`], in words.
    pub fn source(&self) -> String {
        let given = match self.simulated {
            Some(_) => "the simulated disk (--disk-sim bw)",
            None => "the probe's best repeat",
        };
        match self.best_pass() {
            Some((name, bw)) if *bw > self.given() => format!(
                "the {name:?} pass's own reads ({:.1} MB/s), faster than {given} ({:.1} MB/s)",
                bw / 1e6,
                self.given() / 1e6
            ),
            _ => given.to_string(),
        }
    }
}

/// See the module docs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IoBound {
    /// Bytes a second ([`DiskFigure::bandwidth`]).
    pub disk: f64,
    /// Bytes the optimal policy reads over the window.
    pub optimal_bytes: u64,
    /// Bytes the run read over the window.
    pub read_bytes: u64,
    pub tokens: usize,
}

impl IoBound {
    /// Bytes a token must read: the optimal policy's, or the run's own
    /// when they are fewer.
    pub fn bytes_per_token(&self) -> f64 {
        self.optimal_bytes.min(self.read_bytes) as f64 / self.tokens.max(1) as f64
    }

    /// Whether the run read less than the optimal policy would (its cache
    /// held more than the capacity the replay assumed).
    pub fn run_below_optimal(&self) -> bool {
        self.read_bytes < self.optimal_bytes
    }

    pub fn tok_per_s(&self) -> f64 {
        let b = self.bytes_per_token();
        if b > 0.0 && self.disk > 0.0 {
            self.disk / b
        } else {
            f64::INFINITY
        }
    }

    /// The policy's efficiency: the run's bytes over the optimal policy's
    /// (1 is optimal; `None` when the optimal policy reads nothing).
    pub fn efficiency(&self) -> Option<f64> {
        (self.optimal_bytes > 0).then(|| self.read_bytes as f64 / self.optimal_bytes as f64)
    }
}

/// See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ComputeBound {
    /// The all-resident pass's tokens a second.
    pub resident: Option<f64>,
    /// The measured pass's tokens over its decode time less its waits.
    pub measured_compute: Option<f64>,
}

impl ComputeBound {
    pub fn tok_per_s(&self) -> Option<f64> {
        match (self.resident, self.measured_compute) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Tokens over the seconds not spent waiting; `None` without waits
    /// measured or with no time left.
    pub fn from_waits(tokens: usize, decode_secs: f64, wait_secs: f64) -> Option<f64> {
        let busy = decode_secs - wait_secs;
        (tokens > 0 && busy > 0.0 && wait_secs >= 0.0).then(|| tokens as f64 / busy)
    }
}

/// Mean file bytes of a routed expert: layers without routed experts hold
/// empty extents, which are not experts and must not pull the mean down.
pub fn mean_routed_expert_bytes(map: &ExpertMap) -> f64 {
    let (sum, n) = map
        .extents
        .iter()
        .map(|e| e.bytes())
        .filter(|&b| b > 0)
        .fold((0u64, 0u64), |(s, n), b| (s + b, n + 1));
    if n == 0 { 0.0 } else { sum as f64 / n as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use colibri_actors::{ExpertExtent, ExpertKey, Piece};

    #[test]
    fn the_measured_speed_cannot_exceed_the_bound() {
        // Whatever the probe says and however the run read, the window's
        // speed stays at or under the bound.
        let cases = [
            // (probe MB/s, run bytes, optimal bytes, tokens, window secs)
            (100.0, 8_000_000u64, 6_000_000u64, 10usize, 0.05f64),
            (1.0, 8_000_000, 6_000_000, 10, 0.05),
            (500.0, 4_000_000, 6_000_000, 10, 1.0),
            (500.0, 0, 0, 10, 1.0),
        ];
        for (probe_mb, read, optimal, tokens, secs) in cases {
            let disk = DiskFigure {
                probe: None,
                simulated: Some(probe_mb * 1e6),
                passes: vec![("measured".into(), read as f64 / secs)],
            };
            let b = IoBound {
                disk: disk.bandwidth(),
                optimal_bytes: optimal,
                read_bytes: read,
                tokens,
            };
            let measured = tokens as f64 / secs;
            assert!(measured <= b.tok_per_s() * (1.0 + 1e-12), "{b:?}: {measured}");
        }
        let d = DiskFigure {
            probe: None,
            simulated: Some(1e6),
            passes: vec![("measured".into(), 5e6)],
        };
        assert!(d.source().contains("\"measured\" pass"), "{}", d.source());
        assert_eq!(
            ComputeBound {
                resident: Some(2.0),
                measured_compute: ComputeBound::from_waits(10, 2.0, 1.0)
            }
            .tok_per_s(),
            Some(10.0)
        );
        assert_eq!(ComputeBound::from_waits(10, 1.0, 1.0), None);
    }

    #[test]
    fn empty_extents_are_not_experts() {
        let mut map = ExpertMap::new(vec![], 2, 2);
        for e in 0..2 {
            let extent = ExpertExtent {
                pieces: vec![Piece {
                    file: 0,
                    offset: 0,
                    len: 100,
                }],
            };
            map.set_extent(ExpertKey::new(1, e), extent).unwrap();
        }
        assert_eq!(mean_routed_expert_bytes(&map), 100.0);
    }
}
