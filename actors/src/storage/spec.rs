//! `--disk-sim SPEC`: the simulated disk's parameters (documented in the repository's README.md).
//!
//! `bw=200MB/s,lat=2ms,jitter=1ms,spike=P:DUR,fail=P,short=P,seed=N`; every
//! key optional, each at most once. Sizes take B/KB/MB/GB (powers of 1000) or
//! KiB/MiB/GiB (powers of 1024), optionally followed by `/s`; durations take
//! ns/us/ms/s; probabilities are in [0, 1].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A latency spike: with `probability`, a request takes `duration` longer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spike {
    pub probability: f64,
    pub duration: Duration,
}

/// Parameters of [`super::SimDisk`].
#[derive(Clone, Debug, PartialEq)]
pub struct SimSpec {
    /// Bytes per second the whole disk delivers (shared by concurrent
    /// requests); `None` = as fast as the wrapped storage.
    pub bandwidth: Option<u64>,
    /// Fixed cost of every request.
    pub latency: Duration,
    /// Extra latency, uniform in [0, jitter].
    pub jitter: Duration,
    pub spike: Option<Spike>,
    /// Probability that a request fails with EIO.
    pub fail: f64,
    /// Probability that a request returns fewer bytes than asked.
    pub short: f64,
    pub seed: u64,
}

impl Default for SimSpec {
    fn default() -> Self {
        Self {
            bandwidth: None,
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
            spike: None,
            fail: 0.0,
            short: 0.0,
            seed: 0x5EED,
        }
    }
}

/// Why a `--disk-sim` spec was refused; always names the offending part.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimSpecError {
    #[error("--disk-sim: the spec is empty (expected e.g. bw=200MB/s,lat=2ms)")]
    Empty,
    #[error("--disk-sim: `{item}` is not key=value")]
    NotKeyValue { item: String },
    #[error("--disk-sim: unknown key `{key}` (expected bw, lat, jitter, spike, fail, short, seed)")]
    UnknownKey { key: String },
    #[error("--disk-sim: key `{key}` is given twice")]
    Duplicate { key: String },
    #[error("--disk-sim: bad value `{value}` for `{key}`: {reason}")]
    BadValue {
        key: String,
        value: String,
        reason: String,
    },
}

fn bad(key: &str, value: &str, reason: impl Into<String>) -> SimSpecError {
    SimSpecError::BadValue {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Splits `12.5ms` into (12.5, "ms").
fn number_and_unit<'a>(key: &str, value: &'a str) -> Result<(f64, &'a str), SimSpecError> {
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (num, unit) = value.split_at(split);
    if num.is_empty() {
        return Err(bad(key, value, "expected a number"));
    }
    let x: f64 = num.parse().map_err(|_| bad(key, value, "expected a number"))?;
    if !x.is_finite() {
        return Err(bad(key, value, "the number is not finite"));
    }
    Ok((x, unit))
}

fn parse_duration(key: &str, value: &str) -> Result<Duration, SimSpecError> {
    let (x, unit) = number_and_unit(key, value)?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "" => return Err(bad(key, value, "missing unit (us, ms or s)")),
        _ => {
            return Err(bad(
                key,
                value,
                format!("unknown time unit `{unit}` (us, ms or s)"),
            ));
        }
    };
    let secs = x * scale;
    if secs > 3600.0 {
        return Err(bad(key, value, "longer than an hour"));
    }
    Ok(Duration::from_nanos((secs * 1e9).round() as u64))
}

fn parse_bandwidth(key: &str, value: &str) -> Result<u64, SimSpecError> {
    let (x, unit) = number_and_unit(key, value)?;
    let unit = unit.strip_suffix("/s").unwrap_or(unit);
    let mult: f64 = match unit {
        "B" => 1.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "" => {
            return Err(bad(
                key,
                value,
                "missing unit (B, KB, MB, GB, KiB, MiB, GiB, optionally /s)",
            ));
        }
        _ => {
            return Err(bad(
                key,
                value,
                format!("unknown size unit `{unit}` (B, KB, MB, GB, KiB, MiB, GiB)"),
            ));
        }
    };
    let bps = (x * mult).round();
    if bps < 1.0 {
        return Err(bad(key, value, "bandwidth must be at least 1 B/s"));
    }
    if bps > 1e15 {
        return Err(bad(key, value, "bandwidth is implausibly large"));
    }
    Ok(bps as u64)
}

fn parse_probability(key: &str, value: &str) -> Result<f64, SimSpecError> {
    let p: f64 = value
        .parse()
        .map_err(|_| bad(key, value, "expected a probability in [0, 1]"))?;
    if !(0.0..=1.0).contains(&p) {
        return Err(bad(key, value, "probability must be in [0, 1]"));
    }
    Ok(p)
}

impl FromStr for SimSpec {
    type Err = SimSpecError;

    fn from_str(s: &str) -> Result<Self, SimSpecError> {
        if s.trim().is_empty() {
            return Err(SimSpecError::Empty);
        }
        let mut spec = SimSpec::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in s.split(',') {
            let item = item.trim();
            let Some((key, value)) = item.split_once('=') else {
                return Err(SimSpecError::NotKeyValue {
                    item: item.to_string(),
                });
            };
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(SimSpecError::Duplicate { key: key.to_string() });
            }
            match key {
                "bw" => spec.bandwidth = Some(parse_bandwidth(key, value)?),
                "lat" => spec.latency = parse_duration(key, value)?,
                "jitter" => spec.jitter = parse_duration(key, value)?,
                "spike" => {
                    let (p, d) = value
                        .split_once(':')
                        .ok_or_else(|| bad(key, value, "expected P:DUR, e.g. 0.01:50ms"))?;
                    spec.spike = Some(Spike {
                        probability: parse_probability(key, p)?,
                        duration: parse_duration(key, d)?,
                    });
                }
                "fail" => spec.fail = parse_probability(key, value)?,
                "short" => spec.short = parse_probability(key, value)?,
                "seed" => {
                    spec.seed = value
                        .parse()
                        .map_err(|_| bad(key, value, "expected a non-negative integer"))?
                }
                _ => return Err(SimSpecError::UnknownKey { key: key.to_string() }),
            }
            seen.push(key);
        }
        Ok(spec)
    }
}

fn us(d: Duration) -> String {
    format!("{}us", d.as_nanos() as f64 / 1000.0)
}

/// Writes the spec in the same syntax it is parsed from.
impl fmt::Display for SimSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(bw) = self.bandwidth {
            parts.push(format!("bw={bw}B/s"));
        }
        parts.push(format!("lat={}", us(self.latency)));
        parts.push(format!("jitter={}", us(self.jitter)));
        if let Some(s) = self.spike {
            parts.push(format!("spike={}:{}", s.probability, us(s.duration)));
        }
        parts.push(format!("fail={}", self.fail));
        parts.push(format!("short={}", self.short));
        parts.push(format!("seed={}", self.seed));
        write!(f, "{}", parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_contract_example() {
        let s: SimSpec = "bw=200MB/s,lat=2ms,jitter=1ms,spike=0.01:50ms,fail=0.05,short=0.1,seed=42"
            .parse()
            .unwrap();
        assert_eq!(s.bandwidth, Some(200_000_000));
        assert_eq!(s.latency, Duration::from_millis(2));
        assert_eq!(s.jitter, Duration::from_millis(1));
        assert_eq!(
            s.spike,
            Some(Spike {
                probability: 0.01,
                duration: Duration::from_millis(50)
            })
        );
        assert_eq!((s.fail, s.short, s.seed), (0.05, 0.1, 42));
    }

    #[test]
    fn units() {
        let bw = |v: &str| v.parse::<SimSpec>().map(|s| s.bandwidth);
        assert_eq!(bw("bw=1KiB/s"), Ok(Some(1024)));
        assert_eq!(bw("bw=1.5GB"), Ok(Some(1_500_000_000)));
        assert_eq!(bw("bw=2MiB/s"), Ok(Some(2 << 20)));
        assert_eq!(bw("bw=10B/s"), Ok(Some(10)));
        let lat = |v: &str| v.parse::<SimSpec>().map(|s| s.latency);
        assert_eq!(lat("lat=250us"), Ok(Duration::from_micros(250)));
        assert_eq!(lat("lat=1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(lat(" lat = 3ms "), Ok(Duration::from_millis(3)));
    }

    #[test]
    fn errors_name_the_bad_part() {
        let err = |s: &str| s.parse::<SimSpec>().unwrap_err().to_string();
        assert!(err("bw=200XB/s").contains("`bw`"));
        assert!(err("bw=200XB/s").contains("200XB/s"));
        assert!(err("lat=2").contains("missing unit"));
        assert!(err("speed=3").contains("unknown key `speed`"));
        assert!(err("fail=1.5").contains("`fail`"));
        assert!(err("spike=0.1").contains("P:DUR"));
        assert!(err("seed=-1").contains("`seed`"));
        assert!(err("lat=1ms,lat=2ms").contains("twice"));
        assert!(err("lat").contains("key=value"));
        assert!(err("bw=0B/s").contains("at least"));
        assert_eq!("".parse::<SimSpec>(), Err(SimSpecError::Empty));
    }

    fn arb_spec() -> impl Strategy<Value = SimSpec> {
        (
            proptest::option::of(1u64..1_000_000_000_000),
            0u64..10_000_000,
            0u64..10_000_000,
            proptest::option::of((0.0f64..=1.0, 0u64..10_000_000)),
            0.0f64..=1.0,
            0.0f64..=1.0,
            any::<u64>(),
        )
            .prop_map(|(bandwidth, lat, jit, spike, fail, short, seed)| SimSpec {
                bandwidth,
                latency: Duration::from_micros(lat),
                jitter: Duration::from_micros(jit),
                spike: spike.map(|(probability, d)| Spike {
                    probability,
                    duration: Duration::from_micros(d),
                }),
                fail,
                short,
                seed,
            })
    }

    proptest! {
        #[test]
        fn display_round_trips(spec in arb_spec()) {
            let text = spec.to_string();
            let back: SimSpec = text.parse().map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
            prop_assert_eq!(back, spec);
        }

        #[test]
        fn never_panics(s in "[a-z=,:./0-9 ]{0,40}") {
            let _ = s.parse::<SimSpec>();
        }

        #[test]
        fn durations_in_any_unit(n in 0u32..3600, unit in prop::sample::select(vec!["us", "ms", "s"])) {
            let spec: SimSpec = format!("jitter={n}{unit}").parse().unwrap();
            let mult = match unit { "us" => 1_000u64, "ms" => 1_000_000, _ => 1_000_000_000 };
            prop_assert_eq!(spec.jitter, Duration::from_nanos(u64::from(n) * mult));
        }
    }
}
