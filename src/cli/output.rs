//! What a command does when nobody reads its output any more. A reader
//! that closes stdout (`coli run ... | head -c 10`) has asked for nothing
//! more: the command stops writing, finishes what it must (a server saves
//! its conversations) and exits 0 without a message, as `cat` or `grep`
//! would (README, "Exit codes"). The stdout writer here marks that error,
//! so `main` tells it from other broken pipes (a `--trace` FIFO whose
//! reader left is still an error). Diagnostics on a stderr nobody reads
//! are dropped ([`diag!`]): they are best effort, never a reason to panic
//! the way `println!` and `eprintln!` do.

use std::io::{self, Write};

/// Inside the `io::Error` of a write to a stdout whose reader is gone.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed by its reader")]
pub struct StdoutClosed;

/// This process's stdout; a write that finds its reader gone fails with an
/// error [`is_stdout_closed`] recognises.
pub struct Stdout(io::Stdout);

/// The process's stdout as a [`Stdout`].
pub fn stdout() -> Stdout {
    Stdout(io::stdout())
}

fn mark(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        io::Error::new(io::ErrorKind::BrokenPipe, StdoutClosed)
    } else {
        e
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf).map_err(mark)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush().map_err(mark)
    }
}

/// True when `e` comes from writing to a stdout whose reader went away.
pub fn is_stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<StdoutClosed>()
            || c.downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|inner| inner.is::<StdoutClosed>())
    })
}

/// `eprintln!` without the panic: a line on stderr, dropped when stderr
/// cannot take it.
macro_rules! diag {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use diag;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_marked_broken_pipe_counts_as_a_closed_stdout() {
        let closed = anyhow::Error::new(mark(io::Error::from(io::ErrorKind::BrokenPipe)));
        assert!(is_stdout_closed(&closed));
        assert!(is_stdout_closed(&closed.context("writing the reply")));
        let other_pipe = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(!is_stdout_closed(&other_pipe));
        let full = anyhow::Error::new(mark(io::Error::from(io::ErrorKind::WriteZero)));
        assert!(!is_stdout_closed(&full));
    }
}
