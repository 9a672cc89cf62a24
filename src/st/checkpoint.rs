//! A checkpoint directory: its safetensors files, memory mapped and indexed.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use colibri_actors::{FileId, Piece};
use memmap2::{Mmap, UncheckedAdvice};
use safetensors::Dtype;

use super::decode::{decode_f32, matrix_from_bytes, name_tensor};
use super::header::parse_header;
use super::{PAD_PREFIX, SCALE_SUFFIX, StError};
use crate::gguf::GgmlType;
use crate::progress::Progress;
use crate::quant::{ByteStore, QFormat, QMatrix};

/// Where one tensor lives and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorMeta {
    /// For ggml blocks ([`TensorMeta::block`]) `U8`, the bytes as stored.
    pub dtype: Dtype,
    /// ggml's block type when the tensor comes from a GGUF file and is
    /// quantized there (its scales inside the blocks, no `.qs` tensor);
    /// `None` for safetensors tensors and float GGUF tensors.
    pub block: Option<GgmlType>,
    pub shape: Vec<usize>,
    /// Index into [`Checkpoint::files`].
    pub file: FileId,
    /// Absolute byte offset of the tensor's data in its file.
    pub offset: u64,
    /// Byte length of the data.
    pub len: u64,
}

impl TensorMeta {
    /// The byte range, as the runtime's expert map wants it.
    pub fn piece(&self) -> Piece {
        Piece {
            file: self.file,
            offset: self.offset,
            len: self.len,
        }
    }
}

/// A weight matrix as stored: the tensor itself and, when quantized, its
/// `.qs` scale tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct MatrixParts {
    pub weight: TensorMeta,
    pub scales: Option<TensorMeta>,
}

impl MatrixParts {
    /// Byte ranges in read order: the weight, then the scales if any.
    pub fn pieces(&self) -> Vec<Piece> {
        std::iter::once(self.weight.piece())
            .chain(self.scales.as_ref().map(TensorMeta::piece))
            .collect()
    }
}

/// Every tensor of a Hugging Face checkpoint directory or a colibri container.
pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<PathBuf>,
    maps: Vec<Arc<Mmap>>,
    tensors: BTreeMap<String, TensorMeta>,
    metadata: BTreeMap<String, String>,
    /// Tensors of other towers left out ([`text_tower`]).
    skipped_towers: usize,
    /// Told the bytes copied out so far ([`Checkpoint::with_progress`]).
    progress: Option<Arc<dyn Progress>>,
    copied: AtomicU64,
}

/// The language model's prefix in a multimodal release
/// (`…ForConditionalGeneration`: Qwen3.5, Qwen3-VL, Llama 4 …).
const TEXT_PREFIX: &str = "model.language_model.";

/// Prefixes of the other towers of a multimodal release.
const OTHER_TOWERS: [&str; 4] = [
    "model.visual.",
    "visual.",
    "model.vision_tower.",
    "model.audio_tower.",
];

/// A multimodal release's tensors under the names of its text-only
/// sibling: `model.language_model.X` is read as `model.X` (the head and
/// everything else keep their names) and the other towers are dropped, so
/// every family reads one naming whichever release it is given. A
/// checkpoint without the prefix is returned as it is. Also returns how
/// many tensors were dropped.
fn text_tower(tensors: BTreeMap<String, TensorMeta>) -> (BTreeMap<String, TensorMeta>, usize) {
    if !tensors.keys().any(|k| k.starts_with(TEXT_PREFIX)) {
        return (tensors, 0);
    }
    let mut out = BTreeMap::new();
    let mut skipped = 0usize;
    for (name, meta) in tensors {
        if OTHER_TOWERS.iter().any(|p| name.starts_with(p)) {
            skipped += 1;
            continue;
        }
        let name = match name.strip_prefix(TEXT_PREFIX) {
            Some(rest) => format!("model.{rest}"),
            None => name,
        };
        out.insert(name, meta);
    }
    (out, skipped)
}

const INDEX_FILE: &str = "model.safetensors.index.json";
const SINGLE_FILE: &str = "model.safetensors";

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("files", &self.files)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl Checkpoint {
    /// Opens `dir`: the shards listed in `model.safetensors.index.json`, else
    /// `model.safetensors`, else every `*.safetensors` file (sorted by name).
    /// Every header is validated here; a file that passes can be read
    /// without further bounds surprises (as long as nobody modifies it).
    /// A path to a single `.safetensors` file is accepted too.
    pub fn open(dir: &Path) -> Result<Self, StError> {
        if dir.is_file() {
            let parent = dir.parent().unwrap_or(Path::new("."));
            return Self::open_files(parent, vec![dir.to_path_buf()]);
        }
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            return Self::open_index(dir, &index);
        }
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            return Self::open_files(dir, vec![single]);
        }
        let io = |source| StError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            if path.extension().is_some_and(|e| e == "safetensors") && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        if files.is_empty() {
            return Err(StError::NoFiles {
                path: dir.to_path_buf(),
            });
        }
        Self::open_files(dir, files)
    }

    fn open_index(dir: &Path, index: &Path) -> Result<Self, StError> {
        let bad = |reason: String| StError::Index {
            path: index.to_path_buf(),
            reason,
        };
        let text = std::fs::read(index).map_err(|source| StError::Io {
            path: index.to_path_buf(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
        let mut wanted: Vec<(String, String)> = Vec::with_capacity(map.len());
        for (tensor, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| bad(format!("tensor {tensor:?} maps to a non-string")))?;
            let plain = Path::new(file)
                .file_name()
                .is_some_and(|n| n == std::ffi::OsStr::new(file));
            if !plain || file == ".." {
                return Err(bad(format!(
                    "tensor {tensor:?} maps to {file:?}, which is not a file name in the directory"
                )));
            }
            wanted.push((tensor.clone(), file.to_string()));
        }
        let mut names: Vec<&str> = wanted.iter().map(|(_, f)| f.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        if names.is_empty() {
            return Err(bad("weight_map is empty".into()));
        }
        let mut files = Vec::with_capacity(names.len());
        for name in &names {
            let path = dir.join(name);
            if !path.is_file() {
                let tensor = wanted
                    .iter()
                    .find(|(_, f)| f == name)
                    .map_or("", |(t, _)| t.as_str());
                return Err(bad(format!(
                    "shard {} (holding tensor {tensor:?}) does not exist",
                    path.display()
                )));
            }
            files.push(path);
        }
        let ck = Self::open_files(dir, files)?;
        for (tensor, file) in &wanted {
            let in_file = ck
                .tensors
                .get(tensor)
                .map(|m| &ck.files[m.file as usize])
                .filter(|p| p.file_name().is_some_and(|n| n == std::ffi::OsStr::new(file)));
            if in_file.is_none() {
                return Err(StError::Index {
                    path: index.to_path_buf(),
                    reason: format!(
                        "tensor {tensor:?} is listed in shard {file:?} but that shard does not hold it"
                    ),
                });
            }
        }
        Ok(ck)
    }

    /// Opens an explicit list of safetensors files as one checkpoint rooted
    /// at `dir` (for configuration files).
    pub fn open_files(dir: &Path, files: Vec<PathBuf>) -> Result<Self, StError> {
        let mut maps = Vec::with_capacity(files.len());
        let mut tensors: BTreeMap<String, TensorMeta> = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        for (id, path) in files.iter().enumerate() {
            let file_id = FileId::try_from(id).map_err(|_| StError::header(path, "too many files"))?;
            let map = map_file(path)?;
            let header = parse_header(path, &map)?;
            if id == 0 {
                metadata = header.metadata.clone();
            }
            for t in header.tensors {
                if t.name.starts_with(PAD_PREFIX) {
                    continue;
                }
                let meta = TensorMeta {
                    dtype: t.dtype,
                    block: None,
                    shape: t.shape,
                    file: file_id,
                    offset: header.data_start + t.start,
                    len: t.end - t.start,
                };
                if let Some(prev) = tensors.get(&t.name) {
                    return Err(StError::Duplicate {
                        tensor: t.name,
                        first: files[prev.file as usize].clone(),
                        second: path.clone(),
                    });
                }
                tensors.insert(t.name, meta);
            }
            maps.push(Arc::new(map));
        }
        if let Some(first) = files.first() {
            super::ggml_blocks::apply(first, &mut tensors, &metadata)?;
        }
        Ok(Self::assemble(dir, files, maps, tensors, metadata))
    }

    fn assemble(
        dir: &Path,
        files: Vec<PathBuf>,
        maps: Vec<Arc<Mmap>>,
        tensors: BTreeMap<String, TensorMeta>,
        metadata: BTreeMap<String, String>,
    ) -> Self {
        let (tensors, skipped_towers) = text_tower(tensors);
        Self {
            dir: dir.to_path_buf(),
            files,
            maps,
            skipped_towers,
            tensors,
            metadata,
            progress: None,
            copied: AtomicU64::new(0),
        }
    }

    /// How many tensors of other towers (vision, audio) a multimodal
    /// release held that are not loaded: reported at load, so a user knows
    /// the images half of the checkpoint is not run.
    pub fn skipped_tower_tensors(&self) -> usize {
        self.skipped_towers
    }

    /// A checkpoint over `files` whose tensors were indexed by someone else:
    /// a GGUF model's, under the names its family's loader reads
    /// ([`crate::gguf::checkpoint`]). Every range is checked against its
    /// file here, so later reads cannot fall outside a mapping.
    pub fn from_index(
        dir: &Path,
        files: Vec<PathBuf>,
        tensors: BTreeMap<String, TensorMeta>,
        metadata: BTreeMap<String, String>,
    ) -> Result<Self, StError> {
        let maps = files
            .iter()
            .map(|p| map_file(p).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        for (name, meta) in &tensors {
            let inside = maps.get(meta.file as usize).is_some_and(|m| {
                meta.offset
                    .checked_add(meta.len)
                    .is_some_and(|end| end <= m.len() as u64)
            });
            if !inside {
                let path = files.get(meta.file as usize).map_or(dir, PathBuf::as_path);
                return Err(StError::tensor(path, name, "data lies outside the file"));
            }
        }
        Ok(Self::assemble(dir, files, maps, tensors, metadata))
    }

    /// Reports every tensor copied out of the files ([`Self::f32_tensor`],
    /// [`Self::matrix`]: what loading the dense weights does, and what takes
    /// long on a large model) to `progress`, once [`Self::start_progress`]
    /// named the phase.
    pub fn with_progress(mut self, progress: Arc<dyn Progress>) -> Self {
        self.progress = Some(progress);
        self
    }

    /// Starts the phase `phase` of the progress given to
    /// [`Self::with_progress`] (if any), expecting every tensor to be
    /// copied except the `skipped` bytes (the routed experts, which stay in
    /// the files).
    pub fn start_progress(&self, phase: &str, skipped: u64) {
        if let Some(p) = &self.progress {
            p.start(phase, self.total_bytes().saturating_sub(skipped));
        }
    }

    /// Bytes of every tensor (padding excluded).
    pub fn total_bytes(&self) -> u64 {
        self.tensors.values().map(|m| m.len).sum()
    }

    fn note_copied(&self, meta: &TensorMeta) {
        if let Some(p) = &self.progress {
            let done = self.copied.fetch_add(meta.len, Ordering::Relaxed) + meta.len;
            p.advance(done);
        }
    }

    /// The directory the checkpoint was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The safetensors files, indexed by [`TensorMeta::file`].
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The `__metadata__` map of the first file (a container written by
    /// `coli convert` has `format = colibri`, `experts`, `dense`).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Tensor names in sorted order (padding tensors excluded).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn info(&self, name: &str) -> Result<&TensorMeta, StError> {
        self.tensors.get(name).ok_or_else(|| StError::NotFound {
            path: self.dir.clone(),
            tensor: name.to_string(),
        })
    }

    /// The file a tensor lives in (for error messages).
    pub fn path_of(&self, meta: &TensorMeta) -> &Path {
        self.files
            .get(meta.file as usize)
            .map_or(self.dir.as_path(), PathBuf::as_path)
    }

    /// The byte range of a tensor, for building an expert map.
    pub fn piece(&self, name: &str) -> Result<Piece, StError> {
        Ok(self.info(name)?.piece())
    }

    /// The raw little-endian bytes of a tensor (zero copy, from the map).
    pub fn bytes(&self, name: &str) -> Result<&[u8], StError> {
        let meta = self.info(name)?;
        self.meta_bytes(name, meta)
    }

    fn meta_bytes(&self, name: &str, meta: &TensorMeta) -> Result<&[u8], StError> {
        let out_of_file = || StError::tensor(self.path_of(meta), name, "data lies outside the mapped file");
        let map = self.maps.get(meta.file as usize).ok_or_else(out_of_file)?;
        let start = usize::try_from(meta.offset).map_err(|_| out_of_file())?;
        let len = usize::try_from(meta.len).map_err(|_| out_of_file())?;
        let end = start.checked_add(len).ok_or_else(out_of_file)?;
        map.get(start..end).ok_or_else(out_of_file)
    }

    /// A floating-point tensor (F32, BF16 or F16 in the file) as f32, with
    /// its shape checked against `expected_shape`.
    pub fn f32_tensor(&self, name: &str, expected_shape: &[usize]) -> Result<Vec<f32>, StError> {
        let meta = self.info(name)?;
        let path = self.path_of(meta);
        if meta.shape != expected_shape {
            return Err(StError::Shape {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                expected: expected_shape.to_vec(),
                found: meta.shape.clone(),
            });
        }
        let raw = self.meta_bytes(name, meta)?;
        let out = match meta.block {
            Some(ty) => dequantize_blocks(ty, raw).map_err(|e| StError::tensor(path, name, e))?,
            None => decode_f32(meta.dtype, raw).map_err(|e| name_tensor(e, name).in_file(path))?,
        };
        self.release(meta);
        self.note_copied(meta);
        Ok(out)
    }

    /// Drops this process's page-table entries for the whole pages of a
    /// tensor that was just copied out of the mapping. Loading copies every
    /// dense tensor; the mapped pages it touched would otherwise stay in the
    /// process's RSS beside the copies until the kernel reclaimed them, so a
    /// load's peak RSS was about twice the dense weights. The page cache
    /// keeps the data; a later read of the range faults it back in.
    fn release(&self, meta: &TensorMeta) {
        const PAGE: usize = 4096;
        let (Some(map), Ok(start), Ok(len)) = (
            self.maps.get(meta.file as usize),
            usize::try_from(meta.offset),
            usize::try_from(meta.len),
        ) else {
            return;
        };
        let lo = start.next_multiple_of(PAGE);
        let hi = (start.saturating_add(len) / PAGE * PAGE).min(map.len() / PAGE * PAGE);
        if hi > lo {
            // SAFETY: the map is a read-only shared file mapping: dropping
            // its PTEs loses no data (any later access faults the file's
            // pages back in), so slices other code still borrows from it
            // stay valid and read the same bytes.
            let r = unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, lo, hi - lo) };
            if let Err(e) = r {
                tracing::debug!(error = %e, "madvise(DONTNEED) after a tensor copy failed");
            }
        }
    }

    /// The tensor `name` and its `.qs` scales if it is stored quantized.
    pub fn matrix_parts(&self, name: &str) -> Result<MatrixParts, StError> {
        let weight = self.info(name)?.clone();
        let scales = match weight.dtype {
            _ if weight.block.is_some() => None,
            Dtype::U8 | Dtype::I8 => {
                let qs = format!("{name}{SCALE_SUFFIX}");
                let Some(s) = self.tensors.get(&qs) else {
                    return Err(StError::tensor(
                        self.path_of(&weight),
                        name,
                        format!("quantized {} tensor has no {qs} scale tensor", weight.dtype),
                    ));
                };
                if s.dtype != Dtype::F32 {
                    return Err(StError::tensor(
                        self.path_of(s),
                        &qs,
                        format!("scales must be F32, found {}", s.dtype),
                    ));
                }
                Some(s.clone())
            }
            _ => None,
        };
        Ok(MatrixParts { weight, scales })
    }

    /// The `[rows, cols]` weight matrix `name`. Floating-point tensors are
    /// stored as `want` (quantized here if asked); U8/I8 tensors are taken as
    /// stored with their `.qs` scales, whatever `want` says. A quantized
    /// tensor may be 2-D `[rows, bytes_per_row]` or 1-D; its byte count must
    /// match exactly one layout.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize, want: QFormat) -> Result<QMatrix, StError> {
        self.matrix_shaped(name, &[rows, cols], rows, cols, want)
    }

    /// The 3-D float or ggml tensor `name` of shape `[stack, rows, cols]`
    /// as one `[stack * rows, cols]` matrix: MLA's per-head `k_b` / `v_b`
    /// projections as llama.cpp stores them, rows of consecutive heads
    /// adjacent.
    pub fn stacked_matrix(
        &self,
        name: &str,
        stack: usize,
        rows: usize,
        cols: usize,
        want: QFormat,
    ) -> Result<QMatrix, StError> {
        self.matrix_shaped(name, &[stack, rows, cols], stack * rows, cols, want)
    }

    fn matrix_shaped(
        &self,
        name: &str,
        shape: &[usize],
        rows: usize,
        cols: usize,
        want: QFormat,
    ) -> Result<QMatrix, StError> {
        let parts = self.matrix_parts(name)?;
        let w = &parts.weight;
        let path = self.path_of(w);
        let shape_ok = match (&parts.scales, w.shape.as_slice()) {
            (None, s) => s == shape,
            (Some(_), [_]) => true,
            (Some(_), [r, _]) => *r == rows,
            (Some(_), _) => false,
        };
        if !shape_ok {
            let expected = if parts.scales.is_some() {
                vec![rows, w.shape.last().copied().unwrap_or(0)]
            } else {
                shape.to_vec()
            };
            return Err(StError::Shape {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                expected,
                found: w.shape.clone(),
            });
        }
        let bytes = ByteStore::from_vec(self.meta_bytes(name, w)?.to_vec());
        if let Some(ty) = w.block {
            let m = QMatrix::from_ggml(rows, cols, ty, bytes).map_err(|source| StError::Quant {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                source,
            })?;
            self.release(w);
            self.note_copied(w);
            return Ok(m);
        }
        let scales = match &parts.scales {
            Some(s) => {
                let qs = format!("{name}{SCALE_SUFFIX}");
                let raw = self.meta_bytes(&qs, s)?;
                Some(decode_f32(s.dtype, raw).map_err(|e| name_tensor(e, &qs).in_file(path))?)
            }
            None => None,
        };
        self.release(w);
        if let Some(s) = &parts.scales {
            self.release(s);
        }
        let m =
            matrix_from_bytes(name, w.dtype, rows, cols, bytes, scales, want).map_err(|e| e.in_file(path))?;
        // Counted once quantized: that, not the copy, is the slow part.
        self.note_copied(w);
        if let Some(s) = &parts.scales {
            self.note_copied(s);
        }
        Ok(m)
    }
}

/// A tensor of ggml `ty` blocks decoded to f32, row by row of whole blocks
/// (the block count is all that matters for a vector).
fn dequantize_blocks(ty: GgmlType, raw: &[u8]) -> Result<Vec<f32>, String> {
    let (block, size) = (ty.block_size() as usize, ty.type_size() as usize);
    if size == 0 || !raw.len().is_multiple_of(size) {
        return Err(format!("{} bytes are not whole {ty} blocks", raw.len()));
    }
    let mut out = vec![0f32; raw.len() / size * block];
    crate::kernels::ggml::dequantize_row(ty, raw, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Memory-maps a whole file read-only.
fn map_file(path: &Path) -> Result<Mmap, StError> {
    let io = |source| StError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len < 8 {
        return Err(StError::header(
            path,
            format!("file is {len} bytes, too short for the 8-byte header length"),
        ));
    }
    // SAFETY: the map is read-only and checkpoint files are treated as
    // immutable while the engine runs; every access is bounds-checked against
    // the length seen here. A file truncated by another process while mapped
    // would fault (SIGBUS) — the documented limitation of mapping files.
    unsafe { Mmap::map(&file) }.map_err(io)
}
