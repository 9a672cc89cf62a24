//! Attention over one tile of keys for a block of query rows, AVX2 and
//! AVX-512F (see [`crate::kernels::Kernels::dot_f32_grid`] and
//! [`crate::kernels::Kernels::axpy_grid`] for the contract). One call per
//! tile keeps the per-key work inside one function with the vector
//! features on, so nothing is a call per four keys, and the AVX-512
//! versions share loads across rows: a 4 × 4 block of scores loads four
//! query chunks and four key chunks for sixteen products, and a group of
//! four rows with the same visible keys loads each value chunk once for
//! four weighted adds. The arithmetic of every score and every weighted
//! add is the scalar definition's, so the results are bit-identical to it.

use core::arch::x86_64::*;

use super::vec::{
    axpy_avx2, axpy_avx512, axpy4_avx2, axpy4_avx512, dot_avx2, dot_avx512, dot4_avx2, dot4_avx512,
};

/// The scalar remainder of a dot product, summed as
/// [`crate::model::ops::dot`] sums it.
#[inline(always)]
fn tail_dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()
}

/// Key `j` of a tile: `hd` values at `j * stride`.
#[inline(always)]
fn key(keys: &[f32], stride: usize, hd: usize, j: usize) -> &[f32] {
    &keys[j * stride..j * stride + hd]
}

/// Scores of one query against the first `out.len()` keys, four keys at a
/// time, times `scale`.
#[inline(always)]
fn row_scores(
    q: &[f32],
    keys: &[f32],
    stride: usize,
    scale: f32,
    out: &mut [f32],
    dot4: impl Fn(&[f32], [&[f32]; 4]) -> [f32; 4],
    dot: impl Fn(&[f32], &[f32]) -> f32,
) {
    let (hd, nk) = (q.len(), out.len());
    let mut j = 0;
    while j + 4 <= nk {
        let k4 = [
            key(keys, stride, hd, j),
            key(keys, stride, hd, j + 1),
            key(keys, stride, hd, j + 2),
            key(keys, stride, hd, j + 3),
        ];
        for (o, d) in out[j..j + 4].iter_mut().zip(dot4(q, k4)) {
            *o = d * scale;
        }
        j += 4;
    }
    for (j, o) in out.iter_mut().enumerate().skip(j) {
        *o = dot(q, key(keys, stride, hd, j)) * scale;
    }
}

/// Scores of every row of `q` against every key, times `scale`:
/// `out[r * ld + j] = dot(q[r], key j) * scale` for `j < nk`.
///
/// # Safety
/// The CPU supports AVX2; the caller checked the lengths (every `q[r]` has
/// `hd` values, `keys` holds `(nk - 1) * stride + hd`, `ld >= nk` and `out`
/// holds `(q.len() - 1) * ld + nk`).
#[target_feature(enable = "avx2")]
pub(in crate::kernels) unsafe fn dot_grid_avx2(
    q: &[&[f32]],
    keys: &[f32],
    stride: usize,
    nk: usize,
    scale: f32,
    out: &mut [f32],
    ld: usize,
) {
    for (r, qr) in q.iter().enumerate() {
        row_scores(
            qr,
            keys,
            stride,
            scale,
            &mut out[r * ld..r * ld + nk],
            // SAFETY: AVX2 is enabled here; every key holds `hd` values.
            |a, b| unsafe { dot4_avx2(a, b) },
            // SAFETY: as above.
            |a, b| unsafe { dot_avx2(a, b) },
        );
    }
}

/// Sixteen dot products over the first `body` values (a multiple of 16) of
/// four query rows and four keys, in [`crate::model::ops::dot`]'s lanes and
/// tree. Lane `4 j + r` of the result is row `r` against key `j`.
///
/// # Safety
/// The CPU supports AVX-512F; every pointer is valid for `body` values.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dot_4x4(q: [*const f32; 4], k: [*const f32; 4], body: usize) -> __m512 {
    // acc[4 r + j]: the 16 lane sums of row r against key j.
    let mut acc = [_mm512_setzero_ps(); 16];
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 16 <= body`, and every pointer holds `body` values.
        unsafe {
            let qv = q.map(|p| _mm512_loadu_ps(p.add(i)));
            for (j, kp) in k.iter().enumerate() {
                let kv = _mm512_loadu_ps(kp.add(i));
                for (r, qr) in qv.iter().enumerate() {
                    acc[4 * r + j] = _mm512_add_ps(acc[4 * r + j], _mm512_mul_ps(*qr, kv));
                }
            }
        }
        i += 16;
    }
    // The tree `acc[i] += acc[i + 8]`, `+ 4`, `+ 2`, `+ 1` of all sixteen at
    // once, each step pairing vectors so one add does two (then four, eight,
    // sixteen) of the reductions' steps.
    // Step 1: lanes i + (i + 8); t[p] holds acc[2p] in 128-bit blocks 0-1 and
    // acc[2p + 1] in blocks 2-3.
    let mut t = [_mm512_setzero_ps(); 8];
    for (p, tp) in t.iter_mut().enumerate() {
        let (x, y) = (acc[2 * p], acc[2 * p + 1]);
        *tp = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        );
    }
    // Step 2: lanes i + (i + 4); block b of u[v] is acc[4v + b].
    let mut u = [_mm512_setzero_ps(); 4];
    for (v, uv) in u.iter_mut().enumerate() {
        let (x, y) = (t[2 * v], t[2 * v + 1]);
        *uv = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        );
    }
    // Step 3: lanes i + (i + 2); block b of v0 holds acc[b] then acc[4 + b],
    // of v1 acc[8 + b] then acc[12 + b], two lanes each.
    let pair = |x: __m512, y: __m512| {
        let (x, y) = (_mm512_castps_pd(x), _mm512_castps_pd(y));
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)),
        )
    };
    let (v0, v1) = (pair(u[0], u[1]), pair(u[2], u[3]));
    // Step 4: lanes 0 + 1; block b is acc[b], acc[4 + b], acc[8 + b],
    // acc[12 + b], so lane 4 b + r is acc[4 r + b]: row r, key b.
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(v0, v1),
        _mm512_shuffle_ps::<0b11_01_11_01>(v0, v1),
    )
}

/// As [`dot_grid_avx2`], four rows by four keys at a time.
///
/// # Safety
/// As [`dot_grid_avx2`], with AVX-512F (and so AVX2).
#[target_feature(enable = "avx512f")]
pub(in crate::kernels) unsafe fn dot_grid_avx512(
    q: &[&[f32]],
    keys: &[f32],
    stride: usize,
    nk: usize,
    scale: f32,
    out: &mut [f32],
    ld: usize,
) {
    let nr = q.len();
    let Some(hd) = q.first().map(|r| r.len()) else {
        return;
    };
    let body = hd / 16 * 16;
    let quad_keys = nk / 4 * 4;
    let mut r0 = 0;
    while r0 + 4 <= nr {
        let qr = [q[r0], q[r0 + 1], q[r0 + 2], q[r0 + 3]];
        let qp = qr.map(<[f32]>::as_ptr);
        let mut j = 0;
        while j < quad_keys {
            let kr = [
                key(keys, stride, hd, j),
                key(keys, stride, hd, j + 1),
                key(keys, stride, hd, j + 2),
                key(keys, stride, hd, j + 3),
            ];
            // SAFETY: AVX-512F is enabled; every row and key holds `hd >= body` values.
            let w = unsafe { dot_4x4(qp, kr.map(<[f32]>::as_ptr), body) };
            let mut lanes = [0f32; 16];
            // SAFETY: `lanes` holds 16 values.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), w) };
            for (r, q) in qr.iter().enumerate() {
                for (jj, k) in kr.iter().enumerate() {
                    let d = lanes[4 * jj + r] + tail_dot(&q[body..], &k[body..]);
                    out[(r0 + r) * ld + j + jj] = d * scale;
                }
            }
            j += 4;
        }
        for (r, q) in qr.iter().enumerate() {
            let row = &mut out[(r0 + r) * ld..(r0 + r) * ld + nk];
            for (jj, o) in row.iter_mut().enumerate().skip(quad_keys) {
                // SAFETY: AVX-512F is enabled; the key holds `hd` values.
                *o = unsafe { dot_avx512(q, key(keys, stride, hd, jj)) } * scale;
            }
        }
        r0 += 4;
    }
    for (r, qr) in q.iter().enumerate().skip(r0) {
        row_scores(
            qr,
            keys,
            stride,
            scale,
            &mut out[r * ld..r * ld + nk],
            // SAFETY: AVX-512F is enabled; every key holds `hd` values.
            |a, b| unsafe { dot4_avx512(a, b) },
            // SAFETY: as above.
            |a, b| unsafe { dot_avx512(a, b) },
        );
    }
}

/// One row's weighted sum over its visible keys `a..b`, four at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn row_axpy(
    o: &mut [f32],
    w: &[f32],
    vals: &[f32],
    stride: usize,
    (a, b): (usize, usize),
    axpy4: impl Fn(&mut [f32], [f32; 4], [&[f32]; 4]),
    axpy: impl Fn(&mut [f32], f32, &[f32]),
) {
    let hd = o.len();
    let mut j = a;
    while j + 4 <= b {
        let v4 = [
            key(vals, stride, hd, j),
            key(vals, stride, hd, j + 1),
            key(vals, stride, hd, j + 2),
            key(vals, stride, hd, j + 3),
        ];
        axpy4(o, [w[j], w[j + 1], w[j + 2], w[j + 3]], v4);
        j += 4;
    }
    for (j, &wj) in w.iter().enumerate().take(b).skip(j) {
        axpy(o, wj, key(vals, stride, hd, j));
    }
}

/// `out_r += Σ_{j in spans[r]} w[r * ld + j] · value j`, per element in the
/// order of `j`, each step a rounded multiply then a rounded add.
///
/// # Safety
/// The CPU supports AVX2; the caller checked the lengths (`out` is
/// `spans.len() × hd`, `ld >= nk`, `w` holds `(spans.len() - 1) * ld + nk`,
/// every span within `0..=nk`,
/// `vals` holds `(nk - 1) * stride + hd`).
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
pub(in crate::kernels) unsafe fn axpy_grid_avx2(
    out: &mut [f32],
    hd: usize,
    w: &[f32],
    ld: usize,
    nk: usize,
    spans: &[(usize, usize)],
    vals: &[f32],
    stride: usize,
) {
    for (r, (o, span)) in out.chunks_exact_mut(hd).zip(spans).enumerate() {
        row_axpy(
            o,
            &w[r * ld..r * ld + nk],
            vals,
            stride,
            *span,
            // SAFETY: AVX2 is enabled; every value row holds `hd` values.
            |o, w, x| unsafe { axpy4_avx2(o, w, x) },
            // SAFETY: as above.
            |o, w, x| unsafe { axpy_avx2(o, w, x) },
        );
    }
}

/// Four rows that see the same keys `a..b`: each chunk of 32 (then 16)
/// output values is held in registers for the four rows while the keys go
/// by, so a value chunk is loaded once for four rows.
///
/// # Safety
/// The CPU supports AVX-512F; `out` is 4 × `hd`, `w` holds `3 * ld + b`,
/// `vals` holds `(b - 1) * stride + hd` values.
#[inline]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn axpy_4rows(
    out: &mut [f32],
    hd: usize,
    w: &[f32],
    ld: usize,
    (a, b): (usize, usize),
    vals: &[f32],
    stride: usize,
) {
    let po = out.as_mut_ptr();
    let pv = vals.as_ptr();
    let pw = w.as_ptr();
    let body = hd / 16 * 16;
    let mut c = 0;
    while c + 32 <= body {
        // SAFETY: `c + 32 <= hd` for every row of `out` and every value row
        // `j < b`; the weights are at `r * ld + j < 3 * ld + b`.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; 4];
            for (r, ar) in acc.iter_mut().enumerate() {
                ar[0] = _mm512_loadu_ps(po.add(r * hd + c));
                ar[1] = _mm512_loadu_ps(po.add(r * hd + c + 16));
            }
            for j in a..b {
                let v0 = _mm512_loadu_ps(pv.add(j * stride + c));
                let v1 = _mm512_loadu_ps(pv.add(j * stride + c + 16));
                for (r, ar) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*pw.add(r * ld + j));
                    ar[0] = _mm512_add_ps(ar[0], _mm512_mul_ps(wv, v0));
                    ar[1] = _mm512_add_ps(ar[1], _mm512_mul_ps(wv, v1));
                }
            }
            for (r, ar) in acc.iter().enumerate() {
                _mm512_storeu_ps(po.add(r * hd + c), ar[0]);
                _mm512_storeu_ps(po.add(r * hd + c + 16), ar[1]);
            }
        }
        c += 32;
    }
    if c < body {
        // SAFETY: as above with one chunk of 16 (`c + 16 <= body <= hd`).
        unsafe {
            let mut acc = [_mm512_setzero_ps(); 4];
            for (r, ar) in acc.iter_mut().enumerate() {
                *ar = _mm512_loadu_ps(po.add(r * hd + c));
            }
            for j in a..b {
                let v = _mm512_loadu_ps(pv.add(j * stride + c));
                for (r, ar) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*pw.add(r * ld + j));
                    *ar = _mm512_add_ps(*ar, _mm512_mul_ps(wv, v));
                }
            }
            for (r, ar) in acc.iter().enumerate() {
                _mm512_storeu_ps(po.add(r * hd + c), *ar);
            }
        }
    }
    for (r, o) in out.chunks_exact_mut(hd).enumerate() {
        for (i, oi) in o.iter_mut().enumerate().skip(body) {
            for j in a..b {
                *oi += w[r * ld + j] * vals[j * stride + i];
            }
        }
    }
}

/// As [`axpy_grid_avx2`]; four consecutive rows with the same visible keys
/// (every tile but the diagonal one of a causal block) go through
/// [`axpy_4rows`].
///
/// # Safety
/// As [`axpy_grid_avx2`], with AVX-512F (and so AVX2).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(in crate::kernels) unsafe fn axpy_grid_avx512(
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
    let mut r = 0;
    while r < nr {
        let s = spans[r];
        if r + 4 <= nr && spans[r + 1..r + 4].iter().all(|x| *x == s) {
            if s.0 < s.1 {
                // SAFETY: AVX-512F is enabled; the lengths were checked by
                // the caller for every row and every span.
                unsafe {
                    axpy_4rows(
                        &mut out[r * hd..(r + 4) * hd],
                        hd,
                        &w[r * ld..],
                        ld,
                        s,
                        vals,
                        stride,
                    )
                };
            }
            r += 4;
            continue;
        }
        row_axpy(
            &mut out[r * hd..(r + 1) * hd],
            &w[r * ld..r * ld + nk],
            vals,
            stride,
            s,
            // SAFETY: AVX-512F is enabled; every value row holds `hd` values.
            |o, w, x| unsafe { axpy4_avx512(o, w, x) },
            // SAFETY: as above.
            |o, w, x| unsafe { axpy_avx512(o, w, x) },
        );
        r += 1;
    }
}
