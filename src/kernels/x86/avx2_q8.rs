//! AVX2 integer dot products against int8-quantized activations, for CPUs
//! without AVX512-VNNI: the same activation layout and lane sums as the VNNI
//! kernel ([`super::vnni`]), each 64-byte chunk taken as two 32-byte halves
//! of 8 lanes.
//!
//! `vpmaddubsw` multiplies unsigned by signed bytes and adds pairs with
//! 16-bit saturation, then `vpmaddwd` by ones widens to 32-bit lanes of four
//! columns. Int4 and int2 fields (at most 15) go in raw, starting the lanes
//! from the prepared `-offset × Σ q` as VNNI does; their 16-bit pair sums stay
//! far from saturation (at most 4 × 2 × 15 × 127 after adding the fields of
//! one byte). Int8 weights would saturate as `w + 128`, so they take the sign
//! trick instead: `|w|` times `q` with `w`'s sign, pairs at most
//! 2 × 128 × 127 < 2^15, and no offset to correct.

use core::arch::x86_64::*;
use core::ptr;

use super::q8_row::{Q8Row, Q8Rows, Scaling, q8_row, store_tile};
use crate::kernels::RowRef;
use crate::kernels::q8::{Lanes, QActs, dot_ref};

/// How far ahead the weights are prefetched into L1 and into L2, in bytes.
const PREFETCH: usize = 4096;
const PREFETCH_L2: usize = 3 * PREFETCH;

/// `Σ w q` of one half-chunk's 8 lanes.
///
/// # Safety
/// `planes` holds the chunk's `PACK` planes of 64 values, `corr` the
/// half's 8 lane corrections; `h` is 0 or 1.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn half_lanes<const PACK: usize>(
    v: __m256i,
    planes: *const i8,
    h: usize,
    corr: *const i32,
) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    // SAFETY: the caller guarantees the planes and corrections are readable.
    unsafe {
        let plane = |k: usize| _mm256_loadu_si256(planes.add(64 * k + 32 * h).cast());
        match PACK {
            1 => {
                let q = plane(0);
                let p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(q, v));
                _mm256_madd_epi16(p, ones)
            }
            2 => {
                let m = _mm256_set1_epi8(0x0F);
                let lo = _mm256_and_si256(v, m);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m);
                let p = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo, plane(0)),
                    _mm256_maddubs_epi16(hi, plane(1)),
                );
                _mm256_add_epi32(_mm256_loadu_si256(corr.cast()), _mm256_madd_epi16(p, ones))
            }
            _ => {
                let m = _mm256_set1_epi8(0x03);
                let f0 = _mm256_and_si256(v, m);
                let f1 = _mm256_and_si256(_mm256_srli_epi16::<2>(v), m);
                let f2 = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m);
                let f3 = _mm256_and_si256(_mm256_srli_epi16::<6>(v), m);
                let p01 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(f0, plane(0)),
                    _mm256_maddubs_epi16(f1, plane(1)),
                );
                let p23 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(f2, plane(2)),
                    _mm256_maddubs_epi16(f3, plane(3)),
                );
                let p = _mm256_add_epi16(p01, p23);
                _mm256_add_epi32(_mm256_loadu_si256(corr.cast()), _mm256_madd_epi16(p, ones))
            }
        }
    }
}

/// The weight scales of a grouped row, walked half-chunk by half-chunk.
struct HalfScales<'a> {
    scales: &'a [f32],
    scaling: Scaling,
    /// Halves: halves per group, group of the next half, halves left in it.
    halves: usize,
    group: usize,
    left: usize,
}

impl<'a> HalfScales<'a> {
    fn new(scales: &'a [f32], scaling: Scaling) -> Self {
        let halves = match scaling {
            Scaling::Halves { group } => group / 64,
            _ => 0,
        };
        Self {
            scales,
            scaling,
            halves,
            group: 0,
            left: halves,
        }
    }

    /// The factors of half `h` of chunk `c`: its lanes' activation block
    /// scales `dv` times their weight scales.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn next(&mut self, dv: __m256, c: usize, h: usize) -> __m256 {
        match self.scaling {
            Scaling::Row(_) => dv,
            Scaling::Halves { .. } => {
                if self.left == 0 {
                    self.group += 1;
                    self.left = self.halves;
                }
                self.left -= 1;
                // Past the row's last group only padding remains (zero lanes).
                let s = self.scales[self.group.min(self.scales.len() - 1)];
                _mm256_mul_ps(dv, _mm256_set1_ps(s))
            }
            Scaling::Narrow { shift, per } => {
                // Lane `8h + i` takes scale `(8h + i) >> shift` of the chunk;
                // `8h` is a multiple of `1 << shift` (shift <= 2 here).
                let base = c * per + ((8 * h) >> shift);
                let n = (8usize >> shift).min(self.scales.len().saturating_sub(base)) as i32;
                let idx = _mm256_srlv_epi32(
                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                    _mm256_set1_epi32(shift as i32),
                );
                let m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                // SAFETY: masked to the `n` scales left in the row; masked-off
                // lanes are not read.
                let raw = unsafe { _mm256_maskload_ps(self.scales.as_ptr().wrapping_add(base), m) };
                _mm256_mul_ps(dv, _mm256_permutevar8x32_ps(raw, idx))
            }
        }
    }
}

/// `row · x̂` over the row's 64-byte chunks, packed `PACK` columns to a byte.
///
/// # Safety
/// `r` came from [`q8_row`] (its bytes, scales and lanes agree).
#[target_feature(enable = "avx2,fma")]
unsafe fn row_dot<const PACK: usize>(r: &Q8Row<'_>) -> f32 {
    let l = r.lanes;
    let chunks = l.chunks();
    let p = r.bytes.as_ptr();
    let full = (r.nbytes / 64).min(chunks);
    let (planes, corr, dvec) = (
        l.planes.as_slice().as_ptr(),
        l.corr.as_slice().as_ptr(),
        l.dvec.as_slice().as_ptr(),
    );
    let mut walk = HalfScales::new(r.scales, r.scaling);
    let mut acc = [_mm256_setzero_ps(); 2];
    // SAFETY (whole body): chunks below `full` lie inside the row; the last,
    // partial one is copied into a zeroed local buffer (its padding meets
    // zero activations). `l` holds `chunks` chunks of planes, corrections
    // and block scales. Prefetches are hints that never fault.
    unsafe {
        for c in 0..chunks {
            let mut buf = [0u8; 64];
            let src = if c < full {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * c + PREFETCH).cast());
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * c + PREFETCH_L2).cast());
                p.add(64 * c)
            } else {
                let off = 64 * c;
                ptr::copy_nonoverlapping(p.add(off), buf.as_mut_ptr(), r.nbytes - off);
                buf.as_ptr()
            };
            for (h, a) in acc.iter_mut().enumerate() {
                let v = _mm256_loadu_si256(src.add(32 * h).cast());
                let lanes = half_lanes::<PACK>(v, planes.add(64 * PACK * c), h, corr.add(16 * c + 8 * h));
                let f = walk.next(_mm256_loadu_ps(dvec.add(16 * c + 8 * h)), c, h);
                *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), f, *a);
            }
        }
    }
    let s = _mm256_add_ps(acc[0], acc[1]);
    let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
    match r.scaling {
        Scaling::Row(scale) => s * scale,
        _ => s,
    }
}

/// `R` rows against `T` tokens, rows scaled per row ([`Scaling::Row`]):
/// each weight half-chunk is loaded once for all tokens, each activation
/// half-chunk once for all rows. Every (row, token) pair runs exactly the
/// arithmetic of [`row_dot`] (two accumulators, one per half, in chunk
/// order, the same reduction), so tiles and single rows agree bit for bit.
///
/// # Safety
/// Each `rows[r]` holds `nbytes` readable bytes; every `acts[t]` was built
/// for `PACK` from activations of the rows' length.
// The indices address several arrays at once (accumulators, activation
// streams, weight halves).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const PACK: usize, const R: usize, const T: usize>(
    rows: [*const u8; R],
    nbytes: usize,
    acts: [&Lanes; T],
) -> [[f32; T]; R] {
    let chunks = acts[0].chunks();
    let full = (nbytes / 64).min(chunks);
    let planes = acts.map(|l| l.planes.as_slice().as_ptr());
    let corr = acts.map(|l| l.corr.as_slice().as_ptr());
    let dvec = acts.map(|l| l.dvec.as_slice().as_ptr());
    let mut acc = [[[_mm256_setzero_ps(); 2]; T]; R];
    // One chunk whose 64 weight bytes of row `r` start at `src[r]`.
    let mut step = |c: usize, src: [*const u8; R]| {
        for h in 0..2 {
            // SAFETY: `src[r]` holds 64 readable bytes; `c < chunks` chunks
            // of every token's planes, corrections and block scales.
            unsafe {
                let v: [__m256i; R] = src.map(|p| _mm256_loadu_si256(p.add(32 * h).cast()));
                for t in 0..T {
                    let dv = _mm256_loadu_ps(dvec[t].add(16 * c + 8 * h));
                    let pl = planes[t].add(64 * PACK * c);
                    let co = corr[t].add(16 * c + 8 * h);
                    for r in 0..R {
                        let lanes = half_lanes::<PACK>(v[r], pl, h, co);
                        acc[r][t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), dv, acc[r][t][h]);
                    }
                }
            }
        }
    };
    for c in 0..full {
        // SAFETY: chunks below `full` lie inside every row; prefetches are
        // hints that never fault.
        let src = rows.map(|p| unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * c + PREFETCH).cast());
            p.add(64 * c)
        });
        step(c, src);
    }
    if full < chunks {
        // The partial last chunk, zero-padded (its padding meets zero
        // activations).
        let off = 64 * full;
        let mut bufs = [[0u8; 64]; R];
        for (b, p) in bufs.iter_mut().zip(rows) {
            // SAFETY: the row holds `nbytes > off` bytes.
            unsafe { ptr::copy_nonoverlapping(p.add(off), b.as_mut_ptr(), nbytes - off) };
        }
        step(full, std::array::from_fn(|r| bufs[r].as_ptr()));
    }
    acc.map(|row| {
        row.map(|[a0, a1]| {
            let s = _mm256_add_ps(a0, a1);
            let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        })
    })
}

/// Rows `first..first + R` against tokens `t0..t0 + T` into
/// `out[t * ldo + i]`.
///
/// # Safety
/// As [`tile`]; `rows` covers the rows and `out` the indices written.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_into<const PACK: usize, const R: usize, const T: usize>(
    rows: &Q8Rows<'_>,
    first: usize,
    acts: &[&QActs],
    t0: usize,
    out: &mut [f32],
    ldo: usize,
) {
    let (p, lanes, scales) = rows.tile_inputs::<R, T>(first, acts, t0);
    // SAFETY: this function's contract.
    let v = unsafe { tile::<PACK, R, T>(p, rows.row_bytes(), lanes) };
    store_tile(v, scales, out, ldo, first, t0);
}

/// Every row against every token in tiles of 2 rows × 2 tokens.
///
/// # Safety
/// As [`dot_rows`].
#[target_feature(enable = "avx2,fma")]
unsafe fn tiles<const PACK: usize>(rows: &Q8Rows<'_>, acts: &[&QActs], out: &mut [f32], ldo: usize) {
    let (n, m) = (acts.len(), rows.len());
    // SAFETY (every call): `rows` holds `m` rows and every token was laid
    // out for this packing; `out` was checked by the caller.
    unsafe {
        let mut r = 0;
        while r < m {
            let two_rows = r + 2 <= m;
            let mut t = 0;
            while t < n {
                match (two_rows, t + 2 <= n) {
                    (true, true) => tile_into::<PACK, 2, 2>(rows, r, acts, t, out, ldo),
                    (true, false) => tile_into::<PACK, 2, 1>(rows, r, acts, t, out, ldo),
                    (false, true) => tile_into::<PACK, 1, 2>(rows, r, acts, t, out, ldo),
                    (false, false) => tile_into::<PACK, 1, 1>(rows, r, acts, t, out, ldo),
                }
                t += 2;
            }
            r += 2;
        }
    }
}

/// `out[t * ldo + i] = row_i · x̂_t` for consecutive rows analysed once
/// and every token of `acts`. One token (decode) goes row by row through
/// [`row_dot`] and its deeper prefetch; several tokens (prefill) through
/// tiles, with the same values.
///
/// # Safety
/// The CPU supports AVX2 and FMA; `rows` came from `Q8Rows::new`, every
/// `acts[t]` passes `rows.accepts`, and `out.len() >= acts.len() * ldo`
/// with `rows.len() <= ldo`.
pub(crate) unsafe fn dot_rows(rows: &Q8Rows<'_>, acts: &[&QActs], out: &mut [f32], ldo: usize) {
    if acts.len() >= 2 && rows.row_scaled() {
        // SAFETY: this function's contract.
        unsafe {
            match rows.pack() {
                1 => tiles::<1>(rows, acts, out, ldo),
                2 => tiles::<2>(rows, acts, out, ldo),
                _ => tiles::<4>(rows, acts, out, ldo),
            }
        }
        return;
    }
    for (t, a) in acts.iter().enumerate() {
        for i in 0..rows.len() {
            let r = rows.row_for(i, a);
            // SAFETY: this function's contract; `r` came from `Q8Rows`.
            out[t * ldo + i] = unsafe {
                match rows.pack() {
                    1 => row_dot::<1>(&r),
                    2 => row_dot::<2>(&r),
                    _ => row_dot::<4>(&r),
                }
            };
        }
    }
}

/// `row · x̂` for quantized activations.
///
/// # Safety
/// The CPU supports AVX2 and FMA; the row's buffers hold what
/// `RowRef::check` requires and `row.cols() == a.cols()`.
pub(crate) unsafe fn dot(row: &RowRef<'_>, a: &QActs) -> f32 {
    let Some(r) = q8_row(row, a) else {
        return dot_ref(row, a);
    };
    // SAFETY: this function's contract; `r` came from `q8_row`.
    unsafe {
        match r.pack {
            1 => row_dot::<1>(&r),
            2 => row_dot::<2>(&r),
            _ => row_dot::<4>(&r),
        }
    }
}
