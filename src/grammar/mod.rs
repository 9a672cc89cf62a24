//! Constrained decoding through llguidance: what a reply must match (a JSON
//! object, a JSON schema, a Lark or GBNF grammar) becomes, before each
//! token, the set of tokens the model may sample.
//!
//! - [`tokens`] holds the token environment: every token id's bytes, read
//!   from the model's tokenizer.json, and its end-of-sequence ids;
//! - [`compile`] holds turning a [`ConstraintSpec`] into llguidance's
//!   grammar and its errors into ones that say what is wrong;
//! - [`gbnf`] holds reading llama.cpp's GBNF as Lark;
//! - [`matcher`] holds one request's state: the next mask, committing tokens;
//! - [`measure`] holds the mask-cost measurement of `coli bench` and the
//!   criterion bench.
//!
//! [`Grammars`] is built per model and costs nothing until the first
//! constrained request: the token trie and llguidance's factory are made
//! then, once.

pub mod compile;
pub mod gbnf;
pub mod matcher;
pub mod measure;
pub mod tokens;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use llguidance::{Matcher, ParserFactory};

pub use compile::CompileError;
pub use matcher::{Constrained, EnforceError, Progress};
pub use tokens::VocabError;

use crate::runtime::constraint::ConstraintSpec;

/// Stack of the thread a constraint compiles on: llguidance's schema and
/// grammar compilers recurse once per nesting level.
const COMPILE_STACK: usize = 64 << 20;

/// Why a constraint was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    #[error(transparent)]
    Vocab(#[from] VocabError),
    #[error(transparent)]
    Compile(#[from] CompileError),
}

/// Where a model's token environment comes from.
enum Source {
    TokenizerJson(PathBuf),
    Words(Vec<Vec<u8>>),
}

/// The constraint compiler of one model.
pub struct Grammars {
    source: Source,
    vocab: usize,
    stops: Vec<u32>,
    factory: OnceLock<Result<Arc<ParserFactory>, VocabError>>,
}

impl Grammars {
    /// For the model in `dir`, whose logits have `vocab` entries and whose
    /// replies end at `stops`. Reads nothing until the first compile.
    pub fn for_model(dir: &Path, vocab: usize, stops: &[u32]) -> Self {
        Self {
            source: Source::TokenizerJson(dir.join("tokenizer.json")),
            vocab,
            stops: stops.to_vec(),
            factory: OnceLock::new(),
        }
    }

    /// Over a known vocabulary (`words[id]` is token `id`'s bytes).
    pub fn from_words(words: Vec<Vec<u8>>, vocab: usize, stops: &[u32]) -> Self {
        Self {
            source: Source::Words(words),
            vocab,
            stops: stops.to_vec(),
            factory: OnceLock::new(),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, VocabError> {
        let made = self.factory.get_or_init(|| {
            let words = match &self.source {
                Source::TokenizerJson(path) => tokens::token_bytes(path)?,
                Source::Words(w) => w.clone(),
            };
            let env = tokens::token_env(words, self.vocab, &self.stops)?;
            let mut f = ParserFactory::new_simple(&env).map_err(|e| VocabError::Format {
                path: self.path(),
                message: e.to_string(),
            })?;
            f.quiet();
            // Errors go to clients: the parser state dump is not for them.
            f.limits_mut().verbose_errors = false;
            Ok(Arc::new(f))
        });
        made.as_deref().map_err(Clone::clone)
    }

    fn path(&self) -> PathBuf {
        match &self.source {
            Source::TokenizerJson(p) => p.clone(),
            Source::Words(_) => PathBuf::from("(vocabulary)"),
        }
    }

    /// Compiles `spec` and computes its first mask. Blocking work (from
    /// microseconds to, for large schemas, many milliseconds): run it with
    /// [`compile_on_thread`], never on the decode loop or an async worker.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Constrained, ConstraintError> {
        let factory = self.factory()?;
        let grammar = compile::top_level(spec)?;
        let parser = llguidance::panic_utils::catch_unwind(std::panic::AssertUnwindSafe(|| {
            factory.create_parser(grammar)
        }))
        .map_err(|e| compile::classify(spec, &e))?;
        let mut matcher = Matcher::new(Ok(parser));
        for w in matcher.grammar_warnings() {
            tracing::debug!("constraint: {w}");
        }
        Ok(Constrained::start(matcher).map_err(CompileError::Unsatisfiable)?)
    }

    /// Greedy longest-match tokens of `text` in this vocabulary (benchmarks
    /// drive the matcher with them).
    pub fn greedy_tokens(&self, text: &str) -> Result<Vec<u32>, ConstraintError> {
        Ok(self
            .factory()?
            .tok_env()
            .tok_trie()
            .greedy_tokenize(text.as_bytes()))
    }
}

/// Compiles `spec` on a thread of its own (a deep stack, off the caller's
/// thread); the result arrives on the returned channel.
pub fn compile_on_thread(
    grammars: Arc<Grammars>,
    spec: ConstraintSpec,
) -> flume::Receiver<Result<Constrained, ConstraintError>> {
    let (tx, rx) = flume::bounded(1);
    let failed = tx.clone();
    let spawned = std::thread::Builder::new()
        .name("constraint-compile".into())
        .stack_size(COMPILE_STACK)
        .spawn(move || {
            let _ = tx.send(grammars.compile(&spec));
        });
    if let Err(e) = spawned {
        let _ = failed.send(Err(CompileError::Internal(format!(
            "cannot start the compile thread: {e}"
        ))
        .into()));
    }
    rx
}
