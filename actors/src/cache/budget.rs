//! How much RAM the expert cache may use when the user does not say.

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

/// The default cache budget: available memory minus what the model still
/// needs besides the cache (resident weights not yet loaded, KV cache,
/// working set), as the model computes it, minus a 10% safety margin.
/// `ram_gb` (from `--ram-gb`) wins when given: it is the budget for the whole
/// engine, so the cache gets what the rest leaves of it.
pub fn default_ram_budget(ram_gb: Option<f64>, other_needs_bytes: u64) -> Option<u64> {
    let total = match ram_gb {
        Some(g) if g.is_finite() && g > 0.0 => (g * (1u64 << 30) as f64) as u64,
        Some(_) => return None,
        None => mem_available_bytes()? / 10 * 9,
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
}
