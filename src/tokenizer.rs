//! Text ↔ token ids through a model directory's `tokenizer.json`.

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
}

impl Tokenizer {
    pub fn load(model_dir: &Path) -> Result<Self, TokenizerError> {
        let path = model_dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(TokenizerError::Missing(path));
        }
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| TokenizerError::Load {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        Ok(Self { inner })
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
        self.inner
            .decode(ids, true)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

/// Streams text for generated ids: decodes the growing suffix and emits only
/// what is complete, so multi-byte characters split across tokens are never
/// printed half.
pub struct StreamDecoder {
    ids: Vec<u32>,
    emitted: usize,
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self {
            ids: Vec::new(),
            emitted: 0,
        }
    }

    /// Adds one id; returns the newly completed text.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let text = tok.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let new = text.get(self.emitted..).unwrap_or("").to_string();
        self.emitted = text.len();
        Ok(new)
    }
}
