//! The most bytes of input text one token can stand for, read from
//! `tokenizer.json` once at load, so a server can tell that a prompt is
//! longer than the context from its length alone, without tokenizing it.
//!
//! Why the bound holds: encoding splits the text into pieces, and every byte
//! of every piece ends up inside exactly one token, each token being either a
//! vocabulary entry (whose stored string holds at least the bytes it covers:
//! byte-level entries spell each byte as a character of one or two bytes,
//! SentencePiece entries spell a space as the three-byte `▁`, byte-fallback
//! entries spell one byte as the six bytes `<0xAB>`) or an added token (its
//! content, verbatim). So a token covers at most `longest` bytes of the text
//! the model sees, where `longest` is the longest stored string. Normalizing
//! before that can shrink the text, at most by a factor the normalizer's
//! kind tells (below), so a token covers at most `longest * shrink` bytes of
//! the input, and a text of `B` bytes has at least `ceil(B / (longest *
//! shrink))` tokens.
//!
//! That argument needs every byte to land in a token. Tokenizers that can
//! drop text or let one token cover an unbounded run of it get no bound
//! ([`Unbounded`] says which part): a model other than BPE (WordPiece,
//! Unigram and WordLevel map a whole unknown word to one token), a fused
//! unknown token, characters missing from a vocabulary without an unknown
//! token (BPE skips them), added tokens that swallow surrounding
//! whitespace (`lstrip`, `rstrip`), normalizers that delete (`Strip`,
//! `StripAccents`, a `Replace` by nothing or by a regex, BERT's, NMT's, a
//! SentencePiece precompiled map), pre-tokenizers that delete (whitespace
//! splitters, `Removed` splits), and truncation.

use std::collections::HashSet;

use serde_json::Value;

/// Why a tokenizer has no length bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no token-count bound from the text length: {0}")]
pub struct Unbounded(pub String);

fn unbounded(why: impl Into<String>) -> Unbounded {
    Unbounded(why.into())
}

/// The most input bytes one token can cover (at least 1).
pub fn max_span(tokenizer: &Value) -> Result<usize, Unbounded> {
    if !tokenizer.get("truncation").is_none_or(Value::is_null) {
        return Err(unbounded("truncation is configured"));
    }
    let pre = tokenizer.get("pre_tokenizer").unwrap_or(&Value::Null);
    let byte_level = pre_tokenizer_keeps_text(pre)?;
    let model = tokenizer
        .get("model")
        .ok_or_else(|| unbounded("no model section"))?;
    let mut longest = model_longest(model, byte_level)?;
    for added in tokenizer
        .get("added_tokens")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let flag = |k: &str| added.get(k).and_then(Value::as_bool).unwrap_or(false);
        if flag("lstrip") || flag("rstrip") {
            return Err(unbounded("an added token strips the whitespace around it"));
        }
        let content = added
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| unbounded("an added token has no content"))?;
        longest = longest.max(content.len());
    }
    let shrink = normalizer_shrink(tokenizer.get("normalizer").unwrap_or(&Value::Null))?;
    longest
        .max(1)
        .checked_mul(shrink)
        .ok_or_else(|| unbounded("the bound overflows"))
}

fn kind(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

/// The most bytes of input one byte of the normalized text can stand for.
///
/// Unicode normalization (NFC, NFD, NFKC, NFKD) and lower-casing map each
/// code point to one or more code points, and composition merges a starter
/// with the marks it absorbs into one; a code point is 1 to 4 bytes of
/// UTF-8, and no composed character is more than 4 times shorter than the
/// sequence it replaces (checked over every code point by a test), so they
/// shrink by at most 4. A literal `Replace` shrinks by at most the pattern's
/// length over the replacement's.
fn normalizer_shrink(n: &Value) -> Result<usize, Unbounded> {
    if n.is_null() {
        return Ok(1);
    }
    match kind(n) {
        "Sequence" => {
            let mut total = 1usize;
            for inner in n
                .get("normalizers")
                .and_then(Value::as_array)
                .ok_or_else(|| unbounded("a normalizer sequence without normalizers"))?
            {
                total = total
                    .checked_mul(normalizer_shrink(inner)?)
                    .ok_or_else(|| unbounded("the normalizers shrink without bound"))?;
            }
            Ok(total)
        }
        "NFC" | "NFD" | "NFKC" | "NFKD" | "Lowercase" => Ok(4),
        "Prepend" | "ByteLevel" => Ok(1),
        "Replace" => {
            let pattern = n
                .get("pattern")
                .and_then(|p| p.get("String"))
                .and_then(Value::as_str)
                .ok_or_else(|| unbounded("a Replace normalizer with a regex pattern"))?;
            let content = n.get("content").and_then(Value::as_str).unwrap_or("");
            if content.is_empty() {
                return Err(unbounded("a Replace normalizer that deletes"));
            }
            Ok(pattern.len().div_ceil(content.len()).max(1))
        }
        other => Err(unbounded(format!("the {other:?} normalizer can delete text"))),
    }
}

/// Checks that the pre-tokenizer only splits (never deletes); true when it
/// maps bytes to byte-level characters.
fn pre_tokenizer_keeps_text(p: &Value) -> Result<bool, Unbounded> {
    if p.is_null() {
        return Ok(false);
    }
    match kind(p) {
        "Sequence" => {
            let mut byte_level = false;
            for inner in p
                .get("pretokenizers")
                .and_then(Value::as_array)
                .ok_or_else(|| unbounded("a pre-tokenizer sequence without pre-tokenizers"))?
            {
                byte_level |= pre_tokenizer_keeps_text(inner)?;
            }
            Ok(byte_level)
        }
        "ByteLevel" => Ok(true),
        "Metaspace" | "Digits" | "UnicodeScripts" => Ok(false),
        "Split" | "Punctuation" => {
            if p.get("behavior").and_then(Value::as_str) == Some("Removed") {
                Err(unbounded(format!(
                    "the {} pre-tokenizer removes its matches",
                    kind(p)
                )))
            } else {
                Ok(false)
            }
        }
        other => Err(unbounded(format!("the {other:?} pre-tokenizer can delete text"))),
    }
}

/// The longest vocabulary entry of a BPE model that covers every byte.
fn model_longest(model: &Value, byte_level: bool) -> Result<usize, Unbounded> {
    if kind(model) != "BPE" {
        return Err(unbounded(format!(
            "the {:?} model can map a whole word to one token",
            kind(model)
        )));
    }
    let set = |k: &str| {
        model
            .get(k)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    if set("continuing_subword_prefix") || set("end_of_word_suffix") {
        return Err(unbounded("a BPE model with subword affixes"));
    }
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| unbounded("a BPE model without a vocabulary"))?;
    let longest = vocab.keys().map(String::len).max().unwrap_or(0);
    let words: HashSet<&str> = vocab.keys().map(String::as_str).collect();
    // A character outside the vocabulary: BPE spells it in bytes (byte
    // fallback), as the unknown token, or skips it.
    let covered = if byte_level {
        (0..=255u8).all(|b| words.contains(byte_level_char(b).encode_utf8(&mut [0; 4]) as &str))
    } else {
        model.get("byte_fallback").and_then(Value::as_bool) == Some(true)
            && (0..=255u8).all(|b| words.contains(format!("<0x{b:02X}>").as_str()))
    };
    if covered {
        return Ok(longest);
    }
    if !set("unk_token") {
        return Err(unbounded("characters outside the vocabulary are skipped"));
    }
    if model.get("fuse_unk").and_then(Value::as_bool) == Some(true) {
        return Err(unbounded("one unknown token covers a whole unknown run"));
    }
    // One unknown token per character: at most 4 bytes.
    Ok(longest.max(4))
}

/// The character GPT-2's byte-level alphabet spells byte `b` with: printable
/// bytes stand for themselves, the others for 256 onwards in order.
fn byte_level_char(b: u8) -> char {
    let printable = |x: u8| matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or(char::REPLACEMENT_CHARACTER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;

    fn byte_vocab() -> serde_json::Map<String, Value> {
        (0..=255u8)
            .enumerate()
            .map(|(i, b)| (byte_level_char(b).to_string(), json!(i)))
            .collect()
    }

    fn byte_level(extra: &[(&str, Value)]) -> Value {
        let mut vocab = byte_vocab();
        vocab.insert("Ġlonger".into(), json!(300));
        let mut t = json!({
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": []},
            "added_tokens": [{"content": "<|assistant|>", "lstrip": false, "rstrip": false}],
        });
        for (k, v) in extra {
            t[*k] = v.clone();
        }
        t
    }

    #[test]
    fn byte_level_alphabet_is_a_bijection_onto_distinct_chars() {
        let chars: HashSet<char> = (0..=255u8).map(byte_level_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_level_char(b' '), 'Ġ');
        assert_eq!(byte_level_char(b'\n'), 'Ċ');
        assert_eq!(byte_level_char(b'a'), 'a');
    }

    #[test]
    fn the_longest_entry_or_added_token_is_the_span() {
        // "Ġlonger" is 8 bytes, "<|assistant|>" 13.
        assert_eq!(max_span(&byte_level(&[])), Ok(13));
        let t = byte_level(&[("added_tokens", json!([]))]);
        assert_eq!(max_span(&t), Ok(8));
        let t = byte_level(&[(
            "normalizer",
            json!({"type": "Sequence", "normalizers": [
            {"type": "NFC"}, {"type": "Replace", "pattern": {"String": "    "}, "content": "\t"}]}),
        )]);
        assert_eq!(max_span(&t), Ok(13 * 4 * 4));
    }

    #[test]
    fn tokenizers_that_can_drop_text_have_no_bound() {
        let cases = [
            ("truncation", json!({"max_length": 10})),
            ("normalizer", json!({"type": "Strip", "strip_left": true})),
            (
                "normalizer",
                json!({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}),
            ),
            (
                "normalizer",
                json!({"type": "Replace", "pattern": {"String": " "}, "content": ""}),
            ),
            ("pre_tokenizer", json!({"type": "Whitespace"})),
            (
                "pre_tokenizer",
                json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed"}]}),
            ),
            ("added_tokens", json!([{"content": "<mask>", "lstrip": true}])),
            ("model", json!({"type": "WordPiece", "vocab": {"a": 0}})),
        ];
        for (k, v) in cases {
            assert!(max_span(&byte_level(&[(k, v.clone())])).is_err(), "{k}: {v}");
        }
        // A byte-level vocabulary missing a byte skips it unless there is an
        // unknown token, and a fused one covers a whole run.
        let mut vocab = byte_vocab();
        vocab.remove("Ā");
        let model = |unk: Value, fuse: bool| json!({"type": "BPE", "vocab": vocab, "unk_token": unk, "fuse_unk": fuse});
        assert!(max_span(&byte_level(&[("model", model(Value::Null, false))])).is_err());
        assert!(max_span(&byte_level(&[("model", model(json!("<unk>"), true))])).is_err());
        assert_eq!(
            max_span(&byte_level(&[("model", model(json!("<unk>"), false))])),
            Ok(13)
        );
    }

    #[test]
    fn sentencepiece_style_byte_fallback_is_bounded() {
        let mut vocab: serde_json::Map<String, Value> =
            (0..=255u8).map(|b| (format!("<0x{b:02X}>"), json!(b))).collect();
        vocab.insert("▁hello".into(), json!(300));
        let t = json!({
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
            "pre_tokenizer": null,
            "model": {"type": "BPE", "vocab": vocab, "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true},
            "added_tokens": [],
        });
        assert_eq!(max_span(&t), Ok(8));
    }

    /// The shrink factor 4 of Unicode normalization: for every code point
    /// with a chance of a mapping (planes 0 to 3 and the variation
    /// selectors; planes 4 to 13 are unassigned, 15 and 16 private use), its
    /// full decompositions are at most 4 times longer than what they
    /// compose back into, and every form of it is at least a quarter of its
    /// length.
    #[test]
    fn unicode_normalization_shrinks_by_at_most_four() {
        use tokenizers::NormalizedString;
        let form = |s: &str, f: fn(&mut NormalizedString) -> &mut NormalizedString| {
            let mut n = NormalizedString::from(s);
            f(&mut n);
            n.get().len()
        };
        let mut buf = [0u8; 4];
        for c in (0..=0x3FFFFu32)
            .chain(0xE0000..=0xE0FFF)
            .filter_map(char::from_u32)
        {
            let s: &str = c.encode_utf8(&mut buf);
            for f in [
                NormalizedString::nfc,
                NormalizedString::nfd,
                NormalizedString::nfkc,
                NormalizedString::nfkd,
                NormalizedString::lowercase,
            ] {
                assert!(4 * form(s, f) >= s.len(), "{c:?}");
            }
            for (decompose, compose) in [
                (
                    NormalizedString::nfd as fn(&mut _) -> &mut _,
                    NormalizedString::nfc as fn(&mut _) -> &mut _,
                ),
                (NormalizedString::nfkd, NormalizedString::nfkc),
            ] {
                let mut d = NormalizedString::from(s);
                decompose(&mut d);
                let long = d.get().to_string();
                assert!(long.len() <= 4 * form(&long, compose), "{c:?}");
            }
        }
    }

    /// The bound never exceeds the real count, on the bundled tokenizer.
    #[test]
    fn the_bound_is_below_the_real_count_on_the_bundled_tokenizer() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny");
        let json: Value =
            serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
        let span = max_span(&json).unwrap();
        let tok = crate::tokenizer::Tokenizer::load(&dir).unwrap();
        for text in [
            "The cat sat on the mat.",
            "<|user|>hi<|assistant|>",
            "ééé 日本語 \u{1F600}\n\n\t  x",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ] {
            let n = tok.encode(text).unwrap().len();
            assert!(
                text.len().div_ceil(span) <= n,
                "{text:?}: {n} tokens, span {span}"
            );
        }
    }
}
