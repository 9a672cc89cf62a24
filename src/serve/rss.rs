//! Resident memory for the STAT lines.

/// Peak resident set size in GiB, as upstream reports it (`ru_maxrss`):
/// `VmHWM` from `/proc/self/status`, falling back to `VmRSS`; 0 when unknown
/// (non-Linux), because a STAT line must always be printable.
pub fn rss_gb() -> f64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0.0;
    };
    let field = |name: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: f64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb / (1024.0 * 1024.0))
    };
    field("VmHWM:").or_else(|| field("VmRSS:")).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn rss_is_positive_and_sane_on_linux() {
        let g = super::rss_gb();
        if cfg!(target_os = "linux") {
            assert!(g > 0.0 && g < 4096.0, "{g}");
        }
    }
}
