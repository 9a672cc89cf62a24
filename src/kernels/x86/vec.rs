//! AVX2 and AVX-512F versions of the attention inner loops (see
//! [`crate::kernels::Kernels::dot_f32`] and its siblings for the contract):
//! bit-identical to the scalar definitions, so they use separate multiplies
//! and adds (never FMA, which rounds once instead of twice) and the scalar
//! reference's lane layout and reduction tree.
//!
//! The 16 accumulator lanes of [`crate::model::ops::dot`] are two 8-lane
//! vectors on AVX2 (lanes 0..8, 8..16) and one 16-lane vector on AVX-512;
//! the tree `acc[i] += acc[i + 8]`, `+ 4`, `+ 2`, `+ 1` becomes adding the
//! upper half of the vector to the lower half four times.

use core::arch::x86_64::*;

use half::f16;
use half::slice::HalfFloatSliceExt;

/// The scalar remainder of a dot product, summed exactly as
/// [`crate::model::ops::dot`] sums it.
#[inline(always)]
fn tail_dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()
}

/// Lanes 0..8 of the 16-lane tree after `acc[i] += acc[i + 8]`, reduced
/// the rest of the way: `+ 4`, `+ 2`, `+ 1`, in that order.
#[inline]
#[target_feature(enable = "avx2")]
fn reduce8(s8: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
    _mm_cvtss_f32(s1)
}

/// `Σ a_i b_i` in [`crate::model::ops::dot`]'s order.
///
/// # Safety
/// The CPU supports AVX2.
#[target_feature(enable = "avx2")]
pub(in crate::kernels) unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let body = n / 16 * 16;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 16 <= body <= n`, and both slices hold `n` values.
        unsafe {
            let x = _mm256_mul_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)));
            let y = _mm256_mul_ps(_mm256_loadu_ps(pa.add(i + 8)), _mm256_loadu_ps(pb.add(i + 8)));
            lo = _mm256_add_ps(lo, x);
            hi = _mm256_add_ps(hi, y);
        }
        i += 16;
    }
    reduce8(_mm256_add_ps(lo, hi)) + tail_dot(&a[body..n], &b[body..n])
}

/// `Σ a_i b_i` in [`crate::model::ops::dot`]'s order.
///
/// # Safety
/// The CPU supports AVX-512F.
#[target_feature(enable = "avx512f")]
pub(in crate::kernels) unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let body = n / 16 * 16;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 16 <= body <= n`, and both slices hold `n` values.
        unsafe {
            acc = _mm512_add_ps(
                acc,
                _mm512_mul_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i))),
            );
        }
        i += 16;
    }
    // Lanes 8..16 are the upper 256 bits (extracted as f64x4: AVX-512F
    // has no f32x8 extract without DQ; the bits are the same).
    let upper = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    reduce8(_mm256_add_ps(_mm512_castps512_ps256(acc), upper)) + tail_dot(&a[body..n], &b[body..n])
}

/// Four dot products of `a` with `b[j]`, each summed exactly as
/// [`dot_avx2`] sums it; `a` is loaded once for all four and the four
/// chains of adds run side by side.
///
/// # Safety
/// The CPU supports AVX2, and every `b[j]` holds at least `a.len()` values.
#[target_feature(enable = "avx2")]
pub(in crate::kernels) unsafe fn dot4_avx2(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    let n = a.len();
    let body = n / 16 * 16;
    let pa = a.as_ptr();
    let pb = b.map(<[f32]>::as_ptr);
    let mut lo = [_mm256_setzero_ps(); 4];
    let mut hi = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 16 <= body <= n`, and every slice holds `n` values.
        unsafe {
            let (xl, xh) = (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pa.add(i + 8)));
            for j in 0..4 {
                lo[j] = _mm256_add_ps(lo[j], _mm256_mul_ps(xl, _mm256_loadu_ps(pb[j].add(i))));
                hi[j] = _mm256_add_ps(hi[j], _mm256_mul_ps(xh, _mm256_loadu_ps(pb[j].add(i + 8))));
            }
        }
        i += 16;
    }
    let mut out = [0f32; 4];
    for j in 0..4 {
        out[j] = reduce8(_mm256_add_ps(lo[j], hi[j])) + tail_dot(&a[body..n], &b[j][body..n]);
    }
    out
}

/// Four dot products of `a` with `b[j]`, each summed exactly as
/// [`dot_avx512`] sums it, `a` loaded once for all four.
///
/// # Safety
/// The CPU supports AVX-512F (and so AVX2), and every `b[j]` holds at least
/// `a.len()` values.
#[target_feature(enable = "avx512f")]
pub(in crate::kernels) unsafe fn dot4_avx512(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    let n = a.len();
    let body = n / 16 * 16;
    let pa = a.as_ptr();
    let pb = b.map(<[f32]>::as_ptr);
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 16 <= body <= n`, and every slice holds `n` values.
        unsafe {
            let x = _mm512_loadu_ps(pa.add(i));
            for j in 0..4 {
                acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(x, _mm512_loadu_ps(pb[j].add(i))));
            }
        }
        i += 16;
    }
    let mut out = [0f32; 4];
    for j in 0..4 {
        let upper = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[j])));
        out[j] = reduce8(_mm256_add_ps(_mm512_castps512_ps256(acc[j]), upper))
            + tail_dot(&a[body..n], &b[j][body..n]);
    }
    out
}

/// `out_i = (((out_i + w0 x0_i) + w1 x1_i) + w2 x2_i) + w3 x3_i`, each step a
/// rounded multiply then a rounded add: four [`axpy_avx2`] calls in a row,
/// bit for bit, with `out` loaded and stored once instead of four times.
///
/// # Safety
/// The CPU supports AVX2, and every `x[j]` holds at least `out.len()` values.
#[target_feature(enable = "avx2")]
pub(in crate::kernels) unsafe fn axpy4_avx2(out: &mut [f32], w: [f32; 4], x: [&[f32]; 4]) {
    let n = out.len();
    let body = n / 8 * 8;
    let po = out.as_mut_ptr();
    let px = x.map(<[f32]>::as_ptr);
    let wv = w.map(|v| _mm256_set1_ps(v));
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n`, and every slice holds `n` values.
        unsafe {
            let mut o = _mm256_loadu_ps(po.add(i));
            for j in 0..4 {
                o = _mm256_add_ps(o, _mm256_mul_ps(wv[j], _mm256_loadu_ps(px[j].add(i))));
            }
            _mm256_storeu_ps(po.add(i), o);
        }
        i += 8;
    }
    for (k, o) in out.iter_mut().enumerate().skip(body) {
        for j in 0..4 {
            *o += w[j] * x[j][k];
        }
    }
}

/// As [`axpy4_avx2`], 16 lanes at a time.
///
/// # Safety
/// The CPU supports AVX-512F (and so AVX2), and every `x[j]` holds at least
/// `out.len()` values.
#[target_feature(enable = "avx512f")]
pub(in crate::kernels) unsafe fn axpy4_avx512(out: &mut [f32], w: [f32; 4], x: [&[f32]; 4]) {
    let n = out.len();
    let body = n / 16 * 16;
    let po = out.as_mut_ptr();
    let px = x.map(<[f32]>::as_ptr);
    let wv = w.map(|v| _mm512_set1_ps(v));
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 16 <= body <= n`, and every slice holds `n` values.
        unsafe {
            let mut o = _mm512_loadu_ps(po.add(i));
            for j in 0..4 {
                o = _mm512_add_ps(o, _mm512_mul_ps(wv[j], _mm512_loadu_ps(px[j].add(i))));
            }
            _mm512_storeu_ps(po.add(i), o);
        }
        i += 16;
    }
    let rest = x.map(|v| &v[body..n]);
    // SAFETY: AVX-512F implies AVX2; every slice holds `n - body` values.
    unsafe { axpy4_avx2(&mut out[body..n], w, rest) }
}

/// `out_i = out_i + w x_i` (multiply, then add) over the common length.
///
/// # Safety
/// The CPU supports AVX2.
#[target_feature(enable = "avx2")]
pub(in crate::kernels) unsafe fn axpy_avx2(out: &mut [f32], w: f32, x: &[f32]) {
    let n = out.len().min(x.len());
    let body = n / 8 * 8;
    let (po, px) = (out.as_mut_ptr(), x.as_ptr());
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n`, and both slices hold `n` values.
        unsafe {
            let o = _mm256_add_ps(
                _mm256_loadu_ps(po.add(i)),
                _mm256_mul_ps(wv, _mm256_loadu_ps(px.add(i))),
            );
            _mm256_storeu_ps(po.add(i), o);
        }
        i += 8;
    }
    for (o, &v) in out[body..n].iter_mut().zip(&x[body..n]) {
        *o += w * v;
    }
}

/// `out_i = out_i + w x_i` (multiply, then add) over the common length.
///
/// # Safety
/// The CPU supports AVX-512F.
#[target_feature(enable = "avx512f")]
pub(in crate::kernels) unsafe fn axpy_avx512(out: &mut [f32], w: f32, x: &[f32]) {
    let n = out.len().min(x.len());
    let body = n / 16 * 16;
    let (po, px) = (out.as_mut_ptr(), x.as_ptr());
    let wv = _mm512_set1_ps(w);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 16 <= body <= n`, and both slices hold `n` values.
        unsafe {
            let o = _mm512_add_ps(
                _mm512_loadu_ps(po.add(i)),
                _mm512_mul_ps(wv, _mm512_loadu_ps(px.add(i))),
            );
            _mm512_storeu_ps(po.add(i), o);
        }
        i += 16;
    }
    // SAFETY: AVX-512F implies AVX2; the slices are in bounds.
    unsafe { axpy_avx2(&mut out[body..n], w, &x[body..n]) }
}

/// `out_i = src_i` as f32 (exact: every half is an f32) over the common
/// length, with F16C's `vcvtph2ps`, which like `half`'s conversion keeps a
/// NaN's payload and sets its quiet bit.
///
/// # Safety
/// The CPU supports AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::kernels) unsafe fn f16_to_f32_f16c(src: &[f16], out: &mut [f32]) {
    let n = out.len().min(src.len());
    let body = n / 8 * 8;
    let (ps, po) = (src.reinterpret_cast().as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n`: 16 bytes of `src`, 32 of `out`.
        unsafe { _mm256_storeu_ps(po.add(i), _mm256_cvtph_ps(_mm_loadu_si128(ps.add(i).cast()))) };
        i += 8;
    }
    for (o, x) in out[body..n].iter_mut().zip(&src[body..n]) {
        *o = x.to_f32();
    }
}

/// As [`f16_to_f32_f16c`], 16 values per instruction.
///
/// # Safety
/// The CPU supports AVX-512F and F16C.
#[target_feature(enable = "avx512f,f16c")]
pub(in crate::kernels) unsafe fn f16_to_f32_avx512(src: &[f16], out: &mut [f32]) {
    let n = out.len().min(src.len());
    let body = n / 16 * 16;
    let (ps, po) = (src.reinterpret_cast().as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 16 <= body <= n`: 32 bytes of `src`, 64 of `out`.
        unsafe { _mm512_storeu_ps(po.add(i), _mm512_cvtph_ps(_mm256_loadu_si256(ps.add(i).cast()))) };
        i += 16;
    }
    // SAFETY: the features are the caller's; the slices are in bounds.
    unsafe { f16_to_f32_f16c(&src[body..n], &mut out[body..n]) }
}

/// `out_i = q_i as f32 * d` over the common length (the int8 → f32
/// widening is exact, then one multiply, as the scalar reference).
///
/// # Safety
/// The CPU supports AVX2.
#[target_feature(enable = "avx2")]
pub(in crate::kernels) unsafe fn dequant_i8_avx2(q: &[i8], d: f32, out: &mut [f32]) {
    let n = out.len().min(q.len());
    let body = n / 8 * 8;
    let (pq, po) = (q.as_ptr(), out.as_mut_ptr());
    let dv = _mm256_set1_ps(d);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n`: 8 bytes of `q`, 32 of `out`.
        unsafe {
            let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(pq.add(i).cast())));
            _mm256_storeu_ps(po.add(i), _mm256_mul_ps(v, dv));
        }
        i += 8;
    }
    for (o, &v) in out[body..n].iter_mut().zip(&q[body..n]) {
        *o = v as f32 * d;
    }
}

/// [`crate::kernels::scalar::gemm_acc`] bit for bit: tiles of 4 rows × 32
/// columns held in registers over the whole `m` loop, so `b` is read once
/// per 4 rows and `out` once per tile; what is left over goes row by row
/// through [`gemm_rest`].
///
/// # Safety
/// The CPU supports AVX-512F (and so AVX2); `out` holds `r·d` values for
/// some `r`, `a` at least `r·kk`, `b` at least `kk·d`.
#[target_feature(enable = "avx512f")]
pub(in crate::kernels) unsafe fn gemm_acc_avx512(out: &mut [f32], a: &[f32], b: &[f32], kk: usize, d: usize) {
    let r = out.len() / d.max(1);
    assert!(a.len() >= r * kk && b.len() >= kk * d, "gemm_acc: short operands");
    let (po, pa, pb) = (out.as_mut_ptr(), a.as_ptr(), b.as_ptr());
    let rows4 = r / 4 * 4;
    let mut i = 0;
    while i < rows4 {
        let mut j = 0;
        while j + 32 <= d {
            // SAFETY: rows i..i+4 < r and columns j..j+32 <= d are inside
            // `out` (r·d), `a` (r·kk) and `b` (kk·d), checked above.
            unsafe {
                let mut acc = [_mm512_setzero_ps(); 8];
                for t in 0..4 {
                    acc[2 * t] = _mm512_loadu_ps(po.add((i + t) * d + j));
                    acc[2 * t + 1] = _mm512_loadu_ps(po.add((i + t) * d + j + 16));
                }
                for m in 0..kk {
                    let b0 = _mm512_loadu_ps(pb.add(m * d + j));
                    let b1 = _mm512_loadu_ps(pb.add(m * d + j + 16));
                    for t in 0..4 {
                        let w = _mm512_set1_ps(*pa.add((i + t) * kk + m));
                        acc[2 * t] = _mm512_add_ps(acc[2 * t], _mm512_mul_ps(w, b0));
                        acc[2 * t + 1] = _mm512_add_ps(acc[2 * t + 1], _mm512_mul_ps(w, b1));
                    }
                }
                for t in 0..4 {
                    _mm512_storeu_ps(po.add((i + t) * d + j), acc[2 * t]);
                    _mm512_storeu_ps(po.add((i + t) * d + j + 16), acc[2 * t + 1]);
                }
            }
            j += 32;
        }
        if j < d {
            // SAFETY: AVX-512F is present (this function's contract).
            unsafe { gemm_rest(out, a, b, kk, d, i..i + 4, j, axpy4_avx512, axpy_avx512) };
        }
        i += 4;
    }
    if i < r {
        // SAFETY: as above.
        unsafe { gemm_rest(out, a, b, kk, d, i..r, 0, axpy4_avx512, axpy_avx512) };
    }
}

/// [`crate::kernels::scalar::gemm_acc`] bit for bit on AVX2: tiles of 4
/// rows × 16 columns, then [`gemm_rest`] for what is left.
///
/// # Safety
/// The CPU supports AVX2; operand lengths as for [`gemm_acc_avx512`].
#[target_feature(enable = "avx2")]
pub(in crate::kernels) unsafe fn gemm_acc_avx2(out: &mut [f32], a: &[f32], b: &[f32], kk: usize, d: usize) {
    let r = out.len() / d.max(1);
    assert!(a.len() >= r * kk && b.len() >= kk * d, "gemm_acc: short operands");
    let (po, pa, pb) = (out.as_mut_ptr(), a.as_ptr(), b.as_ptr());
    let rows4 = r / 4 * 4;
    let mut i = 0;
    while i < rows4 {
        let mut j = 0;
        while j + 16 <= d {
            // SAFETY: rows i..i+4 < r and columns j..j+16 <= d are inside
            // every operand, checked above.
            unsafe {
                let mut acc = [_mm256_setzero_ps(); 8];
                for t in 0..4 {
                    acc[2 * t] = _mm256_loadu_ps(po.add((i + t) * d + j));
                    acc[2 * t + 1] = _mm256_loadu_ps(po.add((i + t) * d + j + 8));
                }
                for m in 0..kk {
                    let b0 = _mm256_loadu_ps(pb.add(m * d + j));
                    let b1 = _mm256_loadu_ps(pb.add(m * d + j + 8));
                    for t in 0..4 {
                        let w = _mm256_set1_ps(*pa.add((i + t) * kk + m));
                        acc[2 * t] = _mm256_add_ps(acc[2 * t], _mm256_mul_ps(w, b0));
                        acc[2 * t + 1] = _mm256_add_ps(acc[2 * t + 1], _mm256_mul_ps(w, b1));
                    }
                }
                for t in 0..4 {
                    _mm256_storeu_ps(po.add((i + t) * d + j), acc[2 * t]);
                    _mm256_storeu_ps(po.add((i + t) * d + j + 8), acc[2 * t + 1]);
                }
            }
            j += 16;
        }
        if j < d {
            // SAFETY: AVX2 is present (this function's contract).
            unsafe { gemm_rest(out, a, b, kk, d, i..i + 4, j, axpy4_avx2, axpy_avx2) };
        }
        i += 4;
    }
    if i < r {
        // SAFETY: as above.
        unsafe { gemm_rest(out, a, b, kk, d, i..r, 0, axpy4_avx2, axpy_avx2) };
    }
}

/// An axpy of four rows at once and of one, of one kernel set.
type Axpy4 = unsafe fn(&mut [f32], [f32; 4], [&[f32]; 4]);
type Axpy1 = unsafe fn(&mut [f32], f32, &[f32]);

/// The rows `rows` of a [`crate::kernels::scalar::gemm_acc`] from column
/// `col` on, row by row as the axpys of the definition in the order of `m`
/// (four at a time, `out` read once per four; bit for bit the same, see
/// [`axpy4_avx2`]). Also the whole product where `out` has a single row
/// (the recurrent delta rule's).
///
/// # Safety
/// The CPU supports the set `axpy4` and `axpy` belong to; `a` holds the
/// rows' `kk` coefficients, `b` `kk` rows of `d`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_rest(
    out: &mut [f32],
    a: &[f32],
    b: &[f32],
    kk: usize,
    d: usize,
    rows: std::ops::Range<usize>,
    col: usize,
    axpy4: Axpy4,
    axpy: Axpy1,
) {
    let row = |m: usize| &b[m * d + col..(m + 1) * d];
    for i in rows {
        let o = &mut out[i * d + col..(i + 1) * d];
        let w = &a[i * kk..(i + 1) * kk];
        let mut m = 0;
        while m + 4 <= kk {
            // SAFETY: the caller guarantees the set; every row has `o.len()` values.
            unsafe {
                axpy4(
                    o,
                    [w[m], w[m + 1], w[m + 2], w[m + 3]],
                    [row(m), row(m + 1), row(m + 2), row(m + 3)],
                )
            };
            m += 4;
        }
        while m < kk {
            // SAFETY: as above.
            unsafe { axpy(o, w[m], row(m)) };
            m += 1;
        }
    }
}
