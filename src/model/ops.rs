//! Element-wise and small reductions shared by model families, written to
//! follow transformers' float32 arithmetic closely (same formulas, same order
//! where it matters) so greedy tokens match the oracle.

/// RMSNorm: `x / sqrt(mean(x²) + eps) * weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (v * inv);
    }
}

/// In-place RMSNorm.
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = w * (*v * inv);
    }
}

/// Numerically stable softmax in place.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `Σ a_i b_i` in a fixed order that vectorizes: 16 partial sums over the
/// whole slices (lane `i % 16`), then those summed pairwise, then the tail.
/// A plain left-to-right float sum is one long dependency chain the
/// compiler may not reorder; attention scores take this instead, and since
/// the order depends only on the length, results stay deterministic.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0] + ar.iter().zip(br).map(|(x, y)| x * y).sum::<f32>()
}

/// The logistic function 1 / (1 + e^-x).
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// SiLU(x) = x · sigmoid(x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Indices of the `k` largest values, largest first; ties go to the lower
/// index (stable, so routing never depends on anything but the scores).
pub fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Index of the largest value (first on ties).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best
}

/// Rotary embedding tables for the "default" rope type, computed as
/// transformers does: `inv_freq = 1 / theta^(2i/d)` in f32, angle =
/// `pos · inv_freq` in f32.
///
/// `dim` is the number of rotated dimensions: the whole head, or its first
/// part with a partial rotary factor (GLM-4.x); the rest passes through.
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f32>,
    /// Multiplies cos and sin (YaRN's attention factor; 1 otherwise).
    scale: f32,
}

impl Rope {
    pub fn new(dim: usize, theta: f64) -> Self {
        Self {
            inv_freq: base_freqs(dim, theta).iter().map(|p| 1.0 / p).collect(),
            scale: 1.0,
        }
    }

    /// The tables for a config's `rope_scaling` (plain RoPE when `None`).
    pub fn scaled(dim: usize, theta: f64, scaling: Option<&crate::model::moe_decoder::RopeScaling>) -> Self {
        use crate::model::moe_decoder::RopeScaling;
        match scaling {
            None => Self::new(dim, theta),
            Some(RopeScaling::Yarn(y)) => Self::yarn(dim, theta, y),
            Some(RopeScaling::Linear { factor, .. }) => Self::linear(dim, theta, *factor),
        }
    }

    /// Linear scaling (transformers' `_compute_linear_scaling_rope_parameters`):
    /// the default frequencies divided by `factor` in f32, so position `p`
    /// rotates as `p / factor` did.
    pub fn linear(dim: usize, theta: f64, factor: f64) -> Self {
        let factor = factor as f32;
        Self {
            inv_freq: base_freqs(dim, theta).iter().map(|p| 1.0 / p / factor).collect(),
            scale: 1.0,
        }
    }

    /// The inverse frequency of each rotated pair (transformers' `inv_freq`).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// What cos and sin are multiplied by (transformers' `attention_scaling`).
    pub fn attention_scale(&self) -> f32 {
        self.scale
    }

    /// YaRN (transformers' `_compute_yarn_parameters`): frequencies blend
    /// from extrapolated (high frequencies) to interpolated by `factor`
    /// (low frequencies) over a linear ramp between the correction
    /// dimensions of `beta_fast` and `beta_slow` rotations; cos and sin are
    /// scaled by the attention factor.
    pub fn yarn(dim: usize, theta: f64, y: &crate::model::moe_decoder::Yarn) -> Self {
        let pos_freqs = base_freqs(dim, theta);
        let correction = |rotations: f64| {
            (dim as f64
                * (y.original_max_position_embeddings as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln())
                / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (correction(y.beta_fast), correction(y.beta_slow));
        if y.truncate {
            low = low.floor();
            high = high.ceil();
        }
        let (low, high) = (low.max(0.0), high.min(dim as f64 - 1.0));
        let span = if low == high {
            high + 0.001 - low
        } else {
            high - low
        };
        let factor = y.factor as f32;
        let inv_freq = pos_freqs
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let ramp = ((i as f32 - low as f32) / span as f32).clamp(0.0, 1.0);
                let extrapolation = 1.0 - ramp;
                let interp = 1.0 / (factor * p);
                let extrap = 1.0 / p;
                interp * (1.0 - extrapolation) + extrap * extrapolation
            })
            .collect();
        Self {
            inv_freq,
            scale: y.attention_factor as f32,
        }
    }

    /// Rotates one head vector in place (rotate-half convention: pairs
    /// `(i, i + d/2)`), for position `pos`.
    pub fn apply_half(&self, v: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        for i in 0..half {
            let angle = pos as f32 * self.inv_freq[i];
            let (s, c) = angle.sin_cos();
            let (s, c) = (s * self.scale, c * self.scale);
            let (a, b) = (v[i], v[i + half]);
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }

    /// Rotates one head vector in place with the interleaved convention
    /// (pairs `(2i, 2i+1)`), used by MLA models.
    pub fn apply_interleaved(&self, v: &mut [f32], pos: usize) {
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let angle = pos as f32 * f;
            let (s, c) = angle.sin_cos();
            let (s, c) = (s * self.scale, c * self.scale);
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            v[2 * i] = a * c - b * s;
            v[2 * i + 1] = b * c + a * s;
        }
    }
}

/// `theta^(2i/dim)` for each rotated pair, in f32 as transformers computes it.
fn base_freqs(dim: usize, theta: f64) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / dim as f32;
            (theta as f32).powf(exponent)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_stable_on_ties() {
        assert_eq!(top_k(&[0.1, 0.5, 0.5, 0.2], 2), vec![1, 2]);
        assert_eq!(top_k(&[0.3, 0.1, 0.9], 1), vec![2]);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0, -1000.0];
        softmax_inplace(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] == 0.0);
    }

    #[test]
    fn rope_at_zero_is_identity_and_preserves_norm() {
        let r = Rope::new(8, 10000.0);
        let mut v: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let orig = v.clone();
        r.apply_half(&mut v, 0);
        assert_eq!(v, orig);
        r.apply_half(&mut v, 17);
        let n0: f32 = orig.iter().map(|x| x * x).sum();
        let n1: f32 = v.iter().map(|x| x * x).sum();
        assert!((n0 - n1).abs() < 1e-3);
    }

    /// Expected values from transformers 4.57.1 and 5.23.0 (identical),
    /// printed by tools/rope_scaling_oracle.py: head_dim 128, theta 1e6,
    /// inv_freq at pairs IDX and `cos(p * inv_freq) * attention_factor` at
    /// long positions.
    const IDX: [usize; 8] = [0, 1, 7, 20, 31, 40, 50, 63];

    fn check(rope: &Rope, att: f64, inv: [f64; 8], cos: &[(usize, [f64; 8])]) {
        assert!(
            (rope.attention_scale() as f64 - att).abs() < 1e-6,
            "{}",
            rope.attention_scale()
        );
        for (k, &i) in IDX.iter().enumerate() {
            let got = rope.inv_freq()[i] as f64;
            assert!(
                (got - inv[k]).abs() <= inv[k] * 2e-7,
                "inv_freq[{i}] {got} vs {}",
                inv[k]
            );
        }
        for (pos, want) in cos {
            // What apply_half multiplies by: the f32 angle's cos, scaled.
            for (k, &i) in IDX.iter().enumerate() {
                let angle = *pos as f32 * rope.inv_freq()[i];
                let got = (angle.cos() * rope.attention_scale()) as f64;
                assert!(
                    (got - want[k]).abs() < 2e-6,
                    "pos {pos} pair {i}: {got} vs {}",
                    want[k]
                );
            }
        }
    }

    #[test]
    fn yarn_matches_transformers_at_qwen3s_128k() {
        let cfg = serde_json::json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768});
        let path = std::path::Path::new("c.json");
        let scaling = crate::model::moe_decoder::parse_rope(path, Some(&cfg), 40960)
            .unwrap()
            .unwrap();
        let rope = Rope::scaled(128, 1e6, Some(&scaling));
        check(
            &rope,
            1.138629436111989,
            [
                1.0,
                0.8058422207832336,
                0.22067339718341827,
                0.01333521492779255,
                0.000802959781140089,
                4.4456985051510856e-05,
                5.133812464919174e-06,
                3.102344408034696e-07,
            ],
            &[
                (
                    40000,
                    [
                        0.3673075735569,
                        0.6634072065353394,
                        0.6717249751091003,
                        0.8979831337928772,
                        0.8690599799156189,
                        -0.2345549613237381,
                        1.1147059202194214,
                        1.1385416984558105,
                    ],
                ),
                (
                    131071,
                    [
                        -0.9313800930976868,
                        -0.6717970371246338,
                        -0.8247317671775818,
                        0.4811994731426239,
                        0.001582070253789425,
                        1.0222034454345703,
                        0.8904324769973755,
                        1.1376882791519165,
                    ],
                ),
            ],
        );
        assert_eq!(scaling.extended_positions(40960), 131072);
    }

    #[test]
    fn linear_matches_transformers_at_long_positions() {
        let cfg = serde_json::json!({"rope_type": "linear", "factor": 2.0});
        let path = std::path::Path::new("c.json");
        let scaling = crate::model::moe_decoder::parse_rope(path, Some(&cfg), 32768)
            .unwrap()
            .unwrap();
        let rope = Rope::scaled(128, 1e6, Some(&scaling));
        check(
            &rope,
            1.0,
            [
                0.5,
                0.4029211103916168,
                0.11033669859170914,
                0.006667607463896275,
                0.0006204689270816743,
                8.891397010302171e-05,
                1.0267624929838348e-05,
                6.204688816069392e-07,
            ],
            &[
                (
                    40000,
                    [
                        0.8131996989250183,
                        0.8895607590675354,
                        -0.8916113972663879,
                        -0.9456883072853088,
                        0.9511108994483948,
                        -0.9151299595832825,
                        0.916839599609375,
                        0.9996920228004456,
                    ],
                ),
                (
                    131071,
                    [
                        -0.3016757369041443,
                        0.4527665078639984,
                        -0.37126827239990234,
                        0.8433898687362671,
                        0.9373250007629395,
                        0.6119065880775452,
                        0.22311459481716156,
                        0.9966949224472046,
                    ],
                ),
            ],
        );
        // No original context named: the declared one is taken as the scaled length.
        assert_eq!(scaling.extended_positions(32768), 32768);
        let named = serde_json::json!({"rope_type": "linear", "factor": 2.0, "original_max_position_embeddings": 32768});
        let s = crate::model::moe_decoder::parse_rope(path, Some(&named), 32768)
            .unwrap()
            .unwrap();
        assert_eq!(s.extended_positions(32768), 65536);
    }
}
