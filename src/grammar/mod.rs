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
    /// A tokenizer built in memory (a GGUF's), in its tokenizer.json form;
    /// the path names the model file in errors.
    TokenizerValue(PathBuf, serde_json::Value),
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

    /// For a model whose tokenizer was built in memory (a GGUF's, rebuilt
    /// from its metadata); `origin` names the model file in errors.
    pub fn for_tokenizer(
        origin: &Path,
        tokenizer: &crate::tokenizer::Tokenizer,
        vocab: usize,
        stops: &[u32],
    ) -> Self {
        let source = match serde_json::to_value(tokenizer.hf()) {
            Ok(json) => Source::TokenizerValue(origin.to_path_buf(), json),
            // Unreachable for a tokenizer that loaded; reported at compile time.
            Err(_) => Source::TokenizerJson(origin.to_path_buf()),
        };
        Self {
            source,
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
                Source::TokenizerValue(path, json) => tokens::token_bytes_of(path, json)?,
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
            Source::TokenizerJson(p) | Source::TokenizerValue(p, _) => p.clone(),
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
        Constrained::start(matcher).map_err(|m| CompileError::Unsatisfiable(m).into())
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tiny() -> Grammars {
        Grammars::for_model(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny"),
            1024,
            &[5, 0],
        )
    }

    fn schema(v: serde_json::Value) -> ConstraintSpec {
        ConstraintSpec::JsonSchema {
            schema: v,
            strict: true,
        }
    }

    fn compile_err(g: &Grammars, spec: ConstraintSpec) -> CompileError {
        match g.compile(&spec) {
            Err(ConstraintError::Compile(e)) => e,
            Err(e) => panic!("{spec:?}: {e}"),
            Ok(_) => panic!("{spec:?} compiled"),
        }
    }

    #[test]
    fn compile_errors_say_what_is_wrong() {
        let g = tiny();
        let e = compile_err(&g, schema(json!({"type": "strin"})));
        assert!(
            matches!(&e, CompileError::Schema(m) if m.contains("strin")),
            "{e:?}"
        );
        let e = compile_err(
            &g,
            schema(json!({"properties": {"a": {"$ref": "#/$defs/b"}}, "required": ["a"]})),
        );
        assert_eq!(
            e,
            CompileError::UnknownRef {
                reference: "#/$defs/b".into()
            }
        );
        let e = compile_err(&g, schema(json!({"$ref": "other.json"})));
        assert_eq!(
            e,
            CompileError::UnknownRef {
                reference: "other.json".into()
            }
        );
        let e = compile_err(&g, schema(json!({"type": "array", "uniqueItems": true})));
        assert!(
            matches!(&e, CompileError::Schema(m) if m.contains("uniqueItems")),
            "{e:?}"
        );
        let e = compile_err(&g, schema(json!({"type": "integer", "minimum": 5, "maximum": 1})));
        assert!(matches!(e, CompileError::Unsatisfiable(_)), "{e:?}");
        let e = compile_err(&g, ConstraintSpec::Lark("start: a\na: \"x\" |\n  b: ]".into()));
        assert!(matches!(e, CompileError::GrammarAt { line: 3, .. }), "{e:?}");
        let e = compile_err(&g, ConstraintSpec::Lark("start: nothing_here".into()));
        assert!(e.to_string().contains("nothing_here"), "{e}");
        // Not strict: the unknown keyword is ignored.
        let lenient = ConstraintSpec::JsonSchema {
            schema: json!({"type": "array", "uniqueItems": true}),
            strict: false,
        };
        assert!(g.compile(&lenient).is_ok());
    }

    #[test]
    fn gbnf_compiles_through_lark() {
        let g = tiny();
        let gbnf = r#"
# llama.cpp's JSON grammar, shortened
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
"#;
        let lark = gbnf::to_lark(gbnf).expect("translates");
        let mut c = g.compile(&ConstraintSpec::Lark(lark)).expect("compiles");
        // Drive it through a document: every token allowed, then complete.
        let doc = r#"{"a": [1, -2.5e3, "x\n"], "b": {"c": true}}"#;
        let mut logits = vec![0.0f32; 1024];
        for t in g.greedy_tokens(doc).expect("tokens") {
            logits.fill(0.0);
            c.mask_logits(&mut logits).expect("mask");
            assert!(logits[t as usize].is_finite(), "token {t} masked in {doc}");
            c.commit(t).expect("commit");
        }
        logits.fill(0.0);
        c.mask_logits(&mut logits).expect("mask");
        assert!(
            logits[5].is_finite(),
            "the end token is allowed once the object is complete"
        );
    }

    #[test]
    fn masks_allow_exactly_the_grammar() {
        let g = tiny();
        let mut c = g
            .compile(&ConstraintSpec::Lark(r#"start: "yes" | "no""#.into()))
            .expect("compiles");
        let mut logits = vec![0.0f32; 1024];
        c.mask_logits(&mut logits).expect("mask");
        let allowed: Vec<usize> = (0..1024).filter(|&i| logits[i].is_finite()).collect();
        let yes = g.greedy_tokens("yes").expect("tokens");
        assert!(allowed.contains(&(yes[0] as usize)));
        assert!(!allowed.contains(&5), "nothing complete yet: no end token");
        for t in &yes {
            logits.fill(0.0);
            c.mask_logits(&mut logits).expect("mask");
            assert!(logits[*t as usize].is_finite());
            let p = c.commit(*t).expect("commit");
            if Some(t) == yes.last() {
                assert_eq!(p, Progress::Complete);
            }
        }
    }

    #[test]
    fn hostile_inputs_are_errors_or_grammars_never_panics() {
        let g = tiny();
        let mut deep = json!({"type": "integer"});
        for _ in 0..120 {
            deep = json!({"type": "object", "properties": {"a": deep}, "required": ["a"]});
        }
        for spec in [
            schema(deep),
            schema(json!({"$ref": "#"})),
            schema(json!({"type": "string", "pattern": "(a*)*b{1000}"})),
            schema(json!({"type": "string", "pattern": "(?<=x)y"})),
            schema(json!({"type": "array", "items": {"$ref": "#/items"}})),
            ConstraintSpec::Lark("start: start start | \"a\"".into()),
            ConstraintSpec::Lark(format!("start: {}\"a\"{}", "(".repeat(500), ")".repeat(500))),
            ConstraintSpec::Lark("start: %json {\"type\": 3}".into()),
            ConstraintSpec::Lark("start: <|no-such-token|>".into()),
            ConstraintSpec::Lark("start: /\\xff/".into()),
        ] {
            // Either outcome is fine; reaching here without a panic is the test.
            let r = compile_on_thread(Arc::new(tiny()), spec.clone()).recv();
            assert!(r.is_ok(), "{spec:?}: the compile thread died");
        }
        drop(g);
    }
}
