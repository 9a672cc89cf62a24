//! The KV persistence actor: hot-path sends never block, nothing is lost, order is kept.

use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use colibri_actors::kv::{KvActor, KvError, KvFile, KvLayout, KvLoad, KvRecords, KvSink, slot_path};

const LAYOUT: KvLayout = KvLayout {
    fingerprint: 42,
    payload_bytes: 8,
};

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Append(usize, u64, usize),
    Truncate(usize, u64),
    Reset(usize),
}

/// A sink whose first operation parks on a barrier: a disk that stalls.
struct ParkedSink {
    gate: Option<Arc<Barrier>>,
    log: Arc<Mutex<Vec<Op>>>,
}

impl ParkedSink {
    fn park(&mut self) {
        if let Some(g) = self.gate.take() {
            g.wait();
        }
    }
}

impl KvSink for ParkedSink {
    fn append(&mut self, slot: usize, at: u64, records: &KvRecords) -> Result<(), KvError> {
        self.park();
        self.log.lock().unwrap().push(Op::Append(slot, at, records.len()));
        Ok(())
    }
    fn truncate(&mut self, slot: usize, len: u64) -> Result<(), KvError> {
        self.park();
        self.log.lock().unwrap().push(Op::Truncate(slot, len));
        Ok(())
    }
    fn reset(&mut self, slot: usize) -> Result<(), KvError> {
        self.park();
        self.log.lock().unwrap().push(Op::Reset(slot));
        Ok(())
    }
}

fn one_record(t: u32) -> KvRecords {
    let mut r = KvRecords::new(LAYOUT);
    r.push(t, &[t as u8; 8]).unwrap();
    r
}

#[test]
fn stalled_writer_never_blocks_sender_and_loses_nothing() {
    const N: u64 = 1000;
    const DEPTH: usize = 8;
    let gate = Arc::new(Barrier::new(2));
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = ParkedSink {
        gate: Some(gate.clone()),
        log: log.clone(),
    };
    let mut handle = KvActor::spawn(sink, DEPTH).unwrap();

    // The sender runs in its own thread so that a blocking send shows up as a
    // missing report (a failure) instead of a hung test.
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let sender = std::thread::spawn(move || {
        let mut completed = 0u64;
        for i in 0..N {
            if (i + 1).is_multiple_of(100) {
                handle.truncate(1, i).unwrap();
            } else {
                handle.append(1, i, one_record(i as u32)).unwrap();
            }
            completed += 1;
        }
        handle.reset(1).unwrap();
        let spilled = handle.spilled();
        done_tx.send((completed, spilled)).unwrap();
        handle
    });
    // The writer is parked on its first message for this whole wait.
    let (completed, spilled) = done_rx
        .recv_timeout(Duration::from_secs(120))
        .expect("sender blocked");
    assert_eq!(completed, N);
    assert!(log.lock().unwrap().is_empty(), "the writer must still be parked");
    // Everything beyond the channel (and the one message the actor holds) spilled.
    assert!(spilled as u64 >= N + 1 - DEPTH as u64 - 1, "spilled {spilled}");
    gate.wait();
    let mut handle = sender.join().unwrap();
    handle.flush().unwrap();
    let got = log.lock().unwrap().clone();
    let mut want = Vec::new();
    for i in 0..N {
        if (i + 1).is_multiple_of(100) {
            want.push(Op::Truncate(1, i));
        } else {
            want.push(Op::Append(1, i, 1));
        }
    }
    want.push(Op::Reset(1));
    assert_eq!(got, want);
    assert_eq!(handle.spilled(), 0);
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
fn dropping_the_handle_delivers_spilled_messages() {
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
