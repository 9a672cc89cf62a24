//! `coli synth`: write a random model of a real shape (for benchmarks).

use std::path::PathBuf;

use clap::Args;

use super::output::diag;

use crate::convert::{parse_dense_format, parse_format};
use crate::progress::ProgressPrinter;
use crate::synth::{SynthSpec, synth};

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Output container directory (must not exist, or be empty).
    #[arg(long)]
    pub output: PathBuf,
    /// Model shape: olmoe-1b-7b (about 7 GB), small, tiny, glm-5 (GLM-5's
    /// real shape, int4-g64 experts; 4 layers, about 8.7 GB, by default),
    /// glm-tiny, qwen3-30b-a3b (Qwen3-30B-A3B's real shape, about 31 GB at
    /// int8), qwen3-tiny, mixtral-8x7b (Mixtral-8x7B's real shape, about
    /// 47 GB at int8), mixtral-tiny, glm-4.5-air (GLM-4.5-Air's real shape,
    /// about 107 GB at int8), glm4-tiny, gpt-oss-20b (gpt-oss-20b's real
    /// shape, about 21 GB at int8), gpt-oss-tiny, qwen3.6-35b-a3b (about
    /// 35 GB at int8), qwen3.5-397b-a17b (int4-g64, 4 layers by default),
    /// qwen35-tiny, minimax-m2 (int4-g64, 4 layers by default),
    /// minimax-tiny, deepseek-v3.2 (int4-g64, 4 layers by default),
    /// deepseek-v32-tiny, glm-4.7-flash (about 30 GB at int8) or
    /// glm47-flash-tiny; an unknown name lists them all.
    #[arg(long, default_value = "olmoe-1b-7b")]
    pub preset: String,
    /// Decoder layers (default: the preset's).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Routed experts per layer (default: the preset's).
    #[arg(long)]
    pub experts: Option<usize>,
    /// Experts routed per token (default: the preset's, capped at --experts).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Multiply hidden, intermediate and vocabulary sizes by this (0, 1].
    #[arg(long)]
    pub scale: Option<f64>,
    /// Routed experts' format (default: the preset's, int8 for OLMoE,
    /// Qwen3-MoE, Mixtral, GLM-4.x, gpt-oss, Qwen3.6-35B-A3B and
    /// GLM-4.7-Flash, int4-g64 for GLM-5, Qwen3.5-397B-A17B, MiniMax-M2 and
    /// DeepSeek-V3.2; int4-gN is offered for every family but OLMoE).
    #[arg(long)]
    pub expert_format: Option<String>,
    /// Dense matrices: int8 or f32 (norms and router always stay f32).
    #[arg(long, default_value = "int8")]
    pub dense: String,
    /// Seed of the random weights: the same seed and shape write the same
    /// model.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    let mut spec = SynthSpec::preset(&args.preset)?;
    if let Some(f) = args.scale {
        spec = spec.scaled(f)?;
    }
    if let Some(l) = args.layers {
        spec.layers = l;
    }
    if let Some(e) = args.experts {
        spec.experts = e;
        spec.top_k = spec.top_k.min(e);
    }
    if let Some(k) = args.top_k {
        spec.top_k = k;
    }
    if let Some(f) = &args.expert_format {
        spec.expert_format = parse_format(f)?;
    }
    spec.dense_format = parse_dense_format(&args.dense)?;
    spec.seed = args.seed;
    let progress = ProgressPrinter::stderr(0);
    let t0 = std::time::Instant::now();
    let report = synth(&spec, &args.output, Some(&progress))?;
    diag!(
        "wrote {} ({} layers x {} experts, top-{}, hidden {}, {:.1} MB; experts {}, dense {}) in {:.1}s",
        report.output.display(),
        spec.layers,
        spec.experts,
        spec.top_k,
        spec.hidden,
        report.bytes as f64 / 1e6,
        report.experts_format,
        report.dense_format,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
