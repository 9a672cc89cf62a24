//! `coli serve`: the stdin protocol (docs/serve-protocol.md) over the real engine.

use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::output::diag;
use super::{EngineArgs, ModelArg};
use crate::engine::speculative::DraftMode;
use crate::engine::{Engine, PromptCacheSize};
use crate::http::{Defaults, HttpConfig};
use crate::runtime::limits;
use crate::runtime::{DecodeLoop, LoopConfig};
use crate::serve::batch::{self, BatchConfig};
use crate::serve::{LoopServer, MAX_KV_SLOTS, ServeConfig, run_serve};

/// Concurrent requests of `--http` when --kv-slots is not given.
const HTTP_DEFAULT_SLOTS: usize = 4;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Independent conversations (PROMPT's kv_slot), 1..16; with --http the
    /// requests decoded at once (default 1, 4 with --http).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_KV_SLOTS as u64))]
    pub kv_slots: Option<u64>,
    /// Directory of the conversation state files (default:
    /// $XDG_STATE_HOME/colibri/<model fingerprint>, ~/.local/state/... when unset;
    /// with --http nothing is saved unless this is given).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Serve the OpenAI-compatible HTTP API (docs/http-api.md) on ADDR
    /// instead of the stdin protocol: HOST:PORT, or a bare PORT on loopback
    /// (0 picks a free port).
    #[arg(long, value_name = "ADDR", value_parser = crate::http::parse_addr)]
    pub http: Option<SocketAddr>,
    /// With --http: every endpoint but /health and the chat page wants `Authorization: Bearer KEY`.
    #[arg(long, env = "COLI_API_KEY", hide_env_values = true, value_name = "KEY")]
    pub api_key: Option<String>,
    /// With --http: requests that may wait for a slot; more get 429.
    #[arg(long, value_name = "N", requires = "http", allow_negative_numbers = true, value_parser = super::parse_count)]
    pub queue: Option<usize>,
    /// With --http: largest request body in bytes; larger ones get 413.
    #[arg(long, value_name = "BYTES", requires = "http", default_value_t = crate::http::DEFAULT_MAX_BODY,
          allow_negative_numbers = true, value_parser = super::parse_count)]
    pub max_body: usize,
    /// With --http: seconds a request head may take to arrive (an idle
    /// keep-alive connection is closed after this too); a client that sent
    /// part of a head then gets 408.
    #[arg(long, value_name = "SECS", requires = "http", default_value_t = crate::http::DEFAULT_HEADER_TIMEOUT_S as usize,
          allow_negative_numbers = true, value_parser = super::parse_count)]
    pub header_timeout_s: usize,
    /// With --http: seconds a request body may take to arrive, from the end
    /// of its head; a later one gets 408.
    #[arg(long, value_name = "SECS", requires = "http", default_value_t = crate::http::DEFAULT_BODY_TIMEOUT_S as usize,
          allow_negative_numbers = true, value_parser = super::parse_count)]
    pub body_timeout_s: usize,
    /// With --http: connections served at once; more wait until one closes.
    #[arg(long, value_name = "N", requires = "http", default_value_t = crate::http::DEFAULT_MAX_CONNECTIONS,
          allow_negative_numbers = true, value_parser = super::parse_count)]
    pub max_connections: usize,
    /// With --http: no chat page at / (it then answers 404 like any unknown path).
    #[arg(long, requires = "http")]
    pub no_web: bool,
    /// Do not save or restore conversations.
    #[arg(long)]
    pub no_kv_save: bool,
    /// MiB of RAM for the prompt cache: the computed positions of
    /// conversations that lost their slot, so that clients who outnumber
    /// --kv-slots compute only their new tokens (default: the slots' KV
    /// cache at full context, at most a tenth of the memory budget; 0 = off).
    #[arg(long, value_name = "MIB", allow_negative_numbers = true, value_parser = super::parse_count)]
    pub prompt_cache_mb: Option<usize>,
    #[command(flatten)]
    pub usage: super::UsageArgs,
    /// Tokens per chat reply, and the cap on PROMPT's max_tokens; with
    /// --http, what a request that names no limit gets.
    #[arg(long, default_value_t = 256, allow_negative_numbers = true, value_parser = limits::max_tokens)]
    pub max_tokens: usize,
    /// Context length per slot (default: the model's max_position_embeddings,
    /// as far as the memory budget holds the KV cache of the slots; more
    /// than the model's, or more than fits, is refused).
    #[arg(long, allow_negative_numbers = true, value_parser = limits::context)]
    pub ctx: Option<usize>,
    /// Top-k cut for sampling (0 = none).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = limits::top_k)]
    pub top_k: usize,
    /// Sampling temperature for chat lines (PROMPT brings its own); 0 = greedy.
    #[arg(long, default_value_t = 0.7, allow_negative_numbers = true, value_parser = limits::temperature)]
    pub temperature: f32,
    /// Nucleus cut for chat lines.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true, value_parser = limits::top_p)]
    pub top_p: f32,
    /// Seed for chat lines (default: a fresh one per reply).
    #[arg(long, allow_negative_numbers = true, value_parser = limits::seed)]
    pub seed: Option<u64>,
    /// Speak the multiplexed protocol (docs/serve-batch-protocol.md): SUBMIT
    /// frames with client ids, several requests in flight at once.
    #[arg(long)]
    pub batch: bool,
    /// Speculative decoding of every unconstrained request; requests with
    /// a grammar or schema decode without drafts.
    #[command(flatten)]
    pub draft: super::draft::DraftArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The context the engine sized its KV cache for, saying on stderr when
/// the budget held the default below the model's positions.
pub fn engine_context(command: &str, engine: &Engine) -> usize {
    if let Some(note) = &engine.memory.ctx_capped {
        diag!("coli {command}: {note}");
    }
    engine.context()
}

/// `--prompt-cache-mb` as the engine's option.
pub fn prompt_cache_size(mib: Option<usize>) -> PromptCacheSize {
    match mib {
        None => PromptCacheSize::Auto,
        Some(m) => PromptCacheSize::Bytes((m as u64).saturating_mul(1 << 20)),
    }
}

/// The prompt cache's part of the ready line.
fn prompt_cache_note(bytes: u64) -> String {
    if bytes == 0 {
        "prompt cache off".to_string()
    } else {
        format!("prompt cache {:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// The speculative decoding part of the ready line.
fn draft_note(draft: Option<(DraftMode, usize)>) -> String {
    match draft {
        None => "drafts off".to_string(),
        Some((DraftMode::Mtp, k)) => format!("MTP drafts of {k}"),
        Some((_, k)) => format!("n-gram drafts of {k}"),
    }
}

/// The state directory when saving is on and the directory can be used;
/// otherwise `None`, with the reason on stderr.
fn state_dir(args: &ServeArgs, fingerprint: u64) -> anyhow::Result<Option<PathBuf>> {
    if args.no_kv_save || (args.http.is_some() && args.state_dir.is_none()) {
        return Ok(None);
    }
    super::resolve_state_dir(
        args.state_dir.as_deref(),
        fingerprint,
        "conversations will not be saved",
    )
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.http.is_some() && args.api_key.as_deref() == Some("") {
        return Err(super::usage("--api-key must not be empty"));
    }
    for (flag, value) in [
        ("--max-body", args.max_body),
        ("--header-timeout-s", args.header_timeout_s),
        ("--body-timeout-s", args.body_timeout_s),
        ("--max-connections", args.max_connections),
    ] {
        if value == 0 {
            return Err(super::usage(format!("{flag} must be at least 1")));
        }
    }
    let dir = args.model.resolve()?;
    let kv_slots = match args.kv_slots {
        Some(n) => n as usize,
        None if args.http.is_some() => HTTP_DEFAULT_SLOTS,
        None => 1,
    };
    let mut opts = args.engine.options();
    opts.kv_slots = kv_slots;
    opts.max_ctx = args.ctx;
    opts.prompt_cache = prompt_cache_size(args.prompt_cache_mb);
    let engine = Engine::load_with_progress(&dir, &opts, crate::progress::load_progress())
        .with_context(|| format!("loading {}", dir.display()))?;
    let max_ctx = engine_context("serve", &engine);
    let state_dir = state_dir(&args, engine.state_fingerprint())?;
    let (usage, _) = super::start_usage(&engine, args.state_dir.as_deref(), &args.usage)?;
    let loop_cfg = LoopConfig {
        slots: kv_slots,
        max_ctx,
        threads: args.engine.threads.map(|t| t as usize),
        state_dir: state_dir.clone(),
        queue_cap: args.queue.unwrap_or(LoopConfig::default().queue_cap),
        draft: args.draft.options(),
        ..LoopConfig::default()
    };
    let decode = DecodeLoop::spawn(engine, &loop_cfg, Box::new(std::io::stderr()))
        .with_context(|| format!("preparing {} for serving", dir.display()))?;
    if args.batch {
        decode.handle().info().tokenizer().context("serving --batch")?;
        let cfg = BatchConfig {
            top_k: args.top_k,
            max_tokens: args.max_tokens,
            seed: args.seed,
        };
        let served = batch::serve_stdio(
            decode,
            &cfg,
            BufWriter::with_capacity(1 << 16, super::output::stdout()),
            Box::new(std::io::stderr()),
        )
        .context("serving --batch");
        super::finish_usage(usage);
        return served;
    }
    if let Some(addr) = args.http {
        decode.handle().info().tokenizer().context("serving --http")?;
        let served = serve_http(decode, addr, &args, &dir, (kv_slots, max_ctx, state_dir));
        super::finish_usage(usage);
        return served;
    }
    let mut server = LoopServer::new(decode.handle(), args.top_k).context("starting the decode loop")?;
    let cfg = ServeConfig {
        kv_slots,
        max_tokens: args.max_tokens,
        max_ctx,
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        ..ServeConfig::default()
    };
    let saving = match (server.handle().info().saving, &state_dir) {
        (true, Some(d)) => format!("saving to {}", d.display()),
        _ => "saving off".to_string(),
    };
    diag!(
        "coli serve: {} ready ({kv_slots} slot(s), context {max_ctx}, {saving}, {}, {})",
        dir.display(),
        prompt_cache_note(server.handle().info().prompt_cache_bytes),
        draft_note(server.handle().info().draft)
    );
    let stdin = std::io::stdin().lock();
    // The session flushes after every streamed piece and every closing line.
    let mut out = BufWriter::new(super::output::stdout());
    let mut diag = std::io::stderr();
    // A closed stdout ends the session after it saved every slot; the loop
    // is stopped and the usage history written whatever ended it.
    let served = run_serve(stdin, &mut out, &mut diag, &mut server, &cfg)
        .map_err(anyhow::Error::from)
        .and_then(|()| out.flush().context("writing the reply stream"))
        .context("serving");
    drop(server);
    let stopped = decode.shutdown().context("stopping the decode loop");
    // After the loop stopped: every fetch it made is counted.
    super::finish_usage(usage);
    served.and(stopped)
}

/// `--http`: the HTTP API over the loop until SIGINT/SIGTERM.
fn serve_http(
    decode: DecodeLoop,
    addr: SocketAddr,
    args: &ServeArgs,
    dir: &std::path::Path,
    (slots, max_ctx, state_dir): (usize, usize, Option<PathBuf>),
) -> anyhow::Result<()> {
    let cfg = HttpConfig {
        addr,
        api_key: args.api_key.clone(),
        max_body: args.max_body,
        header_timeout: std::time::Duration::from_secs(args.header_timeout_s as u64),
        body_timeout: std::time::Duration::from_secs(args.body_timeout_s as u64),
        max_connections: args.max_connections,
        web: !args.no_web,
        defaults: Defaults {
            max_tokens: args.max_tokens,
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            seed: args.seed,
        },
    };
    let saving = match (decode.handle().info().saving, &state_dir) {
        (true, Some(d)) => format!("saving to {}", d.display()),
        _ => "saving off".to_string(),
    };
    let open = !addr.ip().is_loopback() && args.api_key.is_none();
    let cache = format!(
        "{}, {}",
        prompt_cache_note(decode.handle().info().prompt_cache_bytes),
        draft_note(decode.handle().info().draft)
    );
    crate::http::serve(decode, cfg, |bound| {
        if open {
            diag!("coli serve: warning: {bound} is reachable from other machines and no --api-key is set");
        }
        diag!(
            "coli serve: {} listening on http://{bound} ({slots} slot(s), context {max_ctx}, {saving}, {cache})",
            dir.display()
        );
    })
    .context("serving HTTP")
}
