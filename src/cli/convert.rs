//! `coli convert`: HF checkpoint (OLMoE, GLM-5, DeepSeek-V3; F32, BF16 or
//! FP8 e4m3 with block scales) → streaming container.

use std::path::PathBuf;

use clap::Args;

use crate::convert::{convert, parse_format};
use crate::progress::ProgressPrinter;

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// Hugging Face checkpoint directory.
    #[arg(long)]
    pub input: PathBuf,
    /// Output container directory (must not exist, or be empty).
    #[arg(long)]
    pub output: PathBuf,
    /// Routed experts: f32, int8 (the default), int4, int4-gN
    /// (N in 16..=256; int4-g64 is the usual choice for GLM-5 / DeepSeek-V3),
    /// int2. The MTP layer of GLM / DeepSeek-V3 never goes below int8.
    #[arg(long, default_value = "int8")]
    pub experts: String,
    /// Dense matrices: f32, int8, int4 (norms, routers, biases stay F32).
    #[arg(long, default_value = "f32")]
    pub dense: String,
}

pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    let experts = parse_format(&args.experts)?;
    let dense = parse_format(&args.dense)?;
    let progress = ProgressPrinter::stderr(0);
    let report = convert(&args.input, &args.output, experts, dense, Some(&progress))?;
    eprintln!(
        "wrote {} ({} tensors, {} experts, {:.1} MB; experts {}, dense {})",
        report.output.display(),
        report.tensors,
        report.experts,
        report.bytes as f64 / 1e6,
        report.experts_format,
        report.dense_format
    );
    Ok(())
}
