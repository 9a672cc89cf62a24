//! `tokenizer.ggml.model = gpt2`: byte-level BPE. Tokens are stored in the
//! byte-to-unicode spelling of GPT-2 (`Ġ` for a space), merges as `"a b"`
//! strings in rank order; the pre-tokenizer is the family's ([`super::pre`])
//! followed by the byte-level mapping, and the decoder maps back.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab as BpeVocab};
use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

use super::pre::PreSpec;
use super::{MERGES_KEY, PRE_KEY, TOKENS_KEY, Vocab};
use crate::gguf::{GgufError, Metadata};

pub(super) fn build(meta: &Metadata, vocab: &Vocab, spec: &PreSpec) -> Result<Tokenizer, GgufError> {
    let merges = read_merges(meta, vocab)?;
    let map = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect::<BpeVocab>();
    let model = BPE::builder()
        .vocab_and_merges(map, merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| GgufError::key(MERGES_KEY, e.to_string()))?;
    let mut tok = Tokenizer::new(model);
    if spec.nfc {
        tok.with_normalizer(Some(NFC));
    }
    tok.with_pre_tokenizer(Some(pre_tokenizer(spec)?));
    tok.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(tok)
}

/// The family's splits, then the byte-level mapping (which applies GPT-2's
/// split itself when the family has none of its own).
fn pre_tokenizer(spec: &PreSpec) -> Result<PreTokenizerWrapper, GgufError> {
    if spec.splits.is_empty() {
        return Ok(ByteLevel::new(false, true, true).into());
    }
    let mut seq: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.splits.len() + 1);
    for re in spec.splits {
        let split = Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        // The regexes are constants of this crate; a failure is a bug
        // here, reported against the key that selected them.
        .map_err(|e| GgufError::key(PRE_KEY, format!("pre-tokenizer regex: {e}")))?;
        seq.push(split.into());
    }
    seq.push(ByteLevel::new(false, true, false).into());
    Ok(Sequence::new(seq).into())
}

/// `"left right"` strings, split at the first space after the first byte
/// (as llama.cpp reads them, so a merge whose left side starts with a space
/// still parses), each side and their join checked to be tokens.
fn read_merges(meta: &Metadata, vocab: &Vocab) -> Result<Vec<(String, String)>, GgufError> {
    let merges = meta.get_str_array(MERGES_KEY)?;
    let mut out = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        let split = m
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(at, _)| (&m[..at], &m[at + 1..]));
        let Some((left, right)) = split else {
            return Err(GgufError::key(
                MERGES_KEY,
                format!("merge #{i} {m:?} is not two tokens separated by a space"),
            ));
        };
        for part in [left, right] {
            if !vocab.ids.contains_key(part) {
                return Err(GgufError::key(
                    MERGES_KEY,
                    format!("merge #{i} {m:?} names {part:?}, which is not in {TOKENS_KEY}"),
                ));
            }
        }
        let joined = format!("{left}{right}");
        if !vocab.ids.contains_key(joined.as_str()) {
            return Err(GgufError::key(
                MERGES_KEY,
                format!("merge #{i} {m:?} makes {joined:?}, which is not in {TOKENS_KEY}"),
            ));
        }
        out.push((left.to_string(), right.to_string()));
    }
    Ok(out)
}
