//! IQ4_NL (d, qs[16] per 32 columns) and IQ4_XS (d, scales_h, scales_l[4],
//! qs[128] per 256 columns): 4-bit indices into ggml's non-linear table;
//! IQ4_XS adds a 6-bit scale (minus 32) per 32 columns.

use super::ActBlock;
use super::blocks::{KVALUES_IQ4NL, f16_at};

#[inline(always)]
fn kv(i: u8) -> i32 {
    i32::from(KVALUES_IQ4NL[usize::from(i & 0xF)])
}

/// Σ of 16 bytes' low and high codes against activations `q[..16]`,
/// `q[16..32]`.
#[inline(always)]
fn isum32(qs: &[u8], q: &[i8]) -> i32 {
    (0..16)
        .map(|j| i32::from(q[j]) * kv(qs[j]) + i32::from(q[j + 16]) * kv(qs[j] >> 4))
        .sum()
}

pub(super) fn dequant_nl(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        out[j] = d * kv(b[2 + j]) as f32;
        out[j + 16] = d * kv(b[2 + j] >> 4) as f32;
    }
}

pub(super) fn dot_nl(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    [(a.d * f16_at(b, 0)) * isum32(&b[2..18], a.q) as f32, 0.0]
}

/// The scale of 32-column sub-block `ib` (0..8), minus 32.
#[inline(always)]
pub(crate) fn xs_scale(b: &[u8], ib: usize) -> i32 {
    let h = u16::from_le_bytes([b[2], b[3]]);
    let l = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
    i32::from(l | ((((h >> (2 * ib)) & 3) as u8) << 4)) - 32
}

pub(super) fn dequant_xs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for ib in 0..8 {
        let dl = d * xs_scale(b, ib) as f32;
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        for j in 0..16 {
            out[32 * ib + j] = dl * kv(qs[j]) as f32;
            out[32 * ib + j + 16] = dl * kv(qs[j] >> 4) as f32;
        }
    }
}

pub(super) fn dot_xs(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    let s: i32 = (0..8)
        .map(|ib| xs_scale(b, ib) * isum32(&b[8 + 16 * ib..8 + 16 * ib + 16], &a.q[32 * ib..32 * ib + 32]))
        .sum();
    super::k_quants::k_terms(crate::gguf::GgmlType::IQ4_XS, b, s, a.d, a.bsums)
}
