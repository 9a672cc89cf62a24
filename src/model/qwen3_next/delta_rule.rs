//! The gated delta rule of Gated DeltaNet layers: a fixed-size matrix state
//! per value head that each token decays, corrects towards its value along
//! its key, and reads with its query.
//!
//! For one head with state `S` (`[dk, dv]`), token `t` with key `k`, value
//! `v`, query `q`, log-decay `g` and write strength `beta`:
//! `S ← exp(g)·S`, `S ← S + k ⊗ beta·(v − Sᵀk)`, `out = Sᵀq`.
//! [`recurrent`] runs that token by token (decode). [`chunked`] is the
//! same recurrence regrouped over blocks of [`CHUNK`] tokens (prefill):
//! within a block the tokens' mutual corrections form a small triangular
//! system, and the state is read and written once per block instead of four
//! times per token, so the work becomes block products over data that stays
//! in cache. The two agree to rounding, not bit for bit (the sums run in
//! another order), as transformers' chunked prefill and recurrent decode do.

use rayon::prelude::*;

use crate::kernels::{Kernels, dispatch};

/// Tokens per block of the chunked form (transformers' and the FLA kernels'
/// default). Blocks are aligned to absolute positions (multiples of
/// `CHUNK`), so the same positions are grouped the same way whichever call
/// they arrive in, as long as calls start at a block boundary.
pub const CHUNK: usize = 64;

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
    let kern = dispatch();
    per_head(s, n, state, out, |hd, st, o| {
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
            kv.fill(0.0);
            kern.gemm_acc(&mut kv, k, st, dk, dv);
            for (a, &vj) in kv.iter_mut().zip(v) {
                *a = (vj - *a) * beta;
            }
            for (i, &ki) in k.iter().enumerate() {
                kern.axpy(&mut st[i * dv..(i + 1) * dv], ki, &kv);
            }
            let row = &mut o[t * dv..(t + 1) * dv];
            row.fill(0.0);
            kern.gemm_acc(row, q, st, dk, dv);
        }
    });
}

/// Runs `head(index, state, out)` for every head in parallel, `state` the
/// head's `[dk, dv]` and `out` its own `[n, dv]` outputs, then interleaves
/// those into `out` (`[n, heads, dv]`).
fn per_head(
    s: DeltaShape,
    n: usize,
    state: &mut [f32],
    out: &mut [f32],
    head: impl Fn(usize, &mut [f32], &mut [f32]) + Sync,
) {
    let (h, dv) = (s.heads, s.dv);
    let mut heads: Vec<(usize, &mut [f32], Vec<f32>)> = state
        .chunks_exact_mut(s.dk * dv)
        .enumerate()
        .map(|(i, st)| (i, st, vec![0f32; n * dv]))
        .collect();
    heads.par_iter_mut().for_each(|(hd, st, o)| head(*hd, st, o));
    for (hd, _, o) in &heads {
        for t in 0..n {
            out[(t * h + hd) * dv..(t * h + hd + 1) * dv].copy_from_slice(&o[t * dv..(t + 1) * dv]);
        }
    }
}

/// The chunked form of [`recurrent`] over `n` tokens whose first is at
/// absolute position `start` (blocks end at multiples of [`CHUNK`]): same
/// inputs, state and output layout, equal to it up to rounding. Heads run
/// in parallel; each head's arithmetic is fixed by the shape and `start`,
/// whatever the thread count.
pub fn chunked(s: DeltaShape, x: DeltaInputs<'_>, start: usize, state: &mut [f32], out: &mut [f32]) {
    let n = x.tokens(s);
    let (dk, dv) = (s.dk, s.dv);
    let kern = dispatch();
    per_head(s, n, state, out, |hd, st, o| {
        let mut scratch = Block::new(dk, dv, kern);
        let mut t0 = 0;
        while t0 < n {
            let len = (CHUNK - (start + t0) % CHUNK).min(n - t0);
            scratch.load(s, &x, hd, t0, len);
            scratch.run(st, &mut o[t0 * dv..(t0 + len) * dv]);
            t0 += len;
        }
    });
}

/// One head's block of up to [`CHUNK`] tokens, gathered contiguously, with
/// the buffers of its products (reused block after block).
struct Block {
    kern: Kernels,
    dk: usize,
    dv: usize,
    len: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    /// Cumulative log decay within the block, `G_i = Σ_{j≤i} g_j`.
    cum: Vec<f32>,
    /// `[len, CHUNK]`, strict lower triangle: first the correction system,
    /// then the strict lower triangle of its inverse `T` (see `run`).
    tri: Vec<f32>,
    /// `T·(β v)` then minus the state's prediction: the block's new values.
    u: Vec<f32>,
    /// `T·(β k e^G)` (then negated): what each token's correction takes
    /// from the state.
    w: Vec<f32>,
    /// One row of dot products (or of `tri`, during the substitution).
    row: Vec<f32>,
    /// `[len, CHUNK]`, lower triangle: `e^{G_i - G_j}`, the decay from token
    /// j to token i (computed once per block: the exponentials would
    /// otherwise cost more than the products).
    decay: Vec<f32>,
    /// `e^{G_i}`.
    egc: Vec<f32>,
    /// `[len, len]`: the coefficients of one block product.
    cm: Vec<f32>,
    /// `[len, dk]`: the queries scaled by `e^{G_i}`.
    qe: Vec<f32>,
    /// `[dk, len]`: the keys decayed to the block's end, transposed.
    kd: Vec<f32>,
}

impl Block {
    fn new(dk: usize, dv: usize, kern: Kernels) -> Self {
        Self {
            kern,
            dk,
            dv,
            len: 0,
            q: vec![0.0; CHUNK * dk],
            k: vec![0.0; CHUNK * dk],
            v: vec![0.0; CHUNK * dv],
            beta: vec![0.0; CHUNK],
            cum: vec![0.0; CHUNK],
            tri: vec![0.0; CHUNK * CHUNK],
            u: vec![0.0; CHUNK * dv],
            w: vec![0.0; CHUNK * dk],
            row: vec![0.0; CHUNK],
            decay: vec![0.0; CHUNK * CHUNK],
            egc: vec![0.0; CHUNK],
            cm: vec![0.0; CHUNK * CHUNK],
            qe: vec![0.0; CHUNK * dk],
            kd: vec![0.0; CHUNK * dk],
        }
    }

    fn load(&mut self, s: DeltaShape, x: &DeltaInputs<'_>, hd: usize, t0: usize, len: usize) {
        let (h, dk, dv) = (s.heads, self.dk, self.dv);
        self.len = len;
        let mut acc = 0f32;
        for i in 0..len {
            let t = t0 + i;
            let at = t * h + hd;
            self.q[i * dk..(i + 1) * dk].copy_from_slice(&x.q[at * dk..(at + 1) * dk]);
            self.k[i * dk..(i + 1) * dk].copy_from_slice(&x.k[at * dk..(at + 1) * dk]);
            self.v[i * dv..(i + 1) * dv].copy_from_slice(&x.v[at * dv..(at + 1) * dv]);
            self.beta[i] = x.beta[at];
            acc += x.g[at];
            self.cum[i] = acc;
        }
    }

    /// Outputs of the block into `o` (`[len, dv]`) from the state `st`
    /// (`[dk, dv]`) before it; leaves `st` as the state after it. Every
    /// product is one [`Kernels::gemm_acc`] over the block.
    fn run(&mut self, st: &mut [f32], o: &mut [f32]) {
        let (l, dk, dv) = (self.len, self.dk, self.dv);
        let c = CHUNK;
        let kern = self.kern;
        for i in 0..l {
            self.egc[i] = self.cum[i].exp();
            for j in 0..=i {
                self.decay[i * c + j] = (self.cum[i] - self.cum[j]).exp();
            }
        }
        // The corrections within the block solve (I + B) u = β v with
        // B_ij = β_i (k_i·k_j) e^{G_i - G_j} for j < i. `tri` takes -B, then
        // by forward substitution (row i from the finished rows above it)
        // the strict lower triangle of T = (I + B)⁻¹.
        for i in 0..l {
            let ki = &self.k[i * dk..(i + 1) * dk];
            dots(&kern, dk, ki, &self.k, i, &mut self.row);
            for j in 0..i {
                self.tri[i * c + j] = -self.beta[i] * self.row[j] * self.decay[i * c + j];
            }
        }
        for i in 1..l {
            self.row[..i].copy_from_slice(&self.tri[i * c..i * c + i]);
            for j in 0..i {
                let mut acc = self.row[j];
                for m in j + 1..i {
                    acc += self.row[m] * self.tri[m * c + j];
                }
                self.tri[i * c + j] = acc;
            }
        }
        // u = T diag(β) v, w = T diag(β e^G) k (T unit lower triangular),
        // then the new values u - w S.
        let cm = &mut self.cm[..l * l];
        cm.fill(0.0);
        for i in 0..l {
            for j in 0..i {
                cm[i * l + j] = self.tri[i * c + j] * self.beta[j];
            }
            cm[i * l + i] = self.beta[i];
        }
        let u = &mut self.u[..l * dv];
        u.fill(0.0);
        kern.gemm_acc(u, cm, &self.v[..l * dv], l, dv);
        for i in 0..l {
            for j in 0..=i {
                cm[i * l + j] *= self.egc[j];
            }
        }
        let w = &mut self.w[..l * dk];
        w.fill(0.0);
        kern.gemm_acc(w, cm, &self.k[..l * dk], l, dk);
        for a in w.iter_mut() {
            *a = -*a;
        }
        kern.gemm_acc(u, w, st, dk, dv);
        // o_i = e^{G_i} q_i S + Σ_{j≤i} (q_i·k_j) e^{G_i - G_j} u_j.
        let qe = &mut self.qe[..l * dk];
        for i in 0..l {
            let ei = self.egc[i];
            for (a, &b) in qe[i * dk..(i + 1) * dk]
                .iter_mut()
                .zip(&self.q[i * dk..(i + 1) * dk])
            {
                *a = b * ei;
            }
        }
        let o = &mut o[..l * dv];
        o.fill(0.0);
        kern.gemm_acc(o, qe, st, dk, dv);
        cm.fill(0.0);
        for i in 0..l {
            dots(
                &kern,
                dk,
                &self.q[i * dk..(i + 1) * dk],
                &self.k,
                i + 1,
                &mut self.row,
            );
            for j in 0..=i {
                cm[i * l + j] = self.row[j] * self.decay[i * c + j];
            }
        }
        kern.gemm_acc(o, cm, u, l, dv);
        // S ← e^{G_last} S + Σ_j (e^{G_last - G_j} k_j) ⊗ u_j: row m of S
        // from column m of the decayed keys.
        // (Both decays are already in `egc` and the last row of `decay`.)
        let to_end = &self.decay[(l - 1) * c..(l - 1) * c + l];
        let whole = self.egc[l - 1];
        for a in st.iter_mut() {
            *a *= whole;
        }
        let kd = &mut self.kd[..dk * l];
        for (j, &f) in to_end.iter().enumerate() {
            for m in 0..dk {
                kd[m * l + j] = self.k[j * dk + m] * f;
            }
        }
        kern.gemm_acc(st, kd, u, l, dv);
    }
}

/// `out[j] = a · rows[j]` for the first `n` rows (of `dk` values), each the
/// dispatched [`Kernels::dot_f32`].
fn dots(kern: &Kernels, dk: usize, a: &[f32], rows: &[f32], n: usize, out: &mut [f32]) {
    let r = |j: usize| &rows[j * dk..(j + 1) * dk];
    let mut j = 0;
    while j + 4 <= n {
        out[j..j + 4].copy_from_slice(&kern.dot_f32_x4(a, [r(j), r(j + 1), r(j + 2), r(j + 3)]));
        j += 4;
    }
    while j < n {
        out[j] = kern.dot_f32(a, r(j));
        j += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// q, k, v, g, beta.
    type Owned = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);
    /// (outputs, final state).
    type Run = (Vec<f32>, Vec<f32>);

    /// Inputs as the layer makes them: unit-norm keys, scaled queries,
    /// decays in (0, 1], strengths in (0, 1).
    fn inputs(seed: u64, n: usize, s: DeltaShape) -> Owned {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut r = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
        };
        let unit = |v: &mut [f32]| {
            let n = v.iter().map(|a| a * a).sum::<f32>().sqrt().max(1e-3);
            v.iter_mut().for_each(|a| *a /= n);
        };
        let mut q: Vec<f32> = (0..n * s.heads * s.dk).map(|_| r()).collect();
        let mut k: Vec<f32> = (0..n * s.heads * s.dk).map(|_| r()).collect();
        q.chunks_mut(s.dk).for_each(|c| {
            unit(c);
            c.iter_mut().for_each(|a| *a /= (s.dk as f32).sqrt());
        });
        k.chunks_mut(s.dk).for_each(unit);
        let v = (0..n * s.heads * s.dv).map(|_| 2.0 * r()).collect();
        let g = (0..n * s.heads).map(|_| -0.6 * (r() + 1.0)).collect();
        let beta = (0..n * s.heads).map(|_| 0.5 + 0.49 * r()).collect();
        (q, k, v, g, beta)
    }

    fn both(seed: u64, n: usize, start: usize, s: DeltaShape) -> (Run, Run) {
        let (q, k, v, g, beta) = inputs(seed, n, s);
        let x = DeltaInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let init: Vec<f32> = inputs(
            seed + 1,
            1,
            DeltaShape {
                heads: s.state_len(),
                dk: 1,
                dv: 1,
            },
        )
        .2;
        let (mut s1, mut s2) = (init.clone(), init);
        let (mut o1, mut o2) = (vec![0f32; n * s.heads * s.dv], vec![0f32; n * s.heads * s.dv]);
        recurrent(s, x, &mut s1, &mut o1);
        chunked(s, x, start, &mut s2, &mut o2);
        ((o1, s1), (o2, s2))
    }

    fn close(a: &[f32], b: &[f32], what: &str) {
        let scale = a.iter().fold(1f32, |m, x| m.max(x.abs()));
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 2e-5 * scale,
                "{what}[{i}]: {x} vs {y} (scale {scale})"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The chunked form is the recurrence: same outputs and final state
        /// to rounding, for any length, start offset and head shape.
        #[test]
        fn chunked_equals_recurrent(seed in 0u64..1000, n in 1usize..200, start in 0usize..300,
                                     heads in 1usize..4, dk in 1usize..20, dv in 1usize..20) {
            let s = DeltaShape { heads, dk, dv };
            let ((o1, s1), (o2, s2)) = both(seed, n, start, s);
            close(&o1, &o2, "out");
            close(&s1, &s2, "state");
        }
    }

    /// Blocks follow absolute positions: a call split at a block boundary
    /// gives bit for bit what one call gives.
    #[test]
    fn split_at_a_block_boundary_is_bit_exact() {
        let s = DeltaShape {
            heads: 2,
            dk: 16,
            dv: 8,
        };
        let n = 3 * CHUNK + 5;
        let (q, k, v, g, beta) = inputs(7, n, s);
        let all = DeltaInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let mut s1 = vec![0f32; s.state_len()];
        let mut o1 = vec![0f32; n * s.heads * s.dv];
        chunked(s, all, 0, &mut s1, &mut o1);
        let cut = CHUNK + 17;
        let mut s2 = vec![0f32; s.state_len()];
        let mut o2 = vec![0f32; n * s.heads * s.dv];
        let part = |a: usize, b: usize| DeltaInputs {
            q: &q[a * s.heads * s.dk..b * s.heads * s.dk],
            k: &k[a * s.heads * s.dk..b * s.heads * s.dk],
            v: &v[a * s.heads * s.dv..b * s.heads * s.dv],
            g: &g[a * s.heads..b * s.heads],
            beta: &beta[a * s.heads..b * s.heads],
        };
        let (first, rest) = o2.split_at_mut(2 * CHUNK * s.heads * s.dv);
        chunked(s, part(0, 2 * CHUNK), 0, &mut s2, first);
        chunked(s, part(2 * CHUNK, n), 2 * CHUNK, &mut s2, rest);
        assert_eq!(o1, o2);
        assert_eq!(s1, s2);
        // Not at a boundary: the blocks regroup, equal to rounding only.
        let mut s3 = vec![0f32; s.state_len()];
        let mut o3 = vec![0f32; n * s.heads * s.dv];
        let (first, rest) = o3.split_at_mut(cut * s.heads * s.dv);
        chunked(s, part(0, cut), 0, &mut s3, first);
        chunked(s, part(cut, n), cut, &mut s3, rest);
        close(&o1, &o3, "out");
    }

    #[test]
    fn thread_count_does_not_change_the_chunked_form() {
        let s = DeltaShape {
            heads: 5,
            dk: 12,
            dv: 10,
        };
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| both(3, 150, 40, s).1)
        };
        assert_eq!(run(1), run(4));
    }
}
