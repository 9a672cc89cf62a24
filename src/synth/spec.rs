//! The shape of a synthetic model and the tensors it is made of: the
//! fields, checks, tensor draw and listing every family shares. What only
//! one family has comes from its [`super::SynthFamily`], in the family's
//! folder.

use std::path::Path;

use super::registered::Registered;
use crate::config::ConfigError;
use crate::convert::InputTensor;
use crate::model::family::ModelConfig;
use crate::quant::QFormat;
use crate::st::Dtype;

/// Shape, formats and seed of a synthetic model of one of the engine's
/// families.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub experts: usize,
    pub top_k: usize,
    pub intermediate: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    /// Routed experts' stored format.
    pub expert_format: QFormat,
    /// Dense matrices' stored format (norms and router always stay f32).
    pub dense_format: QFormat,
    pub seed: u64,
    /// The family and its own hyper-parameters.
    pub family: Registered,
}

/// Why a spec cannot be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("unknown preset {name:?} (use one of: {known})")]
    Preset { name: String, known: String },
    #[error("{0}")]
    Invalid(String),
}

impl SynthSpec {
    pub fn preset(name: &str) -> Result<Self, SpecError> {
        match super::registered::presets().find(|p| p.name == name) {
            Some(p) => Ok((p.build)()),
            None => Err(SpecError::Preset {
                name: name.to_string(),
                known: super::registered::presets()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Multiplies vocab, hidden and intermediate sizes by `factor` (in
    /// (0, 1]), and the family's own sizes as the family scales them; hidden
    /// stays a multiple of the family's `hidden_multiple`.
    pub fn scaled(mut self, factor: f64) -> Result<Self, SpecError> {
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(SpecError::Invalid(format!(
                "--scale must be in (0, 1], got {factor}"
            )));
        }
        let round = |v: usize, m: usize| (((v as f64 * factor) / m as f64).round() as usize).max(1) * m;
        let hidden_step = self.family.hidden_multiple(self.heads);
        self.family = Registered(self.family.scaled(&round).map_err(SpecError::Invalid)?);
        self.hidden = round(self.hidden, hidden_step);
        self.intermediate = round(self.intermediate, 8);
        self.vocab = round(self.vocab, 64);
        Ok(self)
    }

    /// Size of one attention head, as the family has it.
    pub fn head_dim(&self) -> usize {
        self.family.head_dim(self)
    }

    /// Layers with routed experts (dense leading layers have none).
    pub fn sparse_layers(&self) -> usize {
        self.family.sparse_layers(self)
    }

    /// Checks what the engine will check later, so a bad flag fails first:
    /// the sizes every family needs, then the family's own checks.
    pub fn validate(&self) -> Result<(), SpecError> {
        let bad = |s: String| Err(SpecError::Invalid(s));
        let sizes = [
            ("vocabulary", self.vocab),
            ("hidden size", self.hidden),
            ("layers", self.layers),
            ("attention heads", self.heads),
            ("experts", self.experts),
            ("top-k", self.top_k),
            ("expert intermediate size", self.intermediate),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return bad(format!(
                "{name} must be non-zero ({} shape)",
                self.family.0.name()
            ));
        }
        if self.top_k > self.experts {
            return bad(format!("top-k {} exceeds {} experts", self.top_k, self.experts));
        }
        self.family.validate(self)
    }

    /// The registry's checks, the default family validation: formats
    /// the loaders read, a sparse layer, and the family's own config
    /// validation (through the registry, as the engine will read it) on
    /// the config.json this spec writes.
    pub fn check_registered(&self) -> Result<(), SpecError> {
        self.check_formats()?;
        if self.sparse_layers() == 0 {
            return Err(SpecError::Invalid(format!(
                "{} layers leave no sparse layer (use more --layers)",
                self.layers
            )));
        }
        let config = ModelConfig::from_json(Path::new("config.json"), self.config_json())
            .map_err(|e| SpecError::Invalid(e.to_string()))?;
        config.family().invariants().map_err(SpecError::Invalid)
    }

    /// Formats the loaders read, then the family's own config parser
    /// `parse` on the config.json this spec writes, for a family whose
    /// parser's messages say more than the registry's check would.
    pub fn check_parsed<T>(
        &self,
        parse: impl FnOnce(&Path, serde_json::Value) -> Result<T, ConfigError>,
    ) -> Result<(), SpecError> {
        self.check_formats()?;
        parse(Path::new("config.json"), self.config_json())
            .map(|_| ())
            .map_err(|e| SpecError::Invalid(e.to_string()))
    }

    /// Dense int8 or f32; experts int8, f32 or int4-gN with N dividing
    /// both sides of every expert matrix.
    pub fn check_formats(&self) -> Result<(), SpecError> {
        let bad = |s: String| Err(SpecError::Invalid(s));
        if !matches!(self.dense_format, QFormat::F32 | QFormat::Int8) {
            return bad(format!(
                "--dense {} is not offered by synth (use int8 or f32)",
                self.dense_format
            ));
        }
        match self.expert_format {
            QFormat::F32 | QFormat::Int8 => Ok(()),
            QFormat::Int4Grouped { group }
                if self.hidden.is_multiple_of(group) && self.intermediate.is_multiple_of(group) =>
            {
                Ok(())
            }
            f => bad(format!(
                "--expert-format {f} is not offered for {} (use int4-gN with N dividing hidden {} and \
                 intermediate {}, int8 or f32)",
                self.family.name(),
                self.hidden,
                self.intermediate
            )),
        }
    }

    /// The id generation stops at: the real model's when the vocabulary
    /// has it (the family's), else the last id.
    pub fn eos_id(&self) -> usize {
        let real = self.family.eos_id();
        if self.vocab > real { real } else { self.vocab - 1 }
    }

    /// config.json for the model, as transformers writes it for the family.
    pub fn config_json(&self) -> serde_json::Value {
        self.family.config_json(self)
    }

    /// Every tensor of the model as a Hugging Face checkpoint of its family
    /// names it, sorted by name (the order the planner expects).
    pub(crate) fn inputs(&self, origin: &Path) -> Vec<InputTensor> {
        let h = self.hidden;
        let mut out = vec![
            ("model.embed_tokens.weight".to_string(), vec![self.vocab, h]),
            ("lm_head.weight".to_string(), vec![self.vocab, h]),
            ("model.norm.weight".to_string(), vec![h]),
        ];
        for l in 0..self.layers {
            out.extend(self.family.layer_tensors(self, l));
        }
        out.sort();
        out.into_iter()
            .map(|(name, shape)| InputTensor {
                block: None,
                name,
                dtype: Dtype::F32,
                shape,
                path: origin.to_path_buf(),
            })
            .collect()
    }

    /// How a tensor's values are drawn: `(base, amplitude)`, values uniform
    /// in `base ± amplitude`, the family's own draw first. Matrices get variance
    /// 1 / fan_in (so every projection keeps activations at unit scale and
    /// nothing overflows over 16 layers); the router twice that, so routing
    /// is decided by the token and varies; norms scatter around 1, biases
    /// (attention, router and expert biases, the router correction and the
    /// indexer key norm) and attention sinks around 0.
    pub(crate) fn distribution(&self, name: &str, shape: &[usize]) -> (f32, f32) {
        const SQRT3: f32 = 1.732_050_8;
        let unit = |fan_in: usize| SQRT3 / (fan_in as f32).sqrt();
        if let Some(d) = self.family.distribution(name, shape) {
            return d;
        }
        if shape.len() == 1 {
            return if name.ends_with("bias") || name.ends_with("sinks") {
                (0.0, 0.1)
            } else {
                (1.0, 0.1)
            };
        }
        let fan_in = shape[1];
        if name == "model.embed_tokens.weight" {
            (0.0, SQRT3)
        } else if name.ends_with("mlp.gate.weight")
            || name.ends_with("block_sparse_moe.gate.weight")
            || name.ends_with("mlp.router.weight")
        {
            (0.0, 2.0 * unit(fan_in))
        } else if name.ends_with("o_proj.weight")
            || name.ends_with("down_proj.weight")
            || name.ends_with(".w2.weight")
        {
            (0.0, 0.5 * unit(fan_in))
        } else {
            (0.0, unit(fan_in))
        }
    }
}

/// The planner's jobs for the container `s` describes.
#[cfg(test)]
pub(crate) fn planned_jobs(s: &SynthSpec) -> Vec<crate::convert::Job> {
    let cfg = ModelConfig::from_json(Path::new("c.json"), s.config_json()).unwrap();
    let model = cfg
        .family()
        .convert_spec(Path::new("c.json"), s.expert_format, s.dense_format)
        .unwrap();
    crate::convert::plan::plan(&s.inputs(Path::new("x")), Path::new("x"), &model).unwrap()
}

/// Bytes of the container `spec` would be, from the planner's entries
/// (each expert's start rounded up to the 4096-byte alignment).
#[cfg(test)]
pub(crate) fn planned_bytes(s: &SynthSpec) -> u64 {
    let jobs = planned_jobs(s);
    let align = crate::convert::ALIGN;
    jobs.iter().fold(0, |at, j| {
        let at = if j.align { at.div_ceil(align) * align } else { at };
        at + j.entries().iter().map(|e| e.len).sum::<u64>()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes the registered presets' doc comments and
    /// docs/benchmarks.md give, from the planner's own entries:
    /// (preset, GB of the default container, MB of one expert).
    #[test]
    fn registered_presets_have_the_sizes_their_docs_give() {
        for (p, gb, expert_mb) in [
            ("qwen3.6-35b-a3b", 34.9, 3.16),
            ("qwen3.5-397b-a17b", 17.1, 7.08),
            ("minimax-m2", 9.6, 7.96),
            ("deepseek-v3.2", 10.3, 24.8),
            ("glm-4.7-flash", 30.0, 9.46),
        ] {
            let s = SynthSpec::preset(p).unwrap();
            let total = planned_bytes(&s) as f64 / 1e9;
            let jobs = planned_jobs(&s);
            let routed: u64 = jobs
                .iter()
                .filter(|j| j.source.tensor.contains(".experts."))
                .flat_map(|j| j.entries())
                .map(|e| e.len)
                .sum();
            let expert = routed / (s.sparse_layers() * s.experts) as u64;
            eprintln!("{p}: {total:.2} GB, {:.3} MB an expert", expert as f64 / 1e6);
            assert!((total / gb - 1.0).abs() < 0.02, "{p}: {total:.2} GB");
            assert!(
                (expert as f64 / 1e6 / expert_mb - 1.0).abs() < 0.02,
                "{p}: {expert} B an expert"
            );
        }
    }
}
