//! Per-sequence attention cache for models with plain (K, V) heads, stored
//! in one of three element types chosen per cache (keys and values
//! separately, like llama.cpp's `-ctk` / `-ctv`):
//!
//! * `f32`: 4 bytes per value, exactly what attention computed (the
//!   token-exact path the transformers oracles check);
//! * `f16`: IEEE half, rounded to nearest even (`half::f16::from_f32`),
//!   2 bytes per value;
//! * `q8`: llama.cpp's `q8_0` layout, 34 bytes per 32 values (see [`KvType::Q8`]).
//!
//! Attention reads the compact rows back to f32 one head slice at a time
//! ([`KvRows::head`]), so a long context costs a half or about a quarter of
//! the f32 memory while the arithmetic after the conversion is unchanged.

use half::f16;

use crate::kernels::dispatch;

/// Values per `q8` block (llama.cpp `QK8_0`).
pub const Q8_BLOCK: usize = 32;
/// Bytes of one `q8` block: an f16 scale then 32 int8 quants.
pub const Q8_BLOCK_BYTES: usize = 2 + Q8_BLOCK;

/// How one cache (keys or values) stores its values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    /// Little-endian f32, exactly the computed values.
    #[default]
    F32,
    /// Little-endian IEEE half (round to nearest even on the way in).
    F16,
    /// Each row of `kv_dim` values is cut into blocks of 32 from its start
    /// (the last block zero-padded when `kv_dim` is not a multiple of 32);
    /// each block is a little-endian f16 scale `d = max|x| / 127` followed
    /// by 32 signed bytes `q = round_half_even(x / d)` (0 when `d` is 0),
    /// and reads back as `q * d`: llama.cpp's `block_q8_0`. (llama.cpp's
    /// scalar reference rounds half away from zero, its SIMD paths half to
    /// even; this follows the SIMD paths.)
    Q8,
}

impl KvType {
    /// Every type, in the order of their header codes.
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8];

    /// The flag spelling (`f32`, `f16`, `q8`).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q8 => "q8",
        }
    }

    /// The code a state file's header stores (f32 is 0, which is what files
    /// written before the field existed hold: they were f32).
    pub fn code(self) -> u8 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q8 => 2,
        }
    }

    pub fn from_code(c: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.code() == c)
    }

    /// Bytes one row of `d` values takes.
    pub fn row_bytes(self, d: usize) -> usize {
        match self {
            Self::F32 => d * 4,
            Self::F16 => d * 2,
            Self::Q8 => d.div_ceil(Q8_BLOCK) * Q8_BLOCK_BYTES,
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("expected f32, f16 or q8, got {s:?}"))
    }
}

/// The storage types of a cache's keys and of its values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    /// Both keys and values as `t`.
    pub const fn both(t: KvType) -> Self {
        Self { k: t, v: t }
    }

    /// Bytes one position takes over `layers` layers of `kv_dim` keys and values.
    pub fn bytes_per_position(self, layers: usize, kv_dim: usize) -> u64 {
        (layers * (self.k.row_bytes(kv_dim) + self.v.row_bytes(kv_dim))) as u64
    }

    /// The state-file header field: the key type's code in the low byte,
    /// the value type's in the next (0 for an all-f32 cache and for files
    /// written before the field existed).
    pub fn header_code(self) -> u32 {
        self.k.code() as u32 | (self.v.code() as u32) << 8
    }

    /// The types a header field names; `None` for an unknown code.
    pub fn from_header_code(c: u32) -> Option<Self> {
        if c >> 16 != 0 {
            return None;
        }
        Some(Self {
            k: KvType::from_code(c as u8)?,
            v: KvType::from_code((c >> 8) as u8)?,
        })
    }
}

impl std::fmt::Display for KvTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.k == self.v {
            write!(f, "{}", self.k)
        } else {
            write!(f, "K {} / V {}", self.k, self.v)
        }
    }
}

/// Rows of `d` values in one [`KvType`].
#[derive(Clone, Debug)]
pub enum KvRows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// One scale per block and `blocks * 32` quants per row (padding included).
    Q8 {
        scales: Vec<f16>,
        quants: Vec<i8>,
    },
}

/// `x` to the nearest int8 step of `id` (`1/d`), half to even, as `q8` stores it.
fn q8_quantize(x: f32, id: f32) -> i8 {
    // |x * id| <= 127 up to rounding of id; the clamp keeps a value that
    // rounds past it in range.
    (x * id).round_ties_even().clamp(-127.0, 127.0) as i8
}

/// The `q8` scale of one block and the reciprocal its quants are computed
/// with (llama.cpp quantizes with `1/d` in f32 and stores `d` as f16).
fn q8_scale(block: &[f32]) -> (f32, f32) {
    let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

impl KvRows {
    pub fn new(t: KvType) -> Self {
        match t {
            KvType::F32 => Self::F32(Vec::new()),
            KvType::F16 => Self::F16(Vec::new()),
            KvType::Q8 => Self::Q8 {
                scales: Vec::new(),
                quants: Vec::new(),
            },
        }
    }

    pub fn kind(&self) -> KvType {
        match self {
            Self::F32(_) => KvType::F32,
            Self::F16(_) => KvType::F16,
            Self::Q8 { .. } => KvType::Q8,
        }
    }

    /// Appends the rows of `vals` (a multiple of `d` values), converted.
    pub fn push_rows(&mut self, vals: &[f32], d: usize) {
        match self {
            Self::F32(v) => v.extend_from_slice(vals),
            Self::F16(v) => v.extend(vals.iter().map(|&x| f16::from_f32(x))),
            Self::Q8 { scales, quants } => {
                for row in vals.chunks_exact(d) {
                    for block in row.chunks(Q8_BLOCK) {
                        let (s, id) = q8_scale(block);
                        scales.push(f16::from_f32(s));
                        quants.extend(block.iter().map(|&x| q8_quantize(x, id)));
                        quants.extend(std::iter::repeat_n(0, Q8_BLOCK - block.len()));
                    }
                }
            }
        }
    }

    /// Keeps rows `0..rows`.
    pub fn truncate(&mut self, rows: usize, d: usize) {
        match self {
            Self::F32(v) => v.truncate(rows * d),
            Self::F16(v) => v.truncate(rows * d),
            Self::Q8 { scales, quants } => {
                let nb = d.div_ceil(Q8_BLOCK);
                scales.truncate(rows * nb);
                quants.truncate(rows * nb * Q8_BLOCK);
            }
        }
    }

    /// Values `off..off + out.len()` of row `p` (rows of `d`), as f32, into `out`.
    ///
    /// The conversions run on the SIMD kernels ([`crate::kernels::Kernels::f16_to_f32`],
    /// [`crate::kernels::Kernels::dequant_i8`]), which give exactly the scalar definitions'
    /// bits: `half`'s `to_f32`, and `q as f32 * d` per value.
    pub fn read_into(&self, p: usize, d: usize, off: usize, out: &mut [f32]) {
        let kern = dispatch();
        let end = off + out.len();
        match self {
            Self::F32(v) => out.copy_from_slice(&v[p * d + off..p * d + end]),
            Self::F16(v) => kern.f16_to_f32(&v[p * d + off..p * d + end], out),
            Self::Q8 { scales, quants } => {
                let nb = d.div_ceil(Q8_BLOCK);
                let (s, q) = (&scales[p * nb..(p + 1) * nb], &quants[p * nb * Q8_BLOCK..]);
                // Block by block: each run of values shares one scale.
                let mut i = off;
                while i < end {
                    let b = i / Q8_BLOCK;
                    let stop = ((b + 1) * Q8_BLOCK).min(end);
                    kern.dequant_i8(&q[i..stop], s[b].to_f32(), &mut out[i - off..stop - off]);
                    i = stop;
                }
            }
        }
    }

    /// Values `off..off + len` of row `p` as f32: borrowed from an f32
    /// cache (no copy, so the f32 path computes on exactly what it stored),
    /// converted into `scratch` otherwise.
    pub fn head<'a>(
        &'a self,
        p: usize,
        d: usize,
        off: usize,
        len: usize,
        scratch: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        match self {
            Self::F32(v) => &v[p * d + off..p * d + off + len],
            _ => {
                scratch.resize(len, 0.0);
                self.read_into(p, d, off, scratch);
                scratch
            }
        }
    }

    /// Rows `0..rows` as one f32 slice: borrowed from an f32 cache,
    /// converted (with [`Self::read_into`]'s exact conversions) otherwise.
    /// Callers that multiply the whole cache by a matrix, or read every row
    /// once per head, convert once per call this way instead of once per
    /// head; the compact copy stays the only one kept between calls.
    pub fn rows_f32(&self, rows: usize, d: usize) -> std::borrow::Cow<'_, [f32]> {
        match self {
            Self::F32(v) => std::borrow::Cow::Borrowed(&v[..rows * d]),
            _ => {
                let mut out = vec![0f32; rows * d];
                for (p, row) in out.chunks_exact_mut(d.max(1)).enumerate().take(rows) {
                    self.read_into(p, d, 0, row);
                }
                std::borrow::Cow::Owned(out)
            }
        }
    }

    /// Rows held (of `d` values each).
    pub fn rows(&self, d: usize) -> usize {
        if d == 0 {
            return 0;
        }
        match self {
            Self::F32(v) => v.len() / d,
            Self::F16(v) => v.len() / d,
            Self::Q8 { scales, .. } => scales.len() / d.div_ceil(Q8_BLOCK),
        }
    }

    /// Appends row `p`'s bytes as a state file stores them (see [`KvType`]).
    pub fn row_bytes_into(&self, p: usize, d: usize, out: &mut Vec<u8>) {
        match self {
            Self::F32(v) => v[p * d..(p + 1) * d]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Self::F16(v) => v[p * d..(p + 1) * d]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Self::Q8 { scales, quants } => {
                let nb = d.div_ceil(Q8_BLOCK);
                for b in p * nb..(p + 1) * nb {
                    out.extend_from_slice(&scales[b].to_le_bytes());
                    out.extend(quants[b * Q8_BLOCK..(b + 1) * Q8_BLOCK].iter().map(|&q| q as u8));
                }
            }
        }
    }

    /// Appends one row from its state-file bytes (`kind().row_bytes(d)` of them).
    pub fn push_row_bytes(&mut self, bytes: &[u8]) {
        match self {
            Self::F32(v) => v.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            Self::F16(v) => v.extend(bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]))),
            Self::Q8 { scales, quants } => {
                for block in bytes.chunks_exact(Q8_BLOCK_BYTES) {
                    scales.push(f16::from_le_bytes([block[0], block[1]]));
                    quants.extend(block[2..].iter().map(|&q| q as i8));
                }
            }
        }
    }
}

/// Keys and values of every past position, per layer, row-major
/// `[position, kv_heads * head_dim]`, in the cache's [`KvTypes`].
#[derive(Clone, Debug)]
pub struct KvCache {
    pub(crate) k: Vec<KvRows>,
    pub(crate) v: Vec<KvRows>,
    kv_dim: usize,
    len: usize,
}

impl Default for KvCache {
    fn default() -> Self {
        Self::new(0, 0)
    }
}

impl KvCache {
    /// An f32 cache (the token-exact path).
    pub fn new(layers: usize, kv_dim: usize) -> Self {
        Self::with_types(layers, kv_dim, KvTypes::default())
    }

    /// A cache storing keys and values as `types` say.
    pub fn with_types(layers: usize, kv_dim: usize, types: KvTypes) -> Self {
        Self {
            k: (0..layers).map(|_| KvRows::new(types.k)).collect(),
            v: (0..layers).map(|_| KvRows::new(types.v)).collect(),
            kv_dim,
            len: 0,
        }
    }

    /// How keys and values are stored.
    pub fn types(&self) -> KvTypes {
        KvTypes {
            k: self.k.first().map_or(KvType::F32, KvRows::kind),
            v: self.v.first().map_or(KvType::F32, KvRows::kind),
        }
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    pub fn layers(&self) -> usize {
        self.k.len()
    }

    /// Drops positions `len..` (prefix reuse keeps the common prefix).
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.len);
        for rows in self.k.iter_mut().chain(self.v.iter_mut()) {
            rows.truncate(len, self.kv_dim);
        }
        self.len = len;
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Marks `n` positions appended on every layer (after each layer pushed them).
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// One position's state, all layers, as bytes: K then V per layer, each
    /// row in its type's layout (the record payload of a conversation state
    /// file; for f32 the same bytes as before the types existed).
    pub fn position_bytes(&self, pos: usize) -> Vec<u8> {
        let d = self.kv_dim;
        let mut out = Vec::with_capacity(self.record_bytes());
        for (k, v) in self.k.iter().zip(&self.v) {
            k.row_bytes_into(pos, d, &mut out);
            v.row_bytes_into(pos, d, &mut out);
        }
        out
    }

    /// Bytes of one position record.
    pub fn record_bytes(&self) -> usize {
        self.types().bytes_per_position(self.k.len(), self.kv_dim) as usize
    }

    /// Appends one position from a record written by [`Self::position_bytes`]
    /// of a cache of the same types; false when the size is wrong.
    pub fn push_position_bytes(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() != self.record_bytes() {
            return false;
        }
        let t = self.types();
        let (kb, vb) = (t.k.row_bytes(self.kv_dim), t.v.row_bytes(self.kv_dim));
        if kb + vb > 0 {
            for ((k, v), rec) in self
                .k
                .iter_mut()
                .zip(&mut self.v)
                .zip(bytes.chunks_exact(kb + vb))
            {
                k.push_row_bytes(&rec[..kb]);
                v.push_row_bytes(&rec[kb..]);
            }
        }
        self.len += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The scalar reference of one `q8` block: llama.cpp's
    /// `quantize_row_q8_0_ref` with half-to-even rounding, then `q * d`.
    fn q8_reference(block: &[f32]) -> Vec<f32> {
        let amax = block.iter().map(|x| x.abs()).fold(0.0f32, f32::max);
        let d = amax / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let dh = f16::from_f32(d).to_f32();
        block.iter().map(|&x| (x * id).round_ties_even() * dh).collect()
    }

    fn read_row(rows: &KvRows, p: usize, d: usize) -> Vec<f32> {
        let mut out = vec![0f32; d];
        rows.read_into(p, d, 0, &mut out);
        out
    }

    proptest! {
        #[test]
        fn f16_rows_read_back_as_their_nearest_half(
            row in prop::collection::vec(-70000.0f32..70000.0, 1..100),
        ) {
            let d = row.len();
            let mut r = KvRows::new(KvType::F16);
            r.push_rows(&row, d);
            let back = read_row(&r, 0, d);
            for (x, y) in row.iter().zip(&back) {
                prop_assert_eq!(*y, f16::from_f32(*x).to_f32());
                // Relative error of round-to-nearest half: 2^-11 (normal range).
                if x.abs() > 1e-4 && x.abs() < 65504.0 {
                    prop_assert!((x - y).abs() <= x.abs() * (1.0 / 2048.0), "{} vs {}", x, y);
                }
            }
        }

        #[test]
        fn q8_rows_match_the_scalar_reference(
            row in prop::collection::vec(-8.0f32..8.0, 1..130),
            rows in 1usize..4,
        ) {
            let d = row.len();
            // Several rows (each a shifted copy) so that row offsets are exercised.
            let all: Vec<f32> = (0..rows).flat_map(|i| row.iter().map(move |x| x * (i + 1) as f32)).collect();
            let mut r = KvRows::new(KvType::Q8);
            r.push_rows(&all, d);
            for p in 0..rows {
                let src = &all[p * d..(p + 1) * d];
                let want: Vec<f32> = src.chunks(Q8_BLOCK).flat_map(q8_reference).collect();
                prop_assert_eq!(read_row(&r, p, d), want.clone());
                // Within half a step of each block's scale (plus f16 rounding of the scale).
                for (b, block) in src.chunks(Q8_BLOCK).enumerate() {
                    let amax = block.iter().map(|x| x.abs()).fold(0.0f32, f32::max);
                    for (j, x) in block.iter().enumerate() {
                        let y = want[b * Q8_BLOCK + j];
                        prop_assert!((x - y).abs() <= amax / 127.0 * 0.5 + amax * 1e-3 + 1e-6);
                    }
                }
            }
        }

        #[test]
        fn every_type_round_trips_through_record_bytes(
            vals in prop::collection::vec(-3.0f32..3.0, 40 * 3 * 2 * 3),
            k in 0u8..3, v in 0u8..3,
        ) {
            let types = KvTypes { k: KvType::from_code(k).unwrap(), v: KvType::from_code(v).unwrap() };
            let (layers, d, n) = (3, 40, 3);
            let mut a = KvCache::with_types(layers, d, types);
            for l in 0..layers {
                let base = l * n * d * 2;
                a.k[l].push_rows(&vals[base..base + n * d], d);
                a.v[l].push_rows(&vals[base + n * d..base + 2 * n * d], d);
            }
            a.commit(n);
            prop_assert_eq!(a.record_bytes() as u64, types.bytes_per_position(layers, d));
            let mut b = KvCache::with_types(layers, d, types);
            for p in 0..n {
                let rec = a.position_bytes(p);
                prop_assert_eq!(rec.len(), a.record_bytes());
                prop_assert!(b.push_position_bytes(&rec));
            }
            for l in 0..layers {
                for p in 0..n {
                    prop_assert_eq!(read_row(&a.k[l], p, d), read_row(&b.k[l], p, d));
                    prop_assert_eq!(read_row(&a.v[l], p, d), read_row(&b.v[l], p, d));
                }
            }
            prop_assert!(!b.push_position_bytes(&[0u8; 3]));
        }
    }

    #[test]
    fn q8_rounds_half_to_even_and_zero_blocks_stay_zero() {
        // amax 127 makes d = 1: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0.
        let mut row = vec![0.5f32, 1.5, 2.5, -0.5, 127.0];
        row.resize(Q8_BLOCK, 0.0);
        row.extend([0.0f32; 8]); // a second, partial block of zeros
        let mut r = KvRows::new(KvType::Q8);
        r.push_rows(&row, row.len());
        let back = read_row(&r, 0, row.len());
        assert_eq!(&back[..5], &[0.0, 2.0, 2.0, 0.0, 127.0]);
        assert!(back[Q8_BLOCK..].iter().all(|&x| x == 0.0));
        assert_eq!(KvType::Q8.row_bytes(row.len()), 2 * Q8_BLOCK_BYTES);
    }

    #[test]
    fn q8_record_layout_is_scale_then_quants_per_block() {
        let mut row = vec![0f32; Q8_BLOCK];
        row[0] = 254.0; // d = 2
        row[1] = -4.0;
        let mut c = KvCache::with_types(
            1,
            Q8_BLOCK,
            KvTypes {
                k: KvType::Q8,
                v: KvType::F32,
            },
        );
        c.k[0].push_rows(&row, Q8_BLOCK);
        c.v[0].push_rows(&row, Q8_BLOCK);
        c.commit(1);
        let rec = c.position_bytes(0);
        assert_eq!(rec.len(), Q8_BLOCK_BYTES + Q8_BLOCK * 4);
        assert_eq!(&rec[..2], &f16::from_f32(2.0).to_le_bytes());
        assert_eq!(rec[2] as i8, 127);
        assert_eq!(rec[3] as i8, -2);
        assert_eq!(&rec[Q8_BLOCK_BYTES..Q8_BLOCK_BYTES + 4], &254f32.to_le_bytes());
    }

    #[test]
    fn f32_records_are_the_bytes_before_types_existed() {
        let (layers, d) = (2, 3);
        let mut c = KvCache::new(layers, d);
        for l in 0..layers {
            c.k[l].push_rows(&[1.0, 2.0, 3.0], d);
            c.v[l].push_rows(&[4.0, 5.0, 6.0], d);
        }
        c.commit(1);
        let old: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
            .repeat(layers)
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(c.position_bytes(0), old);
        assert_eq!(c.types().header_code(), 0);
    }

    #[test]
    fn truncate_keeps_the_prefix_in_every_type() {
        for t in KvType::ALL {
            let d = 36;
            let mut c = KvCache::with_types(1, d, KvTypes::both(t));
            let vals: Vec<f32> = (0..d * 4).map(|i| i as f32 * 0.25 - 9.0).collect();
            c.k[0].push_rows(&vals, d);
            c.v[0].push_rows(&vals, d);
            c.commit(4);
            let before = c.position_bytes(1);
            c.truncate(2);
            assert_eq!(c.len(), 2);
            assert_eq!(c.position_bytes(1), before, "{t}");
            c.k[0].push_rows(&vals[..d], d);
            c.v[0].push_rows(&vals[..d], d);
            c.commit(1);
            assert_eq!(c.position_bytes(2), c.position_bytes(0), "{t}");
        }
    }

    #[test]
    fn header_codes_and_flag_names_round_trip() {
        for k in KvType::ALL {
            assert_eq!(k.name().parse::<KvType>(), Ok(k));
            for v in KvType::ALL {
                let t = KvTypes { k, v };
                assert_eq!(KvTypes::from_header_code(t.header_code()), Some(t));
            }
        }
        assert_eq!(KvTypes::from_header_code(0), Some(KvTypes::both(KvType::F32)));
        assert_eq!(KvTypes::from_header_code(3), None);
        assert_eq!(KvTypes::from_header_code(1 << 16), None);
        assert!("bf16".parse::<KvType>().is_err());
    }
}
