//! What a crash leaves while a conversation streams through the KV actor one
//! position at a time: the writer (a sink over the recording storage of
//! `colibri_actors::kv::crash`) stops after a chosen number of messages, as
//! a killed process would, and every file image a crash could have left up
//! to that point (kill -9 and power loss, after every write and sync the
//! writer issued) must load to a prefix of the positions sent, never shorter
//! than what was committed before the interrupted message. Then the writer
//! resumes and every position arrives.
//!
//! The stop is an event (the sink parks on a channel), not a timing.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use colibri_actors::kv::crash::{CrashPoint, CrashStates, MemStorage, OpLog, RecordingStorage, replay};
use colibri_actors::kv::{KvActor, KvError, KvFile, KvLayout, KvLoad, KvQueueLimits, KvRecords, KvSink};
use common::with_timeout;
use crossbeam_channel::{Receiver, Sender};

/// 32-byte records: a merged message (at most 8 records) spans at most two
/// sectors, so every crash point is enumerable.
const LAYOUT: KvLayout = KvLayout {
    fingerprint: 0x5713,
    payload_bytes: 28,
    payload_kind: 0,
    state_bytes: 0,
};
const RECORD: usize = 32;
const N: u64 = 120;

fn token(pos: u64) -> u32 {
    5000 + pos as u32
}

fn payload(tok: u32) -> Vec<u8> {
    (0..LAYOUT.payload_bytes)
        .map(|i| (tok as usize * 11 + i * 3 + 1) as u8)
        .collect()
}

/// The tokens an image loads to; `Err` when a record holds other bytes.
fn load(img: Vec<u8>) -> Result<Vec<u32>, String> {
    let mut toks = Vec::new();
    let mut bad = None;
    let (_, load) = KvFile::open_storage(
        Box::new(MemStorage(img)),
        Path::new("crash-image"),
        LAYOUT,
        &mut |t, p| {
            if p != payload(t).as_slice() && bad.is_none() {
                bad = Some(format!("record {} (token {t}) holds other bytes", toks.len()));
            }
            toks.push(t);
        },
    )
    .map_err(|e| e.to_string())?;
    if let Some(b) = bad {
        return Err(b);
    }
    Ok(match load {
        KvLoad::Loaded { .. } => toks,
        KvLoad::Missing | KvLoad::Mismatch { .. } | KvLoad::OtherKind { .. } => Vec::new(),
    })
}

/// The real file writer over recorded storage, stopping once after
/// `stop_after` messages until the test lets it go on.
struct StoppingSink {
    files: Vec<KvFile>,
    log: OpLog,
    /// Log length and committed count after each message.
    ends: Arc<Mutex<Vec<(usize, u64)>>>,
    applied: usize,
    stop_after: usize,
    stopped: Sender<()>,
    resume: Receiver<()>,
}

impl StoppingSink {
    fn after(&mut self) {
        let count = self.files[0].len();
        self.ends.lock().unwrap().push((self.log.lock().len(), count));
        self.applied += 1;
        if self.applied == self.stop_after {
            let _ = self.stopped.send(());
            let _ = self.resume.recv();
        }
    }
}

impl KvSink for StoppingSink {
    fn append(&mut self, slot: usize, at: u64, records: &KvRecords) -> Result<(), KvError> {
        let r = KvSink::append(&mut self.files, slot, at, records);
        self.after();
        r
    }
    fn truncate(&mut self, slot: usize, len: u64) -> Result<(), KvError> {
        let r = KvSink::truncate(&mut self.files, slot, len);
        self.after();
        r
    }
    fn reset(&mut self, slot: usize) -> Result<(), KvError> {
        let r = KvSink::reset(&mut self.files, slot);
        self.after();
        r
    }
    fn save_state(&mut self, slot: usize, at: u64, bytes: &[u8]) -> Result<(), KvError> {
        let r = KvSink::save_state(&mut self.files, slot, at, bytes);
        self.after();
        r
    }
}

struct Checked {
    points: usize,
    images: usize,
    committed: u64,
}

/// Streams `N` positions one at a time; the writer stops after `stop_after`
/// messages; every crash image up to there is checked; then all must arrive.
fn stream_and_stop(stop_after: usize) -> Checked {
    let all: Vec<u32> = (0..N).map(token).collect();
    let (storage, log) = RecordingStorage::new(Vec::new());
    let (file, _) =
        KvFile::open_storage(Box::new(storage), Path::new("rec"), LAYOUT, &mut |_, _| {}).expect("open");
    let opened = log.lock().len();
    let ends = Arc::new(Mutex::new(Vec::new()));
    let (stopped_tx, stopped) = crossbeam_channel::bounded(1);
    let (resume_tx, resume) = crossbeam_channel::bounded(1);
    let sink = StoppingSink {
        files: vec![file],
        log: log.clone(),
        ends: ends.clone(),
        applied: 0,
        stop_after,
        stopped: stopped_tx,
        resume,
    };
    let limits = KvQueueLimits {
        depth: 4,
        max_message_bytes: 8 * RECORD,
    };
    let mut handle = KvActor::spawn_with(sink, limits).expect("spawn");
    // The decode loop: one position per step. It waits when the queue is
    // full, so it runs in its own thread.
    let sender = std::thread::spawn(move || {
        for pos in 0..N {
            let mut r = KvRecords::new(LAYOUT);
            r.push(token(pos), &payload(token(pos))).expect("payload");
            handle.append(0, pos, r).expect("append");
        }
        handle
    });
    stopped.recv().expect("the writer stops");
    // The writer is parked: the log is what the process had issued.
    let ops = log.lock().clone();
    let ends = ends.lock().unwrap().clone();
    assert_eq!(ends.len(), stop_after);
    let committed = ends[stop_after - 1].1;
    // kill -9 now: every issued write reached the page cache.
    let img = replay(Vec::new(), &ops);
    assert_eq!(load(img).expect("load"), all[..committed as usize]);
    // Every crash image after every operation so far.
    let mut checked = Checked {
        points: 0,
        images: 0,
        committed,
    };
    for (i, point) in CrashStates::new(Vec::new(), ops).enumerate() {
        // Inside message m (1-based) when i is past message m-1's last op.
        let (floor, ceil) = if i <= opened {
            (0, 0)
        } else {
            let m = ends.iter().position(|&(e, _)| i <= e).expect("within the log");
            let before = if m == 0 { 0 } else { ends[m - 1].1 };
            (before, ends[m].1)
        };
        let CrashPoint::Images(images) = point else {
            panic!("crash point {i} has too many pending writes to enumerate")
        };
        checked.points += 1;
        for img in images {
            checked.images += 1;
            let got = load(img).unwrap_or_else(|e| panic!("stop {stop_after}, after op {i}: {e}"));
            let n = got.len() as u64;
            assert!(
                floor <= n && n <= ceil && got[..] == all[..got.len()],
                "stop {stop_after}, after op {i}: loaded {got:?}, expected a prefix of {floor}..={ceil} positions"
            );
        }
    }
    // Let the writer go on: nothing sent is lost.
    resume_tx.send(()).expect("resume");
    let handle = sender.join().expect("sender");
    let sink = handle.close().expect("close");
    assert_eq!(sink.files[0].len(), N);
    assert_eq!(load(replay(Vec::new(), &log.lock())).expect("load"), all);
    checked
}

#[test]
fn a_writer_stopped_mid_stream_leaves_a_prefix_of_the_positions_sent() {
    with_timeout(300, || {
        let mut images = 0;
        for stop_after in [1, 2, 3, 5, 8, 13] {
            let c = stream_and_stop(stop_after);
            eprintln!(
                "stopped after {stop_after} messages: {} positions committed; {} crash points, {} crash states, all prefixes",
                c.committed, c.points, c.images
            );
            assert!(c.committed >= stop_after as u64);
            images += c.images;
        }
        assert!(images > 100, "only {images} states");
    });
}
