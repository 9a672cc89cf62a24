//! `coli chat`: an interactive conversation in the terminal, on the same
//! engine as `coli serve`. Reads one line per turn from stdin (so it also
//! works piped); `:more` continues a reply cut at the token limit, `:reset`
//! starts over, `:q` or EOF quits. Statistics of each turn go to stderr.

use std::io::{BufRead, Write};
use std::ops::ControlFlow;

use anyhow::Context;
use clap::Args;

use super::output::diag;
use super::{EngineArgs, ModelArg};
use crate::chat_template::ChatMessage;
use crate::engine::Engine;
use crate::runtime::{DecodeLoop, LoopConfig, limits};
use crate::serve::{GenParams, LoopServer, ServeEngine};

/// Positions kept free at the end of the context (as `coli serve`).
const CTX_RESERVE: usize = 8;

#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Tokens per reply.
    #[arg(long, default_value_t = 256, allow_negative_numbers = true, value_parser = limits::max_tokens)]
    pub max_tokens: usize,
    /// Context length (default: the model's max_position_embeddings, as far
    /// as the memory budget holds its KV cache; more is refused).
    #[arg(long, allow_negative_numbers = true, value_parser = limits::context)]
    pub ctx: Option<usize>,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.7, allow_negative_numbers = true, value_parser = limits::temperature)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true, value_parser = limits::top_p)]
    pub top_p: f32,
    /// 0 = no top-k cut.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = limits::top_k)]
    pub top_k: usize,
    /// Seed of the first reply (later replies use seed+1, seed+2, ...); default: fresh.
    #[arg(long, allow_negative_numbers = true, value_parser = limits::seed)]
    pub seed: Option<u64>,
    /// Directory of the usage history (default:
    /// $XDG_STATE_HOME/colibri/<model fingerprint>, ~/.local/state/... when unset).
    #[arg(long)]
    pub state_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub usage: super::UsageArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// One conversation on slot 0 of an [`EngineServer`].
struct Chat {
    server: LoopServer,
    history: Vec<ChatMessage>,
    max_ctx: usize,
    params: GenParams,
    /// The last reply stopped at its token limit.
    continuable: bool,
    turns: u64,
}

impl Chat {
    fn params(&mut self) -> GenParams {
        self.turns += 1;
        GenParams {
            seed: self.params.seed.map(|s| s.wrapping_add(self.turns - 1)),
            ..self.params
        }
    }

    /// Streams one reply to `out`; returns its text.
    fn generate(&mut self, tokens: &[u32], out: &mut dyn Write) -> anyhow::Result<String> {
        let len_after = self.server.slot_tokens(0).len() + tokens.len();
        let budget = limits::reply_budget(len_after, self.params.max_tokens, self.max_ctx);
        let params = GenParams {
            max_tokens: budget,
            ..self.params()
        };
        let mut text = String::new();
        let mut io_err = None;
        let outcome = self
            .server
            .prefill_and_generate(0, tokens, &params, &mut |piece| {
                text.push_str(piece);
                match out.write_all(piece.as_bytes()).and_then(|()| out.flush()) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(e) => {
                        io_err = Some(e);
                        ControlFlow::Break(())
                    }
                }
            })?;
        if let Some(e) = io_err {
            return Err(e.into());
        }
        writeln!(out)?;
        out.flush()?;
        self.continuable = outcome.emitted >= budget && budget > 0;
        let last = self.server.last_call();
        diag!(
            "[{} tok, {:.2} tok/s, expert hit rate {:.1}%, first token {:.0} ms{}]",
            outcome.emitted,
            outcome.tok_per_s,
            outcome.hit_pct,
            last.first_token_secs * 1000.0,
            if self.continuable { "; :more continues" } else { "" }
        );
        Ok(text)
    }

    fn turn(&mut self, line: &str, out: &mut dyn Write) -> anyhow::Result<()> {
        let mut text = self.server.render_user_turn(&self.history, line)?;
        let mut tokens = self.server.tokenize(&text)?;
        let held = self.server.slot_tokens(0).len();
        if held > 0 && held + tokens.len() + CTX_RESERVE >= self.max_ctx {
            diag!("coli chat: the conversation is full; starting a new one");
            self.reset()?;
            text = self.server.render_user_turn(&self.history, line)?;
            tokens = self.server.tokenize(&text)?;
        }
        tokens.truncate(self.max_ctx.saturating_sub(CTX_RESERVE));
        if tokens.is_empty() {
            diag!("coli chat: the turn is empty after tokenization");
            return Ok(());
        }
        self.history.push(ChatMessage::user(line));
        let reply = self.generate(&tokens, out)?;
        self.history.push(ChatMessage::assistant(&reply));
        Ok(())
    }

    fn more(&mut self, out: &mut dyn Write) -> anyhow::Result<()> {
        let held = self.server.slot_tokens(0);
        let (true, Some(&last)) = (self.continuable, held.last()) else {
            diag!("coli chat: nothing to continue");
            return Ok(());
        };
        let len = held.len();
        self.server.truncate_slot(0, len - 1)?;
        let text = self.generate(&[last], out)?;
        if let Some(m) = self.history.last_mut().filter(|m| m.role == "assistant") {
            m.content.push_str(&text);
        }
        Ok(())
    }

    fn reset(&mut self) -> anyhow::Result<()> {
        self.server.reset_slot(0)?;
        self.history.clear();
        self.continuable = false;
        Ok(())
    }
}

pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    let dir = args.model.resolve()?;
    let mut opts = args.engine.options();
    opts.max_ctx = args.ctx;
    let engine = Engine::load_with_progress(&dir, &opts, crate::progress::load_progress())
        .with_context(|| format!("loading {}", dir.display()))?;
    let max_ctx = super::serve::engine_context("chat", &engine);
    let (usage, _) = super::start_usage(&engine, args.state_dir.as_deref(), &args.usage)?;
    let loop_cfg = LoopConfig {
        slots: 1,
        max_ctx,
        threads: args.engine.threads.map(|t| t as usize),
        ..LoopConfig::default()
    };
    let decode = DecodeLoop::spawn(engine, &loop_cfg, Box::new(std::io::stderr()))
        .with_context(|| format!("preparing {} for chat", dir.display()))?;
    let server = LoopServer::new(decode.handle(), args.top_k).context("starting the decode loop")?;
    let mut chat = Chat {
        server,
        history: Vec::new(),
        max_ctx,
        params: GenParams {
            max_tokens: args.max_tokens,
            temperature: args.temperature,
            top_p: args.top_p,
            seed: args.seed,
        },
        continuable: false,
        turns: 0,
    };
    diag!(
        "coli chat: {} (:more continues, :reset starts over, :q quits)",
        dir.display()
    );
    // A closed stdout ends the conversation like :q; the loop is stopped and
    // the usage history written whatever ended it.
    let talked = converse(&mut chat, &mut super::output::stdout());
    drop(chat);
    let stopped = decode.shutdown().context("stopping the decode loop");
    // After the loop stopped: every fetch it made is counted.
    super::finish_usage(usage);
    talked.and(stopped)
}

/// Turns from stdin until `:q` or EOF.
fn converse(chat: &mut Chat, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut input = std::io::stdin().lock();
    let mut line = String::new();
    loop {
        write!(out, "> ")?;
        out.flush()?;
        line.clear();
        if input.read_line(&mut line).context("reading stdin")? == 0 {
            writeln!(out)?;
            break;
        }
        let text = line.trim_end_matches(['\n', '\r']);
        match text.trim() {
            ":q" | ":quit" => break,
            ":reset" => {
                chat.reset()?;
                diag!("coli chat: conversation cleared; starting over");
            }
            ":more" => chat.more(out)?,
            "" => {}
            _ => chat.turn(text, out)?,
        }
    }
    out.flush()?;
    Ok(())
}
