//! The exact bytes `coli serve` writes to stdout (docs/serve-protocol.md).
//!
//! Two STAT shapes exist upstream and clients parse both: the short
//! `STAT <emitted> <tok/s> <hit%> <rss>` (after READY, RESET, MORE and an
//! empty line) and the long one that adds `<prompt_tokens> <length_limited>`
//! (after a generated turn or a malformed frame).

use std::io::{self, Write};

/// Sent once the model is loaded.
pub const READY: &[u8] = b"\x01\x01READY\x01\x01\n";
/// Ends every reply.
pub const END: &[u8] = b"\x01\x01END\x01\x01\n";

/// Non-finite statistics would print as `inf`/`NaN`, which clients cannot parse.
fn finite(x: f64) -> f64 {
    if x.is_finite() { x } else { 0.0 }
}

/// `READY` then the initial short STAT.
pub fn ready(w: &mut dyn Write, rss_gb: f64) -> io::Result<()> {
    w.write_all(READY)?;
    stat_initial(w, rss_gb)
}

/// `STAT 0 0.00 0.0 <rss_gb>` (short form, nothing generated).
pub fn stat_initial(w: &mut dyn Write, rss_gb: f64) -> io::Result<()> {
    writeln!(w, "STAT 0 0.00 0.0 {:.2}", finite(rss_gb))
}

/// END (preceded by `\n` for chat replies, not for raw PROMPT replies) and the long STAT.
#[allow(clippy::too_many_arguments)]
pub fn end_and_stat(
    w: &mut dyn Write,
    newline_before_end: bool,
    emitted: usize,
    tok_per_s: f64,
    hit_pct: f64,
    rss_gb: f64,
    prompt_tokens: usize,
    length_limited: bool,
) -> io::Result<()> {
    if newline_before_end {
        w.write_all(b"\n")?;
    }
    w.write_all(END)?;
    writeln!(
        w,
        "STAT {emitted} {:.2} {:.1} {:.2} {prompt_tokens} {}",
        finite(tok_per_s),
        finite(hit_pct),
        finite(rss_gb),
        u8::from(length_limited)
    )
}

/// The reply to `\x02MORE` that generated: `\n`, END and the short STAT.
pub fn more_end_and_stat(
    w: &mut dyn Write,
    emitted: usize,
    tok_per_s: f64,
    hit_pct: f64,
    rss_gb: f64,
) -> io::Result<()> {
    w.write_all(b"\n")?;
    w.write_all(END)?;
    writeln!(
        w,
        "STAT {emitted} {:.2} {:.1} {:.2}",
        finite(tok_per_s),
        finite(hit_pct),
        finite(rss_gb)
    )
}

/// END and the short zero STAT: RESET, an empty line, MORE with nothing to continue.
pub fn idle(w: &mut dyn Write, rss_gb: f64) -> io::Result<()> {
    w.write_all(END)?;
    stat_initial(w, rss_gb)
}

/// END and `STAT 0 0.00 0.0 <rss_gb> 0 0`: the reply to a frame that cannot be served.
pub fn malformed(w: &mut dyn Write, rss_gb: f64) -> io::Result<()> {
    w.write_all(END)?;
    writeln!(w, "STAT 0 0.00 0.0 {:.2} 0 0", finite(rss_gb))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(f: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Vec<u8> {
        let mut v = Vec::new();
        f(&mut v).unwrap();
        v
    }

    #[test]
    fn exact_bytes() {
        assert_eq!(
            bytes(|w| ready(w, 1.234)),
            b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.23\n"
        );
        assert_eq!(
            bytes(|w| end_and_stat(w, true, 12, 3.14659, 87.25, 0.5, 7, true)),
            b"\n\x01\x01END\x01\x01\nSTAT 12 3.15 87.2 0.50 7 1\n"
        );
        assert_eq!(
            bytes(|w| end_and_stat(w, false, 0, f64::NAN, f64::INFINITY, 2.0, 0, false)),
            b"\x01\x01END\x01\x01\nSTAT 0 0.00 0.0 2.00 0 0\n"
        );
        assert_eq!(
            bytes(|w| more_end_and_stat(w, 3, 10.0, 50.0, 1.0)),
            b"\n\x01\x01END\x01\x01\nSTAT 3 10.00 50.0 1.00\n"
        );
        assert_eq!(
            bytes(|w| idle(w, 0.125)),
            b"\x01\x01END\x01\x01\nSTAT 0 0.00 0.0 0.12\n"
        );
        assert_eq!(
            bytes(|w| malformed(w, 3.0)),
            b"\x01\x01END\x01\x01\nSTAT 0 0.00 0.0 3.00 0 0\n"
        );
    }
}
