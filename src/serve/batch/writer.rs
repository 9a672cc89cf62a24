//! The one thread that writes stdout: frames from every request, in the
//! order each was sent (so in order per request), flushed whenever nothing
//! more is waiting.
//!
//! What waits for stdout is bounded: the queue to the writer holds at most
//! [`QUEUE_FRAMES`] frames (a sender blocks while it is full), and the
//! table of requests whose last line is not written yet lets the reader
//! wait ([`Table::wait_for_room`]) before it submits one more than its
//! limit, so a client that stops reading stdout stops the server reading
//! stdin instead of growing its memory.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::{Condvar, Mutex};

/// Frames the writer's queue holds (each at most a DATA frame of 64 KiB).
pub const QUEUE_FRAMES: usize = 256;

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
pub struct Table {
    map: Mutex<Requests>,
    /// Signalled when an entry goes or the writer is gone.
    freed: Condvar,
}

#[derive(Default)]
struct Requests {
    by_id: HashMap<String, Entry>,
    /// The writer stopped: nothing will be released any more.
    closed: bool,
}

impl Table {
    pub fn contains(&self, id: &str) -> bool {
        self.map.lock().by_id.contains_key(id)
    }

    pub fn insert(&self, id: String, entry: Entry) {
        self.map.lock().by_id.insert(id, entry);
    }

    /// Requests whose last line is not written yet.
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.map.lock().by_id.len()
    }

    /// Blocks while `limit` or more requests wait for their last line (the
    /// client is not reading stdout), unless the writer is gone. Before it
    /// blocks, `waiting` is told how many wait.
    pub fn wait_for_room(&self, limit: usize, waiting: impl FnOnce(usize)) {
        let mut m = self.map.lock();
        if m.by_id.len() < limit || m.closed {
            return;
        }
        waiting(m.by_id.len());
        while m.by_id.len() >= limit && !m.closed {
            self.freed.wait(&mut m);
        }
    }

    /// The writer is gone: wakes a reader waiting for room.
    pub fn close(&self) {
        self.map.lock().closed = true;
        self.freed.notify_all();
    }

    /// Raises the request's intent and asks the loop to end it; false when
    /// no such request is in flight.
    pub fn end(&self, id: &str, intent: u8) -> bool {
        let canceller = {
            let t = self.map.lock();
            let Some(e) = t.by_id.get(id) else { return false };
            e.intent.fetch_max(intent, Ordering::SeqCst);
            e.canceller.clone()
        };
        canceller.cancel();
        true
    }

    /// Cancels everything in flight (the client is gone).
    pub fn cancel_all(&self) {
        let all: Vec<Canceller> = self
            .map
            .lock()
            .by_id
            .values()
            .map(|e| e.canceller.clone())
            .collect();
        for c in all {
            c.cancel();
        }
    }

    fn release(&self, id: &str, serial: u64) {
        let mut t = self.map.lock();
        if t.by_id.get(id).is_some_and(|e| e.serial == serial) {
            t.by_id.remove(id);
            self.freed.notify_all();
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

    fn entry(serial: u64) -> Entry {
        Entry {
            serial,
            canceller: crate::runtime::Canceller::detached(),
            intent: Arc::new(AtomicU8::new(INTENT_NONE)),
        }
    }

    /// The reader waits while the table is full and goes on once the
    /// writer has written a last line (or is gone).
    #[test]
    fn waiting_for_room_ends_when_a_last_line_is_written() {
        let table = Arc::new(Table::default());
        table.insert("a".into(), entry(1));
        table.insert("b".into(), entry(2));
        let mut told = None;
        table.wait_for_room(3, |n| told = Some(n));
        assert_eq!(told, None, "room left: no wait");
        let (tx, rx) = flume::bounded(QUEUE_FRAMES);
        let t = table.clone();
        let writer = std::thread::spawn(move || write_loop(Vec::new(), &rx, &t));
        tx.send(Out::Last {
            id: "a".into(),
            serial: 1,
            bytes: b"DONE a\n".to_vec(),
        })
        .unwrap();
        table.wait_for_room(2, |n| told = Some(n));
        assert!(table.pending() < 2);
        drop(tx);
        writer.join().unwrap().unwrap();
        // A closed table never blocks.
        table.insert("c".into(), entry(3));
        table.insert("d".into(), entry(4));
        table.close();
        table.wait_for_room(1, |_| {});
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
