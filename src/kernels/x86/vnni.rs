//! AVX512-VNNI integer dot products against int8-quantized activations.
//!
//! A row is read in chunks of 64 weight bytes (64 int8, 128 int4 or 256 int2
//! columns) against activations laid out for that packing by
//! [`QActs::quantize_for`]. Each field of the chunk's bytes is brought to an
//! unsigned byte `u = w + offset` (int8: xor 0x80; int4, int2: the raw
//! field) and `vpdpbusd` multiplies it with the matching activation plane,
//! starting every 32-bit lane from the prepared `-offset × Σ q` of its
//! columns: a lane then holds the exact integer `Σ w q` of its `4 × pack`
//! columns, which all lie in one activation block. The lanes are converted
//! to f32 and multiplied-added with their block's scale (times the weight
//! scale of their group, for grouped rows) into two alternating
//! accumulators; a row scale is applied once after the reduction.
//!
//! Per chunk that is two to seven integer instructions, one conversion and
//! one multiply-add: far less work per weight byte than the f32 kernels, so
//! the pass runs at the memory's pace with room to spare.

use core::arch::x86_64::*;
use core::ptr;

use super::q8_row::{Q8Row, Q8Rows, Scaling, q8_row, store_tile};
use crate::kernels::RowRef;
use crate::kernels::q8::{Lanes, QActs, dot_ref};

/// How far ahead of the current chunk the weights are prefetched into L1
/// and into L2, in bytes (as the f32-activation kernels do; see there).
const PREFETCH: usize = 4096;
const PREFETCH_L2: usize = 3 * PREFETCH;

/// `Σ w q` of the chunk's 16 lanes, starting from `corr`.
///
/// # Safety
/// `planes` holds the chunk's `PACK` planes of 64 values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn chunk_lanes<const PACK: usize>(v: __m512i, planes: *const i8, corr: __m512i) -> __m512i {
    // SAFETY: the caller guarantees the planes are readable.
    unsafe {
        let plane = |k: usize| _mm512_loadu_si512(planes.add(64 * k).cast());
        match PACK {
            1 => _mm512_dpbusd_epi32(corr, _mm512_xor_si512(v, _mm512_set1_epi8(i8::MIN)), plane(0)),
            2 => {
                let m = _mm512_set1_epi8(0x0F);
                let lo = _mm512_and_si512(v, m);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
                _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo, plane(0)), hi, plane(1))
            }
            _ => {
                let m = _mm512_set1_epi8(0x03);
                let f0 = _mm512_and_si512(v, m);
                let f1 = _mm512_and_si512(_mm512_srli_epi16::<2>(v), m);
                let f2 = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
                let f3 = _mm512_and_si512(_mm512_srli_epi16::<6>(v), m);
                let a = _mm512_dpbusd_epi32(corr, f0, plane(0));
                let a = _mm512_dpbusd_epi32(a, f1, plane(1));
                let a = _mm512_dpbusd_epi32(a, f2, plane(2));
                _mm512_dpbusd_epi32(a, f3, plane(3))
            }
        }
    }
}

/// Walks a grouped row's scales chunk by chunk, so the loop does no
/// division: `Halves` counts 64-column halves into their groups, `Narrow`
/// steps `per` scales a chunk.
struct ScaleWalk<'a> {
    scales: &'a [f32],
    scaling: Scaling,
    rel: __m512i,
    /// Halves: halves per group, group of the next half, halves left in it.
    halves: usize,
    group: usize,
    left: usize,
    /// Narrow: first scale of the next chunk.
    first: usize,
}

impl<'a> ScaleWalk<'a> {
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn new(scales: &'a [f32], scaling: Scaling) -> Self {
        let (halves, shift) = match scaling {
            Scaling::Halves { group } => (group / 64, 0),
            Scaling::Narrow { shift, .. } => (0, shift),
            Scaling::Row(_) => (0, 0),
        };
        let rel = _mm512_srlv_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(shift as i32),
        );
        Self {
            scales,
            scaling,
            rel,
            halves,
            group: 0,
            left: halves,
            first: 0,
        }
    }

    /// Scale of the next 64-column half.
    #[inline]
    fn next_half(&mut self) -> f32 {
        if self.left == 0 {
            self.group += 1;
            self.left = self.halves;
        }
        self.left -= 1;
        // Past the row's last group only padding remains (zero lanes).
        self.scales[self.group.min(self.scales.len() - 1)]
    }

    /// The next chunk's lane factors: its activation block scales `dv`
    /// times the weight scales of the lanes' groups.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn next(&mut self, dv: __m512) -> __m512 {
        match self.scaling {
            Scaling::Row(_) => dv,
            Scaling::Halves { .. } => {
                let (lo, hi) = (self.next_half(), self.next_half());
                // Two broadcasts joined as 256-bit halves (AVX-512F only;
                // the f32x8 insert would need AVX-512DQ).
                let sv = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                    _mm512_castps_pd(_mm512_set1_ps(lo)),
                    _mm256_castps_pd(_mm256_set1_ps(hi)),
                ));
                _mm512_mul_ps(dv, sv)
            }
            Scaling::Narrow { per, .. } => {
                let first = self.first;
                self.first += per;
                let p = self.scales.as_ptr().wrapping_add(first);
                let raw = if first + 16 <= self.scales.len() {
                    // SAFETY: 16 scales from `first` lie inside the row's.
                    unsafe { _mm512_loadu_ps(p) }
                } else {
                    let n = per.min(self.scales.len().saturating_sub(first));
                    let m = ((1u32 << n) - 1) as __mmask16;
                    // SAFETY: masked to the `n` scales left in the row;
                    // masked-off lanes are not read.
                    unsafe { _mm512_maskz_loadu_ps(m, p) }
                };
                _mm512_mul_ps(dv, _mm512_permutexvar_ps(self.rel, raw))
            }
        }
    }
}

/// `row · x̂` over `nbytes` weight bytes at `p` packed `PACK` columns to a
/// byte. `ROW`: `scaling` is [`Scaling::Row`] (the loop then has no scale
/// work at all).
///
/// # Safety
/// `p` holds `nbytes` readable bytes, `l` was built for `PACK` from
/// activations of the row's length, and the scales `scaling` reads exist.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn row_dot<const PACK: usize, const ROW: bool>(
    p: *const u8,
    nbytes: usize,
    scales: &[f32],
    scaling: Scaling,
    l: &Lanes,
) -> f32 {
    let chunks = l.chunks();
    let full = (nbytes / 64).min(chunks);
    let (planes, corr, dvec) = (
        l.planes.as_slice().as_ptr(),
        l.corr.as_slice().as_ptr(),
        l.dvec.as_slice().as_ptr(),
    );
    let mut walk = ScaleWalk::new(scales, scaling);
    // `f(c) · lanes(c)` for a chunk whose bytes are `v`.
    let mut term = |c: usize, v: __m512i| {
        // SAFETY: `l` holds `chunks` chunks of planes, corrections and
        // block scales, and `c < chunks`.
        unsafe {
            let lanes = chunk_lanes::<PACK>(
                v,
                planes.add(64 * PACK * c),
                _mm512_loadu_si512(corr.add(16 * c).cast()),
            );
            let dv = _mm512_loadu_ps(dvec.add(16 * c));
            let f = if ROW { dv } else { walk.next(dv) };
            (_mm512_cvtepi32_ps(lanes), f)
        }
    };
    let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut c = 0;
    // SAFETY (loads below): chunks below `full` lie inside the row; the
    // last, partial one is copied into a zeroed local buffer (its padding
    // meets zero activations). Prefetches are hints that never fault.
    unsafe {
        while c + 2 <= full {
            for o in [0, 64] {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * c + o + PREFETCH).cast());
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * c + o + PREFETCH_L2).cast());
            }
            let (x0, f0) = term(c, _mm512_loadu_si512(p.add(64 * c).cast()));
            let (x1, f1) = term(c + 1, _mm512_loadu_si512(p.add(64 * c + 64).cast()));
            a0 = _mm512_fmadd_ps(x0, f0, a0);
            a1 = _mm512_fmadd_ps(x1, f1, a1);
            c += 2;
        }
        while c < chunks {
            let v = if c < full {
                _mm512_loadu_si512(p.add(64 * c).cast())
            } else {
                let mut buf = [0u8; 64];
                let off = 64 * c;
                ptr::copy_nonoverlapping(p.add(off), buf.as_mut_ptr(), nbytes - off);
                _mm512_loadu_si512(buf.as_ptr().cast())
            };
            let (x, f) = term(c, v);
            if c % 2 == 0 {
                a0 = _mm512_fmadd_ps(x, f, a0);
            } else {
                a1 = _mm512_fmadd_ps(x, f, a1);
            }
            c += 1;
        }
    }
    let s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    match scaling {
        Scaling::Row(scale) => s * scale,
        _ => s,
    }
}

/// One analysed row through the kernel its packing and scaling select.
///
/// # Safety
/// The CPU supports AVX-512F/BW and AVX512-VNNI; `r` came from `q8_row`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn run(r: &Q8Row<'_>) -> f32 {
    let (p, nb, scales, scaling, l) = (r.bytes.as_ptr(), r.nbytes, r.scales, r.scaling, r.lanes);
    // SAFETY: `r` came from `q8_row`: `l` was built for this packing from
    // `cols` activations and `scaling` only names scales the row has.
    unsafe {
        match (r.pack, matches!(scaling, Scaling::Row(_))) {
            (1, _) => row_dot::<1, true>(p, nb, scales, scaling, l),
            (2, true) => row_dot::<2, true>(p, nb, scales, scaling, l),
            (2, false) => row_dot::<2, false>(p, nb, scales, scaling, l),
            _ => row_dot::<4, true>(p, nb, scales, scaling, l),
        }
    }
}

/// The unsigned fields of one 64-byte chunk of weights (`PACK` of them),
/// ready for `vpdpbusd` against the activation planes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn fields<const PACK: usize>(v: __m512i) -> [__m512i; PACK] {
    match PACK {
        1 => [_mm512_xor_si512(v, _mm512_set1_epi8(i8::MIN)); PACK],
        2 => {
            let m = _mm512_set1_epi8(0x0F);
            let mut f = [_mm512_and_si512(v, m); PACK];
            f[1] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
            f
        }
        _ => {
            let m = _mm512_set1_epi8(0x03);
            let mut f = [_mm512_and_si512(v, m); PACK];
            f[1] = _mm512_and_si512(_mm512_srli_epi16::<2>(v), m);
            f[2] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
            f[3] = _mm512_and_si512(_mm512_srli_epi16::<6>(v), m);
            f
        }
    }
}

/// One chunk's 64 weight bytes of row `p` (a zero-padded copy for the
/// row's partial last chunk).
///
/// # Safety
/// `p` holds `nbytes` readable bytes and `64 * c < nbytes`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn chunk_at(p: *const u8, c: usize, full: usize, nbytes: usize) -> __m512i {
    // SAFETY: the caller guarantees the bytes; chunks below `full` are
    // whole, the last one is copied into a zeroed local buffer (its padding
    // meets zero activations).
    unsafe {
        if c < full {
            _mm512_loadu_si512(p.add(64 * c).cast())
        } else {
            let mut buf = [0u8; 64];
            let off = 64 * c;
            ptr::copy_nonoverlapping(p.add(off), buf.as_mut_ptr(), nbytes - off);
            _mm512_loadu_si512(buf.as_ptr().cast())
        }
    }
}

/// `R` rows against `T` tokens, rows scaled per row ([`Scaling::Row`]):
/// every weight chunk is loaded and split into fields once for all tokens,
/// every activation chunk once for all rows. Each (row, token) pair keeps
/// one accumulator fed in chunk order, so its value does not depend on
/// `R`, `T` or where the pair sits in a tile (one FMA chain per pair is
/// fast enough: 64 weight bytes per FMA latency is far above what memory
/// delivers).
///
/// # Safety
/// Each `rows[r]` holds `nbytes` readable bytes; every `acts[t]` was built
/// for `PACK` from activations of the rows' length.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const PACK: usize, const R: usize, const T: usize>(
    rows: [*const u8; R],
    next: *const u8,
    nbytes: usize,
    acts: [&Lanes; T],
) -> [[f32; T]; R] {
    let chunks = acts[0].chunks();
    let full = (nbytes / 64).min(chunks);
    let planes = acts.map(|l| l.planes.as_slice().as_ptr());
    let corr = acts.map(|l| l.corr.as_slice().as_ptr());
    let dvec = acts.map(|l| l.dvec.as_slice().as_ptr());
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for c in 0..chunks {
        // SAFETY: `c < chunks` chunks of weights (the last one possibly
        // partial, see `chunk_at`) and of every token's planes,
        // corrections and block scales. Prefetches never fault.
        unsafe {
            if R == 1 {
                // One row (decode): one linear stream, prefetched 4 KiB
                // ahead into L1 and 12 KiB ahead into L2.
                let p = rows[0].wrapping_add(64 * c);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH).cast());
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH_L2).cast());
            } else {
                // The rows after this tile, at the same offset, one chunk
                // per row of the tile: into L1 a tile ahead, into L2 three
                // tiles ahead (DRAM latency is longer than one tile's
                // compute; the hardware prefetchers do not follow R
                // interleaved streams).
                for r in 0..R {
                    _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(r * nbytes + 64 * c).cast());
                    _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add((2 * R + r) * nbytes + 64 * c).cast());
                }
            }
            let w: [[__m512i; PACK]; R] = rows.map(|p| fields::<PACK>(chunk_at(p, c, full, nbytes)));
            for t in 0..T {
                let corr_t = _mm512_loadu_si512(corr[t].add(16 * c).cast());
                let dv = _mm512_loadu_ps(dvec[t].add(16 * c));
                let pl = planes[t].add(64 * PACK * c);
                for r in 0..R {
                    let mut lanes = corr_t;
                    for (k, f) in w[r].iter().enumerate() {
                        lanes = _mm512_dpbusd_epi32(lanes, *f, _mm512_loadu_si512(pl.add(64 * k).cast()));
                    }
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), dv, acc[r][t]);
                }
            }
        }
    }
    acc.map(|a| a.map(|v| _mm512_reduce_add_ps(v)))
}

/// Rows `first..first + R` of `rows` against tokens `t0..t0 + T`, into
/// `out[t * ldo + i]` (`i` counted from the first row of `rows`).
///
/// # Safety
/// As [`tile`]; `rows` covers the rows and `out` the indices written.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_into<const PACK: usize, const R: usize, const T: usize>(
    rows: &Q8Rows<'_>,
    first: usize,
    acts: &[&QActs],
    t0: usize,
    out: &mut [f32],
    ldo: usize,
) {
    let (p, lanes, scales) = rows.tile_inputs::<R, T>(first, acts, t0);
    let next = p[0].wrapping_add(R * rows.row_bytes());
    // SAFETY: this function's contract.
    let v = unsafe { tile::<PACK, R, T>(p, next, rows.row_bytes(), lanes) };
    store_tile(v, scales, out, ldo, first, t0);
}

/// Every row against every token in tiles of up to 4 rows × 3 tokens.
///
/// # Safety
/// As [`dot_rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tiles<const PACK: usize>(rows: &Q8Rows<'_>, acts: &[&QActs], out: &mut [f32], ldo: usize) {
    let (n, m) = (acts.len(), rows.len());
    let mut r = 0;
    // SAFETY (every call): `rows` holds `m` rows and every token was laid
    // out for this packing (`Q8Rows::accepts`); `out` is checked by the
    // caller for `n * ldo` values with `m <= ldo`.
    unsafe {
        macro_rules! by_tokens {
            ($R:literal) => {{
                let mut t = 0;
                while t + 3 <= n {
                    tile_into::<PACK, $R, 3>(rows, r, acts, t, out, ldo);
                    t += 3;
                }
                match n - t {
                    2 => tile_into::<PACK, $R, 2>(rows, r, acts, t, out, ldo),
                    1 => tile_into::<PACK, $R, 1>(rows, r, acts, t, out, ldo),
                    _ => {}
                }
            }};
        }
        while r + 4 <= m {
            by_tokens!(4);
            r += 4;
        }
        match m - r {
            3 => by_tokens!(3),
            2 => by_tokens!(2),
            1 => by_tokens!(1),
            _ => {}
        }
    }
}

/// `out[t * ldo + i] = row_i · x̂_t` for consecutive rows analysed once and
/// every token of `acts`: the integer GEMM behind both matvec and the
/// batched prefill. Rows scaled per row go through tiles (one token: tiles
/// of one row); grouped int4 rows through the row kernel.
///
/// # Safety
/// The CPU supports AVX-512F/BW and AVX512-VNNI; `rows` came from
/// `Q8Rows::new`, every `acts[t]` passes `rows.accepts`, and
/// `out.len() >= acts.len() * ldo` with `rows.len() <= ldo`.
pub(crate) unsafe fn dot_rows(rows: &Q8Rows<'_>, acts: &[&QActs], out: &mut [f32], ldo: usize) {
    if !rows.row_scaled() {
        for (t, a) in acts.iter().enumerate() {
            for i in 0..rows.len() {
                let r = rows.row_for(i, a);
                // SAFETY: this function's contract.
                out[t * ldo + i] = unsafe { run(&r) };
            }
        }
        return;
    }
    if acts.len() == 1 {
        // One token (decode): row after row, each one linear stream; the
        // same arithmetic as a tile, so the same values as in a batch.
        for i in 0..rows.len() {
            // SAFETY: this function's contract.
            unsafe {
                match rows.pack() {
                    1 => tile_into::<1, 1, 1>(rows, i, acts, 0, out, ldo),
                    2 => tile_into::<2, 1, 1>(rows, i, acts, 0, out, ldo),
                    _ => tile_into::<4, 1, 1>(rows, i, acts, 0, out, ldo),
                }
            }
        }
        return;
    }
    // SAFETY: this function's contract.
    unsafe {
        match rows.pack() {
            1 => tiles::<1>(rows, acts, out, ldo),
            2 => tiles::<2>(rows, acts, out, ldo),
            _ => tiles::<4>(rows, acts, out, ldo),
        }
    }
}

/// `row · x̂` for quantized activations.
///
/// # Safety
/// The CPU supports AVX-512F/BW and AVX512-VNNI; the row's buffers hold what
/// `RowRef::check` requires and `row.cols() == a.cols()`.
pub(crate) unsafe fn dot(row: &RowRef<'_>, a: &QActs) -> f32 {
    let Some(r) = q8_row(row, a) else {
        return dot_ref(row, a);
    };
    // SAFETY: this function's contract; `r` came from `q8_row`.
    unsafe { run(&r) }
}
