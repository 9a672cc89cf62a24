//! The gated delta rule of Gated DeltaNet layers: a fixed-size matrix state
//! per value head that each token decays, corrects towards its value along
//! its key, and reads with its query.
//!
//! For one head with state `S` (`[dk, dv]`), token `t` with key `k`, value
//! `v`, query `q`, log-decay `g` and write strength `beta`:
//! `S ← exp(g)·S`, `S ← S + k ⊗ beta·(v − Sᵀk)`, `out = Sᵀq`.
//! [`recurrent`] runs that token by token, for decode and prefill alike
//! (the chunked form for prefill is not written yet).

use rayon::prelude::*;

/// The sizes of one layer's delta rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaShape {
    /// Value heads (query and key heads already repeated up to these).
    pub heads: usize,
    /// Key (and query) head size.
    pub dk: usize,
    /// Value head size.
    pub dv: usize,
}

impl DeltaShape {
    /// f32 values of one sequence's state: `[heads, dk, dv]`.
    pub fn state_len(&self) -> usize {
        self.heads * self.dk * self.dv
    }
}

/// Inputs of `n` tokens, row-major by token then head: `q` and `k`
/// `[n, heads, dk]` (already L2-normalised, `q` already scaled by
/// `dk^-1/2`), `v` `[n, heads, dv]`, `g` (log decay, ≤ 0) and `beta`
/// `[n, heads]`.
#[derive(Clone, Copy, Debug)]
pub struct DeltaInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

impl DeltaInputs<'_> {
    fn tokens(&self, s: DeltaShape) -> usize {
        self.g.len() / s.heads.max(1)
    }
}

/// Runs the tokens one by one, updating `state` (`[heads, dk, dv]`) and
/// writing each token's output into `out` (`[n, heads, dv]`). Heads run in
/// parallel; each head's arithmetic is the same whatever the thread count.
pub fn recurrent(s: DeltaShape, x: DeltaInputs<'_>, state: &mut [f32], out: &mut [f32]) {
    let n = x.tokens(s);
    let (h, dk, dv) = (s.heads, s.dk, s.dv);
    let mut per_head: Vec<(usize, &mut [f32], Vec<f32>)> = state
        .chunks_exact_mut(dk * dv)
        .enumerate()
        .map(|(i, st)| (i, st, vec![0f32; n * dv]))
        .collect();
    per_head.par_iter_mut().for_each(|(hd, st, o)| {
        let hd = *hd;
        let mut kv = vec![0f32; dv];
        for t in 0..n {
            let q = &x.q[(t * h + hd) * dk..(t * h + hd + 1) * dk];
            let k = &x.k[(t * h + hd) * dk..(t * h + hd + 1) * dk];
            let v = &x.v[(t * h + hd) * dv..(t * h + hd + 1) * dv];
            let decay = x.g[t * h + hd].exp();
            let beta = x.beta[t * h + hd];
            for a in st.iter_mut() {
                *a *= decay;
            }
            kv.iter_mut().for_each(|a| *a = 0.0);
            for (i, &ki) in k.iter().enumerate() {
                for (a, &sij) in kv.iter_mut().zip(&st[i * dv..(i + 1) * dv]) {
                    *a += sij * ki;
                }
            }
            for (a, &vj) in kv.iter_mut().zip(v) {
                *a = (vj - *a) * beta;
            }
            for (i, &ki) in k.iter().enumerate() {
                for (sij, &d) in st[i * dv..(i + 1) * dv].iter_mut().zip(&kv) {
                    *sij += ki * d;
                }
            }
            let row = &mut o[t * dv..(t + 1) * dv];
            row.iter_mut().for_each(|a| *a = 0.0);
            for (i, &qi) in q.iter().enumerate() {
                for (a, &sij) in row.iter_mut().zip(&st[i * dv..(i + 1) * dv]) {
                    *a += sij * qi;
                }
            }
        }
    });
    for (hd, _, o) in &per_head {
        for t in 0..n {
            out[(t * h + hd) * dv..(t * h + hd + 1) * dv].copy_from_slice(&o[t * dv..(t + 1) * dv]);
        }
    }
}
