//! A Gated DeltaNet layer over a batch of sequences: the projections run
//! once over every new row; the causal convolution, the delta rule and the
//! recurrent state stay per sequence.
//!
//! Per token: `qkv = conv(W_qkv x)` (depthwise causal, SiLU), q and k
//! L2-normalised per head, `beta = sigmoid(W_b x)`,
//! `g = -exp(A_log) · softplus(W_a x + dt_bias)`, the delta rule
//! ([`super::delta_rule`]) from q, k, v, g, beta, then a per-head RMSNorm
//! gated by `silu(W_z x)` and the output projection.
//!
//! Which form of the delta rule runs: the last token of every forward, and
//! every token of a forward shorter than [`delta_rule::CHUNK`] + 1 tokens,
//! go through the recurrent form; the tokens before the last of a longer
//! forward (a prompt, a prefill chunk) through the chunked form. So decode,
//! draft verification and short turns are bit for bit what token-by-token
//! decoding gives, and a long prompt is prefilled in blocks; the two forms
//! agree to rounding (as transformers' do), so where a long prompt is split
//! differently (prefix reuse, another prefill chunk size that is not a
//! multiple of 64) logits can move by rounding.

use super::config::LinearShape;
use super::delta_rule::{self, DeltaInputs, DeltaShape};
use super::state::{HybridState, LinearState};
use super::weights::LinearWeights;
use crate::model::ops::{sigmoid, silu};

/// torch's `softplus` (threshold 20: above it, the identity).
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// `x / sqrt(Σx² + 1e-6)` in place (the L2 norm of the FLA kernels).
fn l2_normalise(x: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss + 1e-6).sqrt();
    for v in x {
        *v *= inv;
    }
}

/// The layer's output `[Σ n_i, hidden]` for the new rows `xn` of the
/// sequences `seqs[i] = (n_i, state_i)`; `linear` is this layer's index
/// among the linear layers (its slot in each state).
pub fn forward(
    s: &LinearShape,
    w: &LinearWeights,
    eps: f32,
    hidden: usize,
    linear: usize,
    xn: &[f32],
    seqs: &mut [(usize, &mut HybridState)],
) -> Vec<f32> {
    let n: usize = seqs.iter().map(|(m, _)| *m).sum();
    let conv_dim = s.conv_dim();
    let (nk, nv, dk, dv) = (s.key_heads, s.value_heads, s.key_dim, s.value_dim);
    let vdim = nv * dv;
    let mut qkv = vec![0f32; n * conv_dim];
    let mut z = vec![0f32; n * vdim];
    let mut b = vec![0f32; n * nv];
    let mut a = vec![0f32; n * nv];
    w.qkv.matmul(xn, n, &mut qkv);
    w.z.matmul(xn, n, &mut z);
    w.b.matmul(xn, n, &mut b);
    w.a.matmul(xn, n, &mut a);
    let beta: Vec<f32> = b.iter().map(|&x| sigmoid(x)).collect();
    let g: Vec<f32> = a
        .chunks_exact(nv)
        .flat_map(|row| {
            row.iter()
                .zip(&w.neg_a)
                .zip(&w.dt_bias)
                .map(|((&x, &na), &dt)| na * softplus(x + dt))
        })
        .collect();
    let shape = DeltaShape { heads: nv, dk, dv };
    let r = nv / nk;
    let scale = (dk as f32).powf(-0.5);
    let mut core = vec![0f32; n * vdim];
    let mut row0 = 0;
    for (m, st) in seqs.iter_mut() {
        let m = *m;
        let rows = row0..row0 + m;
        row0 += m;
        if m == 0 {
            continue;
        }
        let (conv_out, conv_before_last) = convolve(
            s,
            w,
            &mut st.linear[linear],
            &qkv[rows.start * conv_dim..rows.end * conv_dim],
        );
        // q, k per value head (key heads repeated), normalised and q scaled.
        let mut q = vec![0f32; m * nv * dk];
        let mut k = vec![0f32; m * nv * dk];
        let mut v = vec![0f32; m * vdim];
        for t in 0..m {
            let row = &conv_out[t * conv_dim..(t + 1) * conv_dim];
            let (qs, rest) = row.split_at(nk * dk);
            let (ks, vs) = rest.split_at(nk * dk);
            for head in 0..nv {
                let kh = if w.tiled_heads { head % nk } else { head / r };
                let qd = &mut q[(t * nv + head) * dk..(t * nv + head + 1) * dk];
                qd.copy_from_slice(&qs[kh * dk..(kh + 1) * dk]);
                l2_normalise(qd);
                for x in qd.iter_mut() {
                    *x *= scale;
                }
                let kd = &mut k[(t * nv + head) * dk..(t * nv + head + 1) * dk];
                kd.copy_from_slice(&ks[kh * dk..(kh + 1) * dk]);
                l2_normalise(kd);
            }
            v[t * vdim..(t + 1) * vdim].copy_from_slice(vs);
        }
        let out = &mut core[rows.start * vdim..rows.end * vdim];
        let (gs, bs) = (
            &g[rows.start * nv..rows.end * nv],
            &beta[rows.start * nv..rows.end * nv],
        );
        let inputs = |from: usize, to: usize| DeltaInputs {
            q: &q[from * nv * dk..to * nv * dk],
            k: &k[from * nv * dk..to * nv * dk],
            v: &v[from * vdim..to * vdim],
            g: &gs[from * nv..to * nv],
            beta: &bs[from * nv..to * nv],
        };
        // Where this forward starts: the full-attention cache commits its
        // positions only after every layer has run.
        let start = st.kv.len();
        let state = &mut st.linear[linear].delta;
        if m == 1 {
            delta_rule::recurrent(shape, inputs(0, 1), state, out);
        } else {
            // Up to the last token, then a copy for the checkpoint before
            // it (see `HybridState`), then the last token.
            let (head_out, last_out) = out.split_at_mut((m - 1) * vdim);
            if m > delta_rule::CHUNK {
                delta_rule::chunked(shape, inputs(0, m - 1), start, state, head_out);
            } else {
                delta_rule::recurrent(shape, inputs(0, m - 1), state, head_out);
            }
            let snapshot = LinearState {
                conv: conv_before_last,
                delta: st.linear[linear].delta.clone(),
            };
            st.push_pending(snapshot);
            delta_rule::recurrent(shape, inputs(m - 1, m), &mut st.linear[linear].delta, last_out);
        }
    }
    // Per-head RMSNorm gated by silu(z), then the output projection.
    for (o, zg) in core.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
        let ss: f32 = o.iter().map(|x| x * x).sum::<f32>() / dv as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for ((x, &wt), &zz) in o.iter_mut().zip(&w.norm).zip(zg) {
            *x = wt * (*x * inv) * silu(zz);
        }
    }
    let mut out = vec![0f32; n * hidden];
    w.out.matmul(&core, n, &mut out);
    out
}

/// The depthwise causal convolution of one sequence's new rows `x`
/// (`[m, conv_dim]`) after the inputs kept in `st.conv`, with SiLU; the
/// state then keeps the last `kernel - 1` inputs. Also returns the state as
/// it was before the last row (for a checkpoint there).
fn convolve(s: &LinearShape, w: &LinearWeights, st: &mut LinearState, x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let c = s.conv_dim();
    let kk = s.conv_kernel;
    let m = x.len() / c;
    let keep = kk - 1;
    // The past inputs, then the new ones: `[keep + m, c]`.
    let mut all = Vec::with_capacity((keep + m) * c);
    all.extend_from_slice(&st.conv);
    all.extend_from_slice(x);
    let mut out = vec![0f32; m * c];
    for t in 0..m {
        let o = &mut out[t * c..(t + 1) * c];
        for j in 0..kk {
            let src = &all[(t + j) * c..(t + j + 1) * c];
            for (ch, (acc, &xv)) in o.iter_mut().zip(src).enumerate() {
                *acc += w.conv[ch * kk + j] * xv;
            }
        }
        for v in o.iter_mut() {
            *v = silu(*v);
        }
    }
    st.conv.copy_from_slice(&all[m * c..(m + keep) * c]);
    let before_last = all[(m - 1) * c..(m - 1 + keep) * c].to_vec();
    (out, before_last)
}
