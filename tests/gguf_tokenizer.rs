//! The tokenizer rebuilt from GGUF metadata (colibri::gguf::tokenizer_from_gguf)
//! against two independent references, for every family under
//! fixtures/gguf/tokenizers/ (tools/make_gguf_tokenizer_fixtures.py): the
//! Hugging Face tokenizer.json the vocab-only GGUF was converted from
//! (loaded here by the `tokenizers` crate), and llama.cpp's own tokenization
//! of the same hostile corpus (REF.json). Then hostile metadata: every
//! refusal names the key at fault, and nothing panics.

use std::path::PathBuf;

use colibri::gguf::build::GgufImage;
use colibri::gguf::tokenizer::{
    ADD_BOS_KEY, BOS_KEY, EOS_KEY, MERGES_KEY, MODEL_KEY, PRE_KEY, SCORES_KEY, TOKEN_TYPE_KEY, TOKENS_KEY,
};
use colibri::gguf::{Array, GgufFile, GgufTokenizer, TokenizerKind, Value, parse, tokenizer_from_gguf};
use proptest::prelude::*;
use serde_json::Value as Json;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf/tokenizers")
}

fn reference() -> Json {
    let bytes = std::fs::read(dir().join("REF.json")).expect("REF.json");
    serde_json::from_slice(&bytes).expect("REF.json parses")
}

/// Every family in REF.json, with its corpus lines.
fn families() -> Vec<(String, Vec<String>, Json)> {
    let r = reference();
    let corpus: Vec<String> = serde_json::from_value(r["corpus"].clone()).expect("corpus");
    let fams = r["families"].as_object().expect("families").clone();
    fams.into_iter()
        .map(|(name, v)| {
            let extra: Vec<String> = serde_json::from_value(v["extra_lines"].clone()).expect("extra lines");
            let lines = corpus.iter().cloned().chain(extra).collect();
            (name, lines, v)
        })
        .collect()
}

fn gguf_tokenizer(family: &str) -> GgufTokenizer {
    let f = GgufFile::open(&dir().join(family).join("vocab.gguf")).expect("vocab.gguf opens");
    tokenizer_from_gguf(f.metadata()).unwrap_or_else(|e| panic!("{family}: {e}"))
}

fn hf_tokenizer(family: &str) -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(dir().join(family).join("tokenizer.json")).expect("tokenizer.json")
}

fn ids(v: &Json) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("ids")
}

/// Lines where llama.cpp itself departs from the family's tokenizer.json,
/// so the rebuilt tokenizer (which follows tokenizer.json) cannot match it
/// (docs/gguf.md). Both are about combining marks, the corpus's only text
/// that NFC changes: Qwen2's tokenizer.json NFC-normalizes and llama.cpp
/// does not; o200k's and tekken's regexes put marks (`\p{M}`) inside words,
/// and llama.cpp's rewrite of them for its regex engine leaves them out.
fn llama_cpp_departs(family: &str, line: &str) -> bool {
    ["qwen2", "gpt-oss", "tekken"].contains(&family)
        && line.chars().any(|c| ('\u{0300}'..='\u{036f}').contains(&c))
}

#[test]
fn the_fixtures_cover_every_family_colibri_runs() {
    let names: Vec<String> = families().into_iter().map(|f| f.0).collect();
    for want in [
        "olmoe",
        "qwen2",
        "deepseek-v3",
        "glm4",
        "chatglm-bpe",
        "gpt-oss",
        "tekken",
        "llama-bpe",
        "mixtral",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from REF.json");
    }
}

#[test]
fn encode_equals_tokenizer_json_and_llama_cpp_on_every_line() {
    let mut checked = 0;
    for (family, lines, r) in families() {
        let g = gguf_tokenizer(&family);
        let hf = hf_tokenizer(&family);
        let llama = r["llama_cpp"].as_array().expect("llama_cpp");
        let recorded_hf = r["hf_ids"].as_array().expect("hf_ids");
        assert_eq!(llama.len(), lines.len(), "{family}");
        for (i, line) in lines.iter().enumerate() {
            let got = g.tokenizer().encode(line).expect("encode");
            let want = hf.encode(line.as_str(), false).expect("hf encode");
            assert_eq!(
                got,
                want.get_ids(),
                "{family} line {i} {line:?}: GGUF vs tokenizer.json"
            );
            assert_eq!(
                got,
                ids(&recorded_hf[i]),
                "{family} line {i} {line:?}: vs transformers' ids"
            );
            // With special tokens: the BOS/EOS template.
            let got_sp = g.hf().encode(line.as_str(), true).expect("encode special");
            let want_sp = hf.encode(line.as_str(), true).expect("hf encode special");
            assert_eq!(
                got_sp.get_ids(),
                want_sp.get_ids(),
                "{family} line {i} {line:?}: with specials"
            );
            if llama_cpp_departs(&family, line) {
                assert_ne!(
                    got,
                    ids(&llama[i]["ids"]),
                    "{family} line {i}: documented departure gone"
                );
                continue;
            }
            assert_eq!(
                got,
                ids(&llama[i]["ids"]),
                "{family} line {i} {line:?}: vs llama.cpp"
            );
            if !line.is_empty() {
                assert_eq!(
                    got_sp.get_ids(),
                    ids(&llama[i]["ids_add_special"]),
                    "{family} line {i} {line:?}: vs llama.cpp with specials"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 200, "{checked}");
}

#[test]
fn decode_equals_tokenizer_json_and_llama_cpp_on_every_line() {
    for (family, lines, r) in families() {
        let g = gguf_tokenizer(&family);
        let hf = hf_tokenizer(&family);
        let llama = r["llama_cpp"].as_array().expect("llama_cpp");
        let spm = matches!(g.kind, TokenizerKind::Spm { .. });
        for (i, line) in lines.iter().enumerate() {
            let ids = g.tokenizer().encode(line).expect("encode");
            let shown = g.tokenizer().decode_with(&ids, true).expect("decode");
            assert_eq!(
                shown,
                hf.decode(&ids, false).expect("hf decode"),
                "{family} line {i}"
            );
            let skipped = g.tokenizer().decode(&ids).expect("decode");
            assert_eq!(
                skipped,
                hf.decode(&ids, true).expect("hf decode"),
                "{family} line {i}"
            );
            if llama_cpp_departs(&family, line) {
                continue;
            }
            // Every line survives the round trip, except that SentencePiece
            // puts a space before the text after each special token (as
            // tokenizer.json and llama.cpp both do).
            let after_special = spm
                && ids
                    .iter()
                    .any(|id| g.hf().get_added_tokens_decoder().contains_key(id));
            if !after_special {
                assert_eq!(&shown, line, "{family} line {i}: round trip");
            }
            // llama.cpp's pieces keep SentencePiece's leading space, which
            // tokenizer.json's decoder strips.
            let mut want = llama[i]["decoded"].as_str().expect("decoded").to_string();
            if spm && want.starts_with(' ') && !line.is_empty() {
                want.remove(0);
            }
            assert_eq!(shown, want, "{family} line {i} {line:?}: vs llama.cpp");
        }
    }
}

#[test]
fn special_ids_and_stop_tokens_come_from_metadata() {
    let expect = [
        ("olmoe", None, Some("<|endoftext|>"), false),
        ("qwen2", None, Some("<|im_end|>"), false),
        (
            "deepseek-v3",
            Some("<｜begin▁of▁sentence｜>"),
            Some("<｜end▁of▁sentence｜>"),
            true,
        ),
        ("glm4", Some("[gMASK]"), Some("<|endoftext|>"), false),
        ("gpt-oss", Some("<|startoftext|>"), Some("<|return|>"), false),
        ("llama-bpe", Some("<|begin_of_text|>"), Some("<|eot_id|>"), true),
        ("tekken", Some("<s>"), Some("</s>"), true),
        ("mixtral", Some("<s>"), Some("</s>"), true),
    ];
    for (family, bos, eos, add_bos) in expect {
        let g = gguf_tokenizer(family);
        let hf = hf_tokenizer(family);
        let id = |t: Option<&str>| t.map(|t| hf.token_to_id(t).expect("token"));
        assert_eq!(g.special.bos, id(bos), "{family} bos");
        assert_eq!(g.special.eos, id(eos), "{family} eos");
        assert_eq!(g.special.add_bos, add_bos, "{family} add_bos");
        assert!(g.stop_ids().contains(&id(eos).expect("eos")), "{family}");
        // Control tokens are special: a grammar can name them by id.
        let eos_text = eos.expect("eos");
        assert_eq!(g.tokenizer().special_token_id(eos_text), id(eos), "{family}");
    }
    // GLM stops on <|user|> (end of turn) and <|observation|> (a tool call).
    let g = gguf_tokenizer("glm4");
    let hf = hf_tokenizer("glm4");
    let stops = g.stop_ids();
    for t in ["<|endoftext|>", "<|user|>", "<|observation|>"] {
        assert!(stops.contains(&hf.token_to_id(t).expect(t)), "{t} in {stops:?}");
    }
    assert_eq!(
        gguf_tokenizer("olmoe").kind,
        TokenizerKind::Bpe { pre: "olmo".into() }
    );
    assert_eq!(
        gguf_tokenizer("mixtral").kind,
        TokenizerKind::Spm {
            add_space_prefix: true
        }
    );
}

#[test]
fn qwen2s_padded_vocabulary_keeps_its_unused_tokens() {
    // The converter pads Qwen's vocabulary to config.json's vocab_size with
    // [PADn] tokens of type UNUSED; they are ids like any other.
    let g = gguf_tokenizer("qwen2");
    let hf = hf_tokenizer("qwen2");
    let n = g.hf().get_vocab_size(true);
    assert_eq!(n, hf.get_vocab_size(true) + 3);
    let last = u32::try_from(n - 1).expect("id");
    assert_eq!(
        g.hf().id_to_token(last).as_deref(),
        Some(format!("[PAD{last}]").as_str())
    );
}

// ---- hostile metadata ----

/// The metadata of a small valid byte-level vocabulary: the 256 byte
/// characters (so any text encodes), `ab`, a control token, one merge.
fn bpe_kvs() -> Vec<(&'static str, Value)> {
    let mut tokens: Vec<String> = byte_chars().into_iter().map(String::from).collect();
    tokens.push("ab".into());
    tokens.push("<|end|>".into());
    let n = tokens.len();
    let mut types = vec![1i32; n];
    types[n - 1] = 3;
    vec![
        (MODEL_KEY, Value::String("gpt2".into())),
        (PRE_KEY, Value::String("qwen2".into())),
        (TOKENS_KEY, Value::Array(Array::String(tokens))),
        (TOKEN_TYPE_KEY, Value::Array(Array::I32(types))),
        (MERGES_KEY, Value::Array(Array::String(vec!["a b".into()]))),
        (EOS_KEY, Value::U32(n as u32 - 1)),
    ]
}

/// GPT-2's byte-to-unicode table: printable bytes as themselves, the rest
/// shifted past U+0100.
fn byte_chars() -> Vec<char> {
    let mut out = Vec::new();
    let mut n = 0u32;
    for b in 0u32..256 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        if printable {
            out.push(char::from_u32(b).expect("char"));
        } else {
            out.push(char::from_u32(256 + n).expect("char"));
            n += 1;
        }
    }
    out
}

fn spm_kvs() -> Vec<(&'static str, Value)> {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    tokens.extend((0..256).map(|b| format!("<0x{b:02X}>")));
    tokens.extend(["▁", "a", "b", "ab", "▁ab"].map(String::from));
    let n = tokens.len();
    let mut types = vec![1i32; n];
    types[0] = 2;
    types[1] = 3;
    types[2] = 3;
    for t in types.iter_mut().skip(3).take(256) {
        *t = 6;
    }
    let scores: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
    vec![
        (MODEL_KEY, Value::String("llama".into())),
        (TOKENS_KEY, Value::Array(Array::String(tokens))),
        (TOKEN_TYPE_KEY, Value::Array(Array::I32(types))),
        (SCORES_KEY, Value::Array(Array::F32(scores))),
    ]
}

fn build(kvs: &[(&str, Value)]) -> Result<GgufTokenizer, String> {
    let mut img = GgufImage::new();
    img.kv("general.architecture", Value::String("llama".into()));
    for (k, v) in kvs {
        img.kv(k, v.clone());
    }
    let g = parse(&img.to_bytes()).map_err(|e| format!("parse: {e}"))?;
    tokenizer_from_gguf(&g.metadata).map_err(|e| e.to_string())
}

fn with(
    mut kvs: Vec<(&'static str, Value)>,
    key: &'static str,
    v: Option<Value>,
) -> Vec<(&'static str, Value)> {
    kvs.retain(|(k, _)| *k != key);
    if let Some(v) = v {
        kvs.push((key, v));
    }
    kvs
}

fn refused(kvs: Vec<(&'static str, Value)>, key: &str, words: &[&str]) {
    let e = match build(&kvs) {
        Ok(_) => panic!("accepted, expected an error naming {key}"),
        Err(e) => e,
    };
    assert!(e.contains(key), "{e:?} does not name {key}");
    for w in words {
        assert!(e.contains(w), "{e:?} lacks {w:?}");
    }
}

#[test]
fn the_small_valid_vocabularies_build() {
    let g = build(&bpe_kvs()).expect("bpe");
    let ids = g.tokenizer().encode("ab<|end|>ab\u{1F600}").expect("encode");
    assert_eq!(ids[0], 256);
    assert_eq!(ids[1], 257);
    assert_eq!(
        g.tokenizer().decode_with(&ids, true).expect("decode"),
        "ab<|end|>ab\u{1F600}"
    );
    let g = build(&spm_kvs()).expect("spm");
    let ids = g.tokenizer().encode("ab ab\u{e9}").expect("encode");
    // "▁ab", "▁ab", then é as its two UTF-8 bytes.
    assert_eq!(ids, [263, 263, 3 + 0xC3, 3 + 0xA9]);
    assert_eq!(g.tokenizer().decode(&ids).expect("decode"), "ab ab\u{e9}");
    assert_eq!(g.special.bos, Some(1), "llama.cpp's SentencePiece default");
    assert!(g.special.add_bos);
}

#[test]
fn unsupported_models_and_pre_tokenizers_are_refused_with_a_hint() {
    refused(
        with(bpe_kvs(), MODEL_KEY, Some(Value::String("bert".into()))),
        MODEL_KEY,
        &["\"bert\"", "gpt2", "llama", "Hugging Face checkpoint"],
    );
    refused(
        with(bpe_kvs(), PRE_KEY, Some(Value::String("falcon".into()))),
        PRE_KEY,
        &["\"falcon\"", "qwen2", "deepseek-v3"],
    );
    refused(
        with(bpe_kvs(), PRE_KEY, Some(Value::String("default".into()))),
        PRE_KEY,
        &["does not recognise", "reconvert"],
    );
    refused(with(bpe_kvs(), PRE_KEY, None), PRE_KEY, &["missing"]);
    refused(with(bpe_kvs(), MODEL_KEY, None), MODEL_KEY, &["not found"]);
    refused(
        with(bpe_kvs(), MODEL_KEY, Some(Value::U32(1))),
        MODEL_KEY,
        &["u32"],
    );
}

#[test]
fn malformed_vocabularies_are_refused_naming_the_key() {
    refused(with(bpe_kvs(), TOKENS_KEY, None), TOKENS_KEY, &["not found"]);
    refused(
        with(bpe_kvs(), TOKENS_KEY, Some(Value::Array(Array::U32(vec![1, 2])))),
        TOKENS_KEY,
        &["array of u32", "array of string"],
    );
    refused(
        with(
            bpe_kvs(),
            TOKENS_KEY,
            Some(Value::Array(Array::String(Vec::new()))),
        ),
        TOKENS_KEY,
        &["empty"],
    );
    refused(
        with(
            bpe_kvs(),
            TOKEN_TYPE_KEY,
            Some(Value::Array(Array::I32(vec![1; 3]))),
        ),
        TOKEN_TYPE_KEY,
        &["3 entries", "258"],
    );
    let mut bad_type = vec![1i32; 258];
    bad_type[7] = 9;
    refused(
        with(
            bpe_kvs(),
            TOKEN_TYPE_KEY,
            Some(Value::Array(Array::I32(bad_type))),
        ),
        TOKEN_TYPE_KEY,
        &["#7", "9"],
    );
    refused(
        with(
            bpe_kvs(),
            TOKEN_TYPE_KEY,
            Some(Value::Array(Array::F32(vec![1.0; 258]))),
        ),
        TOKEN_TYPE_KEY,
        &["array of f32"],
    );
    let mut dup: Vec<String> = byte_chars().into_iter().map(String::from).collect();
    dup.push("ab".into());
    dup.push("ab".into());
    refused(
        with(bpe_kvs(), TOKENS_KEY, Some(Value::Array(Array::String(dup)))),
        TOKENS_KEY,
        &["twice", "256", "257"],
    );
    for (merge, words) in [
        ("a zz", &["\"zz\"", "not in"][..]),
        ("ab", &["not two tokens"][..]),
        ("b a", &["\"ba\"", "not in"][..]),
    ] {
        refused(
            with(
                bpe_kvs(),
                MERGES_KEY,
                Some(Value::Array(Array::String(vec![merge.into()]))),
            ),
            MERGES_KEY,
            words,
        );
    }
    refused(with(bpe_kvs(), MERGES_KEY, None), MERGES_KEY, &["not found"]);
    refused(
        with(bpe_kvs(), EOS_KEY, Some(Value::U32(258))),
        EOS_KEY,
        &["258", "out of range"],
    );
    refused(with(bpe_kvs(), EOS_KEY, Some(Value::I32(-1))), EOS_KEY, &["-1"]);
    refused(
        with(bpe_kvs(), ADD_BOS_KEY, Some(Value::Bool(true))),
        ADD_BOS_KEY,
        &[BOS_KEY],
    );
    refused(
        with(bpe_kvs(), ADD_BOS_KEY, Some(Value::U8(1))),
        ADD_BOS_KEY,
        &["u8", "bool"],
    );
    // SentencePiece: scores missing, short, not numbers, not finite.
    refused(with(spm_kvs(), SCORES_KEY, None), SCORES_KEY, &["not found"]);
    refused(
        with(
            spm_kvs(),
            SCORES_KEY,
            Some(Value::Array(Array::F32(vec![0.0; 4]))),
        ),
        SCORES_KEY,
        &["4 entries"],
    );
    refused(
        with(
            spm_kvs(),
            SCORES_KEY,
            Some(Value::Array(Array::String(vec!["x".into()]))),
        ),
        SCORES_KEY,
        &["array of string"],
    );
    let mut nan = vec![0.0f32; 264];
    nan[5] = f32::NAN;
    refused(
        with(spm_kvs(), SCORES_KEY, Some(Value::Array(Array::F32(nan)))),
        SCORES_KEY,
        &["#5", "finite"],
    );
    refused(
        with(spm_kvs(), BOS_KEY, Some(Value::U64(u64::MAX))),
        BOS_KEY,
        &["out of range"],
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Arbitrary vocabularies, types, merges and ids: an error or a
    /// tokenizer that encodes, never a panic.
    #[test]
    fn arbitrary_vocabularies_never_panic(
        tokens in proptest::collection::vec("[a-c ▁<>0-9x]{0,4}", 1..12),
        types in proptest::collection::vec(0i32..8, 0..12),
        merges in proptest::collection::vec("[a-c ]{0,4}", 0..6),
        scores in proptest::collection::vec(-5.0f32..5.0, 0..12),
        eos in 0u32..16,
        spm in any::<bool>(),
        text in "[a-c <>▁\u{e9}x]{0,12}",
    ) {
        let mut kvs: Vec<(&'static str, Value)> = vec![
            (MODEL_KEY, Value::String(if spm { "llama" } else { "gpt2" }.into())),
            (PRE_KEY, Value::String("llama-bpe".into())),
            (TOKENS_KEY, Value::Array(Array::String(tokens))),
            (TOKEN_TYPE_KEY, Value::Array(Array::I32(types))),
            (MERGES_KEY, Value::Array(Array::String(merges))),
            (SCORES_KEY, Value::Array(Array::F32(scores))),
            (EOS_KEY, Value::U32(eos)),
        ];
        kvs.push((BOS_KEY, Value::U32(0)));
        if let Ok(g) = build(&kvs)
            && let Ok(ids) = g.tokenizer().encode(&text)
        {
            let _ = g.tokenizer().decode(&ids);
        }
    }
}

#[test]
fn the_fixture_tokenizers_have_length_bounds_like_tokenizer_json() {
    // The wrapper reads the same bound from the rebuilt tokenizer as from a
    // tokenizer.json file (a server refuses overlong prompts by length).
    for family in ["olmoe", "qwen2", "gpt-oss"] {
        let g = gguf_tokenizer(family);
        let loaded = colibri::tokenizer::Tokenizer::load(&dir().join(family)).expect("load");
        assert_eq!(
            g.tokenizer().min_tokens(1000).ok(),
            loaded.min_tokens(1000).ok(),
            "{family}"
        );
    }
}

/// The fixtures can tell the pre-tokenizers apart: the family's metadata
/// with another family's `tokenizer.ggml.pre` (one that splits differently)
/// no longer reproduces its tokenizer.json on the corpus. Without this the
/// agreement above could hold for a wrong regex.
#[test]
fn another_familys_pre_tokenizer_changes_the_ids() {
    use colibri::gguf::tokenizer::pre::{PRE_TOKENIZERS, lookup};
    let splits_of = |name: &str| {
        let p = lookup(name).expect("supported");
        (p.splits, p.nfc)
    };
    for (family, lines, _) in families() {
        let f = GgufFile::open(&dir().join(&family).join("vocab.gguf")).expect("opens");
        let meta = f.metadata();
        if meta.get_str(MODEL_KEY).expect("model") != "gpt2" {
            continue; // SentencePiece: no pre-tokenizer
        }
        let own = meta.get_str(PRE_KEY).expect("pre");
        let hf = hf_tokenizer(&family);
        let want: Vec<Vec<u32>> = lines
            .iter()
            .map(|l| hf.encode(l.as_str(), false).expect("encode").get_ids().to_vec())
            .collect();
        for other in PRE_TOKENIZERS {
            let name = other.names[0];
            if splits_of(name) == splits_of(own) {
                continue;
            }
            let mut img = GgufImage::new();
            for (k, v) in meta.iter() {
                let v = if k == PRE_KEY {
                    Value::String(name.into())
                } else {
                    v.clone()
                };
                img.kv(k, v);
            }
            let g = parse(&img.to_bytes()).expect("reparse");
            let t = tokenizer_from_gguf(&g.metadata).expect("builds");
            let same = lines
                .iter()
                .zip(&want)
                .all(|(l, w)| t.tokenizer().encode(l).expect("encode") == *w);
            assert!(
                !same,
                "{family} with pre {name:?} still matches its tokenizer.json"
            );
        }
    }
}
