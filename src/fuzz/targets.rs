//! The fuzz targets: seeds, how to mutate them, and what must hold.

use std::io::Cursor;
use std::path::Path;

use colibri_actors::kv::crash::{MemStorage, RecordingStorage, replay};
use colibri_actors::kv::{KvFile, KvLayout, KvLoad, KvRecords};

use super::Verdict;
use super::mutate::{Rng, byte_mutation, json_mutation, number_mutation};
use crate::config::{GlmConfig, ModelConfig, MoeDecoderConfig, OlmoeConfig};
use crate::quant::{ByteStore, QFormat};
use crate::serve::batch::codec::{self as batch, Decoder, Item};
use crate::serve::{Frame, FrameLimits, FrameReader};
use crate::st::{Dtype, decode_f32, matrix_from_bytes, parse_header};

/// One parser under test.
pub struct Target {
    pub name: &'static str,
    /// Valid inputs the mutants start from.
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// A mutant of the first seed (the second is for splices).
    pub mutate: fn(&mut Rng, &[u8], &[u8]) -> Vec<u8>,
    /// Feeds one input to the parser and checks what it returned.
    pub check: fn(&[u8]) -> Verdict,
}

/// Every target, in a fixed order.
pub fn all_targets() -> Vec<Target> {
    vec![
        Target {
            name: "safetensors-header",
            seeds: st_seeds,
            mutate: st_mutate,
            check: st_check,
        },
        Target {
            name: "config-json",
            seeds: config_seeds,
            mutate: json_text_mutate,
            check: config_check,
        },
        Target {
            name: "coli-kv",
            seeds: kv_seeds,
            mutate: bytes_mutate,
            check: kv_check,
        },
        Target {
            name: "serve-frames",
            seeds: frame_seeds,
            mutate: bytes_mutate,
            check: frame_check,
        },
        Target {
            name: "serve-batch-frames",
            seeds: batch_seeds,
            mutate: batch_mutate,
            check: batch_check,
        },
    ]
}

fn bytes_mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        byte_mutation(rng, &mut v, other);
    }
    v
}

/// JSON text: mostly structural edits (which reach the validators), some
/// byte-level ones (which reach the JSON parser's error paths).
fn json_text_mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    if rng.below(10) < 7
        && let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(base)
    {
        for _ in 0..1 + rng.below(3) {
            json_mutation(rng, &mut v, 0);
        }
        let mut out = v.to_string().into_bytes();
        if rng.chance(4) {
            number_mutation(rng, &mut out);
        }
        return out;
    }
    bytes_mutate(rng, base, other)
}

// ---- safetensors ---------------------------------------------------------

/// A safetensors file from a header JSON and a data section.
fn st_file(header: &serde_json::Value, data: &[u8]) -> Vec<u8> {
    let h = header.to_string().into_bytes();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

fn st_seeds() -> Vec<Vec<u8>> {
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut q8 = vec![1u8, 255, 3, 4, 5, 6, 7, 128];
    q8.extend(f32s(&[0.5, 0.25]));
    let mut q4 = vec![0x12u8, 0x34, 0x56, 0x78];
    q4.extend(f32s(&[1.0, 2.0, 3.0, 4.0]));
    vec![
        st_file(
            &serde_json::json!({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}),
            &f32s(&[1.0, -2.0, 3.5, 0.0, 1e-3, 7.0]),
        ),
        st_file(
            &serde_json::json!({
                "__metadata__": {"format": "pt"},
                "m": {"dtype": "U8", "shape": [2, 4], "data_offsets": [0, 8]},
                "m.qs": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}
            }),
            &q8,
        ),
        st_file(
            &serde_json::json!({
                "g": {"dtype": "U8", "shape": [2, 2], "data_offsets": [0, 4]},
                "g.qs": {"dtype": "F32", "shape": [4], "data_offsets": [4, 20]}
            }),
            &q4,
        ),
        st_file(
            &serde_json::json!({
                "a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
                "b": {"dtype": "F16", "shape": [2, 1], "data_offsets": [8, 12]}
            }),
            &[0, 0x3f, 0, 0x40, 0x80, 0xbf, 0xff, 0x7f, 0, 0x3c, 0, 0xc0],
        ),
    ]
}

/// Mostly a structural edit of the header JSON (length prefix kept right, so
/// the edit reaches the validator), else raw bytes.
fn st_mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    if rng.below(10) < 6 && base.len() >= 8 {
        let mut n = [0u8; 8];
        n.copy_from_slice(&base[..8]);
        let hl = u64::from_le_bytes(n) as usize;
        if let Some(h) = base.get(8..8 + hl)
            && let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(h)
        {
            for _ in 0..1 + rng.below(3) {
                json_mutation(rng, &mut v, 0);
            }
            let mut data = base[8 + hl..].to_vec();
            if rng.chance(3) {
                byte_mutation(rng, &mut data, &[]);
            }
            return st_file(&v, &data);
        }
    }
    bytes_mutate(rng, base, other)
}

fn st_check(input: &[u8]) -> Verdict {
    let path = Path::new("fuzz.safetensors");
    let Ok(h) = parse_header(path, input) else {
        return Verdict::Refused;
    };
    for t in &h.tensors {
        let range = (h.data_start + t.start) as usize..(h.data_start + t.end) as usize;
        let Some(bytes) = input.get(range) else {
            return Verdict::Broken(format!("tensor {} points outside the file", t.name));
        };
        match t.dtype {
            Dtype::F32 | Dtype::BF16 | Dtype::F16 => {
                if let Ok(v) = decode_f32(t.dtype, bytes) {
                    let n: usize = t.shape.iter().product();
                    if v.len() != n {
                        return Verdict::Broken(format!(
                            "{}: {} values for shape {:?}",
                            t.name,
                            v.len(),
                            t.shape
                        ));
                    }
                }
            }
            Dtype::U8 | Dtype::I8 if t.shape.len() == 2 => {
                let qs = format!("{}.qs", t.name);
                let scales = h
                    .tensors
                    .iter()
                    .find(|s| s.name == qs && s.dtype == Dtype::F32)
                    .and_then(|s| {
                        input.get((h.data_start + s.start) as usize..(h.data_start + s.end) as usize)
                    })
                    .and_then(|b| decode_f32(Dtype::F32, b).ok());
                let _ = matrix_from_bytes(
                    &t.name,
                    t.dtype,
                    t.shape[0],
                    t.shape[1],
                    ByteStore::from_vec(bytes.to_vec()),
                    scales,
                    QFormat::F32,
                );
            }
            _ => {}
        }
    }
    Verdict::Accepted
}

// ---- config.json ---------------------------------------------------------

fn config_seeds() -> Vec<Vec<u8>> {
    let olmoe = serde_json::json!({
        "model_type": "olmoe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_experts": 8, "num_experts_per_tok": 2, "rope_theta": 10000.0, "eos_token_id": [1, 2],
        "clip_qkv": 8.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 128, "head_dim": 8,
        "rope_scaling": null, "tie_word_embeddings": false
    });
    let glm = serde_json::json!({
        "model_type": "glm_moe_dsa", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
        "q_lora_rank": 16, "kv_lora_rank": 8, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8,
        "v_head_dim": 6, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "index_topk": 4,
        "index_head_dim": 8, "index_n_heads": 2, "eos_token_id": [1, 2],
        "index_topk_pattern": "FSF", "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}
    });
    let mut dsv3 = glm.clone();
    dsv3["model_type"] = "deepseek_v3".into();
    dsv3["mlp_layer_types"] = serde_json::json!(["dense", "sparse", "sparse"]);
    dsv3["rope_interleave"] = false.into();
    let qwen = serde_json::json!({
        "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 12, "num_experts": 8, "num_experts_per_tok": 2,
        "norm_topk_prob": true, "mlp_only_layers": [1], "decoder_sparse_step": 1,
        "rope_theta": 1e6, "eos_token_id": 2, "use_sliding_window": false, "sliding_window": null,
        "tie_word_embeddings": false, "hidden_act": "silu"
    });
    let mixtral = serde_json::json!({
        "model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 10,
        "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8, "rope_theta": 1e6,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": true
    });
    let glm4 = serde_json::json!({
        "model_type": "glm4_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 12, "partial_rotary_factor": 0.5,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 2,
        "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
        "attention_bias": true, "use_qk_norm": true, "num_nextn_predict_layers": 1, "eos_token_id": [1, 2]
    });
    let gpt_oss = serde_json::json!({
        "model_type": "gpt_oss", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12,
        "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 5, "swiglu_limit": 7.0,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": false, "original_max_position_embeddings": 4096}
    });
    [olmoe, glm, dsv3, qwen, mixtral, glm4, gpt_oss]
        .iter()
        .map(|v| v.to_string().into_bytes())
        .collect()
}

fn config_check(input: &[u8]) -> Verdict {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(input) else {
        return Verdict::Refused;
    };
    let path = Path::new("config.json");
    match ModelConfig::from_json(path, v) {
        Ok(ModelConfig::Olmoe(c)) => olmoe_invariants(&c),
        Ok(ModelConfig::Glm(c)) => glm_invariants(&c),
        Ok(ModelConfig::MoeDecoder(c)) => moe_decoder_invariants(&c),
        Err(_) => Verdict::Refused,
    }
}

/// What the OLMoE model code assumes of a validated config.
fn olmoe_invariants(c: &OlmoeConfig) -> Verdict {
    if let Some(clip) = c.clip_qkv {
        // What attention does with it; panics when the bound is not a range.
        let b = clip as f32;
        let _ = 1.0f32.clamp(-b, b);
    }
    let hd = c.head_dim();
    if hd == 0 || !hd.is_multiple_of(2) || !c.num_attention_heads.is_multiple_of(c.kv_heads()) {
        return Verdict::Broken(format!(
            "head layout {hd} / {} / {}",
            c.num_attention_heads,
            c.kv_heads()
        ));
    }
    if !((c.rms_norm_eps as f32) > 0.0 && c.rope_theta().is_finite()) {
        return Verdict::Broken("rms_norm_eps or rope_theta unusable in f32".into());
    }
    if c.num_experts_per_tok > c.num_experts {
        return Verdict::Broken("top-k above the expert count".into());
    }
    let _ = c.eos_ids();
    Verdict::Accepted
}

/// What the Llama-style decoder code (Qwen3-MoE, Mixtral, GLM-4.x,
/// gpt-oss) assumes of a validated config.
fn moe_decoder_invariants(c: &MoeDecoderConfig) -> Verdict {
    let hd = c.head_dim;
    if hd == 0 || !hd.is_multiple_of(2) || !c.num_attention_heads.is_multiple_of(c.num_key_value_heads) {
        return Verdict::Broken(format!(
            "head layout {hd} / {} / {}",
            c.num_attention_heads, c.num_key_value_heads
        ));
    }
    if !((c.rms_norm_eps as f32) > 0.0 && c.rope_theta.is_finite() && c.rope_theta > 0.0) {
        return Verdict::Broken("rms_norm_eps or rope_theta unusable in f32".into());
    }
    if c.num_experts_per_tok == 0 || c.num_experts_per_tok > c.num_experts {
        return Verdict::Broken("top-k outside 1..=experts".into());
    }
    if !c.any_sparse() {
        return Verdict::Broken("no layer has routed experts".into());
    }
    if c.sliding_window == Some(0) {
        return Verdict::Broken("an empty sliding window".into());
    }
    if c.rotary_dim == 0 || c.rotary_dim > hd || !c.rotary_dim.is_multiple_of(2) {
        return Verdict::Broken(format!("rotary dims {} of head {hd}", c.rotary_dim));
    }
    if !c.sliding_layers.is_empty() && c.sliding_layers.len() != c.num_hidden_layers {
        return Verdict::Broken("layer_types do not cover the layers".into());
    }
    if let crate::config::RouterChoice::Sigmoid {
        n_group, topk_group, ..
    } = c.router
        && (n_group == 0 || !c.num_experts.is_multiple_of(n_group) || topk_group > n_group)
    {
        return Verdict::Broken("group layout".into());
    }
    if let Some(y) = &c.yarn {
        // What RoPE builds from it must be finite.
        let rope = crate::model::ops::Rope::yarn(c.rotary_dim.min(64), c.rope_theta, y);
        let mut v = vec![1.0f32; c.rotary_dim.min(64)];
        rope.apply_half(&mut v, 3);
        if v.iter().any(|x| !x.is_finite()) {
            return Verdict::Broken("YaRN rope gives non-finite values".into());
        }
    }
    let _ = c.eos_ids();
    Verdict::Accepted
}

/// What the GLM / DeepSeek-V3 model code assumes of a validated config.
fn glm_invariants(c: &GlmConfig) -> Verdict {
    let Ok(kinds) = c.mlp_sparse() else {
        return Verdict::Broken("mlp_sparse refused a validated config".into());
    };
    if kinds.len() != c.num_hidden_layers {
        return Verdict::Broken("layer kinds do not cover the layers".into());
    }
    if c.family() == crate::config::glm::MlaFamily::GlmMoeDsa {
        match c.indexer_kinds() {
            Ok(k) if k.len() == c.num_hidden_layers => {}
            _ => return Verdict::Broken("indexer kinds do not cover the layers".into()),
        }
    }
    let s = c.softmax_scale();
    if !(s.is_finite() && s > 0.0 && (c.rms_norm_eps as f32) > 0.0) {
        return Verdict::Broken(format!("softmax scale {s} or eps unusable"));
    }
    if !c.n_routed_experts.is_multiple_of(c.n_group) || c.topk_group > c.n_group {
        return Verdict::Broken("group layout".into());
    }
    let _ = c.eos_ids();
    Verdict::Accepted
}

// ---- .coli_kv --------------------------------------------------------------

const KV_LAYOUT: KvLayout = KvLayout {
    fingerprint: 0xF022,
    payload_bytes: 12,
};

fn kv_records(tokens: std::ops::Range<u32>) -> Option<KvRecords> {
    let mut r = KvRecords::new(KV_LAYOUT);
    for t in tokens {
        r.push(t, &[t as u8; 12]).ok()?;
    }
    Some(r)
}

/// A state file image written through the real writer.
fn kv_image(steps: &[(u64, std::ops::Range<u32>)]) -> Vec<u8> {
    let (storage, log) = RecordingStorage::new(Vec::new());
    let Ok((mut f, _)) =
        KvFile::open_storage(Box::new(storage), Path::new("seed"), KV_LAYOUT, &mut |_, _| {})
    else {
        return Vec::new();
    };
    for (at, toks) in steps {
        if let Some(r) = kv_records(toks.clone()) {
            let _ = f.append(*at, &r);
        }
    }
    drop(f);
    let ops = log.lock().clone();
    replay(Vec::new(), &ops)
}

fn kv_seeds() -> Vec<Vec<u8>> {
    vec![
        kv_image(&[]),
        kv_image(&[(0, 0..3)]),
        kv_image(&[(0, 0..5), (5, 5..7), (2, 20..22)]),
    ]
}

/// Loading never panics, loads whole records only, and the loaded file
/// accepts an append that the next load sees after what it held.
fn kv_check(input: &[u8]) -> Verdict {
    let (storage, log) = RecordingStorage::new(input.to_vec());
    let mut held = Vec::new();
    let Ok((mut f, load)) =
        KvFile::open_storage(Box::new(storage), Path::new("fuzz"), KV_LAYOUT, &mut |t, p| {
            held.push((t, p.to_vec()))
        })
    else {
        return Verdict::Refused;
    };
    match load {
        KvLoad::Loaded { records, declared } if records > declared || records != held.len() as u64 => {
            return Verdict::Broken(format!("{records} records of {declared}, {} visited", held.len()));
        }
        KvLoad::Missing | KvLoad::Mismatch { .. } if !held.is_empty() => {
            return Verdict::Broken("records visited from an ignored file".into());
        }
        _ => {}
    }
    let accepted = matches!(load, KvLoad::Loaded { .. });
    let Some(more) = kv_records(900..902) else {
        return Verdict::Broken("test records".into());
    };
    if let Err(e) = f.append(held.len() as u64, &more) {
        return Verdict::Broken(format!("append after load: {e}"));
    }
    drop(f);
    let image = replay(input.to_vec(), &log.lock().clone());
    let mut again = Vec::new();
    let reopened = KvFile::open_storage(
        Box::new(MemStorage(image)),
        Path::new("fuzz"),
        KV_LAYOUT,
        &mut |t, _| again.push(t),
    );
    let want: Vec<u32> = held.iter().map(|h| h.0).chain([900, 901]).collect();
    match reopened {
        Ok(_) if again == want => {
            if accepted {
                Verdict::Accepted
            } else {
                Verdict::Refused
            }
        }
        Ok(_) => Verdict::Broken(format!("reloaded {again:?}, wrote {want:?}")),
        Err(e) => Verdict::Broken(format!("reload: {e}")),
    }
}

// ---- serve frames ----------------------------------------------------------

fn frame_seeds() -> Vec<Vec<u8>> {
    [
        &b"hello there\n"[..],
        b"\x02RESET\n",
        b"\x02MORE\n",
        b"\x02PROMPT 5 16 0.7 0.9\nhello\n",
        b"\x02PROMPT 3 8 0 1 2 42\nabc\n\x02RESET\nnext line\n",
        b"\x02PROMPT 4 1 1.5 0.5 0\n\x01\x02\x03\n\n",
        b"line one\r\nline two\n\x02MORE\r\n",
    ]
    .iter()
    .map(|s| s.to_vec())
    .collect()
}

const FRAME_SLOTS: usize = 4;

/// The reader always reaches EOF (each frame consumes input), bodies keep
/// their limit, slots stay in range.
fn frame_check(input: &[u8]) -> Verdict {
    let limits = FrameLimits {
        kv_slots: FRAME_SLOTS,
        max_body: 4096,
        max_line: 4096,
    };
    let mut r = FrameReader::new(Cursor::new(input), limits);
    let mut prompts = 0u64;
    for _ in 0..input.len() + 2 {
        match r.next_frame() {
            Err(e) => return Verdict::Broken(format!("I/O error from a byte slice: {e}")),
            Ok(Frame::Eof) => {
                return if prompts > 0 {
                    Verdict::Accepted
                } else {
                    Verdict::Refused
                };
            }
            Ok(Frame::Prompt { body, kv_slot, .. }) => {
                if body.len() > 4096 || kv_slot.is_some_and(|s| s >= FRAME_SLOTS) {
                    return Verdict::Broken(format!("PROMPT of {} bytes for slot {kv_slot:?}", body.len()));
                }
                prompts += 1;
            }
            Ok(_) => {}
        }
    }
    Verdict::Broken("the reader stopped consuming input".into())
}

// ---- serve --batch frames ---------------------------------------------------

fn batch_seeds() -> Vec<Vec<u8>> {
    let mut a = batch::submit_frame("1", 0, 16, 0.7, 0.95, b"<|user|>\nhi\n<|assistant|>\n");
    a.extend_from_slice(b"STOP 1\nCANCEL 2\n");
    let mut b = b"SUBMIT req-7 3 5 8 0 1 0 12\r\nab\ncd\r\nIMAGE 9 3 2 2\nxyz\n".to_vec();
    b.extend(batch::submit_frame("9", 1, 4, 0.0, 1.0, b"x"));
    vec![
        a,
        b,
        b"SUBMIT 4 2 0 1 2 1\n\nCANCEL 4\nnot a command\n\n".to_vec(),
        b"SUBMIT 5 0 3 8 0 1 2\nabcde\nSUBMIT 6 0 x 8 0 1\nSTOP 6".to_vec(),
    ]
}

/// Mostly byte edits, some edits of the numbers (lengths, slots, limits).
fn batch_mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        if rng.below(4) == 0 {
            number_mutation(rng, &mut v);
        } else {
            byte_mutation(rng, &mut v, other);
        }
    }
    v
}

const BATCH_SLOTS: usize = 4;
const BATCH_MAX_PAYLOAD: u64 = 4096;

fn batch_decode(input: &[u8], chunk: usize) -> Vec<Item> {
    let mut d = Decoder::new(batch::Limits {
        slots: BATCH_SLOTS,
        max_payload: BATCH_MAX_PAYLOAD,
    });
    let mut out = Vec::new();
    for piece in input.chunks(chunk.max(1)) {
        d.push(piece, &mut out);
    }
    out.extend(d.finish());
    out
}

/// The same items whether the input comes whole or byte by byte; every
/// request within the limits, with a valid id.
fn batch_check(input: &[u8]) -> Verdict {
    let whole = batch_decode(input, input.len());
    let bytewise = batch_decode(input, 1);
    if whole != bytewise {
        return Verdict::Broken(format!("chunking changed the frames: {whole:?} vs {bytewise:?}"));
    }
    let mut submits = 0u64;
    for item in &whole {
        let id = match item {
            Item::Submit(s) => {
                let ok = s.slot < BATCH_SLOTS
                    && s.prompt.len() as u64 <= BATCH_MAX_PAYLOAD
                    && s.max_tokens >= 1
                    && (0.0..=2.0).contains(&s.temperature)
                    && s.top_p > 0.0
                    && s.top_p <= 1.0;
                if !ok {
                    return Verdict::Broken(format!("accepted {s:?}"));
                }
                submits += 1;
                Some(&s.id)
            }
            Item::Stop(id) | Item::Cancel(id) | Item::Image(id) => Some(id),
            Item::Rejected { id, .. } => id.as_ref(),
        };
        if let Some(id) = id
            && batch::parse_id(id.as_bytes()).as_ref() != Some(id)
        {
            return Verdict::Broken(format!("invalid id {id:?}"));
        }
    }
    if submits > 0 {
        Verdict::Accepted
    } else {
        Verdict::Refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config target would have caught the negative `clip_qkv` panic:
    /// the mutator produces such configs, and the invariant panics on one
    /// that skipped validation (as every config did before the check).
    #[test]
    fn the_config_target_reaches_the_clip_qkv_bug() {
        let seeds = config_seeds();
        let mut rng = Rng::new(1);
        let negative = (0..200_000).any(|_| {
            let m = json_text_mutate(&mut rng, &seeds[0], &seeds[1]);
            serde_json::from_slice::<serde_json::Value>(&m)
                .ok()
                .and_then(|v| v.get("clip_qkv").and_then(|c| c.as_f64()))
                .is_some_and(|c| c < 0.0)
        });
        assert!(negative, "no mutant with a negative clip_qkv");
        let mut v: serde_json::Value = serde_json::from_slice(&seeds[0]).expect("seed");
        v["clip_qkv"] = (-1.0).into();
        let unchecked: OlmoeConfig = serde_json::from_value(v).expect("deserializes");
        let r = std::panic::catch_unwind(|| olmoe_invariants(&unchecked));
        assert!(
            r.is_err(),
            "the invariant must trip on an unvalidated negative clip"
        );
    }
}
