//! Q8_0: 32 int8 values and one f16 scale (`block_q8_0`: d, qs[32]).

use super::ActBlock;
use super::blocks::f16_at;

pub(super) fn dequant(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

pub(super) fn dot(b: &[u8], a: ActBlock<'_>) -> [f32; 2] {
    let sumi: i32 = b[2..34]
        .iter()
        .zip(a.q)
        .map(|(&w, &q)| i32::from(w as i8) * i32::from(q))
        .sum();
    [sumi as f32 * (f16_at(b, 0) * a.d), 0.0]
}
