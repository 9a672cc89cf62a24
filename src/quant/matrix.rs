//! The weight matrix every linear layer holds.

use rayon::prelude::*;

use super::{ByteStore, QFormat, QuantError, infer_format, quantize_matrix};
use crate::gguf::GgmlType;
use crate::kernels::ggml::GgmlActs;
use crate::kernels::{self, Kernels, QActs};

/// Storage of a matrix's weights.
#[derive(Clone, Debug)]
enum Data {
    F32(Vec<f32>),
    Packed(ByteStore),
}

/// A row-major `[rows, cols]` weight matrix in any supported format.
/// `y = W x` is the only operation models need from it.
#[derive(Clone, Debug)]
pub struct QMatrix {
    rows: usize,
    cols: usize,
    format: QFormat,
    data: Data,
    scales: Vec<f32>,
    /// Products go through int8-quantized activations and integer dot
    /// products ([`QMatrix::with_int8_acts`]); never set for f32 weights.
    int8_acts: bool,
}

/// Rows handed to one rayon task: enough work to amortise the task.
const ROWS_PER_TASK: usize = 16;

impl QMatrix {
    /// A full-precision matrix.
    pub fn from_f32(rows: usize, cols: usize, w: Vec<f32>) -> Result<Self, QuantError> {
        if w.len() != rows * cols {
            return Err(QuantError::Size {
                what: "f32 matrix",
                rows,
                cols,
                expected: rows * cols,
                got: w.len(),
            });
        }
        Ok(Self {
            rows,
            cols,
            format: QFormat::F32,
            data: Data::F32(w),
            scales: Vec::new(),
            int8_acts: false,
        })
    }

    /// Stores `w` in `format`, quantizing when it is not `F32`.
    pub fn quantize(rows: usize, cols: usize, w: Vec<f32>, format: QFormat) -> Result<Self, QuantError> {
        if format == QFormat::F32 {
            return Self::from_f32(rows, cols, w);
        }
        let (bytes, scales) = quantize_matrix(rows, cols, &w, format)?;
        Ok(Self {
            rows,
            cols,
            format,
            data: Data::Packed(ByteStore::from_vec(bytes)),
            scales,
            int8_acts: false,
        })
    }

    /// A stored quantized tensor: the format is recognised from the byte and
    /// scale counts, and every scale must be finite and positive.
    pub fn from_stored(
        rows: usize,
        cols: usize,
        bytes: ByteStore,
        scales: Vec<f32>,
    ) -> Result<Self, QuantError> {
        let format = infer_format(rows, cols, bytes.len(), scales.len())?;
        Self::from_parts(rows, cols, format, bytes, scales)
    }

    /// A matrix of ggml `ty` blocks as a GGUF stores it (`bytes` are `rows`
    /// rows of whole blocks, no separate scales). Products go through the
    /// activation quantization llama.cpp uses for `ty`, always: that is
    /// what the weights were quantized for, and what makes colibri's
    /// results comparable with llama.cpp's on the same file.
    pub fn from_ggml(rows: usize, cols: usize, ty: GgmlType, bytes: ByteStore) -> Result<Self, QuantError> {
        let bad = |reason: String| QuantError::Ggml { ty, cols, reason };
        // Supported types only: every kernel below is then defined.
        crate::kernels::ggml::vec_dot_type(ty).map_err(|e| bad(e.to_string()))?;
        let rb = crate::kernels::ggml::row_bytes(ty, cols).map_err(|e| bad(e.to_string()))?;
        if rows.checked_mul(rb) != Some(bytes.len()) {
            return Err(bad(format!(
                "{rows} rows need {} bytes, found {}",
                rows.saturating_mul(rb),
                bytes.len()
            )));
        }
        Ok(Self {
            rows,
            cols,
            format: QFormat::Ggml(ty),
            data: Data::Packed(bytes),
            scales: Vec::new(),
            int8_acts: false,
        })
    }

    /// A quantized tensor whose format is known (checked against the sizes).
    pub fn from_parts(
        rows: usize,
        cols: usize,
        format: QFormat,
        bytes: ByteStore,
        scales: Vec<f32>,
    ) -> Result<Self, QuantError> {
        let ok_bytes = rows.checked_mul(format.row_bytes(cols)) == Some(bytes.len());
        let ok_scales = rows.checked_mul(format.scales_per_row(cols)) == Some(scales.len());
        if let QFormat::Ggml(ty) = format {
            return Self::from_ggml(rows, cols, ty, bytes);
        }
        if format == QFormat::F32 || !ok_bytes || !ok_scales {
            return Err(QuantError::NoLayout {
                rows,
                cols,
                bytes: bytes.len(),
                scales: scales.len(),
            });
        }
        if let Some((index, &value)) = scales
            .iter()
            .enumerate()
            .find(|(_, s)| !(s.is_finite() && **s > 0.0))
        {
            return Err(QuantError::BadScale { index, value });
        }
        Ok(Self {
            rows,
            cols,
            format,
            data: Data::Packed(bytes),
            scales,
            int8_acts: false,
        })
    }

    /// Sends this matrix's `matvec` and `matmul` through int8-quantized
    /// activations (per block of 64, [`QActs`]) and integer dot products,
    /// as llama.cpp and the C engine's IDOT mode do for quantized weights:
    /// the quantized weights already carry an error of that order, and on
    /// AVX512-VNNI the integer kernels have twice the headroom over memory
    /// bandwidth. Results stay deterministic (independent of threads and
    /// batching) but are not the f32-activation values. A no-op for f32
    /// weights, which keep the exact path.
    pub fn with_int8_acts(mut self, on: bool) -> Self {
        // ggml blocks always multiply through their own activation types.
        self.int8_acts = on && !matches!(self.format, QFormat::F32 | QFormat::Ggml(_));
        self
    }

    /// A matrix of the rows `rows` of this one, in that order, stored as
    /// they are (no re-quantization, so the values are bit for bit the
    /// same): how a family whose checkpoint interleaves several projections
    /// in one tensor (Qwen3-Next's `in_proj_qkvz`, its gated `q_proj`)
    /// splits them at load, in any storage format. `None` when a row index
    /// is out of range.
    pub fn select_rows(&self, rows: &[usize]) -> Option<Self> {
        if rows.iter().any(|&r| r >= self.rows) {
            return None;
        }
        let cols = self.cols;
        let data = match &self.data {
            Data::F32(w) => Data::F32(
                rows.iter()
                    .flat_map(|&r| &w[r * cols..(r + 1) * cols])
                    .copied()
                    .collect(),
            ),
            Data::Packed(b) => {
                let rb = self.format.row_bytes(cols);
                let bytes = b.as_slice();
                let mut out = Vec::with_capacity(rows.len() * rb);
                for &r in rows {
                    out.extend_from_slice(bytes.get(r * rb..(r + 1) * rb)?);
                }
                Data::Packed(ByteStore::from_vec(out))
            }
        };
        let scales = if self.scales.is_empty() {
            Vec::new()
        } else {
            let per = self.scales.len() / self.rows.max(1);
            let mut out = Vec::with_capacity(rows.len() * per);
            for &r in rows {
                out.extend_from_slice(self.scales.get(r * per..(r + 1) * per)?);
            }
            out
        };
        Some(Self {
            rows: rows.len(),
            cols,
            format: self.format,
            data,
            scales,
            int8_acts: self.int8_acts,
        })
    }

    /// Whether products use int8-quantized activations.
    pub fn int8_acts(&self) -> bool {
        self.int8_acts
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn format(&self) -> QFormat {
        self.format
    }

    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Packed bytes of a quantized matrix (None for f32).
    pub fn packed(&self) -> Option<&[u8]> {
        match &self.data {
            Data::Packed(b) => Some(b.as_slice()),
            Data::F32(_) => None,
        }
    }

    /// Weights of an f32 matrix (None when quantized).
    pub fn f32_data(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(w) => Some(w),
            Data::Packed(_) => None,
        }
    }

    /// Memory the weights occupy.
    pub fn resident_bytes(&self) -> usize {
        let data = match &self.data {
            Data::F32(w) => w.len() * 4,
            Data::Packed(b) => b.len(),
        };
        data + self.scales.len() * 4
    }

    /// One row of the matrix as f32 (embedding lookup, tests).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        if let Some((ty, row)) = self.ggml_row(r) {
            // The row length was checked when the matrix was built.
            if crate::kernels::ggml::dequantize_row(ty, row, &mut out[..self.cols]).is_err() {
                out.fill(0.0);
            }
            return;
        }
        let row = self.row_ref(r);
        kernels::scalar::dequantize_row(&row, out);
    }

    /// Row `r`'s bytes when the matrix holds ggml blocks.
    fn ggml_row(&self, r: usize) -> Option<(GgmlType, &[u8])> {
        let ty = self.format.ggml()?;
        let Data::Packed(b) = &self.data else {
            return None;
        };
        let rb = self.format.row_bytes(self.cols);
        Some((ty, &b.as_slice()[r * rb..(r + 1) * rb]))
    }

    /// The activation `x` quantized for this matrix's ggml type.
    fn ggml_acts(ty: GgmlType, x: &[f32]) -> GgmlActs {
        // Cannot fail: the type is supported and `x` has `cols` values, a
        // whole number of blocks, both checked when the matrix was built.
        GgmlActs::for_weights(ty, x).unwrap_or_else(|e| panic!("ggml activations: {e}"))
    }

    /// `y = W x` for ggml blocks, parallel over rows; each row's value is
    /// [`Kernels::ggml_dot`] of it, whatever the split.
    fn ggml_matvec(&self, k: &Kernels, ty: GgmlType, x: &[f32], y: &mut [f32]) {
        let a = Self::ggml_acts(ty, x);
        let bytes = self.packed().unwrap_or(&[]);
        let rb = self.format.row_bytes(self.cols);
        y.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(c, ys)| {
            let first = c * ROWS_PER_TASK;
            k.ggml_dot_rows(ty, &bytes[first * rb..(first + ys.len()) * rb], &a, ys);
        });
    }

    /// `Y = X Wᵀ` for ggml blocks: each token quantized once (as matvec
    /// does), each block of rows read once for every token.
    fn ggml_matmul(&self, k: &Kernels, ty: GgmlType, x: &[f32], n: usize, y: &mut [f32]) {
        let cols = self.cols;
        let acts: Vec<GgmlActs> = (0..n)
            .map(|t| Self::ggml_acts(ty, &x[t * cols..(t + 1) * cols]))
            .collect();
        let bytes = self.packed().unwrap_or(&[]);
        let (rows, rb) = (self.rows, self.format.row_bytes(cols));
        let mut yt = vec![0f32; n * rows];
        yt.par_chunks_mut(ROWS_PER_TASK * n)
            .enumerate()
            .for_each(|(c, block)| {
                let (first, m) = (c * ROWS_PER_TASK, block.len() / n);
                let rows_bytes = &bytes[first * rb..(first + m) * rb];
                // Token-major in the block: `block[t * m + i]`.
                for (a, out) in acts.iter().zip(block.chunks_mut(m)) {
                    k.ggml_dot_rows(ty, rows_bytes, a, out);
                }
            });
        for (c, block) in yt.chunks(ROWS_PER_TASK * n).enumerate() {
            let (first, m) = (c * ROWS_PER_TASK, block.len() / n);
            for t in 0..n {
                y[t * rows + first..t * rows + first + m].copy_from_slice(&block[t * m..(t + 1) * m]);
            }
        }
    }

    fn row_ref(&self, r: usize) -> kernels::RowRef<'_> {
        match &self.data {
            Data::F32(w) => kernels::RowRef::F32(&w[r * self.cols..(r + 1) * self.cols]),
            Data::Packed(b) => {
                let rb = self.format.row_bytes(self.cols);
                let spr = self.format.scales_per_row(self.cols);
                kernels::RowRef::Packed {
                    format: self.format,
                    cols: self.cols,
                    bytes: &b.as_slice()[r * rb..(r + 1) * rb],
                    scales: &self.scales[r * spr..(r + 1) * spr],
                }
            }
        }
    }

    /// `row r · x` with f32 activations, for callers that need a few rows
    /// against different vectors (MLA's absorbed attention); the same value
    /// the exact matvec gives for that row.
    pub fn row_dot(&self, r: usize, x: &[f32]) -> f32 {
        if let Some((ty, row)) = self.ggml_row(r) {
            return kernels::dispatch().ggml_dot(ty, row, &Self::ggml_acts(ty, x));
        }
        kernels::dispatch().dot(&self.row_ref(r), x)
    }

    /// `y = W x`, parallel over rows. Each row's sum is computed in a fixed
    /// order, so the result does not depend on the thread count.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        self.matvec_with(&kernels::dispatch(), x, y);
    }

    /// [`QMatrix::matvec`] with a chosen kernel set (tests, benches).
    pub fn matvec_with(&self, k: &Kernels, x: &[f32], y: &mut [f32]) {
        if let Some(ty) = self.format.ggml() {
            assert_eq!(x.len(), self.cols, "matvec input length");
            assert_eq!(y.len(), self.rows, "matvec output length");
            return self.ggml_matvec(k, ty, x, y);
        }
        if self.int8_acts {
            return self.matvec_q8_with(k, x, y);
        }
        assert_eq!(x.len(), self.cols, "matvec input length");
        assert_eq!(y.len(), self.rows, "matvec output length");
        // Laid out once for the kernels, shared by every row.
        let a = k.prepare(self.format, x);
        y.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(c, ys)| {
            for (i, yv) in ys.iter_mut().enumerate() {
                *yv = k.dot_acts(&self.row_ref(c * ROWS_PER_TASK + i), &a);
            }
        });
    }

    /// `y ≈ W x` with `x` quantized to int8 per block of 64 columns (integer
    /// dot products where the CPU has them). Opt-in: faster on some CPUs but
    /// not token-exact against the f32 reference.
    pub fn matvec_q8(&self, x: &[f32], y: &mut [f32]) {
        self.matvec_q8_with(&kernels::dispatch(), x, y);
    }

    /// [`QMatrix::matvec_q8`] with a chosen kernel set.
    pub fn matvec_q8_with(&self, k: &Kernels, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), self.cols, "matvec input length");
        assert_eq!(y.len(), self.rows, "matvec output length");
        if let Some(ty) = self.format.ggml() {
            return self.ggml_matvec(k, ty, x, y);
        }
        let a = QActs::quantize_for(self.format, x);
        y.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(c, ys)| {
            let m = ys.len();
            self.q8_rows(k, c * ROWS_PER_TASK, m, &[&a], ys, m);
        });
    }

    /// `out[t * ldo + i] = row(first + i) · acts[t]` for `m` rows through
    /// the integer kernels ([`Kernels::dot_q8_rows`]).
    fn q8_rows(&self, k: &Kernels, first: usize, m: usize, acts: &[&QActs], out: &mut [f32], ldo: usize) {
        match &self.data {
            Data::Packed(b) => {
                let rb = self.format.row_bytes(self.cols);
                let spr = self.format.scales_per_row(self.cols);
                k.dot_q8_rows(
                    self.format,
                    self.cols,
                    &b.as_slice()[first * rb..(first + m) * rb],
                    &self.scales[first * spr..(first + m) * spr],
                    m,
                    acts,
                    out,
                    ldo,
                );
            }
            Data::F32(_) => {
                for (t, a) in acts.iter().enumerate() {
                    for i in 0..m {
                        out[t * ldo + i] = k.dot_q8(&self.row_ref(first + i), a);
                    }
                }
            }
        }
    }

    /// `Y = X Wᵀ` for `n` input rows (`x` is `[n, cols]`, `y` is `[n, rows]`):
    /// each weight row is read once for the whole batch, and every value
    /// equals what [`QMatrix::matvec`] gives for that token.
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) {
        self.matmul_with(&kernels::dispatch(), x, n, y);
    }

    /// [`QMatrix::matmul`] with a chosen kernel set.
    pub fn matmul_with(&self, k: &Kernels, x: &[f32], n: usize, y: &mut [f32]) {
        assert_eq!(x.len(), n * self.cols, "matmul input length");
        assert_eq!(y.len(), n * self.rows, "matmul output length");
        if n == 1 {
            return self.matvec_with(k, x, y);
        }
        if let Some(ty) = self.format.ggml() {
            return self.ggml_matmul(k, ty, x, n, y);
        }
        let cols = self.cols;
        if self.int8_acts {
            // Each token quantized once, as matvec does, so values match it.
            let acts: Vec<QActs> = (0..n)
                .map(|t| QActs::quantize_for(self.format, &x[t * cols..(t + 1) * cols]))
                .collect();
            return self.matmul_q8(k, &acts, y);
        }
        // Each token laid out once, as matvec does, so values match it.
        let acts: Vec<kernels::Acts<'_>> = (0..n)
            .map(|t| k.prepare(self.format, &x[t * cols..(t + 1) * cols]))
            .collect();
        self.by_rows(n, y, |row, out| k.dot_batch_acts(row, &acts, out));
    }

    /// `y[t] = W a_t` for prepared int8 activations (`y` is `[n, rows]`):
    /// one block of rows at a time, every token against it while its bytes
    /// are in cache.
    fn matmul_q8(&self, k: &Kernels, acts: &[QActs], y: &mut [f32]) {
        let (n, rows) = (acts.len(), self.rows);
        let refs: Vec<&QActs> = acts.iter().collect();
        let mut yt = vec![0f32; n * rows];
        yt.par_chunks_mut(ROWS_PER_TASK * n)
            .enumerate()
            .for_each(|(c, block)| {
                let m = block.len() / n;
                // Token-major for the kernel, then row-major into the block.
                let mut part = vec![0f32; n * m];
                self.q8_rows(k, c * ROWS_PER_TASK, m, &refs, &mut part, m);
                for t in 0..n {
                    for i in 0..m {
                        block[i * n + t] = part[t * m + i];
                    }
                }
            });
        for (r, ys) in yt.chunks_exact(n).enumerate() {
            for (t, &v) in ys.iter().enumerate() {
                y[t * rows + r] = v;
            }
        }
    }

    /// Runs `dot(row, out)` for every weight row in parallel, `out` being
    /// that row's `n` token results, then writes them token-major into `y`:
    /// each row is read once for the whole batch.
    fn by_rows(&self, n: usize, y: &mut [f32], dot: impl Fn(&kernels::RowRef<'_>, &mut [f32]) + Sync) {
        let rows = self.rows;
        let mut yt = vec![0f32; n * rows];
        yt.par_chunks_mut(ROWS_PER_TASK * n)
            .enumerate()
            .for_each(|(c, block)| {
                for (i, out) in block.chunks_mut(n).enumerate() {
                    dot(&self.row_ref(c * ROWS_PER_TASK + i), out);
                }
            });
        for (r, ys) in yt.chunks_exact(n).enumerate() {
            for (t, &v) in ys.iter().enumerate() {
                y[t * rows + r] = v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i * 7919 % 103) as f32 - 51.0) / 37.0)
            .collect()
    }

    /// `m.matmul` of the `n` rows of `x` equals each row's matvec bit for bit.
    fn assert_matmul_is_matvec(m: &QMatrix, k: &Kernels, x: &[f32], n: usize, what: &str) {
        let (rows, cols) = (m.rows(), m.cols());
        let mut ys = vec![0f32; n * rows];
        m.matmul_with(k, x, n, &mut ys);
        for t in 0..n {
            let mut one = vec![0f32; rows];
            m.matvec_with(k, &x[t * cols..(t + 1) * cols], &mut one);
            assert_eq!(&ys[t * rows..(t + 1) * rows], &one[..], "{what} token {t}");
        }
    }

    #[test]
    fn quantized_matvec_matches_dequantized_weights() {
        let (rows, cols) = (37, 129);
        let w = sample(rows, cols);
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
        for fmt in [
            QFormat::Int8,
            QFormat::Int4,
            QFormat::Int4Grouped { group: 32 },
            QFormat::Int2,
        ] {
            let q = QMatrix::quantize(rows, cols, w.clone(), fmt).unwrap();
            let mut yq = vec![0.0; rows];
            q.matvec(&x, &mut yq);
            let mut deq = vec![0.0; cols];
            for r in 0..rows {
                q.dequantize_row(r, &mut deq);
                // Round-to-nearest: every weight within half a step of its scale.
                let spr = fmt.scales_per_row(cols);
                for (j, (&a, &b)) in w[r * cols..(r + 1) * cols].iter().zip(&deq).enumerate() {
                    let s = q.scales()[r * spr + j / fmt.group_len(cols)];
                    assert!(
                        (a - b).abs() <= s * 0.5 + 1e-6 || fmt == QFormat::Int2,
                        "{fmt} r{r} c{j}"
                    );
                }
                let want: f32 = deq.iter().zip(&x).map(|(a, b)| a * b).sum();
                assert!(
                    (want - yq[r]).abs() < 1e-3 * (1.0 + want.abs()),
                    "{fmt}: {want} vs {}",
                    yq[r]
                );
            }
        }
    }

    #[test]
    fn matmul_matches_matvec() {
        let (rows, cols, n) = (19, 33, 3);
        let q = QMatrix::quantize(rows, cols, sample(rows, cols), QFormat::Int8).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut y = vec![0.0; n * rows];
        q.matmul(&x, n, &mut y);
        for t in 0..n {
            let mut yv = vec![0.0; rows];
            q.matvec(&x[t * cols..(t + 1) * cols], &mut yv);
            assert_eq!(&y[t * rows..(t + 1) * rows], &yv[..]);
        }
    }

    #[test]
    fn int8_acts_route_products_through_quantized_activations() {
        let (rows, cols, n) = (21, 300, 5);
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 23.0)
            .collect();
        for format in [
            QFormat::Int8,
            QFormat::Int4,
            QFormat::Int4Grouped { group: 64 },
            QFormat::Int2,
        ] {
            let exact = QMatrix::quantize(rows, cols, sample(rows, cols), format).unwrap();
            let m = exact.clone().with_int8_acts(true);
            assert!(m.int8_acts());
            for k in Kernels::available() {
                // matvec takes the integer path...
                let (mut want, mut got) = (vec![0f32; rows], vec![0f32; rows]);
                m.matvec_q8_with(&k, &x[..cols], &mut want);
                m.matvec_with(&k, &x[..cols], &mut got);
                assert_eq!(got, want, "{} {format}", k.name);
                // ...and matmul gives every token exactly its matvec.
                assert_matmul_is_matvec(&m, &k, &x, n, &format!("{} {format}", k.name));
                // Close to the f32-activation result, not equal to it.
                let mut e = vec![0f32; rows];
                exact.matvec_with(&k, &x[..cols], &mut e);
                assert_ne!(e, got, "{} {format}", k.name);
                for (a, b) in e.iter().zip(&got) {
                    assert!(
                        (a - b).abs() <= 0.05 * (1.0 + a.abs()),
                        "{} {format}: {a} vs {b}",
                        k.name
                    );
                }
            }
        }
        // F32 weights keep the exact path.
        let f = QMatrix::from_f32(rows, cols, sample(rows, cols))
            .unwrap()
            .with_int8_acts(true);
        assert!(!f.int8_acts());
    }

    /// ggml Q8_0 / Q4_0 rows: every matvec row is the ggml reference dot
    /// of that row (to its rounding), matmul gives each token exactly its
    /// matvec, rows decode as ggml decodes them, and a matrix whose byte
    /// count is not whole rows is refused.
    #[test]
    fn ggml_blocks_multiply_as_the_reference_does() {
        use crate::kernels::ggml::{GgmlActs, dequantize_row, vec_dot, vec_dot_magnitude};
        let (rows, cols, n) = (21, 96, 3);
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
            let rb = crate::kernels::ggml::row_bytes(ty, cols).unwrap();
            let mut bytes = vec![0u8; rows * rb];
            let bs = ty.type_size() as usize;
            for (i, b) in bytes.chunks_mut(bs).enumerate() {
                // A finite f16 scale, then pseudo-random codes.
                let d = half::f16::from_f32(0.01 + (i % 7) as f32 * 0.003);
                b[..2].copy_from_slice(&d.to_le_bytes());
                for (j, v) in b[2..].iter_mut().enumerate() {
                    *v = ((i * 31 + j * 17) % 251) as u8;
                }
            }
            let m = QMatrix::from_ggml(rows, cols, ty, ByteStore::from_vec(bytes.clone())).unwrap();
            assert_eq!(m.format(), QFormat::Ggml(ty));
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 23.0)
                .collect();
            for k in Kernels::available() {
                let mut y = vec![0f32; rows];
                m.matvec_with(&k, &x[..cols], &mut y);
                let acts = GgmlActs::for_weights(ty, &x[..cols]).unwrap();
                for (r, &v) in y.iter().enumerate() {
                    let row = &bytes[r * rb..(r + 1) * rb];
                    let want = vec_dot(ty, row, &acts).unwrap();
                    let mag = vec_dot_magnitude(ty, row, &acts).unwrap();
                    assert!(
                        (v - want).abs() <= 1e-5 * mag,
                        "{} {ty} row {r}: {v} vs {want}",
                        k.name
                    );
                }
                assert_matmul_is_matvec(&m, &k, &x, n, &format!("{} {ty}", k.name));
            }
            let (mut got, mut want) = (vec![0f32; cols], vec![0f32; cols]);
            m.dequantize_row(5, &mut got);
            dequantize_row(ty, &bytes[5 * rb..6 * rb], &mut want).unwrap();
            assert_eq!(got, want);
            assert!(QMatrix::from_ggml(rows, cols, ty, ByteStore::from_vec(vec![0; rows * rb - 1])).is_err());
            assert!(QMatrix::from_ggml(rows, cols + 1, ty, ByteStore::from_vec(bytes)).is_err());
            // ggml blocks keep their own activation types.
            assert!(!m.with_int8_acts(true).int8_acts());
        }
        assert!(QMatrix::from_ggml(1, 32, GgmlType::Q8_1, ByteStore::from_vec(vec![0; 36])).is_err());
        assert!(QMatrix::quantize(1, 32, vec![0.0; 32], QFormat::Ggml(GgmlType::Q8_0)).is_err());
    }
}
