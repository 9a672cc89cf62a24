//! `coli validate`: token-exactness against a transformers oracle (REF.json).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde::Deserialize;

use super::{EngineArgs, ModelArg};
use crate::engine::Engine;
use crate::model::lm::Logits;
use crate::model::ops::argmax;
use crate::sampling::{Sampler, SamplingParams};

#[derive(Debug, Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Oracle file: {"prompt_ids", "full_ids", "tf_pred"}.
    #[arg(long = "ref")]
    pub reference: PathBuf,
    /// Compare one forward pass over full_ids with tf_pred instead of greedy generation.
    #[arg(long)]
    pub teacher_forcing: bool,
    /// Compare with the oracle's int8 round-trip run (`int8_full_ids`,
    /// `int8_tf_pred`: transformers on the weights the engine's int8 formats
    /// give), for `--expert-bits 8 --dense-bits 8` runs.
    #[arg(long)]
    pub int8_oracle: bool,
    /// Mismatches tolerated before exiting 1.
    #[arg(long, default_value_t = 0)]
    pub max_mismatches: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// docs/formats.md, "Oracle reference files"; extra keys are ignored.
#[derive(Debug, Deserialize)]
pub struct Reference {
    pub prompt_ids: Vec<u32>,
    pub full_ids: Vec<u32>,
    #[serde(default)]
    pub tf_pred: Option<Vec<u32>>,
    /// The same run of transformers on int8 round-trip weights.
    #[serde(default)]
    pub int8_full_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub int8_tf_pred: Option<Vec<u32>>,
}

impl Reference {
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let r: Self = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        if r.prompt_ids.is_empty() {
            anyhow::bail!("{}: prompt_ids is empty", path.display());
        }
        if r.full_ids.len() < r.prompt_ids.len() || r.full_ids[..r.prompt_ids.len()] != r.prompt_ids[..] {
            anyhow::bail!("{}: full_ids does not start with prompt_ids", path.display());
        }
        Ok(r)
    }

    /// The int8 round-trip oracle as a reference of its own, when the file
    /// has one.
    pub fn int8(&self) -> Option<Reference> {
        let full = self.int8_full_ids.clone()?;
        if full.len() < self.prompt_ids.len() || full[..self.prompt_ids.len()] != self.prompt_ids[..] {
            return None;
        }
        Some(Reference {
            prompt_ids: self.prompt_ids.clone(),
            full_ids: full,
            tf_pred: self.int8_tf_pred.clone(),
            int8_full_ids: None,
            int8_tf_pred: None,
        })
    }
}

/// Returns (matching, total).
pub fn greedy(engine: &mut Engine, r: &Reference) -> anyhow::Result<(usize, usize)> {
    let want = &r.full_ids[r.prompt_ids.len()..];
    let mut session = engine.new_session();
    let mut sampler = Sampler::new(SamplingParams::default());
    // Oracles generate a fixed count without stopping at EOS.
    let stops = std::mem::take(&mut engine.stop_ids);
    let res = session.generate(engine, &r.prompt_ids, want.len(), &mut sampler, &mut |_| true);
    engine.stop_ids = stops;
    let got = res?.generated;
    // Position-wise, as upstream counts: a late divergence costs what it costs.
    let matching = got.iter().zip(want).filter(|(a, b)| a == b).count();
    Ok((matching, want.len()))
}

/// Returns (matching, total) over every position of full_ids.
pub fn teacher_forcing(engine: &mut Engine, r: &Reference) -> anyhow::Result<(usize, usize)> {
    let Some(tf) = &r.tf_pred else {
        anyhow::bail!("the reference has no tf_pred; teacher forcing needs it");
    };
    if tf.len() != r.full_ids.len() {
        anyhow::bail!(
            "tf_pred has {} entries for {} full_ids",
            tf.len(),
            r.full_ids.len()
        );
    }
    let mut state = engine.model.new_state();
    let tag = engine.next_tag();
    let logits = engine
        .model
        .forward(&r.full_ids, state.as_mut(), tag, Logits::All)?;
    let vocab = engine.model.vocab_size();
    let mut matching = 0;
    let positions: Vec<usize> = (0..r.full_ids.len()).collect();
    for &p in &positions {
        if argmax(&logits[p * vocab..(p + 1) * vocab]) as u32 == tf[p] {
            matching += 1;
        }
    }
    Ok((matching, positions.len()))
}

pub fn run(args: ValidateArgs) -> anyhow::Result<bool> {
    let dir = args.model.resolve()?;
    let mut r = Reference::load(&args.reference)?;
    if args.int8_oracle {
        r = r.int8().with_context(|| {
            format!(
                "{}: no int8 oracle (int8_full_ids starting with prompt_ids)",
                args.reference.display()
            )
        })?;
    }
    let mut engine =
        Engine::load_with_progress(&dir, &args.engine.options(), crate::progress::load_progress())
            .with_context(|| format!("loading {}", dir.display()))?;
    let mut out = super::output::stdout();
    let (ok, total) = if args.teacher_forcing {
        let (ok, total) = teacher_forcing(&mut engine, &r)?;
        writeln!(out, "Teacher-forcing: {ok}/{total} positions")?;
        (ok, total)
    } else {
        let (ok, total) = greedy(&mut engine, &r)?;
        writeln!(out, "Matching tokens: {ok}/{total}")?;
        (ok, total)
    };
    Ok(total - ok <= args.max_mismatches)
}
