//! Crash states beyond kill -9: every write and sync the state-file writer
//! issues is recorded, every file image a power loss could leave (POSIX:
//! unsynced operations lost or kept in any combination, writes torn at
//! sector boundaries, lost extensions left as zeros) is generated at every
//! point of a conversation, and each must load to a consistent prefix of the
//! conversation: a prefix of the state before or after the interrupted step,
//! never shorter than what both share (nothing already synced is lost).

use std::path::Path;

use colibri_actors::kv::crash::{CrashPoint, CrashStates, MemStorage, Op, RecordingStorage};
use colibri_actors::kv::{HEADER_LEN, KvFile, KvLayout, KvLoad, KvRecords};

const LAYOUT: KvLayout = KvLayout {
    fingerprint: 0xC0117,
    payload_bytes: 28,
    payload_kind: 0,
    state_bytes: 0,
};

/// Records of 1004 bytes: a batch spans several sectors, so it can tear.
const WIDE: KvLayout = KvLayout {
    fingerprint: 0xC0118,
    payload_bytes: 1000,
    payload_kind: 0,
    state_bytes: 0,
};

/// A payload that identifies its token, so a record holding another
/// token's (or zeroed) bytes is caught.
fn payload_for(layout: KvLayout, token: u32) -> Vec<u8> {
    (0..layout.payload_bytes)
        .map(|i| (token as usize * 7 + i * 13 + 1) as u8)
        .collect()
}

fn payload(token: u32) -> Vec<u8> {
    payload_for(LAYOUT, token)
}

fn batch_for(layout: KvLayout, tokens: impl IntoIterator<Item = u32>) -> KvRecords {
    let mut r = KvRecords::new(layout);
    for t in tokens {
        r.push(t, &payload_for(layout, t)).expect("payload size");
    }
    r
}

fn batch(tokens: impl IntoIterator<Item = u32>) -> KvRecords {
    batch_for(LAYOUT, tokens)
}

/// One step of the scripted conversation.
#[derive(Clone)]
enum Step {
    Append(u64, Vec<u32>),
    Truncate(u64),
    Reset,
}

fn apply_logical(state: &mut Vec<u32>, step: &Step) {
    match step {
        Step::Append(at, toks) => {
            state.truncate(*at as usize);
            state.extend(toks);
        }
        Step::Truncate(n) => state.truncate(*n as usize),
        Step::Reset => state.clear(),
    }
}

/// Loads an image as the engine would; `Err` when a record is damaged.
fn load(img: Vec<u8>) -> Result<Vec<u32>, String> {
    load_as(LAYOUT, img)
}

fn load_as(layout: KvLayout, img: Vec<u8>) -> Result<Vec<u32>, String> {
    let mut toks = Vec::new();
    let mut bad = None;
    let (_, load) = KvFile::open_storage(
        Box::new(MemStorage(img)),
        Path::new("crash-image"),
        layout,
        &mut |t, p| {
            if p != payload_for(layout, t).as_slice() && bad.is_none() {
                bad = Some(format!("record {} (token {t}) holds other bytes", toks.len()));
            }
            toks.push(t);
        },
    )
    .map_err(|e| e.to_string())?;
    if let Some(b) = bad {
        return Err(b);
    }
    match load {
        KvLoad::Loaded { .. } => Ok(toks),
        // A foreign, damaged or new file is ignored: the empty conversation.
        KvLoad::Missing | KvLoad::Mismatch { .. } | KvLoad::OtherKind { .. } => Ok(Vec::new()),
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Checks one loaded image against the states around the interrupted step.
fn consistent(got: &[u32], before: &[u32], after: &[u32]) -> bool {
    let floor = common_prefix(before, after);
    got.len() >= floor
        && [before, after]
            .iter()
            .any(|s| s.len() >= got.len() && s[..got.len()] == *got)
}

struct Report {
    points: usize,
    images: usize,
}

/// Runs `steps` on a file starting as `initial`, then checks every crash image.
fn check_script(layout: KvLayout, initial: Vec<u8>, steps: &[Step]) -> Report {
    let (storage, log) = RecordingStorage::new(initial.clone());
    let (mut f, _) =
        KvFile::open_storage(Box::new(storage), Path::new("rec"), layout, &mut |_, _| {}).expect("open");
    // Logical states: after open (the file is ignored or empty), then after each step.
    let mut states = vec![Vec::new()];
    let mut ends = vec![log.lock().len()];
    let mut cur = Vec::new();
    for step in steps {
        match step {
            Step::Append(at, toks) => f
                .append(*at, &batch_for(layout, toks.iter().copied()))
                .expect("append"),
            Step::Truncate(n) => f.truncate(*n).expect("truncate"),
            Step::Reset => f.reset().expect("reset"),
        }
        apply_logical(&mut cur, step);
        states.push(cur.clone());
        ends.push(log.lock().len());
    }
    let ops: Vec<Op> = log.lock().clone();
    let mut report = Report { points: 0, images: 0 };
    for (i, point) in CrashStates::new(initial, ops).enumerate() {
        // Crash after `i` operations: inside the first step whose ops reach past i.
        let m = ends.iter().position(|&e| i <= e).unwrap_or(ends.len() - 1);
        let (before, after) = if m == 0 {
            (&states[0], &states[0])
        } else {
            (&states[m - 1], &states[m])
        };
        let CrashPoint::Images(images) = point else {
            panic!("crash point {i} has too many pending writes to enumerate");
        };
        report.points += 1;
        for img in images {
            report.images += 1;
            let got = load_as(layout, img).unwrap_or_else(|e| panic!("after op {i}: {e}"));
            assert!(
                consistent(&got, before, after),
                "after op {i} (step {m}): loaded {got:?}, expected a prefix of {before:?} or {after:?}"
            );
        }
    }
    report
}

fn script() -> Vec<Step> {
    use Step::*;
    vec![
        Append(0, (0..20).collect()),
        Append(20, (20..23).collect()),
        Truncate(10),
        Append(10, (100..130).collect()),
        Append(5, (200..210).collect()),
        Reset,
        Append(0, (300..305).collect()),
        Truncate(0),
        Append(0, (400..440).collect()),
        Append(40, vec![440]),
    ]
}

/// A seeded conversation: appends of 1..=4 records (sometimes rewriting a
/// tail, as prefix reuse does), truncations and resets.
fn random_script(seed: u64, steps: usize) -> Vec<Step> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut len = 0u64;
    let mut token = 1000u32 * seed as u32;
    let mut out = Vec::new();
    for _ in 0..steps {
        let step = match next(10) {
            0 => Step::Reset,
            1 | 2 => Step::Truncate(next(len + 1)),
            _ => {
                let at = if next(4) == 0 { next(len + 1) } else { len };
                let n = 1 + next(4) as u32;
                let toks: Vec<u32> = (token..token + n).collect();
                token += n;
                Step::Append(at, toks)
            }
        };
        let mut st = vec![0u32; len as usize];
        apply_logical(&mut st, &step);
        len = st.len() as u64;
        out.push(step);
    }
    out
}

/// The image of a file another model wrote (3 records, other fingerprint).
fn foreign_file() -> Vec<u8> {
    let other = KvLayout {
        fingerprint: 1,
        ..LAYOUT
    };
    let mut r = KvRecords::new(other);
    for t in 0..3 {
        r.push(t, &payload(t)).expect("payload");
    }
    // Written through the recorder; replayed in full, its last state.
    let (storage, log) = RecordingStorage::new(Vec::new());
    let (mut f, _) =
        KvFile::open_storage(Box::new(storage), Path::new("x"), other, &mut |_, _| {}).expect("open");
    f.append(0, &r).expect("append");
    let ops = log.lock().clone();
    let mut img = Vec::new();
    for op in ops {
        match op {
            Op::Write { at, bytes } => {
                let end = at as usize + bytes.len();
                if img.len() < end {
                    img.resize(end, 0);
                }
                img[at as usize..end].copy_from_slice(&bytes);
            }
            Op::SetLen(n) => img.resize(n as usize, 0),
            Op::Sync => {}
        }
    }
    img
}

#[test]
fn every_posix_crash_state_loads_to_a_consistent_prefix() {
    let mut points = 0;
    let mut images = 0;
    for (name, initial) in [
        ("new file", Vec::new()),
        ("another model's file", foreign_file()),
        ("garbage", vec![0xA5; 300]),
    ] {
        let r = check_script(LAYOUT, initial, &script());
        eprintln!(
            "{name}: {} crash points, {} crash states checked",
            r.points, r.images
        );
        points += r.points;
        images += r.images;
    }
    for seed in 1..=4 {
        let r = check_script(WIDE, Vec::new(), &random_script(seed, 60));
        eprintln!(
            "random conversation {seed} (wide records): {} crash points, {} crash states checked",
            r.points, r.images
        );
        points += r.points;
        images += r.images;
    }
    eprintln!("total: {points} crash points, {images} crash states, all consistent");
    assert!(images > 5000, "only {images} states");
}

/// The checker is not vacuous: a writer that commits the count before its
/// records are synced is caught.
#[test]
fn a_writer_without_the_barrier_is_caught() {
    let (storage, _) = RecordingStorage::new(Vec::new());
    let (f, _) =
        KvFile::open_storage(Box::new(storage), Path::new("x"), LAYOUT, &mut |_, _| {}).expect("open");
    drop(f);
    // The header a fresh file gets (count 0), durable.
    let mut header = vec![0u8; HEADER_LEN as usize];
    header[..8].copy_from_slice(b"COLIKVR\0");
    header[8..12].copy_from_slice(&1u32.to_le_bytes());
    header[16..24].copy_from_slice(&LAYOUT.fingerprint.to_le_bytes());
    header[24..32].copy_from_slice(&(LAYOUT.record_size() as u64).to_le_bytes());
    let recs = batch(0..4);
    let ops = vec![
        Op::Write {
            at: HEADER_LEN,
            bytes: recs.as_bytes().to_vec(),
        },
        Op::Write {
            at: 32,
            bytes: 4u64.to_le_bytes().to_vec(),
        },
        Op::Sync,
    ];
    let mut caught = 0;
    for point in CrashStates::new(header, ops) {
        let CrashPoint::Images(images) = point else {
            panic!("narrow")
        };
        for img in images {
            match load(img) {
                Err(_) => caught += 1,
                Ok(got) if !consistent(&got, &[], &[0, 1, 2, 3]) => caught += 1,
                Ok(_) => {}
            }
        }
    }
    assert!(caught > 0, "the unsafe ordering went unnoticed");
}

/// Records of 28 bytes and a recurrent state of 700 (it spans two sectors,
/// so its write can tear).
const HYBRID: KvLayout = KvLayout {
    fingerprint: 0xC0119,
    payload_bytes: 28,
    payload_kind: 0,
    state_bytes: 700,
};

/// The recurrent state after `tokens`: a function of the whole prefix, so a
/// state saved for other records (or torn, or zeroed) is caught.
fn state_after(tokens: &[u32]) -> Vec<u8> {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &t in tokens {
        h = (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3);
    }
    (0..HYBRID.state_bytes)
        .map(|i| (h.rotate_left(i as u32 % 64) as u8) ^ (i as u8))
        .collect()
}

#[derive(Clone)]
enum HybridStep {
    Append(u64, Vec<u32>),
    /// Saves the state after the first n records.
    Save(u64),
    Truncate(u64),
    Reset,
}

/// Tokens and the position of the saved state (withdrawn by a cut below it).
#[derive(Clone, Debug, Default)]
struct Logical {
    tokens: Vec<u32>,
    saved: Option<usize>,
}

impl Logical {
    fn apply(&mut self, step: &HybridStep) {
        let cut = |l: &mut Logical, n: usize| {
            l.tokens.truncate(n);
            if l.saved.is_some_and(|s| s > n) {
                l.saved = None;
            }
        };
        match step {
            HybridStep::Append(at, toks) => {
                cut(self, *at as usize);
                self.tokens.extend(toks);
            }
            HybridStep::Save(at) => self.saved = Some(*at as usize),
            HybridStep::Truncate(n) => cut(self, *n as usize),
            HybridStep::Reset => cut(self, 0),
        }
    }
}

/// Loads an image: the records it restores and the state handed back.
fn load_hybrid(img: Vec<u8>) -> Result<(Vec<u32>, Option<Vec<u8>>), String> {
    let mut toks = Vec::new();
    let (mut f, load) = KvFile::open_storage(
        Box::new(MemStorage(img)),
        Path::new("crash-image"),
        HYBRID,
        &mut |t, p| {
            assert_eq!(p, payload_for(HYBRID, t).as_slice(), "record of token {t}");
            toks.push(t);
        },
    )
    .map_err(|e| e.to_string())?;
    match load {
        KvLoad::Loaded { .. } => {
            let state = f.take_state();
            if let Some((at, _)) = &state
                && *at as usize != toks.len()
            {
                return Err(format!("state at {at}, {} records loaded", toks.len()));
            }
            Ok((toks, state.map(|(_, b)| b)))
        }
        KvLoad::Missing | KvLoad::Mismatch { .. } | KvLoad::OtherKind { .. } => Ok((Vec::new(), None)),
    }
}

/// Every crash image of a conversation whose recurrent state is saved now
/// and then loads to exactly a saved state: its records are a prefix of the
/// conversation before or after the interrupted step, end where a state was
/// saved (before or after the step), and the state is the one saved for
/// exactly those records. Nothing loads without a state.
#[test]
fn a_saved_recurrent_state_survives_every_crash_state_with_its_records() {
    use HybridStep::*;
    let steps = vec![
        Append(0, (0..12).collect()),
        Save(12),
        Append(12, (12..15).collect()),
        Save(15),
        Append(15, vec![15]),
        Truncate(14),
        Append(14, (50..60).collect()),
        Save(24),
        Save(20),
        Append(10, (70..73).collect()),
        Save(13),
        Truncate(13),
        Append(13, (80..82).collect()),
        Save(15),
        Reset,
        Append(0, (90..95).collect()),
        Save(5),
    ];
    let (storage, log) = RecordingStorage::new(Vec::new());
    let (mut f, _) =
        KvFile::open_storage(Box::new(storage), Path::new("rec"), HYBRID, &mut |_, _| {}).expect("open");
    let mut states = vec![Logical::default()];
    let mut ends = vec![log.lock().len()];
    let mut cur = Logical::default();
    for step in &steps {
        match step {
            Append(at, toks) => f
                .append(*at, &batch_for(HYBRID, toks.iter().copied()))
                .expect("append"),
            Save(at) => f
                .save_state(*at, &state_after(&cur.tokens[..*at as usize]))
                .expect("save"),
            Truncate(n) => f.truncate(*n).expect("truncate"),
            Reset => f.reset().expect("reset"),
        }
        cur.apply(step);
        states.push(cur.clone());
        ends.push(log.lock().len());
    }
    let ops: Vec<Op> = log.lock().clone();
    let (mut images, mut restored) = (0, 0);
    for (i, point) in CrashStates::new(Vec::new(), ops).enumerate() {
        let m = ends.iter().position(|&e| i <= e).unwrap_or(ends.len() - 1);
        let (before, after) = (&states[m.saturating_sub(1)], &states[m]);
        let CrashPoint::Images(imgs) = point else {
            panic!("crash point {i} has too many pending writes to enumerate");
        };
        for img in imgs {
            images += 1;
            let (got, state) = load_hybrid(img).unwrap_or_else(|e| panic!("after op {i}: {e}"));
            let Some(state) = state else {
                assert!(got.is_empty(), "after op {i}: records without a state");
                continue;
            };
            restored += 1;
            assert_eq!(
                state,
                state_after(&got),
                "after op {i}: the state is not the one saved for {got:?}"
            );
            assert!(
                [before, after]
                    .iter()
                    .any(|s| s.saved == Some(got.len()) && s.tokens[..got.len()] == *got),
                "after op {i} (step {m}): loaded {got:?}, saved before {:?}, after {:?}",
                before.saved,
                after.saved
            );
            // What was saved before the step and the step keeps is not lost.
            if let (Some(b), Some(a)) = (before.saved, after.saved)
                && a == b
            {
                assert_eq!(got.len(), b, "after op {i}: a saved state was lost");
            }
        }
    }
    eprintln!("{images} crash states, {restored} restored a saved state");
    assert!(images > 100 && restored > 40, "{images} / {restored}");
}

/// The checker is not vacuous for states either: a writer that points the
/// header at an area before the area's bytes are synced is caught.
#[test]
fn a_state_committed_before_its_bytes_is_caught() {
    let (storage, log) = RecordingStorage::new(Vec::new());
    let (mut f, _) =
        KvFile::open_storage(Box::new(storage), Path::new("x"), HYBRID, &mut |_, _| {}).expect("open");
    let toks: Vec<u32> = (0..4).collect();
    f.append(0, &batch_for(HYBRID, toks.iter().copied()))
        .expect("append");
    drop(f);
    let mut image = Vec::new();
    for op in log.lock().iter() {
        match op {
            Op::Write { at, bytes } => {
                let end = *at as usize + bytes.len();
                if image.len() < end {
                    image.resize(end, 0);
                }
                image[*at as usize..end].copy_from_slice(bytes);
            }
            Op::SetLen(n) => image.resize(*n as usize, 0),
            Op::Sync => {}
        }
    }
    let mut fields = 4u64.to_le_bytes().to_vec();
    fields.extend_from_slice(&1u64.to_le_bytes());
    let ops = vec![
        Op::Write {
            at: HEADER_LEN,
            bytes: state_after(&toks),
        },
        Op::Write {
            at: 48,
            bytes: fields,
        },
        Op::Sync,
    ];
    let mut caught = 0;
    for point in CrashStates::new(image, ops) {
        let CrashPoint::Images(images) = point else {
            panic!("narrow")
        };
        for img in images {
            if let Ok((got, Some(state))) = load_hybrid(img)
                && state != state_after(&got)
            {
                caught += 1;
            }
        }
    }
    assert!(caught > 0, "the unsafe ordering went unnoticed");
}
