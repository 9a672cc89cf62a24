//! The one thread that writes stdout: frames from every request, in the
//! order each was sent (so in order per request), flushed whenever nothing
//! more is waiting.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;

use crate::runtime::Canceller;

/// What the client asked of a running request.
pub const INTENT_NONE: u8 = 0;
/// `STOP`: end it as a normal reply.
pub const INTENT_STOP: u8 = 1;
/// `CANCEL`: end it with `ERROR <id> CANCELLED`.
pub const INTENT_CANCEL: u8 = 2;

/// A request whose last line is not written yet.
pub struct Entry {
    /// Tells this submission apart from a later one reusing the id.
    pub serial: u64,
    pub canceller: Canceller,
    /// INTENT_*: only ever raised (CANCEL wins over STOP).
    pub intent: Arc<AtomicU8>,
}

/// The requests in flight, by client id. The reader adds; the writer
/// removes, just before the request's last line goes out, so a client that
/// has read that line may reuse the id (and the slot) at once.
#[derive(Default)]
pub struct Table(Mutex<HashMap<String, Entry>>);

impl Table {
    pub fn contains(&self, id: &str) -> bool {
        self.0.lock().contains_key(id)
    }

    pub fn insert(&self, id: String, entry: Entry) {
        self.0.lock().insert(id, entry);
    }

    /// Raises the request's intent and asks the loop to end it; false when
    /// no such request is in flight.
    pub fn end(&self, id: &str, intent: u8) -> bool {
        let canceller = {
            let t = self.0.lock();
            let Some(e) = t.get(id) else { return false };
            e.intent.fetch_max(intent, Ordering::SeqCst);
            e.canceller.clone()
        };
        canceller.cancel();
        true
    }

    /// Cancels everything in flight (the client is gone).
    pub fn cancel_all(&self) {
        let all: Vec<Canceller> = self.0.lock().values().map(|e| e.canceller.clone()).collect();
        for c in all {
            c.cancel();
        }
    }

    fn release(&self, id: &str, serial: u64) {
        let mut t = self.0.lock();
        if t.get(id).is_some_and(|e| e.serial == serial) {
            t.remove(id);
        }
    }
}

/// A message for the writer.
pub enum Out {
    /// Bytes to write as they are.
    Bytes(Vec<u8>),
    /// A request's last line (DONE or ERROR): its table entry is released
    /// first.
    Last { id: String, serial: u64, bytes: Vec<u8> },
}

/// Writes until every sender is gone; stops at the first write error.
pub fn write_loop(mut w: impl Write, rx: &flume::Receiver<Out>, table: &Table) -> io::Result<()> {
    loop {
        let msg = match rx.try_recv() {
            Ok(m) => m,
            Err(flume::TryRecvError::Empty) => {
                w.flush()?;
                match rx.recv() {
                    Ok(m) => m,
                    Err(flume::RecvError::Disconnected) => break,
                }
            }
            Err(flume::TryRecvError::Disconnected) => break,
        };
        match msg {
            Out::Bytes(b) => w.write_all(&b)?,
            Out::Last { id, serial, bytes } => {
                table.release(&id, serial);
                w.write_all(&bytes)?;
            }
        }
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts flushes, to see that the writer flushes when it runs dry.
    #[derive(Default)]
    struct Sink {
        bytes: Vec<u8>,
        flushes: usize,
    }

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.bytes.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            self.flushes += 1;
            Ok(())
        }
    }

    #[test]
    fn writes_in_send_order_and_flushes_at_the_end() {
        let (tx, rx) = flume::unbounded();
        for i in 0..3 {
            tx.send(Out::Bytes(format!("L{i}\n").into_bytes())).unwrap();
        }
        tx.send(Out::Last {
            id: "x".into(),
            serial: 1,
            bytes: b"DONE x\n".to_vec(),
        })
        .unwrap();
        drop(tx);
        let mut sink = Sink::default();
        write_loop(&mut sink, &rx, &Table::default()).unwrap();
        assert_eq!(sink.bytes, b"L0\nL1\nL2\nDONE x\n");
        assert!(sink.flushes >= 1);
    }

    /// A write error ends the loop with that error.
    #[test]
    fn stops_at_a_write_error() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::from(io::ErrorKind::BrokenPipe))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let (tx, rx) = flume::unbounded();
        tx.send(Out::Bytes(b"x\n".to_vec())).unwrap();
        let e = write_loop(Broken, &rx, &Table::default()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}
