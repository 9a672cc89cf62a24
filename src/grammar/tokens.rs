//! The token environment llguidance computes masks over: every token id of
//! the model's logits with the bytes it stands for, and the end-of-sequence
//! ids a finished grammar allows. Built from the model's tokenizer.json by
//! llguidance's own reader, so the token bytes do not depend on the version
//! of the `tokenizers` crate colibri encodes prompts with.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

/// Why no token environment could be built for the model.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VocabError {
    #[error("constrained decoding needs the model's tokenizer: {path} cannot be read ({message})")]
    Read { path: PathBuf, message: String },
    #[error("constrained decoding cannot use {path}: {message}")]
    Format { path: PathBuf, message: String },
    #[error(
        "constrained decoding needs an end-of-sequence token to end a finished reply, and the model has none \
         inside its vocabulary of {vocab}"
    )]
    NoStopToken { vocab: usize },
}

/// The bytes of every token id, as the tokenizer.json at `path` defines
/// them. Special tokens carry llguidance's marker byte, so grammars never
/// produce them unless they name them.
pub fn token_bytes(path: &Path) -> Result<Vec<Vec<u8>>, VocabError> {
    let text = std::fs::read_to_string(path).map_err(|e| VocabError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| VocabError::Format {
        path: path.to_path_buf(),
        message: format!("not JSON: {e}"),
    })?;
    token_bytes_of(path, &json)
}

/// [`token_bytes`] of a tokenizer.json already parsed (`path` names where
/// it came from).
pub fn token_bytes_of(path: &Path, json: &serde_json::Value) -> Result<Vec<Vec<u8>>, VocabError> {
    // The reader asserts on some unexpected vocabularies: a panic there is
    // an unusable file, not a crash.
    llguidance::panic_utils::catch_unwind(std::panic::AssertUnwindSafe(|| {
        llguidance::token_bytes_from_tokenizer_json(json)
    }))
    .map_err(|e| VocabError::Format {
        path: path.to_path_buf(),
        message: first_line(&format!("{e:#}")),
    })
}

/// A token environment over `words`, sized to the model's logits: ids the
/// tokenizer lacks (padding rows of the embedding) stand for no bytes and
/// are never allowed; tokenizer ids past the logits are dropped, since they
/// can never be sampled. `stops` are the model's end-of-sequence ids.
pub fn token_env(mut words: Vec<Vec<u8>>, vocab: usize, stops: &[u32]) -> Result<TokEnv, VocabError> {
    let stops: Vec<u32> = stops.iter().copied().filter(|&t| (t as usize) < vocab).collect();
    let Some(&eos) = stops.first() else {
        return Err(VocabError::NoStopToken { vocab });
    };
    words.resize(vocab, Vec::new());
    let info = TokRxInfo::new(vocab as u32, eos);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&stops);
    // Greedy tokenization, marked not canonical: llguidance then never forces
    // a tokenization of its own, it only masks what the model may sample.
    Ok(Arc::new(ApproximateTokEnv::new(trie)))
}

/// A stand-in byte-level vocabulary of `vocab` tokens, for measuring mask
/// cost on models that ship no tokenizer (the synthetic benchmark shapes):
/// the 256 single bytes, then seeded English-like words with and without a
/// leading space, capitalised words, digits, punctuation runs and
/// indentation, in proportions like a GPT-style BPE vocabulary's. Random
/// words share fewer prefixes than a trained vocabulary's, so the token
/// trie is larger and the measured cost is on the high side.
pub fn synthetic_vocabulary(vocab: usize, seed: u64) -> Vec<Vec<u8>> {
    const LETTERS: &[u8] = b"etaoinshrdlcumwfgypbvkjxqz";
    const PUNCT: &[&[u8]] = &[
        b"\"", b"\",", b"\":", b"\": ", b"{\"", b"\"}", b"},", b"],", b"[\"", b"\"]", b"()", b");", b"::",
        b"->", b"//", b"==", b"...", b"--", b"\\n", b"',", b"='", b"=\"",
    ];
    let mut rng = crate::sampling::Rng::new(seed);
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let mut seen: std::collections::HashSet<Vec<u8>> = words.iter().cloned().collect();
    let pick = |rng: &mut crate::sampling::Rng, n: usize| (rng.next_u64() % n as u64) as usize;
    let mut tries = 0usize;
    while words.len() < vocab && tries < vocab * 64 {
        tries += 1;
        let kind = pick(&mut rng, 100);
        let mut w = Vec::new();
        // Word lengths like BPE's: mostly 2 to 7 letters, a long tail to 14.
        let len = 1 + pick(&mut rng, 4) + pick(&mut rng, 4) + pick(&mut rng, 3) * pick(&mut rng, 4);
        // Zipf-like letter choice: frequent letters far more often.
        let letter = |rng: &mut crate::sampling::Rng| {
            let a = pick(rng, LETTERS.len());
            LETTERS[pick(rng, a + 1)]
        };
        match kind {
            0..=54 => {
                w.push(b' ');
                w.extend((0..len).map(|_| letter(&mut rng)));
            }
            55..=79 => w.extend((0..len).map(|_| letter(&mut rng))),
            80..=87 => {
                w.push(b' ');
                w.push(letter(&mut rng).to_ascii_uppercase());
                w.extend((1..len).map(|_| letter(&mut rng)));
            }
            88..=92 => {
                if pick(&mut rng, 2) == 0 {
                    w.push(b' ');
                }
                let n = 1 + pick(&mut rng, 4);
                w.extend((0..n).map(|_| b'0' + pick(&mut rng, 10) as u8));
            }
            93..=96 => {
                w.extend_from_slice(PUNCT[pick(&mut rng, PUNCT.len())]);
                if pick(&mut rng, 2) == 0 {
                    w.extend_from_slice(PUNCT[pick(&mut rng, PUNCT.len())]);
                }
            }
            _ => {
                if pick(&mut rng, 2) == 0 {
                    w.push(b'\n');
                }
                w.extend(std::iter::repeat_n(b' ', 1 + pick(&mut rng, 16)));
            }
        }
        if seen.insert(w.clone()) {
            words.push(w);
        }
    }
    words.truncate(vocab);
    // The last id is an end-of-text special token, as in GPT-style vocabularies.
    if let Some(last) = words.last_mut() {
        let mut special = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        special.extend_from_slice(b"<|endoftext|>");
        *last = special;
    }
    words
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tiny_models_tokenizer_gives_a_byte_for_every_token() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny/tokenizer.json");
        let words = token_bytes(&path).expect("tokenizer.json");
        assert_eq!(words.len(), 1024);
        // `<|end|>` (id 5) is special: marked, so grammars cannot produce it as text.
        assert_eq!(words[5][0], TokTrie::SPECIAL_TOKEN_MARKER);
        assert!(words.iter().all(|w| !w.is_empty()));
        let env = token_env(words, 1030, &[5, 0]).expect("env");
        assert_eq!(env.tok_trie().vocab_size(), 1030);
        assert_eq!(env.tok_trie().eos_tokens(), &[5, 0]);
    }

    #[test]
    fn unusable_tokenizers_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("tokenizer.json");
        assert!(matches!(token_bytes(&missing), Err(VocabError::Read { .. })));
        std::fs::write(&missing, "{not json").expect("write");
        assert!(matches!(token_bytes(&missing), Err(VocabError::Format { .. })));
        // A vocabulary llguidance cannot decode (no byte-level decoder).
        std::fs::write(
            &missing,
            r#"{"decoder": null, "added_tokens": [], "model": {"vocab": {}}}"#,
        )
        .expect("write");
        assert!(matches!(token_bytes(&missing), Err(VocabError::Format { .. })));
        assert_eq!(
            token_env(vec![vec![b'a']], 1, &[7]).err(),
            Some(VocabError::NoStopToken { vocab: 1 })
        );
    }

    #[test]
    fn synthetic_vocabulary_is_seeded_and_sized() {
        let a = synthetic_vocabulary(50304, 1);
        assert_eq!(a.len(), 50304);
        assert_eq!(a, synthetic_vocabulary(50304, 1));
        let distinct: std::collections::HashSet<&Vec<u8>> = a.iter().collect();
        assert_eq!(distinct.len(), a.len());
    }
}
