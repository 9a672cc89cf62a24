//! The tokenizer of a GGUF file, rebuilt from its `tokenizer.ggml.*`
//! metadata as a Hugging Face [`tokenizers::Tokenizer`], so a GGUF model
//! tokenizes exactly as the tokenizer.json it was converted from.
//!
//! GGUF stores a tokenizer as data, not as a pipeline: the vocabulary
//! (`tokens`, and per token a `token_type` and, for SentencePiece, a
//! `score`), the BPE `merges`, the special ids and flags, and two names:
//! `tokenizer.ggml.model` says which algorithm (`gpt2` is byte-level BPE,
//! `llama` is SentencePiece BPE) and, for `gpt2`, `tokenizer.ggml.pre` names
//! the family whose pre-tokenizer to use ([`pre`]). The rest of the
//! pipeline (normalizer, byte-level or `▁` handling, decoder, BOS/EOS
//! template) follows from those names as llama.cpp and the family's
//! tokenizer.json define it: [`bpe`] and [`spm`].
//!
//! GGUF files come from anywhere, so the metadata is validated before
//! anything is built: the arrays agree in length, tokens are unique, every
//! merge names tokens of the vocabulary, token types and special ids are in
//! range. Each refusal names the key ([`GgufError`]); nothing panics.

mod bpe;
pub mod pre;
mod spm;

use std::collections::HashMap;

use tokenizers::AddedToken;

use super::GgufError;
use super::metadata::{Metadata, optional};
use super::value::Array;
use crate::tokenizer::Tokenizer;

pub const MODEL_KEY: &str = "tokenizer.ggml.model";
pub const PRE_KEY: &str = "tokenizer.ggml.pre";
pub const TOKENS_KEY: &str = "tokenizer.ggml.tokens";
pub const SCORES_KEY: &str = "tokenizer.ggml.scores";
pub const TOKEN_TYPE_KEY: &str = "tokenizer.ggml.token_type";
pub const MERGES_KEY: &str = "tokenizer.ggml.merges";
pub const BOS_KEY: &str = "tokenizer.ggml.bos_token_id";
pub const EOS_KEY: &str = "tokenizer.ggml.eos_token_id";
pub const EOT_KEY: &str = "tokenizer.ggml.eot_token_id";
pub const EOM_KEY: &str = "tokenizer.ggml.eom_token_id";
pub const PAD_KEY: &str = "tokenizer.ggml.padding_token_id";
pub const UNK_KEY: &str = "tokenizer.ggml.unknown_token_id";
pub const SEP_KEY: &str = "tokenizer.ggml.seperator_token_id";
pub const ADD_BOS_KEY: &str = "tokenizer.ggml.add_bos_token";
pub const ADD_EOS_KEY: &str = "tokenizer.ggml.add_eos_token";
pub const ADD_SPACE_PREFIX_KEY: &str = "tokenizer.ggml.add_space_prefix";

/// The `tokenizer.ggml.model` values rebuilt here.
pub const SUPPORTED_MODELS: &str = "gpt2 (byte-level BPE), llama (SentencePiece BPE)";

/// What a token is, from `tokenizer.ggml.token_type` (llama.cpp's
/// `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    /// 0: written by old converters; read as normal, as llama.cpp does.
    Undefined,
    Normal,
    Unknown,
    /// Special tokens (BOS, EOS, chat markers): matched in text as a whole,
    /// not printed by a decode that skips special tokens.
    Control,
    /// Added tokens that are not special: matched in text as a whole, printed.
    UserDefined,
    Unused,
    /// SentencePiece byte-fallback tokens `<0xNN>`.
    Byte,
}

impl TokenType {
    fn from_i64(v: i64) -> Option<Self> {
        Some(match v {
            0 => Self::Undefined,
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return None,
        })
    }
}

/// Which algorithm the file's tokenizer uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// `gpt2`: byte-level BPE with the pre-tokenizer named `pre`.
    Bpe { pre: String },
    /// `llama`: SentencePiece BPE over `▁`-escaped text with byte fallback.
    Spm { add_space_prefix: bool },
}

/// The special ids and flags of a GGUF tokenizer, each checked to be a
/// vocabulary id. What the engine stops on is [`SpecialTokens::stop_ids`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End of turn (chat models whose EOS is not the turn marker).
    pub eot: Option<u32>,
    /// End of message (tool calls: GLM's `<|observation|>`).
    pub eom: Option<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    /// Encoding with special tokens adds BOS first.
    pub add_bos: bool,
    /// Encoding with special tokens adds EOS last.
    pub add_eos: bool,
}

impl SpecialTokens {
    /// The ids that end generation: EOS, EOT and EOM, each once.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for id in [self.eos, self.eot, self.eom].into_iter().flatten() {
            if !out.contains(&id) {
                out.push(id);
            }
        }
        out
    }
}

/// A GGUF file's tokenizer: the engine's [`Tokenizer`] wrapper (the same
/// type a checkpoint's tokenizer.json loads into) plus what the metadata
/// says about special tokens.
pub struct GgufTokenizer {
    tokenizer: Tokenizer,
    pub kind: TokenizerKind,
    pub special: SpecialTokens,
}

impl GgufTokenizer {
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn into_tokenizer(self) -> Tokenizer {
        self.tokenizer
    }

    /// The rebuilt Hugging Face tokenizer itself (to encode with the
    /// BOS/EOS template, or to serialize as tokenizer.json).
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        self.tokenizer.hf()
    }

    pub fn stop_ids(&self) -> Vec<u32> {
        self.special.stop_ids()
    }
}

/// The tokenizer described by `meta`'s `tokenizer.ggml.*` keys.
pub fn tokenizer_from_gguf(meta: &Metadata) -> Result<GgufTokenizer, GgufError> {
    let (hf, kind, special) = hf_tokenizer_from_gguf(meta)?;
    Ok(GgufTokenizer {
        tokenizer: Tokenizer::from_hf(hf),
        kind,
        special,
    })
}

/// [`tokenizer_from_gguf`]'s parts: the Hugging Face tokenizer, the kind
/// and the special tokens.
pub fn hf_tokenizer_from_gguf(
    meta: &Metadata,
) -> Result<(tokenizers::Tokenizer, TokenizerKind, SpecialTokens), GgufError> {
    let model = meta.get_str(MODEL_KEY)?;
    // The names first: an unsupported tokenizer is refused as such, whatever
    // its vocabulary looks like.
    let plan = match model {
        "gpt2" => Plan::Bpe(pre_spec(meta)?),
        "llama" => Plan::Spm {
            add_space_prefix: optional(meta.get_bool(ADD_SPACE_PREFIX_KEY))?.unwrap_or(true),
        },
        other => {
            return Err(GgufError::Unsupported {
                key: MODEL_KEY.into(),
                found: other.into(),
                supported: SUPPORTED_MODELS.into(),
                hint: "WordPiece (bert), Unigram (t5), RWKV and the other llama.cpp vocabularies are \
                       not rebuilt; run the model's Hugging Face checkpoint (its tokenizer.json) instead",
            });
        }
    };
    let vocab = Vocab::read(meta)?;
    let defaults = match plan {
        Plan::Bpe(spec) => Defaults {
            bos: None,
            eos: None,
            unk: None,
            add_bos: spec.add_bos,
        },
        // llama.cpp's defaults for a SentencePiece vocabulary.
        Plan::Spm { .. } => Defaults {
            bos: Some(1),
            eos: Some(2),
            unk: Some(0),
            add_bos: true,
        },
    };
    let special = read_special(meta, &vocab, &defaults)?;
    let (mut tok, kind) = match plan {
        Plan::Bpe(spec) => (
            bpe::build(meta, &vocab, spec)?,
            TokenizerKind::Bpe {
                pre: meta.get_str(PRE_KEY)?.to_string(),
            },
        ),
        Plan::Spm { add_space_prefix } => (
            spm::build(meta, &vocab, special.unk, add_space_prefix)?,
            TokenizerKind::Spm { add_space_prefix },
        ),
    };
    add_special_tokens(&mut tok, &vocab);
    if let Some(pp) = template(&vocab, &special)? {
        tok.with_post_processor(Some(pp));
    }
    Ok((tok, kind, special))
}

#[derive(Clone, Copy)]
enum Plan {
    Bpe(&'static pre::PreSpec),
    Spm { add_space_prefix: bool },
}

/// The pre-tokenizer `tokenizer.ggml.pre` names, refused with a hint when
/// missing or unknown.
fn pre_spec(meta: &Metadata) -> Result<&'static pre::PreSpec, GgufError> {
    let name = meta.get_str(PRE_KEY).map_err(|e| match e {
        GgufError::MissingKey { .. } => GgufError::key(
            PRE_KEY,
            "missing: a byte-level BPE needs its pre-tokenizer's name (llama.cpp falls back to \
             \"default\" and warns that generation quality degrades); reconvert the model with a \
             current convert_hf_to_gguf.py",
        ),
        e => e,
    })?;
    pre::lookup(name).ok_or_else(|| GgufError::Unsupported {
        key: PRE_KEY.into(),
        found: name.into(),
        supported: pre::supported(),
        hint: if name == "default" {
            "\"default\" is what llama.cpp's converter writes when it does not recognise the \
             checkpoint's pre-tokenizer; reconvert the model with a current convert_hf_to_gguf.py, \
             or run its Hugging Face checkpoint"
        } else {
            "run the model's Hugging Face checkpoint (its tokenizer.json) instead"
        },
    })
}

struct Defaults {
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
}

/// The vocabulary arrays, validated against each other.
pub(crate) struct Vocab<'a> {
    pub tokens: &'a [String],
    pub types: Vec<TokenType>,
    /// id of each token.
    pub ids: HashMap<&'a str, u32>,
}

impl<'a> Vocab<'a> {
    fn read(meta: &'a Metadata) -> Result<Self, GgufError> {
        let tokens = meta.get_str_array(TOKENS_KEY)?;
        if tokens.is_empty() {
            return Err(GgufError::key(TOKENS_KEY, "the vocabulary is empty"));
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(GgufError::key(
                TOKENS_KEY,
                format!("{} tokens do not fit 32-bit token ids", tokens.len()),
            ));
        }
        let types = match optional(meta.get_array(TOKEN_TYPE_KEY))? {
            None => vec![TokenType::Normal; tokens.len()],
            Some(a) => read_types(a, tokens.len())?,
        };
        let mut ids = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            if let Some(first) = ids.insert(t.as_str(), i as u32) {
                return Err(GgufError::key(
                    TOKENS_KEY,
                    format!("token {t:?} appears twice (ids {first} and {i}); ids would be ambiguous"),
                ));
            }
        }
        Ok(Self { tokens, types, ids })
    }

    fn len(&self) -> usize {
        self.tokens.len()
    }
}

fn read_types(a: &Array, n: usize) -> Result<Vec<TokenType>, GgufError> {
    let values: Vec<i64> = match a {
        Array::I32(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U32(v) => v.iter().map(|&x| x.into()).collect(),
        Array::I8(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U8(v) => v.iter().map(|&x| x.into()).collect(),
        Array::I16(v) => v.iter().map(|&x| x.into()).collect(),
        Array::U16(v) => v.iter().map(|&x| x.into()).collect(),
        Array::I64(v) => v.clone(),
        Array::U64(v) => v.iter().map(|&x| i64::try_from(x).unwrap_or(-1)).collect(),
        other => {
            return Err(GgufError::KeyType {
                key: TOKEN_TYPE_KEY.into(),
                expected: "array of integers",
                found: format!("array of {}", other.element_type().name()),
            });
        }
    };
    if values.len() != n {
        return Err(GgufError::key(
            TOKEN_TYPE_KEY,
            format!("{} entries, but {TOKENS_KEY} has {n}", values.len()),
        ));
    }
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            TokenType::from_i64(v).ok_or_else(|| {
                GgufError::key(
                    TOKEN_TYPE_KEY,
                    format!("entry #{i} is {v}, not a token type (0 to 6)"),
                )
            })
        })
        .collect()
}

fn read_special(meta: &Metadata, vocab: &Vocab, d: &Defaults) -> Result<SpecialTokens, GgufError> {
    let n = vocab.len();
    let id = |key: &str, default: Option<u32>| -> Result<Option<u32>, GgufError> {
        match optional(meta.get_count(key))? {
            Some(v) if v < n => Ok(Some(v as u32)),
            Some(v) => Err(GgufError::key(
                key,
                format!("token id {v} is out of range (the vocabulary has {n} tokens)"),
            )),
            // A default that the vocabulary is too small for is no id.
            None => Ok(default.filter(|&v| (v as usize) < n)),
        }
    };
    let special = SpecialTokens {
        bos: id(BOS_KEY, d.bos)?,
        eos: id(EOS_KEY, d.eos)?,
        eot: id(EOT_KEY, None)?,
        eom: id(EOM_KEY, None)?,
        pad: id(PAD_KEY, None)?,
        unk: id(UNK_KEY, d.unk)?,
        sep: id(SEP_KEY, None)?,
        add_bos: optional(meta.get_bool(ADD_BOS_KEY))?.unwrap_or(d.add_bos),
        add_eos: optional(meta.get_bool(ADD_EOS_KEY))?.unwrap_or(false),
    };
    if special.add_bos && special.bos.is_none() {
        return Err(GgufError::key(
            ADD_BOS_KEY,
            format!("is true but there is no {BOS_KEY}"),
        ));
    }
    if special.add_eos && special.eos.is_none() {
        return Err(GgufError::key(
            ADD_EOS_KEY,
            format!("is true but there is no {EOS_KEY}"),
        ));
    }
    Ok(special)
}

/// Control, unknown and user-defined tokens become added tokens: matched in
/// the text as a whole before anything else (as llama.cpp partitions the
/// text on them), never split by the model. Control and unknown tokens are
/// special (a decode that skips special tokens drops them); user-defined
/// ones are not. An empty token is skipped: it cannot be written in text,
/// and an empty pattern would match everywhere.
fn add_special_tokens(tok: &mut tokenizers::Tokenizer, vocab: &Vocab) {
    let added: Vec<AddedToken> = vocab
        .tokens
        .iter()
        .zip(&vocab.types)
        .filter(|(t, _)| !t.is_empty())
        .filter_map(|(t, ty)| match ty {
            TokenType::Control | TokenType::Unknown => {
                Some(AddedToken::from(t.clone(), true).normalized(false))
            }
            TokenType::UserDefined => Some(AddedToken::from(t.clone(), false).normalized(false)),
            _ => None,
        })
        .collect();
    tok.add_special_tokens(&added);
}

/// The BOS/EOS template of an encode with special tokens, when the file
/// asks for either. Built through serde rather than the template string
/// syntax, which would misread a token containing `$`, `:` or a space.
fn template(
    vocab: &Vocab,
    special: &SpecialTokens,
) -> Result<Option<tokenizers::processors::template::TemplateProcessing>, GgufError> {
    let bos = special.bos.filter(|_| special.add_bos);
    let eos = special.eos.filter(|_| special.add_eos);
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    let tok = |id: u32| vocab.tokens[id as usize].clone();
    let piece =
        |id: u32, type_id: u32| serde_json::json!({"SpecialToken": {"id": tok(id), "type_id": type_id}});
    let seq = |s: &str, type_id: u32| serde_json::json!({"Sequence": {"id": s, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = serde_json::Map::new();
    for (s, type_id) in [("A", 0), ("B", 1)] {
        if let Some(b) = bos {
            pair.push(piece(b, type_id));
        }
        pair.push(seq(s, type_id));
        if let Some(e) = eos {
            pair.push(piece(e, type_id));
        }
    }
    if let Some(b) = bos {
        single.push(piece(b, 0));
    }
    single.push(seq("A", 0));
    if let Some(e) = eos {
        single.push(piece(e, 0));
    }
    for id in [bos, eos].into_iter().flatten() {
        specials.insert(
            tok(id),
            serde_json::json!({"id": tok(id), "ids": [id], "tokens": [tok(id)]}),
        );
    }
    let json = serde_json::json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": specials,
    });
    serde_json::from_value(json)
        .map(Some)
        .map_err(|e| GgufError::key(if bos.is_some() { BOS_KEY } else { EOS_KEY }, e.to_string()))
}
