//! `coli run`: generate from a prompt.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use super::output::diag;
use super::{EngineArgs, ModelArg, parse_ids};
use crate::chat_template::ChatMessage;
use crate::engine::Engine;
use crate::engine::speculative::{DraftMode, Speculator};
use crate::runtime::limits;
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::StreamDecoder;

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Prompt text (needs tokenizer.json in the model directory).
    #[arg(
        long,
        conflicts_with_all = ["prompt_ids", "prompt_file", "prompt_ids_file"],
        required_unless_present_any = ["prompt_ids", "prompt_file", "prompt_ids_file"]
    )]
    pub prompt: Option<String>,
    /// Prompt text read from a file (`-`: standard input), for prompts too
    /// long for a command line (the kernel caps one argument at 128 KiB).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["prompt_ids", "prompt_ids_file"])]
    pub prompt_file: Option<PathBuf>,
    /// Use the --prompt text as it is, without the model's chat template
    /// (models whose tokenizer_config.json has a template get it by default).
    #[arg(long)]
    pub raw: bool,
    /// Prompt as comma-separated token ids.
    #[arg(long, conflicts_with = "prompt_ids_file")]
    pub prompt_ids: Option<String>,
    /// Prompt as token ids read from a file (`-`: standard input), separated
    /// by commas, spaces or newlines.
    #[arg(long, value_name = "PATH")]
    pub prompt_ids_file: Option<PathBuf>,
    #[arg(long, default_value_t = 64, allow_negative_numbers = true, value_parser = limits::max_tokens)]
    pub max_tokens: usize,
    /// Context length the KV cache is sized for (default: the model's
    /// max_position_embeddings, as far as the memory budget holds it; more
    /// is refused).
    #[arg(long, allow_negative_numbers = true, value_parser = limits::context)]
    pub ctx: Option<usize>,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = limits::temperature)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true, value_parser = limits::top_p)]
    pub top_p: f32,
    /// 0 = no top-k cut.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = limits::top_k)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = limits::seed)]
    pub seed: u64,
    /// Print the generated token ids on one line instead of text.
    #[arg(long)]
    pub ids: bool,
    /// Speculative decoding (greedy only here; `coli serve` also samples).
    #[command(flatten)]
    pub draft: super::draft::DraftArgs,
    /// Directory of the usage history (default:
    /// $XDG_STATE_HOME/colibri/<model fingerprint>, ~/.local/state/... when unset).
    #[arg(long)]
    pub state_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub usage: super::UsageArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// The stderr line summarising a speculative run.
fn draft_report(spec: &Speculator, engine: &Engine) -> String {
    let using = match spec.using {
        Some(DraftMode::Mtp) => "mtp",
        Some(DraftMode::Ngram) => "ngram",
        _ => "none",
    };
    let mut line = format!(
        "speculative decoding ({using}, k={}): acceptance {:.1}% ({}/{} drafts), {:.2} tokens/forward ({} tokens in {} forwards)",
        spec.opts.max_draft,
        100.0 * spec.acceptance(),
        spec.accepted,
        spec.proposed,
        spec.tokens_per_forward(),
        spec.tokens,
        spec.forwards
    );
    if spec.opts.mode == DraftMode::Mtp
        && spec.using == Some(DraftMode::Ngram)
        && let Err(why) = engine.model.draft_head()
    {
        line.push_str(&format!("; no MTP drafts: {why}"));
    }
    if let Some(why) = &spec.off {
        line.push_str(&format!("; {why}"));
    }
    line
}

/// `text` as one user turn in the model's chat template, ready for the
/// assistant's reply; the text itself for a model without a template.
/// A chat model given bare text sees no assistant prompt and often ends at once.
pub fn chat_prompt(dir: &Path, text: &str) -> anyhow::Result<String> {
    match crate::engine::ModelFiles::resolve(dir)?.shipped_template()? {
        Some(t) => Ok(t.render(&[ChatMessage::user(text)], true)?),
        None => Ok(text.to_string()),
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    if args.draft.draft.0.is_some() && args.temperature > 0.0 {
        return Err(super::usage(format!(
            "--draft needs greedy decoding (--temperature 0, got {}): `coli run` verifies greedy drafts only (`coli serve --draft` samples)",
            args.temperature
        )));
    }
    let dir = args.model.resolve()?;
    let mut opts = args.engine.options();
    opts.max_ctx = args.ctx;
    let mut engine = Engine::load_with_progress(&dir, &opts, crate::progress::load_progress())
        .with_context(|| format!("loading {}", dir.display()))?;
    let (usage, _) = super::start_usage(&engine, args.state_dir.as_deref(), &args.usage)?;
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(path)) => Some(read_prompt_file(path, "--prompt-file")?),
        (None, None) => None,
    };
    let ids = match (&args.prompt_ids, &args.prompt_ids_file) {
        (Some(ids), _) => Some(ids.clone()),
        (None, Some(path)) => Some(read_prompt_file(path, "--prompt-ids-file")?),
        (None, None) => None,
    };
    let prompt = match (text, ids) {
        (_, Some(ids)) => parse_ids(&ids)?,
        (Some(text), None) => {
            let text = if args.raw { text } else { chat_prompt(&dir, &text)? };
            engine.tokenizer()?.encode(&text)?
        }
        (None, None) => {
            return Err(super::usage(
                "give --prompt, --prompt-file, --prompt-ids or --prompt-ids-file",
            ));
        }
    };
    if prompt.is_empty() {
        return Err(super::usage("the prompt is empty"));
    }
    // The context rule of every front end: the prompt must fit, the reply
    // stops at the context's end.
    let ctx = super::serve::engine_context("run", &engine);
    if !limits::fits_context(prompt.len(), ctx) {
        let e = crate::runtime::RequestError::ContextExceeded {
            used: prompt.len(),
            limit: ctx,
        };
        return Err(super::usage(format!("the prompt does not fit: {e}")));
    }
    let max_tokens = limits::reply_budget(prompt.len(), args.max_tokens, ctx);
    let mut session = engine.new_session();
    session.spec = args.draft.options().map(Speculator::new);
    let mut sampler = Sampler::new(SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
    });
    let text_mode = !args.ids;
    if text_mode {
        engine.tokenizer()?;
    }
    let before = engine.profile();
    let mut out = super::output::stdout();
    let mut stream = StreamDecoder::new();
    let mut io_err: Option<anyhow::Error> = None;
    let tok_for_stream = if text_mode { engine.tokenizer.take() } else { None };
    let stats = session.generate(&mut engine, &prompt, max_tokens, &mut sampler, &mut |id| {
        if let Some(tok) = &tok_for_stream {
            match stream.push(tok, id) {
                Ok(piece) => {
                    if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                        io_err = Some(e.into());
                        return false;
                    }
                }
                Err(e) => {
                    io_err = Some(e.into());
                    return false;
                }
            }
        }
        true
    })?;
    engine.tokenizer = tok_for_stream;
    // A stdout that stopped taking the text ends the output, not the run:
    // the report and the usage history are written all the same.
    let printed = match io_err {
        Some(e) => Err(e),
        None if args.ids => {
            let line: Vec<String> = stats.generated.iter().map(|t| t.to_string()).collect();
            writeln!(out, "{}", line.join(" ")).map_err(anyhow::Error::from)
        }
        None => writeln!(out).map_err(anyhow::Error::from),
    };
    if args.engine.profile
        && let (Some(b), Some(a)) = (before, engine.profile())
    {
        let report = crate::engine::profile::report(&stats, &b, &a)
            + &crate::engine::profile::memory_report(&engine.memory, crate::engine::peak_rss_bytes());
        diag!("{}", report.trim_end_matches('\n'));
    }
    if let Some(spec) = &session.spec {
        diag!("{}", draft_report(spec, &engine));
    }
    let s = engine.stats();
    diag!(
        "prompt {} tok, prefill {:.2}s; generated {} tok in {:.2}s ({:.2} tok/s); expert hit rate {:.1}%, {:.1} MB read",
        stats.prompt_tokens,
        stats.prefill_secs,
        stats.generated.len(),
        stats.decode_secs,
        stats.decode_tok_per_s(),
        s.hit_rate() * 100.0,
        s.bytes_read as f64 / 1e6
    );
    super::finish_usage(usage);
    printed
}

/// The contents of a prompt file (`-`: standard input) as text; `flag` names
/// the flag in the error.
fn read_prompt_file(path: &Path, flag: &str) -> anyhow::Result<String> {
    let mut text = String::new();
    let read = if path == Path::new("-") {
        std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut text)
    } else {
        std::fs::File::open(path).and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
    };
    read.map_err(|e| super::usage(format!("{flag} {}: {e}", path.display())))?;
    Ok(text)
}
