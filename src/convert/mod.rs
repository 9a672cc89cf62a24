//! `coli convert`: a Hugging Face checkpoint (every registered family; F32,
//! BF16, F16 or FP8 e4m3 with block scales) or a GGUF model ([`gguf`]: its
//! ggml blocks copied as stored) to a streaming container.
//!
//! The container is one `model.safetensors` (readable by any safetensors
//! reader) laid out for streaming: dense tensors first, then every routed
//! expert (layer-major, expert-minor) with its tensors adjacent and its first
//! byte 4096-aligned, so one read fetches a whole expert. Alignment gaps are
//! filled with `__pad__.N` U8 tensors, because safetensors forbids holes.
//! The file is written by a streaming writer (one tensor in memory at a time)
//! into a temporary directory renamed into place at the very end, so an
//! interrupted conversion never leaves something that loads.

mod gguf;
pub(crate) mod plan;
mod writer;

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::config::{ConfigError, read_json};
use crate::model::family::ModelConfig;
use crate::progress::Progress;
use crate::quant::{QFormat, QuantError, quantize_matrix};
use crate::st::fp8::dequantize_fp8;
use crate::st::{Checkpoint, Dtype, StError, decode_f32};

pub(crate) use plan::{InputTensor, Job, ModelSpec};

pub use writer::ALIGN;

/// Why a conversion failed.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Checkpoint(#[from] StError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unknown format {0:?} (use f32, int8, int4, int4-gN with N in 16..=256, or int2)")]
    Format(String),
    #[error("{0:?} is not a dense format (use f32, int8 or int4)")]
    DenseFormat(String),
    #[error("{0} already exists; refusing to overwrite it")]
    OutputExists(PathBuf),
    #[error("{path}: tensor {tensor:?}: {reason}")]
    Input {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("tensor {tensor:?}: {source}")]
    Quant {
        tensor: String,
        #[source]
        source: QuantError,
    },
}

/// What a conversion wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvertReport {
    pub output: PathBuf,
    /// Logical tensors written (a quantized tensor and its scales count once).
    pub tensors: usize,
    pub experts: usize,
    /// Size of the written `model.safetensors`.
    pub bytes: u64,
    pub experts_format: QFormat,
    pub dense_format: QFormat,
}

/// Parses a `--experts` / `--dense` value: f32, int8, int4, int4-gN
/// (N in 16..=256; int4-g64 is the documented one) or int2.
pub fn parse_format(s: &str) -> Result<QFormat, ConvertError> {
    let bad = || ConvertError::Format(s.to_string());
    match s {
        "f32" => Ok(QFormat::F32),
        "int8" => Ok(QFormat::Int8),
        "int4" => Ok(QFormat::Int4),
        "int2" => Ok(QFormat::Int2),
        _ => {
            let g: usize = s
                .strip_prefix("int4-g")
                .ok_or_else(bad)?
                .parse()
                .map_err(|_| bad())?;
            if (16..=256).contains(&g) {
                Ok(QFormat::Int4Grouped { group: g })
            } else {
                Err(bad())
            }
        }
    }
}

/// Parses a `--dense` value: f32, int8 or int4 (per row). The other
/// formats are for routed experts only: int2 dense matrices lose the model
/// (a container that validates nowhere), and the grouped layouts are not
/// what the dense kernels are tuned for.
pub fn parse_dense_format(s: &str) -> Result<QFormat, ConvertError> {
    match s {
        "f32" => Ok(QFormat::F32),
        "int8" => Ok(QFormat::Int8),
        "int4" => Ok(QFormat::Int4),
        _ => Err(ConvertError::DenseFormat(s.to_string())),
    }
}

/// The family-specific plan inputs for the checkpoint in `input`, from the
/// family config.json's `model_type` names.
fn model_spec(input: &Path, experts: QFormat, dense: QFormat) -> Result<ModelSpec, ConvertError> {
    let (path, json) = read_json(input)?;
    ModelConfig::from_json(&path, json)?
        .family()
        .convert_spec(&path, experts, dense)
}

/// Converts the checkpoint in `input` into a container at `output` (a
/// directory that must not exist yet, or be empty). The model family comes
/// from config.json's `model_type`; a GGUF input (a file, or a directory
/// holding one GGUF model) goes to [`gguf::convert_gguf`]. The work happens in `<output>.tmp-<pid>`,
/// renamed to `output` only once complete; on error the temporary directory
/// is removed.
///
/// `experts` applies to routed experts and `dense` to the other matrices;
/// norms, routers and biases stay F32. GLM / DeepSeek-V3 MTP layers never go
/// below int8 (see [`crate::model::glm::mtp_format`]).
///
/// `progress` hears the container being written, in bytes (phase
/// [`CONVERT_PHASE`]).
pub fn convert(
    input: &Path,
    output: &Path,
    experts: QFormat,
    dense: QFormat,
    progress: Option<&dyn Progress>,
) -> Result<ConvertReport, ConvertError> {
    if let Ok(crate::engine::ModelFiles::Gguf(file)) = crate::engine::ModelFiles::resolve(input) {
        return gguf::convert_gguf(&file, output, experts, dense, progress);
    }
    let model = model_spec(input, experts, dense)?;
    let ck = Checkpoint::open(input)?;
    let inputs = plan::checkpoint_inputs(&ck)?;
    let jobs = plan::plan(&inputs, ck.dir(), &model)?;
    let copy_side_files = |tmp: &Path| -> Result<(), ConvertError> {
        for name in SIDE_FILES {
            let src = input.join(name);
            if src.is_file() {
                std::fs::copy(&src, tmp.join(name)).map_err(|source| ConvertError::Io {
                    path: src.clone(),
                    source,
                })?;
            }
        }
        Ok(())
    };
    let spec = ContainerSpec {
        output,
        experts,
        dense,
        progress,
        phase: CONVERT_PHASE,
        metadata: &model.metadata,
    };
    let bytes = write_container(&spec, &jobs, &CheckpointInput(&ck), &copy_side_files)?;
    Ok(ConvertReport {
        output: output.to_path_buf(),
        tensors: jobs.len(),
        experts: model.experts(),
        bytes,
        experts_format: experts,
        dense_format: dense,
    })
}

/// The phase [`convert`] reports to its progress.
pub const CONVERT_PHASE: &str = "converting";

/// What a container is written as, beyond its jobs.
pub(crate) struct ContainerSpec<'a> {
    pub output: &'a Path,
    pub experts: QFormat,
    pub dense: QFormat,
    /// Hears the bytes written.
    pub progress: Option<&'a dyn Progress>,
    /// What the progress is told the job is.
    pub phase: &'static str,
    /// `__metadata__` entries beyond format/experts/dense (the family's
    /// choices, [`ModelSpec::metadata`]).
    pub metadata: &'a [(&'static str, String)],
}

/// A job's input values: bytes in the source tensor's dtype (borrowed from a
/// checkpoint), or values already in f32 (a generator's, or FP8 weights
/// dequantized through their block scales).
pub(crate) enum JobData<'a> {
    Bytes(&'a [u8]),
    F32(Vec<f32>),
}

/// Where the writer gets each job's values, one job at a time (so only one
/// tensor is ever in memory).
pub(crate) trait JobInput {
    fn data(&self, job: &Job) -> Result<JobData<'_>, ConvertError>;

    /// What errors about the input's values name.
    fn origin(&self) -> &Path;
}

struct CheckpointInput<'a>(&'a Checkpoint);

impl JobInput for CheckpointInput<'_> {
    fn data(&self, job: &Job) -> Result<JobData<'_>, ConvertError> {
        let ck = self.0;
        let src = &job.source;
        let size = plan::dtype_bytes(src.dtype) as usize;
        let all = ck.bytes(&src.tensor)?;
        let bad = |reason: String| ConvertError::Input {
            path: ck.dir().to_path_buf(),
            tensor: job.name.clone(),
            reason,
        };
        if src.view != plan::View::Contiguous {
            let scales = match (&src.view, &src.scale_inv) {
                (plan::View::Mxfp4 { .. }, Some(s)) => Some(ck.bytes(s)?),
                (plan::View::Mxfp4 { .. }, None) => return Err(bad("MXFP4 blocks without scales".into())),
                _ => None,
            };
            return gather(src, all, scales)
                .map(JobData::F32)
                .map_err(|reason| bad(format!("{reason} (tensor {:?})", src.tensor)));
        }
        let bytes = src
            .elem_start
            .checked_mul(size)
            .and_then(|a| Some(a..a.checked_add(src.elems.checked_mul(size)?)?))
            .and_then(|r| all.get(r))
            .ok_or_else(|| bad(format!("source range lies outside tensor {:?}", src.tensor)))?;
        match &src.scale_inv {
            Some(sname) => {
                let sinfo = ck.info(sname)?;
                let scales = decode_f32(sinfo.dtype, ck.bytes(sname)?)?;
                let [rows, cols] = job.shape[..] else {
                    return Err(bad(format!(
                        "an FP8 weight of shape {:?} is not a matrix",
                        job.shape
                    )));
                };
                let v = dequantize_fp8(&src.tensor, bytes, rows, cols, &scales)
                    .map_err(|e| e.in_file(ck.dir()))?;
                Ok(JobData::F32(v))
            }
            None if src.dtype == Dtype::F8_E4M3 => Err(bad("F8_E4M3 tensor without block scales".into())),
            None => Ok(JobData::Bytes(bytes)),
        }
    }

    fn origin(&self) -> &Path {
        self.0.dir()
    }
}

/// The values of a strided or MXFP4 view (`src.view`), in output order.
fn gather(src: &plan::Source, bytes: &[u8], scales: Option<&[u8]>) -> Result<Vec<f32>, String> {
    crate::st::view::gather(src.view, src.dtype, src.elem_start, src.elems, bytes, scales)
}

/// Writes `jobs` as a container directory at `spec.output`: prepares a
/// temporary directory, lets `side_files` put files next to the container,
/// streams `model.safetensors`, and renames into place only when complete
/// (removing the temporary directory on error). Returns the container size.
pub(crate) fn write_container(
    spec: &ContainerSpec<'_>,
    jobs: &[Job],
    input: &dyn JobInput,
    side_files: &dyn Fn(&Path) -> Result<(), ConvertError>,
) -> Result<u64, ConvertError> {
    let output = spec.output;
    prepare_output(output)?;
    let mut tmp_name = output.as_os_str().to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp_name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|source| ConvertError::Io {
            path: tmp.clone(),
            source,
        })?;
    }
    let result = std::fs::create_dir_all(&tmp)
        .map_err(|source| ConvertError::Io {
            path: tmp.clone(),
            source,
        })
        .and_then(|()| side_files(&tmp))
        .and_then(|()| write_all(spec, input, &tmp, jobs))
        .and_then(|bytes| {
            std::fs::rename(&tmp, output).map_err(|source| ConvertError::Io {
                path: output.to_path_buf(),
                source,
            })?;
            Ok(bytes)
        });
    if result.is_err() {
        // Best effort: the error being reported matters more than a
        // failure to clean up (the name never loads as `output`).
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// An existing empty output directory is replaced; anything else existing
/// is refused.
fn prepare_output(output: &Path) -> Result<(), ConvertError> {
    let io = |source| ConvertError::Io {
        path: output.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(output) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(e)),
        Ok(m) if m.is_dir() => {
            if std::fs::read_dir(output).map_err(io)?.next().is_some() {
                Err(ConvertError::OutputExists(output.to_path_buf()))
            } else {
                std::fs::remove_dir(output).map_err(io)
            }
        }
        Ok(_) => Err(ConvertError::OutputExists(output.to_path_buf())),
    }
}

/// Files copied next to the container when the input has them.
const SIDE_FILES: [&str; 7] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "special_tokens_map.json",
    "REF.json",
];

fn write_all(
    spec: &ContainerSpec<'_>,
    input: &dyn JobInput,
    tmp: &Path,
    jobs: &[Job],
) -> Result<u64, ConvertError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ConvertError::Io { path, source }
    };
    let path = tmp.join("model.safetensors");
    let mut meta = vec![
        ("format", "colibri".to_string()),
        ("experts", spec.experts.to_string()),
        ("dense", spec.dense.to_string()),
    ];
    meta.extend(spec.metadata.iter().cloned());
    let lay = writer::layout(jobs, &meta);
    let total = lay.header.len() as u64 + lay.data_len;
    if let Some(p) = spec.progress {
        p.start(spec.phase, total);
    }
    let file = std::fs::File::create(&path).map_err(io(&path))?;
    let mut w = writer::Counting {
        inner: std::io::BufWriter::with_capacity(8 << 20, file),
        written: 0,
    };
    w.write_all(&lay.header).map_err(io(&path))?;
    for (job, &pad) in jobs.iter().zip(&lay.pad_before) {
        writer::write_zeros(&mut w, pad).map_err(io(&path))?;
        let before = w.written;
        write_job(input, job, &mut w).map_err(|e| match e {
            JobError::Io(source) => ConvertError::Io {
                path: path.clone(),
                source,
            },
            JobError::Other(e) => e,
        })?;
        let want: u64 = job.entries().iter().map(|e| e.len).sum();
        if w.written - before != want {
            return Err(ConvertError::Input {
                path: path.clone(),
                tensor: job.name.clone(),
                reason: format!("wrote {} bytes, layout expected {want}", w.written - before),
            });
        }
        if let Some(p) = spec.progress {
            p.advance(w.written);
        }
    }
    let file = w.inner.into_inner().map_err(|e| ConvertError::Io {
        path: path.clone(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io(&path))?;
    if let Some(p) = spec.progress {
        p.finish();
    }
    Ok(total)
}

enum JobError {
    Io(std::io::Error),
    Other(ConvertError),
}

impl From<std::io::Error> for JobError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<ConvertError> for JobError {
    fn from(e: ConvertError) -> Self {
        Self::Other(e)
    }
}

impl From<StError> for JobError {
    fn from(e: StError) -> Self {
        Self::Other(e.into())
    }
}

/// Produces one job's bytes (a single tensor's values in memory at a time).
fn write_job<W: Write>(input: &dyn JobInput, job: &Job, w: &mut W) -> Result<(), JobError> {
    let data = input.data(job)?;
    let bad = |reason: String| ConvertError::Input {
        path: input.origin().to_path_buf(),
        tensor: job.name.clone(),
        reason,
    };
    let values = |data: JobData<'_>| -> Result<Vec<f32>, JobError> {
        match data {
            JobData::Bytes(b) => Ok(decode_f32(job.source.dtype, b)?),
            JobData::F32(v) => Ok(v),
        }
    };
    match job.kind {
        plan::Kind::Raw => match data {
            JobData::Bytes(b) => w.write_all(b)?,
            JobData::F32(v) if job.source.dtype == Dtype::F32 => writer::write_f32s(w, &v)?,
            JobData::F32(_) => {
                return Err(bad(format!("f32 values given for a raw {} tensor", job.source.dtype)).into());
            }
        },
        plan::Kind::F32 => {
            let v = values(data)?;
            writer::write_f32s(w, &v)?;
        }
        plan::Kind::Quant(f) => {
            let v = values(data)?;
            if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(bad(format!(
                    "value {i} is {x}; refusing to quantize non-finite weights"
                ))
                .into());
            }
            let (rows, cols) = (job.shape[0], job.shape[1]);
            let (q, scales) = quantize_matrix(rows, cols, &v, f).map_err(|source| ConvertError::Quant {
                tensor: job.name.clone(),
                source,
            })?;
            drop(v);
            w.write_all(&q)?;
            writer::write_f32s(w, &scales)?;
        }
    }
    Ok(())
}
