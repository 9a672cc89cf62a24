//! Dot-product kernels over one weight row, in every storage format.
//!
//! The scalar versions are the reference; SIMD versions (AVX2+FMA, AVX-512,
//! NEON) are chosen once at run time from the CPU's features and are
//! property-tested against them. Every kernel sums a row in a fixed order that
//! depends only on the kernel set and the row's length, never on the thread
//! count or on how many tokens are processed together, so `matmul` equals
//! `matvec` per token bit for bit.
//!
//! Int4 rows are fastest against activations rearranged once per matvec
//! ([`Kernels::prepare`], [`Acts`]): the SIMD kernels then turn each nibble
//! into an f32 with one table lookup instead of widening byte by byte.
//!
//! The attention inner loops ([`Kernels::dot_f32`], [`Kernels::axpy`]) and
//! the KV cache reads ([`Kernels::f16_to_f32`], [`Kernels::dequant_i8`]) have
//! SIMD versions too, but unlike the row kernels they are bit-identical to
//! their scalar definitions (no FMA, the same lanes and reduction tree), so
//! choosing a set never changes a token.
//!
//! The optional int8-activation mode ([`QActs`], [`Kernels::dot_q8`]) trades
//! exactness against the f32 reference for speed; it is never the default.

pub mod ggml;
pub mod q8;
pub mod scalar;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_ggml;
#[cfg(target_arch = "aarch64")]
mod neon_vec;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

pub use q8::{Q8_BLOCK, QActs};

use crate::quant::QFormat;

/// One row of a weight matrix, borrowed.
#[derive(Clone, Copy, Debug)]
pub enum RowRef<'a> {
    F32(&'a [f32]),
    Packed {
        format: QFormat,
        cols: usize,
        bytes: &'a [u8],
        scales: &'a [f32],
    },
}

impl<'a> RowRef<'a> {
    /// A packed row's format, columns, bytes and scales; `None` for f32.
    /// (Only the x86 kernels take a row apart this way.)
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn packed(&self) -> Option<(QFormat, usize, &'a [u8], &'a [f32])> {
        match *self {
            RowRef::F32(_) => None,
            RowRef::Packed {
                format,
                cols,
                bytes,
                scales,
            } => Some((format, cols, bytes, scales)),
        }
    }
}

impl RowRef<'_> {
    /// Storage format (`F32` for an f32 row).
    pub fn format(&self) -> QFormat {
        match *self {
            RowRef::F32(_) => QFormat::F32,
            RowRef::Packed { format, .. } => format,
        }
    }

    /// Logical number of columns.
    pub fn cols(&self) -> usize {
        match *self {
            RowRef::F32(w) => w.len(),
            RowRef::Packed { cols, .. } => cols,
        }
    }

    /// Panics unless the row's buffers hold what its format says and `x` has
    /// `cols` values: the SIMD kernels read through raw pointers, so this
    /// check is what keeps them in bounds.
    fn check(&self, x_len: usize) {
        if let RowRef::Packed {
            format,
            cols,
            bytes,
            scales,
        } = *self
        {
            let spr = match format {
                QFormat::Int4Grouped { group: 0 } => usize::MAX,
                f => f.scales_per_row(cols),
            };
            assert!(
                bytes.len() >= format.row_bytes(cols) && scales.len() >= spr,
                "{format} row of {cols} columns with {} bytes and {} scales",
                bytes.len(),
                scales.len()
            );
        }
        assert!(
            x_len >= self.cols(),
            "activation of {x_len} values for a row of {}",
            self.cols()
        );
    }
}

/// An activation vector as one kernel set wants it for one weight format:
/// the plain values, plus for int4 on x86 SIMD a de-interleaved copy built
/// once per matvec and shared by every row. Only the plain values decide the
/// result's meaning; the copy only changes speed.
#[derive(Clone, Debug)]
pub struct Acts<'a> {
    x: &'a [f32],
    #[cfg(target_arch = "x86_64")]
    nib: Option<x86::NibActs>,
}

impl<'a> Acts<'a> {
    /// Plain activations, usable with any kernel set and format.
    pub fn plain(x: &'a [f32]) -> Self {
        Self {
            x,
            #[cfg(target_arch = "x86_64")]
            nib: None,
        }
    }

    /// The plain values.
    pub fn values(&self) -> &'a [f32] {
        self.x
    }
}

/// Instruction set a [`Kernels`] value uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "aarch64")]
    Neon,
}

/// A kernel set: which instruction set computes row dot products. A value can
/// only be built for a CPU that supports it, which is what makes calling the
/// `#[target_feature]` functions behind it sound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernels {
    /// Human-readable name for logs and benches ("scalar", "avx2", "avx512", ...).
    pub name: &'static str,
    isa: Isa,
    vnni: bool,
    /// Whether the CPU has F16C (x86), for the f16 → f32 conversion.
    f16c: bool,
}

impl Kernels {
    /// The portable reference kernels, always available.
    pub fn scalar() -> Self {
        Self {
            name: "scalar",
            isa: Isa::Scalar,
            vnni: false,
            f16c: false,
        }
    }

    /// AVX2+FMA kernels, when this CPU has them.
    pub fn avx2() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        if x86::has_avx2() {
            return Some(Self {
                name: "avx2",
                isa: Isa::Avx2,
                vnni: false,
                f16c: x86::has_f16c(),
            });
        }
        None
    }

    /// AVX-512F/BW kernels (with the VNNI int8-activation path when the CPU
    /// has AVX512-VNNI), when this CPU has them.
    pub fn avx512() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        if x86::has_avx512() {
            let vnni = x86::has_vnni();
            return Some(Self {
                name: if vnni { "avx512+vnni" } else { "avx512" },
                isa: Isa::Avx512,
                vnni,
                f16c: x86::has_f16c(),
            });
        }
        None
    }

    /// NEON kernels on aarch64.
    pub fn neon() -> Option<Self> {
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Some(Self {
                name: "neon",
                isa: Isa::Neon,
                vnni: false,
                f16c: false,
            });
        }
        None
    }

    /// Every kernel set this CPU can run, scalar first (tests, benches).
    pub fn available() -> Vec<Self> {
        let mut all = vec![Self::scalar()];
        all.extend(Self::avx2());
        if let Some(k) = Self::avx512() {
            if k.vnni {
                all.push(k.without_vnni());
            }
            all.push(k);
        }
        all.extend(Self::neon());
        all
    }

    /// The fastest set for this CPU (uncached; see [`dispatch`]).
    pub fn detect() -> Self {
        Self::avx512()
            .or_else(Self::avx2)
            .or_else(Self::neon)
            .unwrap_or_else(Self::scalar)
    }

    /// Whether [`Kernels::dot_q8`] uses AVX512-VNNI integer dot products.
    pub fn has_vnni(&self) -> bool {
        self.vnni
    }

    /// Whether [`Kernels::dot_q8`] has a SIMD integer kernel here (VNNI, or
    /// AVX2's multiply-add of bytes) rather than the scalar reference.
    pub fn has_int_dot(&self) -> bool {
        match self.isa {
            Isa::Scalar => false,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 => true,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => false,
        }
    }

    /// The same set without the VNNI int8-activation kernel (AVX2's then
    /// serves it).
    pub fn without_vnni(self) -> Self {
        let name = if self.vnni { "avx512" } else { self.name };
        Self {
            name,
            vnni: false,
            ..self
        }
    }

    /// `x` laid out for this kernel set's `format` rows: prepare once, then
    /// [`Kernels::dot_acts`] every row. Results equal [`Kernels::dot`]'s.
    pub fn prepare<'a>(&self, format: QFormat, x: &'a [f32]) -> Acts<'a> {
        #[cfg(target_arch = "x86_64")]
        {
            let lanes = match self.isa {
                Isa::Avx512 => Some(16),
                Isa::Avx2 => Some(8),
                Isa::Scalar => None,
            };
            if let Some(lanes) = lanes.filter(|&l| x86::nib_groups(format, l).is_some()) {
                return Acts {
                    x,
                    nib: Some(x86::NibActs::new(x, lanes, self.isa == Isa::Avx2)),
                };
            }
        }
        let _ = format;
        Acts::plain(x)
    }

    /// `row · x` in the row's format. Prepares `x` for this one row (an
    /// allocation for int4 on x86 SIMD): callers with many rows use
    /// [`Kernels::prepare`] and [`Kernels::dot_acts`].
    #[inline]
    pub fn dot(&self, row: &RowRef<'_>, x: &[f32]) -> f32 {
        row.check(x.len());
        let x = &x[..row.cols()];
        self.dot_n::<1>(row, [&self.prepare(row.format(), x)])[0]
    }

    /// `row · a`, with `a` from [`Kernels::prepare`] (any kernel set or
    /// format works; the matching one is fastest).
    #[inline]
    pub fn dot_acts(&self, row: &RowRef<'_>, a: &Acts<'_>) -> f32 {
        row.check(a.x.len());
        self.dot_n::<1>(row, [a])[0]
    }

    /// `out[t] = row · x_t` for the `n` tokens of `x` (`[n, cols]`), reading
    /// the row once per block of tokens so it stays in L1. Each value equals
    /// [`Kernels::dot`] of that token exactly.
    pub fn dot_batch(&self, row: &RowRef<'_>, x: &[f32], n: usize, out: &mut [f32]) {
        let cols = row.cols();
        assert!(
            x.len() >= n * cols,
            "dot_batch: {n} tokens of {cols} with {} inputs",
            x.len(),
        );
        let acts: Vec<Acts<'_>> = (0..n)
            .map(|t| self.prepare(row.format(), &x[t * cols..(t + 1) * cols]))
            .collect();
        self.dot_batch_acts(row, &acts, out);
    }

    /// `out[t] = row · acts[t]` for every token, as [`Kernels::dot_batch`]:
    /// each value equals [`Kernels::dot_acts`] of that token exactly.
    pub fn dot_batch_acts(&self, row: &RowRef<'_>, acts: &[Acts<'_>], out: &mut [f32]) {
        let n = acts.len();
        assert!(out.len() >= n, "dot_batch: {n} tokens, {} outputs", out.len());
        for a in acts {
            row.check(a.x.len());
        }
        let tok = |t: usize| &acts[t];
        let block = match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => 4,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => 2,
            _ => 1,
        };
        let mut t = 0;
        if block == 4 {
            while t + 4 <= n {
                let r = self.dot_n::<4>(row, [tok(t), tok(t + 1), tok(t + 2), tok(t + 3)]);
                out[t..t + 4].copy_from_slice(&r);
                t += 4;
            }
        }
        if block >= 2 {
            while t + 2 <= n {
                let r = self.dot_n::<2>(row, [tok(t), tok(t + 1)]);
                out[t..t + 2].copy_from_slice(&r);
                t += 2;
            }
        }
        while t < n {
            out[t] = self.dot_n::<1>(row, [tok(t)])[0];
            t += 1;
        }
    }

    /// `row · x̂` where `x̂` is the int8-quantized activation `a` (see
    /// [`q8`] for the exact arithmetic). Opt-in: not token-exact against the
    /// f32 reference.
    pub fn dot_q8(&self, row: &RowRef<'_>, a: &QActs) -> f32 {
        row.check(a.cols());
        assert_eq!(row.cols(), a.cols(), "dot_q8: row and activation lengths");
        #[cfg(target_arch = "x86_64")]
        {
            if self.vnni {
                // SAFETY: `vnni` is only set by `Kernels::avx512` after
                // detecting AVX-512F/BW and AVX512-VNNI; `check` validated
                // the buffers.
                return unsafe { x86::vnni::dot(row, a) };
            }
            if matches!(self.isa, Isa::Avx2 | Isa::Avx512) {
                // SAFETY: both sets are only built after detecting AVX2 and
                // FMA (`has_avx512` includes `has_avx2`); `check` validated
                // the buffers.
                return unsafe { x86::avx2_q8::dot(row, a) };
            }
        }
        q8::dot_ref(row, a)
    }

    /// `out[t * ldo + i] = row_i · acts[t]` for the `rows` consecutive rows
    /// of one packed matrix held in `bytes` / `scales` (row `i`'s bytes and
    /// scales follow row `i - 1`'s) and every token: the integer GEMM behind
    /// both matvec (one token) and batched prefill. The rows are analysed
    /// once and, on AVX512-VNNI, computed in tiles of rows × tokens that
    /// load each weight chunk once for several tokens. Every value depends
    /// only on its row and its token, never on `rows`, the other tokens or
    /// the tiling, so a token's results are the same alone or in a batch.
    #[allow(clippy::too_many_arguments)]
    pub fn dot_q8_rows(
        &self,
        format: QFormat,
        cols: usize,
        bytes: &[u8],
        scales: &[f32],
        rows: usize,
        acts: &[&QActs],
        out: &mut [f32],
        ldo: usize,
    ) {
        let (rb, spr) = (format.row_bytes(cols), format.scales_per_row(cols));
        let n = acts.len();
        assert!(
            format != QFormat::F32 && bytes.len() >= rows * rb && scales.len() >= rows * spr,
            "dot_q8_rows: {rows} {format} rows of {cols} columns with {} bytes and {} scales",
            bytes.len(),
            scales.len()
        );
        assert!(
            rows <= ldo && out.len() >= n * ldo,
            "dot_q8_rows: {n} tokens of {rows} rows (stride {ldo}) into {} values",
            out.len()
        );
        assert!(
            acts.iter().all(|a| a.cols() == cols),
            "dot_q8_rows: row and activation lengths"
        );
        #[cfg(target_arch = "x86_64")]
        if self.has_int_dot()
            && let Some(first) = acts.first()
            && let Some(q) = x86::q8_row::Q8Rows::new(format, cols, bytes, scales, rows, first)
            && acts.iter().all(|a| q.accepts(a))
        {
            if self.vnni {
                // SAFETY: `vnni` is only set after detecting AVX-512F/BW and
                // AVX512-VNNI; `q` was built and bounds-checked by
                // `Q8Rows::new` for `rows` rows, every token passes
                // `accepts`, and `out` was checked above.
                unsafe { x86::vnni::dot_rows(&q, acts, out, ldo) };
            } else {
                // SAFETY: `has_int_dot` holds only for sets built after
                // detecting AVX2 and FMA; the rest as above.
                unsafe { x86::avx2_q8::dot_rows(&q, acts, out, ldo) };
            }
            return;
        }
        for (t, a) in acts.iter().enumerate() {
            for i in 0..rows {
                let row = RowRef::Packed {
                    format,
                    cols,
                    bytes: &bytes[i * rb..(i + 1) * rb],
                    scales: &scales[i * spr..(i + 1) * spr],
                };
                out[t * ldo + i] = self.dot_q8(&row, a);
            }
        }
    }

    /// Wrapping sum of the little-endian u64 words of `bytes` (a trailing
    /// partial word is ignored). It is the memory-read roofline benches
    /// compare the matvec kernels with: the same wide loads and prefetching,
    /// no arithmetic to speak of.
    pub fn read_sum(&self, bytes: &[u8]) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.isa == Isa::Avx512 {
            // SAFETY: `Isa::Avx512` is only built after detecting AVX-512F.
            return unsafe { x86::avx512::read_sum(bytes) };
        }
        bytes.chunks_exact(8).fold(0u64, |a, w| {
            a.wrapping_add(u64::from_le_bytes([
                w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
            ]))
        })
    }

    /// `Σ a_i b_i` over the common length, bit-identical to
    /// [`crate::model::ops::dot`] (the scalar set calls it): 16 lane sums
    /// (lane `i % 16`) of separately rounded products, the tree
    /// `acc[i] += acc[i + 8]`, `+ 4`, `+ 2`, `+ 1`, then the scalar sum of the
    /// leftover `len % 16` products added last. No FMA anywhere: a fused
    /// multiply-add rounds once where the reference rounds twice, and
    /// attention scores feed the token-exact oracle tests. What the SIMD sets
    /// gain is width (2 × 8 lanes on AVX2, 16 on AVX-512, 4 × 4 on NEON, where
    /// the crate built for baseline x86_64 gets 4-lane SSE2) with the same
    /// per-lane order.
    #[inline]
    pub fn dot_f32(&self, a: &[f32], b: &[f32]) -> f32 {
        match self.isa {
            Isa::Scalar => crate::model::ops::dot(a, b),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only built after detecting AVX2.
            Isa::Avx2 => unsafe { x86::vec::dot_avx2(a, b) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only built after detecting AVX-512F.
            Isa::Avx512 => unsafe { x86::vec::dot_avx512(a, b) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `Isa::Neon` is only built after detecting NEON.
            Isa::Neon => unsafe { neon_vec::dot(a, b) },
        }
    }

    /// Four [`Self::dot_f32`]s of `a` against `b[j]`, bit for bit, with `a`
    /// read once and the four sums' add chains interleaved (attention's
    /// scores, four keys at a time). Each `b[j]` must hold `a.len()` values.
    #[inline]
    pub fn dot_f32_x4(&self, a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        assert!(
            b.iter().all(|v| v.len() >= a.len()),
            "dot_f32_x4: a key shorter than the query"
        );
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only built after detecting AVX2; the
            // lengths are checked above.
            Isa::Avx2 => unsafe { x86::vec::dot4_avx2(a, b) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only built after detecting AVX-512F
            // and AVX2; the lengths are checked above.
            Isa::Avx512 => unsafe { x86::vec::dot4_avx512(a, b) },
            _ => b.map(|v| self.dot_f32(a, v)),
        }
    }

    /// Four [`Self::axpy`]s into `out` in order (`w[0]` with `x[0]` first),
    /// bit for bit, with `out` read and written once (attention's weighted
    /// sum, four values at a time). Each `x[j]` must hold `out.len()` values.
    #[inline]
    pub fn axpy_x4(&self, out: &mut [f32], w: [f32; 4], x: [&[f32]; 4]) {
        assert!(
            x.iter().all(|v| v.len() >= out.len()),
            "axpy_x4: a value row shorter than the output"
        );
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only built after detecting AVX2; the
            // lengths are checked above.
            Isa::Avx2 => unsafe { x86::vec::axpy4_avx2(out, w, x) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only built after detecting AVX-512F
            // and AVX2; the lengths are checked above.
            Isa::Avx512 => unsafe { x86::vec::axpy4_avx512(out, w, x) },
            _ => {
                for j in 0..4 {
                    self.axpy(out, w[j], x[j]);
                }
            }
        }
    }

    /// Attention scores of a block of query rows against one tile of keys:
    /// `out[r * ld + j] = dot_f32(q[r], key j) * scale` for `j < nk`, where key `j` is
    /// the `hd = q[r].len()` values at `keys[j * stride..]`, bit for bit
    /// (every score is [`Self::dot_f32`]'s, times `scale`). One call per
    /// tile rather than per four keys; AVX-512 computes 4 × 4 scores per
    /// pass over the head (each query and key chunk loaded once for four
    /// products) and reduces the sixteen lane sets together, in
    /// [`crate::model::ops::dot`]'s tree.
    #[allow(clippy::too_many_arguments)]
    pub fn dot_f32_grid(
        &self,
        q: &[&[f32]],
        keys: &[f32],
        stride: usize,
        nk: usize,
        scale: f32,
        out: &mut [f32],
        ld: usize,
    ) {
        let hd = q.first().map_or(0, |r| r.len());
        assert!(
            q.iter().all(|r| r.len() == hd)
                && ld >= nk
                && (nk == 0 || (stride >= hd && keys.len() >= (nk - 1) * stride + hd))
                && (q.is_empty() || out.len() >= (q.len() - 1) * ld + nk),
            "dot_f32_grid: {} rows of {hd}, {nk} keys at stride {stride} in {} values, {} outputs {ld} apart",
            q.len(),
            keys.len(),
            out.len()
        );
        if nk == 0 || q.is_empty() {
            return;
        }
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only built after detecting AVX2; the
            // lengths are checked above.
            Isa::Avx2 => unsafe { x86::attn_tile::dot_grid_avx2(q, keys, stride, nk, scale, out, ld) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only built after detecting AVX-512F
            // and AVX2; the lengths are checked above.
            Isa::Avx512 => unsafe { x86::attn_tile::dot_grid_avx512(q, keys, stride, nk, scale, out, ld) },
            _ => {
                for (r, qr) in q.iter().enumerate() {
                    let mut j = 0;
                    while j + 4 <= nk {
                        let k4 = [0, 1, 2, 3].map(|i| &keys[(j + i) * stride..(j + i) * stride + hd]);
                        for (i, d) in self.dot_f32_x4(qr, k4).into_iter().enumerate() {
                            out[r * ld + j + i] = d * scale;
                        }
                        j += 4;
                    }
                    for j in j..nk {
                        out[r * ld + j] = self.dot_f32(qr, &keys[j * stride..j * stride + hd]) * scale;
                    }
                }
            }
        }
    }

    /// Attention's weighted sums over one tile of values for a block of
    /// rows: row `r` of `out` (`hd` wide) gets `w[r * ld + j] · value j`
    /// added for `j` in `spans[r].0..spans[r].1`, in the order of `j`, bit
    /// for bit as [`Self::axpy`] one key after another (value `j` is the
    /// `hd` values at `vals[j * stride..]`). AVX-512 runs four rows with the
    /// same span together, each value chunk loaded once for the four.
    #[allow(clippy::too_many_arguments)]
    pub fn axpy_grid(
        &self,
        out: &mut [f32],
        hd: usize,
        w: &[f32],
        ld: usize,
        nk: usize,
        spans: &[(usize, usize)],
        vals: &[f32],
        stride: usize,
    ) {
        let nr = spans.len();
        assert!(
            out.len() == nr * hd
                && ld >= nk
                && (nr == 0 || w.len() >= (nr - 1) * ld + nk)
                && spans.iter().all(|&(a, b)| a <= b && b <= nk)
                && (nk == 0 || (stride >= hd && vals.len() >= (nk - 1) * stride + hd)),
            "axpy_grid: {} outputs for {nr} rows of {hd}, {} weights for {nk} keys, {} values at stride {stride}",
            out.len(),
            w.len(),
            vals.len()
        );
        if nk == 0 || hd == 0 {
            return;
        }
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only built after detecting AVX2; the
            // lengths are checked above.
            Isa::Avx2 => unsafe { x86::attn_tile::axpy_grid_avx2(out, hd, w, ld, nk, spans, vals, stride) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only built after detecting AVX-512F
            // and AVX2; the lengths are checked above.
            Isa::Avx512 => unsafe {
                x86::attn_tile::axpy_grid_avx512(out, hd, w, ld, nk, spans, vals, stride)
            },
            _ => {
                for (r, (o, &(a, b))) in out.chunks_exact_mut(hd).zip(spans).enumerate() {
                    let mut j = a;
                    while j + 4 <= b {
                        let v4 = [0, 1, 2, 3].map(|i| &vals[(j + i) * stride..(j + i) * stride + hd]);
                        let w4 = [0, 1, 2, 3].map(|i| w[r * ld + j + i]);
                        self.axpy_x4(o, w4, v4);
                        j += 4;
                    }
                    for j in j..b {
                        self.axpy(o, w[r * ld + j], &vals[j * stride..j * stride + hd]);
                    }
                }
            }
        }
    }

    /// `out_i += w * x_i` over the common length: per element one rounded
    /// multiply then one rounded add, as the scalar loop (never fused), so
    /// every set gives the same bits. Attention's weighted sum of values.
    #[inline]
    pub fn axpy(&self, out: &mut [f32], w: f32, x: &[f32]) {
        match self.isa {
            Isa::Scalar => scalar::axpy(out, w, x),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only built after detecting AVX2.
            Isa::Avx2 => unsafe { x86::vec::axpy_avx2(out, w, x) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only built after detecting AVX-512F
            // and AVX2 (`has_avx512` includes `has_avx2`).
            Isa::Avx512 => unsafe { x86::vec::axpy_avx512(out, w, x) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `Isa::Neon` is only built after detecting NEON.
            Isa::Neon => unsafe { neon_vec::axpy(out, w, x) },
        }
    }

    /// `out[i] += Σ_m a[i][m] · b[m]`: `out` is `r × d`, `a` `r × kk`, `b`
    /// `kk × d`, row-major ([`scalar::gemm_acc`], the definition every set
    /// equals bit for bit: per element the terms in the order of `m`, no
    /// FMA). The linear-attention layers' block products.
    #[inline]
    pub fn gemm_acc(&self, out: &mut [f32], a: &[f32], b: &[f32], kk: usize, d: usize) {
        let r = out.len() / d.max(1);
        assert!(
            out.len() == r * d && a.len() >= r * kk && b.len() >= kk * d,
            "gemm_acc: operands of {} / {} / {} values for {r}x{kk} by {kk}x{d}",
            out.len(),
            a.len(),
            b.len()
        );
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only built after detecting AVX2; the
            // lengths are checked above.
            Isa::Avx2 => unsafe { x86::vec::gemm_acc_avx2(out, a, b, kk, d) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only built after detecting AVX-512F;
            // the lengths are checked above.
            Isa::Avx512 => unsafe { x86::vec::gemm_acc_avx512(out, a, b, kk, d) },
            _ => scalar::gemm_acc(out, a, b, kk, d),
        }
    }

    /// `out_i = src_i` as f32 over the common length (the f16 KV cache's
    /// read). Every half is exactly an f32, so this equals `half`'s
    /// `f16::to_f32` bit for bit, NaNs included (both quiet a signalling
    /// NaN and keep its payload). F16C on x86 (AVX-512's 16-wide form with
    /// AVX-512F); scalar elsewhere, NEON included.
    #[inline]
    pub fn f16_to_f32(&self, src: &[half::f16], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.f16c {
            if self.isa == Isa::Avx512 {
                // SAFETY: `Isa::Avx512` is only built after detecting
                // AVX-512F and AVX2, and `f16c` only set after detecting F16C.
                return unsafe { x86::vec::f16_to_f32_avx512(src, out) };
            }
            if self.isa == Isa::Avx2 {
                // SAFETY: `Isa::Avx2` is only built after detecting AVX2,
                // and `f16c` only set after detecting F16C.
                return unsafe { x86::vec::f16_to_f32_f16c(src, out) };
            }
        }
        scalar::f16_to_f32(src, out)
    }

    /// `out_i = q_i as f32 * d` over the common length (one `q8` KV cache
    /// block's read): an exact widening then one rounded multiply, the same
    /// bits on every set.
    #[inline]
    pub fn dequant_i8(&self, q: &[i8], d: f32, out: &mut [f32]) {
        match self.isa {
            Isa::Scalar => scalar::dequant_i8(q, d, out),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: both sets are only built after detecting AVX2.
            Isa::Avx2 | Isa::Avx512 => unsafe { x86::vec::dequant_i8_avx2(q, d, out) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `Isa::Neon` is only built after detecting NEON.
            Isa::Neon => unsafe { neon_vec::dequant_i8(q, d, out) },
        }
    }

    /// `T` dot products of one row; lengths already checked.
    #[inline]
    fn dot_n<const T: usize>(&self, row: &RowRef<'_>, xs: [&Acts<'_>; T]) -> [f32; T] {
        match self.isa {
            Isa::Scalar => xs.map(|a| scalar::dot(row, a.x)),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only built by `Kernels::avx2` after
            // detecting AVX2 and FMA; lengths were checked by the caller.
            Isa::Avx2 => unsafe { x86::avx2::dot_n(row, xs) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for AVX-512F/BW and FMA.
            Isa::Avx512 => unsafe { x86::avx512::dot_n(row, xs) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `Isa::Neon` is only built after detecting NEON.
            Isa::Neon => unsafe { neon::dot_n(row, xs.map(|a| a.x)) },
        }
    }
}

/// The kernels every matrix product uses: the best set this CPU supports,
/// or the one `COLI_KERNELS` names (`scalar`, `avx2`, `avx512`,
/// `avx512+vnni`, `neon`) when this CPU has it, so an AVX-512 machine can
/// measure the AVX2 path. Chosen once; the value is immutable afterwards.
pub fn dispatch() -> Kernels {
    static BEST: OnceLock<Kernels> = OnceLock::new();
    *BEST.get_or_init(|| {
        let Ok(name) = std::env::var("COLI_KERNELS") else {
            return Kernels::detect();
        };
        match Kernels::available().into_iter().find(|k| k.name == name) {
            Some(k) => k,
            None => {
                let have: Vec<&str> = Kernels::available().iter().map(|k| k.name).collect();
                tracing::warn!(
                    name,
                    ?have,
                    "COLI_KERNELS names no kernel set of this CPU; using the best"
                );
                Kernels::detect()
            }
        }
    })
}
