//! Text ↔ token ids through a model directory's `tokenizer.json`.

pub mod bound;

use std::path::{Path, PathBuf};

/// Why text could not be tokenized.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(
        "{0} not found: this model directory has no tokenizer; use --prompt-ids with token ids, or add tokenizer.json"
    )]
    Missing(PathBuf),
    #[error("loading {path}: {reason}")]
    Load { path: PathBuf, reason: String },
    #[error("tokenizing: {0}")]
    Encode(String),
    #[error("detokenizing: {0}")]
    Decode(String),
}

/// A loaded Hugging Face tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The most input bytes one token covers ([`bound`]), when that is bounded.
    span: Result<usize, bound::Unbounded>,
}

impl Tokenizer {
    pub fn load(model_dir: &Path) -> Result<Self, TokenizerError> {
        let path = model_dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(TokenizerError::Missing(path));
        }
        let load = |reason: String| TokenizerError::Load {
            path: path.clone(),
            reason,
        };
        let bytes = std::fs::read(&path).map_err(|e| load(e.to_string()))?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| load(e.to_string()))?;
        // The file parsed as a tokenizer, so it is JSON.
        let span = serde_json::from_slice(&bytes)
            .map_err(|e| bound::Unbounded(e.to_string()))
            .and_then(|json| bound::max_span(&json));
        Ok(Self { inner, span })
    }

    /// Wraps a tokenizer built in memory (a GGUF file's, rebuilt from its
    /// metadata by [`crate::gguf::tokenizer_from_gguf`]); the length bound
    /// is read from its tokenizer.json form, as [`Tokenizer::load`] reads it
    /// from the file.
    pub fn from_hf(inner: tokenizers::Tokenizer) -> Self {
        let span = serde_json::to_value(&inner)
            .map_err(|e| bound::Unbounded(e.to_string()))
            .and_then(|json| bound::max_span(&json));
        Self { inner, span }
    }

    /// The Hugging Face tokenizer inside.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The fewest tokens a text of `bytes` bytes can encode to, when the
    /// tokenizer allows such a bound ([`bound`] says why it holds): every
    /// token covers at most `span` bytes, so there are at least
    /// `ceil(bytes / span)`. Lets a server refuse a prompt longer than the
    /// context without tokenizing it.
    pub fn min_tokens(&self, bytes: usize) -> Result<usize, &bound::Unbounded> {
        self.span.as_ref().map(|&span| bytes.div_ceil(span))
    }

    /// Ids of `text` as-is (special-token strings in the text are recognised,
    /// no BOS is added: chat templates place their own).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`; special tokens (end-of-turn markers and the like) are
    /// not printed.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_with(ids, false)
    }

    /// Text of `ids`, special tokens printed too when `special`.
    pub fn decode_with(&self, ids: &[u32], special: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, !special)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// The id of the special token spelled `text`, if the vocabulary has one
    /// (added tokens marked special; a grammar must name those by id).
    pub fn special_token_id(&self, text: &str) -> Option<u32> {
        self.inner
            .get_added_tokens_decoder()
            .iter()
            .find(|(_, t)| t.special && t.content == text)
            .map(|(id, _)| *id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

/// Streams text for generated ids and emits only what is complete, so
/// multi-byte characters split across tokens are never printed half.
///
/// Each push decodes a short window, not the whole reply (which made a long
/// reply quadratic): the text of `ids[prefix..read]` (already emitted) is
/// compared with that of `ids[prefix..]`, and the difference is new. Decoding
/// from `prefix` rather than from the start keeps context for tokenizers that
/// treat a leading token specially (SentencePiece's leading space), since
/// both texts start at the same token.
#[derive(Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
    /// Special tokens are printed too.
    special: bool,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that prints special tokens too ([`Tokenizer::decode_with`]).
    pub fn with_special(special: bool) -> Self {
        Self {
            special,
            ..Self::default()
        }
    }

    /// Adds one id; returns the newly completed text.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let done = tok.decode_with(&self.ids[self.prefix..self.read], self.special)?;
        let text = tok.decode_with(&self.ids[self.prefix..], self.special)?;
        if text.len() <= done.len() || text.ends_with('\u{FFFD}') || !text.is_char_boundary(done.len()) {
            return Ok(String::new());
        }
        let new = text[done.len()..].to_string();
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bundled() -> Tokenizer {
        Tokenizer::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny")).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The streamed pieces add up to the text of the whole reply.
        #[test]
        fn streamed_pieces_add_up_to_the_full_text(ids in proptest::collection::vec(0u32..2000, 1..120)) {
            let tok = bundled();
            let mut d = StreamDecoder::new();
            let mut out = String::new();
            for &id in &ids {
                out.push_str(&d.push(&tok, id).unwrap());
            }
            let full = tok.decode(&ids).unwrap();
            let full = full.trim_end_matches('\u{FFFD}');
            prop_assert!(full.starts_with(&out), "{out:?} vs {full:?}");
            prop_assert!(full.len() - out.len() <= 16, "{out:?} vs {full:?}");
        }
    }
}
