//! Shared fixtures for the pipeline tests: expert files whose bytes encode
//! their key, a decoder that checks them, a scripted decode workload and a
//! watchdog so a deadlock fails a test instead of hanging it.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use colibri_actors::buffer::BUF_ALIGN;
use colibri_actors::storage::{PreadStorage, SplitMix64};
use colibri_actors::{
    ExpertDecoder, ExpertExtent, ExpertKey, ExpertMap, ExpertSource, FileId, Piece, Predictor, SharedBytes,
    SourceError, Storage, Tag,
};

/// The byte at position `i` of piece `p` of expert `key`.
fn pattern_seed(key: ExpertKey, piece: usize) -> u64 {
    (u64::from(key.layer) << 40) ^ (u64::from(key.expert) << 16) ^ piece as u64 ^ 0xC0FFEE
}

fn fill_pattern(key: ExpertKey, piece: usize, out: &mut [u8]) {
    let mut r = SplitMix64::new(pattern_seed(key, piece));
    for chunk in out.chunks_mut(8) {
        let w = r.next_u64().to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Expert files on disk plus their map.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub map: ExpertMap,
    pub layers: u32,
    pub experts: u32,
}

impl Fixture {
    /// Two files; each expert has three pieces (gate, up, down) of varying
    /// sizes, some adjacent, some separated by alignment padding, at
    /// unaligned offsets, so reads exercise span merging and O_DIRECT
    /// alignment.
    pub fn new(layers: u32, experts: u32) -> Self {
        Self::new_in(tempfile::tempdir().expect("tempdir"), layers, experts)
    }

    pub fn new_in(dir: tempfile::TempDir, layers: u32, experts: u32) -> Self {
        let files = vec![dir.path().join("experts-0.bin"), dir.path().join("experts-1.bin")];
        let mut map = ExpertMap::new(files.clone(), layers as usize, experts as usize);
        let mut data: Vec<Vec<u8>> = vec![vec![0u8; 333], vec![0u8; 17]];
        for l in 0..layers {
            for e in 0..experts {
                let key = ExpertKey::new(l, e);
                let file = ((l + e) % 2) as FileId;
                let buf = &mut data[file as usize];
                let mut pieces = Vec::new();
                for p in 0..3 {
                    if e % 3 == 0 && p == 1 {
                        // alignment padding between pieces
                        let pad = buf.len().next_multiple_of(4096) - buf.len();
                        buf.resize(buf.len() + pad, 0xEE);
                    }
                    let len = 700 + ((l * 131 + e * 57 + p * 29) % 900) as usize;
                    let off = buf.len();
                    buf.resize(off + len, 0);
                    fill_pattern(key, p as usize, &mut buf[off..]);
                    pieces.push(Piece {
                        file,
                        offset: off as u64,
                        len: len as u64,
                    });
                }
                // a few junk bytes between experts
                buf.resize(buf.len() + (e as usize % 5), 0xAB);
                map.set_extent(key, ExpertExtent { pieces }).expect("in range");
            }
        }
        for (p, d) in files.iter().zip(&data) {
            std::fs::write(p, d).expect("write fixture");
        }
        Self {
            dir,
            map,
            layers,
            experts,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The checksum a correct delivery of `key` carries.
    pub fn expected(&self, key: ExpertKey) -> u64 {
        let ext = self.map.extent(key).expect("known key");
        let mut h = Vec::new();
        for (p, piece) in ext.pieces.iter().enumerate() {
            let mut b = vec![0u8; piece.len as usize];
            fill_pattern(key, p, &mut b);
            h.extend_from_slice(&fnv(&b).to_le_bytes());
        }
        fnv(&h)
    }

    pub fn decoder(&self) -> Box<dyn ExpertDecoder<MockExpert>> {
        Box::new(MockDecoder {
            map: self.map.clone(),
        })
    }

    pub fn pread(&self) -> Arc<dyn Storage> {
        Arc::new(PreadStorage::open(&self.map.files, false).expect("open"))
    }
}

/// A "decoded expert": its key, a checksum of its pieces, and the buffer it
/// keeps (so resident bytes are real).
pub struct MockExpert {
    pub key: ExpertKey,
    pub checksum: u64,
    pub buf: SharedBytes,
}

/// Verifies every piece holds exactly the pattern of the requested key.
pub struct MockDecoder {
    map: ExpertMap,
}

impl ExpertDecoder<MockExpert> for MockDecoder {
    fn decode(&self, key: ExpertKey, buf: SharedBytes, piece_at: &[usize]) -> Result<MockExpert, String> {
        let ext = self.map.extent(key).map_err(|e| e.to_string())?;
        if piece_at.len() != ext.pieces.len() {
            return Err("piece count".into());
        }
        let mut h = Vec::new();
        for (p, (piece, &at)) in ext.pieces.iter().zip(piece_at).enumerate() {
            let got = (*buf)
                .as_ref()
                .get(at..at + piece.len as usize)
                .ok_or_else(|| format!("piece {p} out of the buffer"))?;
            let mut want = vec![0u8; piece.len as usize];
            fill_pattern(key, p, &mut want);
            if got != want.as_slice() {
                return Err(format!("piece {p} of {key} holds the wrong bytes"));
            }
            h.extend_from_slice(&fnv(got).to_le_bytes());
        }
        Ok(MockExpert {
            key,
            checksum: fnv(&h),
            buf,
        })
    }

    fn resident_bytes(&self, value: &MockExpert) -> usize {
        // What the worker's aligned buffer allocated for it.
        (*value.buf).as_ref().len().div_ceil(BUF_ALIGN).max(1) * BUF_ALIGN
    }
}

/// Scripted routing: skewed (hot experts exist, so caches hit), distinct
/// within a layer, a pure function of (seed, step, layer).
pub fn routing(seed: u64, step: u64, layer: u32, experts: u32, k: usize) -> Vec<u32> {
    let mut r = SplitMix64::new(seed ^ (step << 20) ^ (u64::from(layer) * 0x9E37));
    let mut out = Vec::new();
    while out.len() < k.min(experts as usize) {
        let e = if r.chance(0.6) {
            r.below(u64::from(experts / 4).max(1)) as u32
        } else {
            r.below(u64::from(experts)) as u32
        };
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// The "residual" the workload offers the pilot: one score per expert,
/// highest for the routed ones except that the last routed expert is hidden
/// (recall (k-1)/k by construction).
pub fn residual(seed: u64, step: u64, layer: u32, experts: u32, k: usize) -> Vec<f32> {
    let routed = routing(seed, step, layer, experts, k);
    let mut v: Vec<f32> = (0..experts).map(|e| (e as f32 * 0.001) % 0.1).collect();
    for (i, &e) in routed.iter().enumerate() {
        v[e as usize] = if i + 1 < routed.len() {
            1.0 + i as f32
        } else {
            -1.0
        };
    }
    v
}

/// Picks the top-k scores.
pub struct TopK;

impl Predictor for TopK {
    fn predict(&self, _layer: u32, residual: &[f32], k: usize) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..residual.len() as u32).collect();
        idx.sort_by(|&a, &b| {
            residual[b as usize]
                .total_cmp(&residual[a as usize])
                .then(a.cmp(&b))
        });
        idx.truncate(k);
        idx
    }
}

/// What one fetch delivered, by index: (key, checksum).
pub type Delivered = Vec<(ExpertKey, u64)>;

/// Fetches `keys` and checks every delivery: right key for its index, right
/// bytes, each index exactly once.
pub fn fetch_checked(
    src: &dyn ExpertSource<MockExpert>,
    fx: &Fixture,
    tag: Tag,
    keys: &[ExpertKey],
) -> Result<Delivered, SourceError> {
    let mut got: Vec<Option<(ExpertKey, u64)>> = vec![None; keys.len()];
    src.fetch(tag, keys, &mut |i, e| {
        assert!(got[i].is_none(), "index {i} delivered twice");
        assert_eq!(e.key, keys[i], "wrong expert delivered at index {i}");
        assert_eq!(e.checksum, fx.expected(keys[i]), "corrupt expert {}", keys[i]);
        got[i] = Some((e.key, e.checksum));
        Ok(())
    })?;
    Ok(got
        .into_iter()
        .map(|g| g.expect("every index delivered"))
        .collect())
}

/// Runs a decode-like workload: per step, announce it; per layer, offer the
/// next layer's residual to the pilot, then fetch this layer's experts.
pub fn run_workload(
    src: &dyn ExpertSource<MockExpert>,
    fx: &Fixture,
    seed: u64,
    steps: u64,
    k: usize,
) -> Vec<Delivered> {
    let mut out = Vec::new();
    for s in 0..steps {
        let tag = Tag::new(1, s, 0);
        src.advance(tag);
        src.pilot(tag, &residual(seed, s, 0, fx.experts, k));
        for l in 0..fx.layers {
            if l + 1 < fx.layers {
                src.pilot(tag.at_layer(l + 1), &residual(seed, s, l + 1, fx.experts, k));
            }
            let keys: Vec<ExpertKey> = routing(seed, s, l, fx.experts, k)
                .into_iter()
                .map(|e| ExpertKey::new(l, e))
                .collect();
            out.push(fetch_checked(src, fx, tag.at_layer(l), &keys).expect("fetch"));
        }
    }
    out
}

/// Runs `f` on its own thread and fails the test if it does not finish in
/// `secs` (a deadlock must fail, not hang).
pub fn with_timeout<R: Send + 'static>(secs: u64, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let h = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(r) => {
            let _ = h.join();
            r
        }
        // The closure panicked (its sender is gone): re-raise the panic.
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => match h.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => panic!("test body ended without a result"),
        },
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
            panic!("test did not finish within {secs} s (deadlock?)")
        }
    }
}

/// A storage wrapper that injects failures and short reads on command and
/// can hold reads at a gate.
pub struct ControlledStorage {
    pub inner: Arc<dyn Storage>,
    /// Fail this many upcoming reads with EIO.
    pub fail_next: AtomicU32,
    pub always_fail: AtomicBool,
    /// Return one byte short this many times.
    pub short_next: AtomicU32,
    /// When set, each read first waits for a token.
    pub gate: Option<crossbeam_channel::Receiver<()>>,
    /// Reads that have reached the storage (counted before the gate), so a
    /// test can wait for "an I/O worker is running this read" as an event
    /// instead of guessing how long the worker takes to pick it up.
    pub entered: AtomicU32,
    /// When set, each read also reports on it as it reaches the storage
    /// (before the gate): a test can block on that event.
    pub notify: Option<crossbeam_channel::Sender<()>>,
    /// Offsets read, in order.
    pub log: parking_lot::Mutex<Vec<(FileId, u64)>>,
}

impl ControlledStorage {
    pub fn new(inner: Arc<dyn Storage>, gate: Option<crossbeam_channel::Receiver<()>>) -> Self {
        Self {
            inner,
            fail_next: AtomicU32::new(0),
            always_fail: AtomicBool::new(false),
            short_next: AtomicU32::new(0),
            gate,
            entered: AtomicU32::new(0),
            notify: None,
            log: parking_lot::Mutex::new(Vec::new()),
        }
    }
}

fn take_one(c: &AtomicU32) -> bool {
    c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl Storage for ControlledStorage {
    fn read_at(&self, file: FileId, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        if let Some(n) = &self.notify {
            let _ = n.send(());
        }
        if let Some(g) = &self.gate {
            // No deadline: the test's own guard (with_timeout) catches a
            // hang, and a dropped gate (test over) releases the read.
            g.recv().map_err(|_| std::io::Error::other("gate closed"))?;
        }
        self.log.lock().push((file, offset));
        if self.always_fail.load(Ordering::SeqCst) || take_one(&self.fail_next) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        let n = self.inner.read_at(file, offset, buf)?;
        if take_one(&self.short_next) {
            return Ok(n.saturating_sub(1));
        }
        Ok(n)
    }

    fn path(&self, file: FileId) -> Option<&Path> {
        self.inner.path(file)
    }

    fn kind(&self) -> &'static str {
        "controlled"
    }
}
