//! `tokenizer.ggml.model = llama`: SentencePiece BPE (Llama 2, Mistral,
//! Mixtral). Spaces are escaped as `▁`, a `▁` is put before the text when
//! `add_space_prefix` (and after every special token, since the text
//! between special tokens is normalized piece by piece, which is also what
//! llama.cpp does), and a character no token covers falls back to its UTF-8
//! bytes as `<0xNN>` tokens.
//!
//! SentencePiece keeps no merge list: it merges the adjacent pair whose
//! join has the highest score. The merges are derived from the scores the
//! way transformers' converter derives them for the tokenizer.json of these
//! models (`generate_merges`): every split of every token into two tokens is
//! a merge, ranked by the joined token's score (highest first), then by the
//! lengths of the left and right sides (longest first), then by token id,
//! so the rebuilt tokenizer is the one that tokenizer.json holds.

use tokenizers::Tokenizer;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab as BpeVocab};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormalizerSequence};

use super::{SCORES_KEY, TOKENS_KEY, Vocab};
use crate::gguf::value::Array;
use crate::gguf::{GgufError, Metadata};

/// Tokens longer than this are not split into merges: SentencePiece pieces
/// are at most 16 characters by default, and splitting a hostile megabyte
/// token at every position would take quadratic time. Such a token can
/// still be matched whole only if it is a control or user-defined token.
const MAX_MERGE_TOKEN_BYTES: usize = 256;

pub(super) fn build(
    meta: &Metadata,
    vocab: &Vocab,
    unk: Option<u32>,
    add_space_prefix: bool,
) -> Result<Tokenizer, GgufError> {
    let scores = read_scores(meta, vocab.len())?;
    let merges = merges_from_scores(vocab, &scores);
    let map = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect::<BpeVocab>();
    let mut builder = BPE::builder()
        .vocab_and_merges(map, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(u) = unk {
        builder = builder.unk_token(vocab.tokens[u as usize].clone());
    }
    let model = builder
        .build()
        .map_err(|e| GgufError::key(TOKENS_KEY, format!("building the SentencePiece model: {e}")))?;
    let mut tok = Tokenizer::new(model);
    let replace = Replace::new(" ", "▁").map_err(|e| GgufError::key(TOKENS_KEY, e.to_string()))?;
    let mut norm: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        norm.push(Prepend::new("▁".into()).into());
    }
    norm.push(replace.into());
    tok.with_normalizer(Some(NormalizerSequence::new(norm)));
    // The decoder's Replace is the normalizer's type.
    let unescape = Replace::new("▁", " ").map_err(|e| GgufError::key(TOKENS_KEY, e.to_string()))?;
    let mut dec: Vec<DecoderWrapper> = vec![
        DecoderWrapper::Replace(unescape),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        dec.push(Strip::new(' ', 1, 0).into());
    }
    tok.with_decoder(Some(DecoderSequence::new(dec)));
    // Merges are derived, not read: a file that carries some anyway is not
    // refused (llama.cpp ignores them too).
    Ok(tok)
}

fn read_scores(meta: &Metadata, n: usize) -> Result<Vec<f32>, GgufError> {
    let scores: Vec<f32> = match meta.get_array(SCORES_KEY)? {
        Array::F32(v) => v.clone(),
        Array::F64(v) => v.iter().map(|&x| x as f32).collect(),
        other => {
            return Err(GgufError::KeyType {
                key: SCORES_KEY.into(),
                expected: "array of f32",
                found: format!("array of {}", other.element_type().name()),
            });
        }
    };
    if scores.len() != n {
        return Err(GgufError::key(
            SCORES_KEY,
            format!("{} entries, but {TOKENS_KEY} has {n}", scores.len()),
        ));
    }
    if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
        return Err(GgufError::key(
            SCORES_KEY,
            format!("entry #{i} is {}, not a finite score", scores[i]),
        ));
    }
    Ok(scores)
}

struct Candidate {
    left: u32,
    right: u32,
    score: f32,
    left_chars: usize,
    right_chars: usize,
}

/// transformers' `generate_merges`: for each token in id order, its splits
/// into two tokens sorted by the sides' ids; then all of them sorted
/// (stably) by score, left length and right length, each descending.
fn merges_from_scores(vocab: &Vocab, scores: &[f32]) -> Vec<(String, String)> {
    let mut all: Vec<Candidate> = Vec::new();
    for (token, &score) in vocab.tokens.iter().zip(scores) {
        if token.len() > MAX_MERGE_TOKEN_BYTES {
            continue;
        }
        let mut local: Vec<Candidate> = token
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = token.split_at(at);
                let left = *vocab.ids.get(l)?;
                let right = *vocab.ids.get(r)?;
                Some(Candidate {
                    left,
                    right,
                    score,
                    left_chars: l.chars().count(),
                    right_chars: r.chars().count(),
                })
            })
            .collect();
        local.sort_by_key(|c| (c.left, c.right));
        all.extend(local);
    }
    all.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.left_chars.cmp(&a.left_chars))
            .then(b.right_chars.cmp(&a.right_chars))
    });
    all.into_iter()
        .map(|c| {
            (
                vocab.tokens[c.left as usize].clone(),
                vocab.tokens[c.right as usize].clone(),
            )
        })
        .collect()
}
