//! The pre-tokenizers of byte-level BPE vocabularies, by the name
//! llama.cpp's converter stores in `tokenizer.ggml.pre`.
//!
//! A GGUF file does not carry its pre-tokenizer, only this name: the
//! converter recognises the checkpoint's tokenizer (by hashing its output on
//! a fixed text) and names the family. Each entry below is what that
//! family's own tokenizer.json does: the split regexes (applied one after
//! the other, each to the pieces of the last, the matches and the text
//! between them both kept), whether the merges are skipped for a piece that
//! is already a token (`ignore_merges`), the NFC normalizer of Qwen2, and
//! whether llama.cpp adds a BOS by default. The regexes are the original
//! Hugging Face ones (`(?i:'s|...)`), which the Oniguruma engine of the
//! `tokenizers` crate runs as written; llama.cpp spells some differently
//! for its own regex engine.

/// GPT-2's split (the `ByteLevel` pre-tokenizer with `use_regex`).
const GPT2: &[&str] = &[];

/// Llama 3's split; GLM-4 and ChatGLM use the same.
const LLAMA3: &[&str] = &[
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Qwen2 (and Qwen3): Llama 3's with single digits.
const QWEN2: &[&str] = &[
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// DeepSeek-V3: digit runs of up to three, then CJK runs, then the rest.
const DEEPSEEK_V3: &[&str] = &[
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

/// o200k (gpt-oss's `gpt-4o` name): case-aware words with contractions.
const O200K: &[&str] = &[
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Mistral's tekken: o200k's words without contractions, single digits.
const TEKKEN: &[&str] = &[
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// How one `tokenizer.ggml.pre` value pre-tokenizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreSpec {
    /// The names that select it (llama.cpp's aliases included).
    pub names: &'static [&'static str],
    /// Split regexes, in order; empty for GPT-2's, which the `ByteLevel`
    /// pre-tokenizer applies itself.
    pub splits: &'static [&'static str],
    /// A piece that is already a vocabulary entry is taken whole.
    pub ignore_merges: bool,
    /// Text is NFC-normalized first (Qwen2's tokenizer.json does; see
    /// docs/gguf.md for how llama.cpp differs).
    pub nfc: bool,
    /// llama.cpp's default for `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
}

const fn spec(names: &'static [&'static str], splits: &'static [&'static str]) -> PreSpec {
    PreSpec {
        names,
        splits,
        ignore_merges: false,
        nfc: false,
        add_bos: false,
    }
}

/// Every supported pre-tokenizer. Each is checked against a tokenizer.json
/// of that family and llama.cpp's own tokenization (tests/gguf_tokenizer.rs).
pub const PRE_TOKENIZERS: &[PreSpec] = &[
    spec(&["gpt-2", "olmo"], GPT2),
    PreSpec {
        ignore_merges: true,
        add_bos: true,
        ..spec(&["llama-bpe", "llama3", "llama-v3"], LLAMA3)
    },
    PreSpec {
        nfc: true,
        ..spec(&["qwen2", "deepseek-r1-qwen"], QWEN2)
    },
    spec(&["deepseek-v3"], DEEPSEEK_V3),
    PreSpec {
        ignore_merges: true,
        ..spec(&["glm4"], LLAMA3)
    },
    spec(&["chatglm-bpe"], LLAMA3),
    spec(&["gpt-4o"], O200K),
    // MiniMax-M2's tokenizer.json splits with o200k's regex (llama.cpp's
    // vocabulary code quotes it as the original), without ignore_merges.
    spec(&["minimax-m2"], O200K),
    PreSpec {
        ignore_merges: true,
        add_bos: true,
        ..spec(&["tekken"], TEKKEN)
    },
];

/// The pre-tokenizer named `name`, if supported.
pub fn lookup(name: &str) -> Option<&'static PreSpec> {
    PRE_TOKENIZERS.iter().find(|p| p.names.contains(&name))
}

/// The supported names, for error messages.
pub fn supported() -> String {
    PRE_TOKENIZERS
        .iter()
        .flat_map(|p| p.names.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::SplitDelimiterBehavior;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};

    #[test]
    fn every_regex_compiles_and_every_name_is_unique() {
        let mut names = Vec::new();
        for p in PRE_TOKENIZERS {
            for re in p.splits {
                Split::new(
                    SplitPattern::Regex(re.to_string()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .unwrap_or_else(|e| panic!("{:?}: {e}", p.names));
            }
            names.extend(p.names.iter().copied());
        }
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a name twice");
        assert!(lookup("default").is_none(), "llama.cpp's fallback is refused");
        assert_eq!(lookup("llama3").map(|p| p.names[0]), Some("llama-bpe"));
        let (minimax, o200k) = (lookup("minimax-m2"), lookup("gpt-4o"));
        assert_eq!(
            minimax.map(|p| (p.splits, p.ignore_merges, p.add_bos, p.nfc)),
            o200k.map(|p| (p.splits, p.ignore_merges, p.add_bos, p.nfc))
        );
    }
}
