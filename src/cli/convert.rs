//! `coli convert`: HF checkpoint (F32, BF16 or FP8 e4m3 with block scales)
//! or GGUF model (ggml blocks copied as stored) → streaming container.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use super::output::diag;
use crate::catalog;
use crate::convert::{convert, parse_dense_format, parse_format};
use crate::progress::{Progress, ProgressPrinter};
use crate::quant::QFormat;

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// Hugging Face checkpoint (a directory), GGUF model (a file, the first
    /// shard of a split model, or a directory holding one), or a model name
    /// from `coli list`.
    #[arg(long, value_name = "DIR|FILE|NAME")]
    pub input: PathBuf,
    /// Output container: a bare NAME is written to the models directory
    /// (`coli list`, then `--model NAME`); a path (`./NAME`, `dir/NAME`,
    /// absolute) is written where it says. It must not exist, or be empty,
    /// unless --force is given.
    #[arg(long, value_name = "NAME|DIR")]
    pub output: PathBuf,
    /// Routed experts: f32, int8 (the default for a checkpoint), int4,
    /// int4-gN (N in 16..=256; int4-g64 is the usual choice for GLM-5 /
    /// DeepSeek-V3), int2. The MTP layer of GLM / DeepSeek-V3 never goes
    /// below int8. A GGUF's quantized experts are copied as stored whatever
    /// this says; it applies to experts the GGUF stores as floats (kept as
    /// they are by default).
    #[arg(long, value_parser = experts_format)]
    pub experts: Option<QFormat>,
    /// Dense matrices: f32 (the default), int8, int4 (norms, routers,
    /// biases stay F32). A GGUF's quantized matrices are copied as stored.
    #[arg(long, value_parser = dense_format)]
    pub dense: Option<QFormat>,
    /// Replace an existing model at the output. The new container is written
    /// beside it first, so the old one stays whole if the conversion fails.
    #[arg(long)]
    pub force: bool,
}

fn experts_format(s: &str) -> Result<QFormat, String> {
    parse_format(s).map_err(|e| e.to_string())
}

fn dense_format(s: &str) -> Result<QFormat, String> {
    parse_dense_format(s).map_err(|e| e.to_string())
}

/// True when `dir` holds a model (what `--force` may replace): a config and
/// safetensors weights, nothing a user keeps other files in.
fn is_model_dir(dir: &Path) -> bool {
    dir.join("config.json").is_file()
        && std::fs::read_dir(dir).is_ok_and(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        })
}

/// True when the directory `dir` has any entry.
fn non_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut rd| rd.next().is_some())
}

pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    let input = catalog::resolve(&args.input)?;
    let gguf = crate::engine::ModelFiles::resolve(&input).is_ok_and(|f| f.is_gguf());
    let experts = args
        .experts
        .unwrap_or(if gguf { QFormat::F32 } else { QFormat::Int8 });
    let dense = args.dense.unwrap_or(QFormat::F32);
    let output = catalog::output_path(&args.output)?;
    let occupied = std::fs::symlink_metadata(&output).is_ok_and(|m| !m.is_dir() || non_empty(&output));
    let printer = ProgressPrinter::stderr(0);
    let progress: Option<&dyn Progress> = Some(&printer);
    let report = if occupied && args.force {
        replace(&input, &output, experts, dense, progress)?
    } else {
        if occupied {
            return Err(super::usage(format!(
                "{} already exists; pass --force to replace it",
                output.display()
            )));
        }
        convert(&input, &output, experts, dense, progress)?
    };
    diag!(
        "wrote {} ({} tensors, {} experts, {:.1} MB; experts {}, dense {})",
        report.output.display(),
        report.tensors,
        report.experts,
        report.bytes as f64 / 1e6,
        report.experts_format,
        report.dense_format
    );
    if output.parent() == catalog::ModelsDir::from_env().ok().as_ref().map(|m| m.root())
        && let Some(name) = output.file_name()
    {
        diag!("run it with --model {}", name.to_string_lossy());
    }
    Ok(())
}

/// `--force`: converts into a sibling directory, then swaps it in for the
/// old model and deletes the old one. Refuses to replace the input itself
/// or a directory that does not hold a model.
fn replace(
    input: &Path,
    output: &Path,
    experts: QFormat,
    dense: QFormat,
    progress: Option<&dyn Progress>,
) -> anyhow::Result<crate::convert::ConvertReport> {
    let same = match (input.canonicalize(), output.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Err(super::usage(format!(
            "--force would replace the input {} with its own conversion: choose another --output",
            output.display()
        )));
    }
    if !output.is_dir() || !is_model_dir(output) {
        return Err(super::usage(format!(
            "--force replaces a model directory (config.json and .safetensors files), and {} is not one: remove it yourself",
            output.display()
        )));
    }
    let pid = std::process::id();
    let with_suffix = |suffix: &str| {
        let mut s = output.as_os_str().to_os_string();
        s.push(format!(".{suffix}-{pid}"));
        PathBuf::from(s)
    };
    let staged = with_suffix("new");
    let mut report = convert(input, &staged, experts, dense, progress)?;
    let old = with_suffix("old");
    std::fs::rename(output, &old).with_context(|| format!("moving {} aside", output.display()))?;
    if let Err(e) = std::fs::rename(&staged, output) {
        // Put the old model back: the new one stays at `staged`.
        let _ = std::fs::rename(&old, output);
        return Err(anyhow::Error::new(e).context(format!(
            "placing the new container at {} (it is at {})",
            output.display(),
            staged.display()
        )));
    }
    std::fs::remove_dir_all(&old).with_context(|| format!("removing the old model at {}", old.display()))?;
    report.output = output.to_path_buf();
    Ok(report)
}
