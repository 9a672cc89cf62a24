//! `coli synth`: a random model of a real shape, for benchmarks.
//!
//! Benchmarks of the expert pipeline need a model as large as the real one
//! (so the expert cache and the disk matter) without downloading it. This
//! module draws seeded random weights, scaled so activations stay finite and
//! routing varies with the token, and writes them straight into a streaming
//! container through the same planner and writer as `coli convert`: one
//! tensor in memory at a time, a temporary directory renamed at the end.

mod decoder;
mod glm;
mod measure;
mod registered;
mod rng;
mod shape;
mod spec;

pub use decoder::DecoderShape;
pub use glm::GlmShape;
pub(crate) use glm::deepseek_mlp;
pub use measure::{PassResult, decode_pass, parse_replay_ids, replay_pass, stats_delta, synthetic_prompt};
pub use registered::{Registered, SynthFamily, SynthPreset, SynthTensor, presets};
pub use rng::{WyRand, splitmix, tensor_seed, uniform};
pub use shape::ModelShape;
#[cfg(test)]
pub(crate) use spec::planned_bytes;
pub use spec::{SpecError, SynthSpec};

use std::path::Path;

use crate::convert::{ContainerSpec, ConvertError, ConvertReport, Job, JobData, JobInput};
use crate::model::family::ModelConfig;
use crate::progress::Progress;

/// Why a synthetic model could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Write(#[from] ConvertError),
}

/// Generated values for each job, drawn when the writer asks.
struct Generator<'a> {
    spec: &'a SynthSpec,
    origin: &'a Path,
}

impl JobInput for Generator<'_> {
    fn data(&self, job: &Job) -> Result<JobData<'_>, ConvertError> {
        let src = &job.source;
        let (base, amp) = self.spec.distribution(&src.tensor, &job.shape);
        let seed = tensor_seed(self.spec.seed, &src.tensor) ^ splitmix(src.elem_start as u64);
        let mut v = uniform(seed, src.elems, amp);
        if base != 0.0 {
            v.iter_mut().for_each(|x| *x += base);
        }
        Ok(JobData::F32(v))
    }

    fn origin(&self) -> &Path {
        self.origin
    }
}

/// The phase [`synth`] reports to its progress.
pub const SYNTH_PHASE: &str = "generating";

/// Writes the model described by `spec` as a container directory at
/// `output` (which must not exist, or be empty), with its config.json.
/// `progress` hears the container being written, in bytes (phase
/// [`SYNTH_PHASE`]).
pub fn synth(
    spec: &SynthSpec,
    output: &Path,
    progress: Option<&dyn Progress>,
) -> Result<ConvertReport, SynthError> {
    spec.validate()?;
    let config = spec.config_json();
    let cfg_path = output.join("config.json");
    let (experts, dense) = (spec.expert_format, spec.dense_format);
    // Each family's own convert rules, on the config it is read back with.
    let model = ModelConfig::from_json(&cfg_path, config.clone())
        .map_err(ConvertError::from)?
        .family()
        .convert_spec(&cfg_path, experts, dense)?;
    let inputs = spec.inputs(output);
    let jobs = crate::convert::plan::plan(&inputs, output, &model)?;
    let write_config = |tmp: &Path| -> Result<(), ConvertError> {
        let path = tmp.join("config.json");
        let text = serde_json::to_string_pretty(&config).map_err(|e| ConvertError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        std::fs::write(&path, text).map_err(|source| ConvertError::Io { path, source })
    };
    let container = ContainerSpec {
        output,
        experts: spec.expert_format,
        dense: spec.dense_format,
        progress,
        phase: SYNTH_PHASE,
        metadata: &model.metadata,
    };
    let generator = Generator { spec, origin: output };
    let bytes = crate::convert::write_container(&container, &jobs, &generator, &write_config)?;
    Ok(ConvertReport {
        output: output.to_path_buf(),
        tensors: jobs.len(),
        experts: model.experts(),
        bytes,
        experts_format: spec.expert_format,
        dense_format: spec.dense_format,
    })
}
