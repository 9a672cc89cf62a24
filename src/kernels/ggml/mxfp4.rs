//! MXFP4 (OCP microscaling FP4): an E8M0 exponent and 32 E2M1 codes
//! (`block_mxfp4`: e, qs[16]); column `j < 16` is the low nibble of byte
//! `j`, column `j + 16` its high nibble. ggml keeps twice the E2M1 values
//! (integers) and half the scale, so products are exact integers.

use super::ActBlock;
use super::blocks::{KVALUES_MXFP4, e8m0_half};

pub(super) fn dequant(b: &[u8], out: &mut [f32]) {
    let d = e8m0_half(b[0]);
    for j in 0..16 {
        out[j] = f32::from(KVALUES_MXFP4[usize::from(b[1 + j] & 0xF)]) * d;
        out[j + 16] = f32::from(KVALUES_MXFP4[usize::from(b[1 + j] >> 4)]) * d;
    }
}

pub(super) fn dot(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    let mut s = 0i32;
    for j in 0..16 {
        s += i32::from(a.q[j]) * i32::from(KVALUES_MXFP4[usize::from(b[1 + j] & 0xF)]);
        s += i32::from(a.q[j + 16]) * i32::from(KVALUES_MXFP4[usize::from(b[1 + j] >> 4)]);
    }
    [(a.d * e8m0_half(b[0])) * s as f32, 0.0]
}
