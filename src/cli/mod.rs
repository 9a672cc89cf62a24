//! The `coli` command line (documented in README.md and docs/).
//!
//! Exit codes: 0 success, 1 a runtime error (loading a model, I/O, a
//! failed validation), 2 a usage error (clap's code for bad flags).

pub mod bench;
mod bench_conversations;
mod bench_interfere;
mod bench_report;
mod bench_streams;
pub mod chat;
pub mod convert;
pub mod doctor;
pub mod draft;
pub mod fit;
pub mod models;
pub mod output;
pub mod plan;
pub mod policy;
pub mod quality;
pub mod run;
pub mod serve;
pub mod synth;
pub mod validate;

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};

use self::output::diag;
use crate::engine::state::{StateError, default_state_dir, prepare_state_dir};
use crate::engine::usage::{PinMode, UsageRecorder, UsageStart};
use crate::engine::{Engine, EngineOptions};

/// colibri: Mixture-of-Experts inference that streams experts from disk.
#[derive(Debug, Parser)]
#[command(name = "coli", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate from a prompt.
    Run(run::RunArgs),
    /// Compare greedy / teacher-forced predictions with a transformers oracle.
    Validate(validate::ValidateArgs),
    /// How far a (quantized) model's next-token distributions are from a
    /// reference's on the same text: top-1 agreement, KL divergence,
    /// perplexity.
    Quality(quality::QualityArgs),
    /// Write a streaming container (quantized experts, one read per expert).
    Convert(convert::ConvertArgs),
    /// Serve the stdin/stdout protocol (front ends drive this).
    Serve(serve::ServeArgs),
    /// Interactive chat in the terminal.
    Chat(chat::ChatArgs),
    /// Write a random model of a real shape (for benchmarks).
    Synth(synth::SynthArgs),
    /// Measure decode speed against the I/O and compute bounds.
    Bench(bench::BenchArgs),
    /// Replay a recorded routing trace through the cache policies (LRU,
    /// pins, optimal) over a range of cache sizes.
    Policy(policy::PolicyArgs),
    /// The machine and the install on one screen (CPU, kernels, memory
    /// budget, disk, a model's formats and integrity, state files).
    Doctor(doctor::DoctorArgs),
    /// What a model will do here before it runs: residency, cache, placement,
    /// the expected decode speed range.
    Plan(plan::PlanArgs),
    /// The models in the models directory ($COLI_MODELS): name, family,
    /// formats, size on disk, whether each fits this machine.
    List(models::ListArgs),
    /// Delete models from the models directory by name.
    Rm(models::RmArgs),
}

impl Command {
    /// The engine options of commands that run a model.
    pub fn engine_args(&self) -> Option<&EngineArgs> {
        match self {
            Command::Run(a) => Some(&a.engine),
            Command::Validate(a) => Some(&a.engine),
            Command::Quality(a) => Some(&a.engine),
            Command::Serve(a) => Some(&a.engine),
            Command::Chat(a) => Some(&a.engine),
            Command::Bench(a) => Some(&a.engine),
            Command::Convert(_)
            | Command::Synth(_)
            | Command::Doctor(_)
            | Command::Plan(_)
            | Command::Policy(_)
            | Command::List(_)
            | Command::Rm(_) => None,
        }
    }
}

/// A flag value, or a combination of flags, the command cannot run with.
/// Exits with 2 like clap's own usage errors; everything else that fails
/// after the command line parsed exits with 1.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A [`UsageError`] as an `anyhow::Error`.
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

/// True when `e` (or a cause) is a usage error: a [`UsageError`] or an engine
/// option the engine refused (`--ram-gb`, `--disk-sim`, bit widths).
pub fn is_usage_error(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<UsageError>()
            || c.is::<crate::engine::context::ContextError>()
            || matches!(
                c.downcast_ref::<crate::engine::EngineError>(),
                Some(crate::engine::EngineError::Option(_) | crate::engine::EngineError::Context(_))
            )
    })
}

/// Where the model is: `--model`, else `$COLI_MODEL`, else the bundled model.
#[derive(Debug, Args, Clone)]
pub struct ModelArg {
    /// Model: a directory (HF checkpoint or colibri container), or the name
    /// of one in the models directory (`coli list`).
    #[arg(long, env = "COLI_MODEL", value_name = "DIR|NAME")]
    pub model: Option<PathBuf>,
}

impl ModelArg {
    /// The model's directory: a path as given, a name looked up in the
    /// models directory, the bundled model when nothing is given.
    pub fn resolve(&self) -> anyhow::Result<PathBuf> {
        let given = self
            .model
            .as_deref()
            .unwrap_or(Path::new(crate::catalog::bundled::NAME));
        Ok(crate::catalog::resolve(given)?)
    }
}

/// Options every engine command accepts.
#[derive(Debug, Args, Clone)]
pub struct EngineArgs {
    /// Bits for full-precision routed experts: >=16 f32, 5..8 int8, 3..4 int4, 2 int2.
    #[arg(long, default_value_t = 32)]
    pub expert_bits: u32,
    /// Bits for full-precision dense matrices.
    #[arg(long, default_value_t = 32)]
    pub dense_bits: u32,
    /// Experts kept resident per layer.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_count)]
    pub cache_cap: Option<usize>,
    /// Memory budget of the whole engine in GB (2^30 bytes): the dense
    /// weights, KV cache and working set, and the expert cache gets the rest
    /// (default: 90% of what is free once the dense weights are loaded, by
    /// MemAvailable or the cgroup limit, whichever is smaller).
    #[arg(long, allow_negative_numbers = true)]
    pub ram_gb: Option<f64>,
    /// Pilot prefetcher (predicts the next layer's experts).
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub pilot: bool,
    /// Experts the pilot prefetches per layer (default: the model's top-k).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_count)]
    pub pilot_k: Option<usize>,
    /// Run the pilot's predictions on its own thread instead of on the
    /// compute thread (inline, the default, costs one router product per
    /// offered residual and is never late).
    #[arg(long)]
    pub pilot_thread: bool,
    /// Disk I/O worker threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub io_workers: u64,
    /// Read experts with O_DIRECT (falls back where the filesystem refuses).
    #[arg(long)]
    pub direct: bool,
    /// Read experts through mmap instead of pread.
    #[arg(long)]
    pub mmap: bool,
    /// Simulated disk, e.g. `bw=200MB/s,lat=2ms,jitter=1ms,fail=0.01,seed=1`.
    #[arg(long)]
    pub disk_sim: Option<String>,
    /// Multiply quantized matrices through f32 activations: the
    /// token-exact path that the transformers oracles check, slower than
    /// the default int8 activations (integer dot products, as llama.cpp
    /// does). f32 weights always take the exact path.
    #[arg(long)]
    pub f32_acts: bool,
    /// Int8 activations for quantized matrices: the default; accepted so
    /// older scripts keep working.
    #[arg(long, conflicts_with = "f32_acts", hide = true)]
    pub int8_acts: bool,
    /// Where routed experts live: `mapped` serves them in place from the
    /// container's mapping (no copies, no I/O threads), `streamed` through
    /// the private cache, I/O workers and pilot; `auto` maps when every
    /// expert fits the memory budget and no streaming option is given.
    #[arg(long, default_value = "auto", value_name = "auto|mapped|streamed")]
    pub placement: crate::engine::Placement,
    /// The most of the expert cache per layer (`--cache-cap`, the byte
    /// budget) pins from the usage history may take, in (0, 1]. How much
    /// they do take is chosen by replaying the recorded routing: pins are
    /// kept only where they beat LRU, and never when the cache holds no
    /// more than one token's experts a layer.
    #[arg(long, default_value_t = crate::engine::usage::DEFAULT_PIN_SHARE, value_parser = parse_share, value_name = "F")]
    pub pin_share: f64,
    /// Compute threads, the calling thread included (default: every CPU,
    /// or RAYON_NUM_THREADS when set).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024), value_name = "N")]
    pub threads: Option<u64>,
    /// Strict no-overlap mode (loads and compute in sequence), for comparison.
    #[arg(long)]
    pub no_overlap: bool,
    /// Print where decode time went (disk wait, compute, other) after the run.
    #[arg(long)]
    pub profile: bool,
    /// Write a Chrome trace (open in Perfetto) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    #[command(flatten)]
    pub kv: KvTypeArgs,
}

/// How the KV cache stores keys and values (docs/state-files.md, "KV cache
/// types"): every command that runs a model or plans its memory takes them.
#[derive(Debug, Args, Clone, Default)]
pub struct KvTypeArgs {
    /// KV cache storage for keys and values: `f16` (the default, half of
    /// f32's memory), `f32` (the token-exact path the oracles check) or `q8`
    /// (blocks of 32 int8 values with an f16 scale, about a quarter). A
    /// compact type can change the tokens slightly, like --expert-bits.
    #[arg(long, value_name = "f32|f16|q8")]
    pub kv_type: Option<crate::model::kv_cache::KvType>,
    /// Storage of the keys alone (overrides --kv-type for them).
    #[arg(long, value_name = "f32|f16|q8")]
    pub kv_type_k: Option<crate::model::kv_cache::KvType>,
    /// Storage of the values alone (overrides --kv-type for them).
    #[arg(long, value_name = "f32|f16|q8")]
    pub kv_type_v: Option<crate::model::kv_cache::KvType>,
}

impl KvTypeArgs {
    /// The types the flags name, the rest from [`crate::engine::DEFAULT_KV_TYPES`].
    pub fn types(&self) -> crate::model::kv_cache::KvTypes {
        let d = crate::engine::DEFAULT_KV_TYPES;
        crate::model::kv_cache::KvTypes {
            k: self.kv_type_k.or(self.kv_type).unwrap_or(d.k),
            v: self.kv_type_v.or(self.kv_type).unwrap_or(d.v),
        }
    }
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("expected a number in (0, 1], got {s:?}")),
    }
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "1" | "true" => Ok(true),
        "off" | "0" | "false" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

/// A count flag (`--cache-cap`, `--queue`, ...): a whole number >= 0. The
/// flags of a generation request (`--max-tokens`, `--temperature`, ...)
/// are checked by [`crate::runtime::limits`] instead, as every front end's.
/// Negative numbers reach this parser (the flags allow them) so that `-1`
/// gets this message instead of clap's "unexpected argument '-1'".
pub fn parse_count(s: &str) -> Result<usize, String> {
    let t = s.trim();
    if t.starts_with('-') && t[1..].parse::<f64>().is_ok() {
        return Err(format!("must be a whole number >= 0, got {s}"));
    }
    t.parse::<usize>()
        .map_err(|_| format!("expected a whole number >= 0, got {s:?}"))
}

impl EngineArgs {
    pub fn options(&self) -> EngineOptions {
        EngineOptions {
            expert_bits: self.expert_bits,
            dense_bits: self.dense_bits,
            cache_cap: self.cache_cap,
            ram_gb: self.ram_gb,
            pilot: self.pilot,
            pilot_k: self.pilot_k,
            pilot_thread: self.pilot_thread,
            io_workers: self.io_workers as usize,
            direct: self.direct,
            mmap: self.mmap,
            disk_sim: self.disk_sim.clone(),
            overlap: !self.no_overlap,
            kv_slots: 1,
            max_ctx: None,
            int8_acts: !self.f32_acts,
            placement: self.placement,
            pin_share: self.pin_share,
            prompt_cache: crate::engine::PromptCacheSize::Off,
            kv_types: self.kv.types(),
        }
    }
}

/// The usage-history flags of the commands that run a model
/// (docs/state-files.md, "Usage history").
#[derive(Debug, Args, Clone)]
pub struct UsageArgs {
    /// Do not keep the usage history (which experts the model routes to)
    /// in the state directory.
    #[arg(long)]
    pub no_usage: bool,
    /// Experts pinned in the cache at start-up: `off`; `auto`, the hottest
    /// per layer by the usage history when there is one; or a usage-history
    /// FILE of this model. Pins then follow the counts while it runs.
    #[arg(long, default_value = "auto", value_name = "off|auto|FILE")]
    pub pin: PinMode,
}

/// The state directory to use: `explicit`, else the default one for the
/// model's fingerprint, made private. `None` (with the reason and `what`
/// happens then on stderr) when it cannot be used; a directory other users
/// can write to is an error, not a warning: the user asked for something
/// unsafe.
pub fn resolve_state_dir(
    explicit: Option<&Path>,
    fingerprint: u64,
    what: &str,
) -> anyhow::Result<Option<PathBuf>> {
    let dir = match explicit {
        Some(d) => d.to_path_buf(),
        None => match default_state_dir(
            fingerprint,
            std::env::var_os("XDG_STATE_HOME").as_deref(),
            std::env::var_os("HOME").as_deref(),
        ) {
            Ok(d) => d,
            Err(e) => {
                diag!("coli: {e}; {what}");
                return Ok(None);
            }
        },
    };
    match prepare_state_dir(&dir) {
        Ok(()) => Ok(Some(dir)),
        Err(e @ StateError::Insecure { .. }) => Err(e.into()),
        Err(e) => {
            diag!(
                "coli: cannot use the state directory {} ({e}); {what}",
                dir.display()
            );
            Ok(None)
        }
    }
}

/// Starts the usage history of `engine` in the state directory (unless
/// `--no-usage`) and the pins `--pin` asks for. A history file that cannot
/// be used is ignored with a message; a `--pin FILE` that cannot is an error.
pub fn start_usage(
    engine: &Engine,
    state_dir: Option<&Path>,
    args: &UsageArgs,
) -> anyhow::Result<(Option<UsageRecorder>, UsageStart)> {
    let dir = if args.no_usage {
        None
    } else {
        resolve_state_dir(
            state_dir,
            engine.state_fingerprint(),
            "the usage history will not be kept",
        )?
    };
    let (recorder, start) = engine
        .start_usage(dir.as_deref(), &args.pin)
        .map_err(|e| match &args.pin {
            PinMode::File(p) => anyhow::Error::new(e).context(format!("--pin {}", p.display())),
            _ => anyhow::Error::new(e).context("starting the usage history"),
        })?;
    if let Some(why) = &start.ignored {
        diag!("coli: ignoring the usage history: {why}; starting a new one");
    }
    if start.pinned > 0 {
        tracing::info!(
            pinned = start.pinned,
            runs = start.history_runs,
            "pinned the hottest experts of the usage history"
        );
    }
    Ok((recorder, start))
}

/// Writes the final usage history; a failure is reported, not fatal (the
/// run itself succeeded).
pub fn finish_usage(recorder: Option<UsageRecorder>) {
    if let Some(r) = recorder
        && let Err(e) = r.finish()
    {
        diag!("coli: usage history: {e}");
    }
}

/// Parses `1,2,3` (spaces and newlines allowed) into token ids.
pub fn parse_ids(s: &str) -> anyhow::Result<Vec<u32>> {
    s.split([',', ' ', '\n', '\r', '\t'])
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim()
                .parse::<u32>()
                .map_err(|e| usage(format!("--prompt-ids: {p:?} is not a token id ({e})")))
        })
        .collect()
}

/// The error and its causes, skipping a cause whose text the message before
/// it already contains (library errors often print their source inline).
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}
