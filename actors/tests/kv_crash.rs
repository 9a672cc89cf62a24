//! Crash safety of `.coli_kv`: a writer killed with SIGKILL at random moments
//! always leaves a file that loads to a consistent prefix, also when the
//! positions stream one at a time through the KV actor.
//!
//! The test binary re-invokes itself as the writer (env `COLI_KV_CRASH_CHILD`,
//! `COLI_KV_STREAM_CHILD`).

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use colibri_actors::kv::{KvActor, KvFile, KvLayout, KvLoad, KvQueueLimits, KvRecords};

const LAYOUT: KvLayout = KvLayout {
    fingerprint: 0xC0117,
    payload_bytes: 4096,
    payload_kind: 0,
    state_bytes: 0,
};
const CHILD_ENV: &str = "COLI_KV_CRASH_CHILD";
const STREAM_CHILD_ENV: &str = "COLI_KV_STREAM_CHILD";
/// What the writer prints once its first append is committed.
const COMMITTED: &str = "<first append committed>";

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// Payload: position, token, a fill pattern, and a checksum of all of it.
fn payload(pos: u64, token: u32) -> Vec<u8> {
    let mut p = vec![0u8; LAYOUT.payload_bytes];
    p[..8].copy_from_slice(&pos.to_le_bytes());
    p[8..12].copy_from_slice(&token.to_le_bytes());
    for (i, b) in p[12..LAYOUT.payload_bytes - 8].iter_mut().enumerate() {
        *b = (pos as usize * 31 + token as usize * 7 + i) as u8;
    }
    let sum = fnv(&p[..LAYOUT.payload_bytes - 8]);
    let n = LAYOUT.payload_bytes;
    p[n - 8..].copy_from_slice(&sum.to_le_bytes());
    p
}

fn check_record(pos: u64, token: u32, p: &[u8]) -> Result<(), String> {
    let n = p.len();
    let sum = u64::from_le_bytes(p[n - 8..].try_into().unwrap());
    if fnv(&p[..n - 8]) != sum {
        return Err(format!("record {pos}: checksum mismatch"));
    }
    let rpos = u64::from_le_bytes(p[..8].try_into().unwrap());
    let rtok = u32::from_le_bytes(p[8..12].try_into().unwrap());
    if rpos != pos || rtok != token {
        return Err(format!(
            "record {pos}: holds position {rpos} token {rtok} (header token {token})"
        ));
    }
    Ok(())
}

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The writer: appends batches forever, sometimes truncating (prefix reuse) or resetting.
fn child(path: &Path, seed: u64) -> ! {
    let (mut f, _) = KvFile::open(path, LAYOUT, &mut |_, _| {}).unwrap();
    let mut rng = XorShift(seed | 1);
    let mut round = 0u32;
    // First a committed append, announced on stdout; then wait for the
    // parent's go (a byte or EOF on stdin). A parent that kills at this point
    // knows the file holds at least this append: an event, not a guess.
    let at = f.len();
    let mut recs = KvRecords::new(LAYOUT);
    for pos in at..at + 3 {
        let token = 7_000_000 + pos as u32;
        recs.push(token, &payload(pos, token)).unwrap();
    }
    f.append(at, &recs).unwrap();
    {
        use std::io::{Read, Write};
        let mut out = std::io::stdout().lock();
        writeln!(out, "{COMMITTED}").unwrap();
        out.flush().unwrap();
        let _ = std::io::stdin().read(&mut [0u8; 1]);
    }
    loop {
        round = round.wrapping_add(1);
        let r = rng.next();
        match r % 16 {
            0 => f.reset().unwrap(),
            1..=3 if !f.is_empty() => {
                let len = rng.next() % f.len();
                f.truncate(len).unwrap();
            }
            _ => {
                // Sometimes overwrite from inside the committed range.
                let at = if r.is_multiple_of(5) && !f.is_empty() {
                    rng.next() % f.len()
                } else {
                    f.len()
                };
                let n = 1 + rng.next() % 24;
                let mut recs = KvRecords::new(LAYOUT);
                for pos in at..at + n {
                    let token = round.wrapping_mul(1000).wrapping_add(pos as u32);
                    recs.push(token, &payload(pos, token)).unwrap();
                }
                f.append(at, &recs).unwrap();
            }
        }
    }
}

#[test]
fn kill_9_always_leaves_a_consistent_prefix() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (path, seed) = spec.split_once('|').unwrap();
        child(Path::new(path), seed.parse().unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".coli_kv");
    let exe = std::env::current_exe().unwrap();
    let mut rng = XorShift(0x9E3779B97F4A7C15);
    let start = Instant::now();
    let mut rounds = 0;
    let mut nonempty = 0;
    while rounds < 60 && (rounds < 8 || start.elapsed() < Duration::from_secs(8)) {
        let mut c = Command::new(&exe)
            .args([
                "--exact",
                "kill_9_always_leaves_a_consistent_prefix",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, format!("{}|{}", path.display(), rng.next()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait for the child's first commit (an event; the harness prints
        // its own lines first).
        let mut lines = std::io::BufReader::new(c.stdout.take().unwrap()).lines();
        loop {
            match lines.next() {
                // The harness may print "test NAME ... " on the same line.
                Some(Ok(l)) if l.ends_with(COMMITTED) => break,
                Some(Ok(_)) => continue,
                other => panic!("round {rounds}: the writer ended before committing: {other:?}"),
            }
        }
        if rounds % 2 == 1 {
            // Let it run, and kill it somewhere in its writes.
            let _ = c.stdin.take().unwrap().write_all(b"g");
            std::thread::sleep(Duration::from_millis(rng.next() % 60));
        }
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
        let mut pos = 0u64;
        let mut errors = Vec::new();
        let (_, load) = KvFile::open(&path, LAYOUT, &mut |tok, p| {
            if let Err(e) = check_record(pos, tok, p) {
                errors.push(e);
            }
            pos += 1;
        })
        .unwrap();
        assert!(errors.is_empty(), "round {rounds}: {errors:?}");
        match load {
            KvLoad::Loaded { records, .. } => {
                assert_eq!(records, pos);
                if records > 0 {
                    nonempty += 1;
                }
            }
            KvLoad::Missing => {}
            KvLoad::Mismatch { reason } => {
                // Only a kill during the very first header write may leave this.
                assert!(reason.contains("header truncated"), "round {rounds}: {reason}");
            }
            KvLoad::OtherKind { found } => panic!("round {rounds}: payload kind {found} never written"),
        }
        rounds += 1;
    }
    // Every even round kills the writer parked after a commit.
    assert!(
        nonempty > 0,
        "the writer never committed anything in {rounds} rounds"
    );
}

/// The token the streaming writer stores at `pos`.
fn stream_token(pos: u64) -> u32 {
    9_000_000 + pos as u32
}

/// Every this many positions the streaming writer flushes and says so.
const DURABLE_EVERY: u64 = 8;

/// The streaming writer: the decode loop's pattern, one position per step
/// through the KV actor (a small queue, so it also waits on the disk),
/// flushing every `DURABLE_EVERY` positions and announcing `<durable N>`
/// once the first N positions are on disk. Runs until killed.
fn stream_child(path: &Path) -> ! {
    let (f, _) = KvFile::open(path, LAYOUT, &mut |_, _| {}).unwrap();
    let limits = KvQueueLimits {
        depth: 4,
        max_message_bytes: 3 * LAYOUT.record_size(),
    };
    let mut h = KvActor::spawn_with(vec![f], limits).unwrap();
    for pos in 0..1_000_000u64 {
        let token = stream_token(pos);
        let mut r = KvRecords::new(LAYOUT);
        r.push(token, &payload(pos, token)).unwrap();
        h.append(0, pos, r).unwrap();
        if (pos + 1).is_multiple_of(DURABLE_EVERY) {
            h.flush().unwrap();
            let mut out = std::io::stdout().lock();
            // A parent that went away: stop.
            if writeln!(out, "<durable {}>", pos + 1)
                .and_then(|()| out.flush())
                .is_err()
            {
                std::process::exit(0);
            }
        }
    }
    std::process::exit(0)
}

#[test]
fn kill_9_while_positions_stream_through_the_actor_leaves_a_prefix() {
    if let Ok(path) = std::env::var(STREAM_CHILD_ENV) {
        stream_child(Path::new(&path));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".coli_kv");
    let exe = std::env::current_exe().unwrap();
    let mut rng = XorShift(0xD1B5_4A32_D192_ED03);
    for round in 0..12 {
        let _ = std::fs::remove_file(&path);
        let target = DURABLE_EVERY * (1 + rng.next() % 16);
        let mut c = Command::new(&exe)
            .args([
                "--exact",
                "kill_9_while_positions_stream_through_the_actor_leaves_a_prefix",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(STREAM_CHILD_ENV, &path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Kill once `target` positions are known durable; the writer is
        // streaming further positions when the kill lands.
        let mut lines = std::io::BufReader::new(c.stdout.take().unwrap()).lines();
        let durable = loop {
            match lines.next() {
                Some(Ok(l)) => {
                    let n = l
                        .rsplit_once("<durable ")
                        .and_then(|(_, n)| n.strip_suffix('>'))
                        .and_then(|n| n.parse::<u64>().ok());
                    if let Some(n) = n
                        && n >= target
                    {
                        break n;
                    }
                }
                other => panic!("round {round}: the writer ended early: {other:?}"),
            }
        };
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
        let mut pos = 0u64;
        let mut errors = Vec::new();
        let (_, load) = KvFile::open(&path, LAYOUT, &mut |tok, p| {
            if tok != stream_token(pos) {
                errors.push(format!("record {pos}: token {tok}, sent {}", stream_token(pos)));
            } else if let Err(e) = check_record(pos, tok, p) {
                errors.push(e);
            }
            pos += 1;
        })
        .unwrap();
        assert!(errors.is_empty(), "round {round}: {errors:?}");
        let KvLoad::Loaded { records, .. } = load else {
            panic!("round {round}: {load:?}")
        };
        assert_eq!(records, pos);
        assert!(
            records >= durable,
            "round {round}: {records} positions loaded, {durable} were flushed"
        );
    }
}
