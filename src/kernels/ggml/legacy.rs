//! The legacy 32-column types: Q4_0 (d, qs[16]), Q4_1 (d, m, qs[16]),
//! Q5_0 (d, qh[4], qs[16]), Q5_1 (d, m, qh[4], qs[16]). Column `j < 16`
//! is the low nibble of byte `j`, column `j + 16` its high nibble; the
//! Q5 types take bit `j` of `qh` as the fifth bit of column `j`.

use super::ActBlock;
use super::blocks::f16_at;

/// The 5th bits of columns `j` and `j + 16` of a Q5 block, as 0 or 16.
#[inline(always)]
fn high(qh: u32, j: usize) -> (u8, u8) {
    ((((qh >> j) << 4) & 0x10) as u8, ((qh >> (j + 12)) & 0x10) as u8)
}

fn qh_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Integer sum of a block's unsigned codes `v(j)` against the activations,
/// and the codes' offset `off` applied per column (`Σ (v - off) q`).
#[inline(always)]
fn isum(a: ActBlock<'_>, off: i32, v: impl Fn(usize) -> (u8, u8)) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        let (v0, v1) = v(j);
        s += (i32::from(v0) - off) * i32::from(a.q[j]) + (i32::from(v1) - off) * i32::from(a.q[j + 16]);
    }
    s
}

pub(super) fn dequant_q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        out[j] = (i32::from(b[2 + j] & 0xF) - 8) as f32 * d;
        out[j + 16] = (i32::from(b[2 + j] >> 4) - 8) as f32 * d;
    }
}

pub(super) fn dot_q4_0(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    let s = isum(a, 8, |j| (b[2 + j] & 0xF, b[2 + j] >> 4));
    [s as f32 * (f16_at(b, 0) * a.d), 0.0]
}

pub(super) fn dequant_q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..16 {
        out[j] = f32::from(b[4 + j] & 0xF) * d + m;
        out[j + 16] = f32::from(b[4 + j] >> 4) * d + m;
    }
}

pub(super) fn dot_q4_1(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    let s = isum(a, 0, |j| (b[4 + j] & 0xF, b[4 + j] >> 4));
    [(f16_at(b, 0) * a.d) * s as f32, f16_at(b, 2) * a.s]
}

pub(super) fn dequant_q5_0(b: &[u8], out: &mut [f32]) {
    let (d, qh) = (f16_at(b, 0), qh_at(b, 2));
    for j in 0..16 {
        let (h0, h1) = high(qh, j);
        out[j] = (i32::from((b[6 + j] & 0xF) | h0) - 16) as f32 * d;
        out[j + 16] = (i32::from((b[6 + j] >> 4) | h1) - 16) as f32 * d;
    }
}

pub(super) fn dot_q5_0(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    let qh = qh_at(b, 2);
    let s = isum(a, 16, |j| {
        let (h0, h1) = high(qh, j);
        ((b[6 + j] & 0xF) | h0, (b[6 + j] >> 4) | h1)
    });
    [(f16_at(b, 0) * a.d) * s as f32, 0.0]
}

pub(super) fn dequant_q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m, qh) = (f16_at(b, 0), f16_at(b, 2), qh_at(b, 4));
    for j in 0..16 {
        let (h0, h1) = high(qh, j);
        out[j] = f32::from((b[8 + j] & 0xF) | h0) * d + m;
        out[j + 16] = f32::from((b[8 + j] >> 4) | h1) * d + m;
    }
}

pub(super) fn dot_q5_1(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    let qh = qh_at(b, 4);
    let s = isum(a, 0, |j| {
        let (h0, h1) = high(qh, j);
        ((b[8 + j] & 0xF) | h0, (b[8 + j] >> 4) | h1)
    });
    [(f16_at(b, 0) * a.d) * s as f32, f16_at(b, 2) * a.s]
}
