//! The KV persistence actor: bounded memory (a full queue makes the sender
//! wait), contiguous appends merged, nothing lost, order kept.
//!
//! Slow and stalled disks are test doubles of `KvSink` driven by channels;
//! the frozen states checked below are reached by waiting for events
//! (`KvMonitor::wait_until`, a sink announcing it was entered), never by
//! sleeping. A deadlock fails through the watchdog instead of hanging.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use colibri_actors::kv::{
    KvActor, KvError, KvFile, KvLayout, KvLoad, KvMonitor, KvQueueLimits, KvRecords, KvSink, slot_path,
};
use common::with_timeout;
use crossbeam_channel::{Receiver, Sender};

const LAYOUT: KvLayout = KvLayout {
    fingerprint: 42,
    payload_bytes: 8,
    payload_kind: 0,
    state_bytes: 0,
};
/// 4-byte token + 8-byte payload.
const RECORD: usize = 12;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    /// slot, at, tokens
    Append(usize, u64, Vec<u32>),
    Truncate(usize, u64),
    Reset(usize),
    /// slot, at
    SaveState(usize, u64),
}

fn tokens_of(records: &KvRecords) -> Vec<u32> {
    records
        .as_bytes()
        .chunks_exact(records.record_size())
        .map(|r| u32::from_le_bytes([r[0], r[1], r[2], r[3]]))
        .collect()
}

/// A disk the test drives: every operation announces itself on `entered`,
/// then waits for a permit on `permits` (a dropped permit sender lets every
/// later operation through), and is logged. It also checks, each time it
/// is entered, that the queue holds no more than `bound` record bytes.
struct GatedSink {
    entered: Sender<()>,
    permits: Receiver<()>,
    log: Arc<Mutex<Vec<Op>>>,
    monitor: Arc<OnceLock<KvMonitor>>,
    bound: usize,
    over_bound: Arc<Mutex<Vec<usize>>>,
}

impl GatedSink {
    fn gate(&mut self, op: Op) {
        if let Some(m) = self.monitor.get() {
            let held = m.stats().unwritten_bytes;
            if held > self.bound {
                self.over_bound.lock().unwrap().push(held);
            }
        }
        let _ = self.entered.send(());
        let _ = self.permits.recv();
        self.log.lock().unwrap().push(op);
    }
}

impl KvSink for GatedSink {
    fn append(&mut self, slot: usize, at: u64, records: &KvRecords) -> Result<(), KvError> {
        self.gate(Op::Append(slot, at, tokens_of(records)));
        Ok(())
    }
    fn truncate(&mut self, slot: usize, len: u64) -> Result<(), KvError> {
        self.gate(Op::Truncate(slot, len));
        Ok(())
    }
    fn reset(&mut self, slot: usize) -> Result<(), KvError> {
        self.gate(Op::Reset(slot));
        Ok(())
    }
    fn save_state(&mut self, slot: usize, at: u64, _: &[u8]) -> Result<(), KvError> {
        self.gate(Op::SaveState(slot, at));
        Ok(())
    }
}

struct Rig {
    entered: Receiver<()>,
    permits: Option<Sender<()>>,
    log: Arc<Mutex<Vec<Op>>>,
    over_bound: Arc<Mutex<Vec<usize>>>,
    monitor: KvMonitor,
}

fn gated(limits: KvQueueLimits) -> (colibri_actors::kv::KvHandle<GatedSink>, Rig) {
    let (entered_tx, entered) = crossbeam_channel::unbounded();
    let (permits_tx, permits) = crossbeam_channel::unbounded();
    let log = Arc::new(Mutex::new(Vec::new()));
    let over_bound = Arc::new(Mutex::new(Vec::new()));
    let cell = Arc::new(OnceLock::new());
    let sink = GatedSink {
        entered: entered_tx,
        permits,
        log: log.clone(),
        monitor: cell.clone(),
        bound: limits.bound_bytes(RECORD),
        over_bound: over_bound.clone(),
    };
    let handle = KvActor::spawn_with(sink, limits).unwrap();
    let monitor = handle.monitor();
    let _ = cell.set(monitor.clone());
    (
        handle,
        Rig {
            entered,
            permits: Some(permits_tx),
            log,
            over_bound,
            monitor,
        },
    )
}

fn one_record(t: u32) -> KvRecords {
    let mut r = KvRecords::new(LAYOUT);
    r.push(t, &[t as u8; 8]).unwrap();
    r
}

fn records(tokens: std::ops::Range<u32>) -> KvRecords {
    let mut r = KvRecords::new(LAYOUT);
    for t in tokens {
        r.push(t, &[t as u8; 8]).unwrap();
    }
    r
}

/// The stream of the stalled-writer test: appends alternating between two
/// slots (so no two neighbours merge), a truncation every 100, a reset last.
fn unmergeable(i: u64) -> Op {
    if (i + 1).is_multiple_of(100) {
        Op::Truncate((i % 2) as usize, i / 2)
    } else {
        Op::Append((i % 2) as usize, i / 2, vec![i as u32])
    }
}

#[test]
fn a_stalled_writer_makes_the_sender_wait_and_loses_nothing() {
    with_timeout(120, || {
        const N: u64 = 1000;
        const DEPTH: usize = 8;
        let limits = KvQueueLimits {
            depth: DEPTH,
            max_message_bytes: 64 * RECORD,
        };
        let (mut handle, mut rig) = gated(limits);
        let completed = Arc::new(AtomicU64::new(0));
        let done = completed.clone();
        let sender = std::thread::spawn(move || {
            for i in 0..N {
                match unmergeable(i) {
                    Op::Append(slot, at, t) => handle.append(slot, at, one_record(t[0])).unwrap(),
                    Op::Truncate(slot, len) => handle.truncate(slot, len).unwrap(),
                    Op::Reset(_) | Op::SaveState(..) => unreachable!(),
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            handle.reset(1).unwrap();
            handle
        });
        // The writer holds the first message, parked in the sink ...
        rig.entered.recv().unwrap();
        // ... and the sender waits for room: nothing moves until a permit.
        // (The queue is full again only once the sender pushed after the
        // writer took the first message: an earlier wait is not this one.)
        let s = rig
            .monitor
            .wait_until(|s| s.sender_waiting && s.queued == DEPTH)
            .unwrap();
        assert_eq!(s.applied, 0);
        assert_eq!(s.queued, DEPTH, "{s:?}");
        assert_eq!(s.messages, DEPTH as u64 + 1, "{s:?}");
        assert_eq!(s.merged, 0);
        assert_eq!(completed.load(Ordering::SeqCst), DEPTH as u64 + 1);
        assert!(
            rig.log.lock().unwrap().is_empty(),
            "the writer must still be parked"
        );
        // Let the disk go; everything arrives, in order.
        rig.permits = None;
        let mut handle = sender.join().unwrap();
        handle.flush().unwrap();
        let mut want: Vec<Op> = (0..N).map(unmergeable).collect();
        want.push(Op::Reset(1));
        assert_eq!(*rig.log.lock().unwrap(), want);
        let s = handle.stats();
        assert!(s.waits >= 1);
        assert_eq!(s.messages, N + 1);
        assert_eq!((s.queued, s.unwritten_bytes), (0, 0));
        assert!(rig.over_bound.lock().unwrap().is_empty());
    });
}

#[test]
fn a_slow_sink_gets_merged_appends_in_order_within_the_memory_bound() {
    with_timeout(120, || {
        const N: u64 = 2000;
        const DEPTH: usize = 4;
        const PER_MESSAGE: usize = 10;
        let limits = KvQueueLimits {
            depth: DEPTH,
            max_message_bytes: PER_MESSAGE * RECORD,
        };
        let bound = limits.bound_bytes(RECORD);
        assert_eq!(bound, (DEPTH + 1) * PER_MESSAGE * RECORD);
        let (mut handle, rig) = gated(limits);
        let completed = Arc::new(AtomicU64::new(0));
        let done = completed.clone();
        // The decode loop: one position per step.
        let sender = std::thread::spawn(move || {
            for i in 0..N {
                handle.append(0, i, one_record(i as u32)).unwrap();
                done.fetch_add(1, Ordering::SeqCst);
            }
            handle
        });
        let all_sent = |s: &colibri_actors::kv::KvQueueStats| s.messages + s.merged == N;
        let permits = rig.permits.clone().unwrap();
        // The disk takes one message per permit. Between permits the sender
        // runs until the queue is full again and waits: a frozen state whose
        // figures are exact. (The writer takes a message before announcing
        // itself, so a full queue with the sender waiting is a new wait.)
        let mut frozen = 0;
        let mut waits = 0;
        loop {
            rig.entered.recv().unwrap();
            let s = rig
                .monitor
                .wait_until(|s| (s.sender_waiting && s.queued == DEPTH && s.waits > waits) || all_sent(s))
                .unwrap();
            if all_sent(&s) {
                break;
            }
            waits = s.waits;
            frozen += 1;
            let sent = completed.load(Ordering::SeqCst);
            assert!(sent < N, "the sender must wait, not queue everything");
            assert_eq!(s.queued, DEPTH, "{s:?}");
            assert!(s.unwritten_bytes <= bound, "{s:?}");
            // Merging came first: every queued message is full.
            assert!(s.unwritten_bytes >= DEPTH * PER_MESSAGE * RECORD, "{s:?}");
            // Every record the sender handed over and the disk has not
            // taken is in the queue or being written: none is elsewhere.
            let written: usize = rig
                .log
                .lock()
                .unwrap()
                .iter()
                .map(|op| match op {
                    Op::Append(_, _, t) => t.len(),
                    _ => 0,
                })
                .sum();
            assert_eq!(sent as usize - written, s.unwritten_bytes / RECORD, "{s:?}");
            permits.send(()).unwrap();
        }
        assert!(frozen >= 10, "only {frozen} frozen states");
        drop(permits);
        drop(rig.permits);
        let mut handle = sender.join().unwrap();
        handle.flush().unwrap();
        let log = rig.log.lock().unwrap().clone();
        let mut next = 0u64;
        let mut toks = Vec::new();
        for op in &log {
            let Op::Append(0, at, t) = op else {
                panic!("unexpected {op:?}")
            };
            assert_eq!(*at, next, "appends must be contiguous and in order");
            assert!(t.len() <= PER_MESSAGE, "a message over the limit: {}", t.len());
            next += t.len() as u64;
            toks.extend_from_slice(t);
        }
        assert_eq!(toks, (0..N as u32).collect::<Vec<_>>());
        let s = handle.stats();
        assert_eq!(s.messages + s.merged, N);
        assert!(s.merged > 0 && s.waits > 0, "{s:?}");
        assert!(s.peak_unwritten_bytes <= bound, "{s:?}");
        assert_eq!(s.applied, log.len() as u64);
        assert!(rig.over_bound.lock().unwrap().is_empty());
    });
}

#[test]
fn a_large_append_is_split_in_order_within_the_message_limit() {
    with_timeout(120, || {
        let limits = KvQueueLimits {
            depth: 2,
            max_message_bytes: 7 * RECORD + 5,
        };
        let (mut handle, rig) = gated(limits);
        drop(rig.permits);
        handle.append(3, 10, records(0..100)).unwrap();
        handle.flush().unwrap();
        let log = rig.log.lock().unwrap().clone();
        let mut at = 10;
        let mut toks = Vec::new();
        for op in &log {
            let Op::Append(3, a, t) = op else {
                panic!("unexpected {op:?}")
            };
            assert_eq!(*a, at);
            assert!(t.len() <= 7);
            at += t.len() as u64;
            toks.extend_from_slice(t);
        }
        assert_eq!(toks, (0..100).collect::<Vec<_>>());
        assert!(handle.stats().peak_unwritten_bytes <= limits.bound_bytes(RECORD));
        // A record larger than the limit still travels, alone.
        let (mut handle, rig) = gated(KvQueueLimits {
            depth: 1,
            max_message_bytes: 1,
        });
        drop(rig.permits);
        handle.append(0, 0, records(0..3)).unwrap();
        handle.append(0, 3, records(3..4)).unwrap();
        handle.flush().unwrap();
        let want: Vec<Op> = (0..4).map(|t| Op::Append(0, t as u64, vec![t])).collect();
        assert_eq!(*rig.log.lock().unwrap(), want);
    });
}

#[test]
fn actor_writes_real_files_and_reports_errors_at_flush() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<KvFile> = (0..2)
        .map(|s| {
            KvFile::open(&slot_path(dir.path(), s), LAYOUT, &mut |_, _| {})
                .unwrap()
                .0
        })
        .collect();
    let mut h = KvActor::spawn(files, 2).unwrap();
    for i in 0..10 {
        h.append(0, i, one_record(i as u32)).unwrap();
    }
    h.append(1, 0, one_record(7)).unwrap();
    h.truncate(0, 6).unwrap();
    h.flush().unwrap();
    // A gap is a caller bug: reported at the next flush, later writes still apply.
    h.append(1, 5, one_record(1)).unwrap();
    h.append(1, 1, one_record(8)).unwrap();
    assert!(matches!(h.flush(), Err(KvError::Gap { .. })));
    h.flush().unwrap();
    assert!(matches!(
        h.append(5, 0, one_record(1)).and_then(|()| h.flush()),
        Err(KvError::BadSlot { .. })
    ));
    let files = h.close().unwrap();
    assert_eq!(files[0].len(), 6);
    drop(files);
    let mut toks = Vec::new();
    let (_, load) = KvFile::open(&slot_path(dir.path(), 1), LAYOUT, &mut |t, _| toks.push(t)).unwrap();
    assert_eq!(
        load,
        KvLoad::Loaded {
            records: 2,
            declared: 2
        }
    );
    assert_eq!(toks, vec![7, 8]);
}

#[test]
fn check_reports_a_write_error_without_waiting() {
    with_timeout(120, || {
        let dir = tempfile::tempdir().unwrap();
        let f = KvFile::open(&slot_path(dir.path(), 0), LAYOUT, &mut |_, _| {})
            .unwrap()
            .0;
        let mut h = KvActor::spawn(vec![f], 4).unwrap();
        h.check().unwrap();
        h.append(0, 3, one_record(1)).unwrap(); // a gap
        let m = h.monitor();
        m.wait_until(|s| s.applied == 1).unwrap();
        assert!(matches!(h.check(), Err(KvError::Gap { .. })));
        h.check().unwrap();
        h.flush().unwrap();
        h.close().unwrap();
    });
}

/// A sink that panics: the sender gets `ActorGone` instead of waiting forever.
struct PanickingSink;

impl KvSink for PanickingSink {
    fn append(&mut self, _: usize, _: u64, _: &KvRecords) -> Result<(), KvError> {
        panic!("the disk caught fire (expected by the test)")
    }
    fn truncate(&mut self, _: usize, _: u64) -> Result<(), KvError> {
        Ok(())
    }
    fn reset(&mut self, _: usize) -> Result<(), KvError> {
        Ok(())
    }
    fn save_state(&mut self, _: usize, _: u64, _: &[u8]) -> Result<(), KvError> {
        Ok(())
    }
}

#[test]
fn a_dead_writer_fails_sends_instead_of_blocking_them() {
    with_timeout(120, || {
        let mut h = KvActor::spawn(PanickingSink, 2).unwrap();
        h.append(0, 0, one_record(0)).unwrap();
        assert!(matches!(h.flush(), Err(KvError::ActorGone)));
        // Unmergeable messages: the queue would fill; sends fail instead.
        for i in 0..10 {
            assert!(matches!(h.truncate(i, 0), Err(KvError::ActorGone)));
        }
        assert!(matches!(h.check(), Err(KvError::ActorGone)));
        assert!(h.close().is_err());
    });
}

#[test]
fn dropping_the_handle_delivers_queued_messages() {
    let dir = tempfile::tempdir().unwrap();
    let path = slot_path(dir.path(), 0);
    let f = KvFile::open(&path, LAYOUT, &mut |_, _| {}).unwrap().0;
    let mut h = KvActor::spawn(vec![f], 1).unwrap();
    for i in 0..50 {
        h.append(0, i, one_record(i as u32)).unwrap();
    }
    drop(h);
    let (f, _) = KvFile::open(&path, LAYOUT, &mut |_, _| {}).unwrap();
    assert_eq!(f.len(), 50);
}
