//! The fuzz targets: seeds, how to mutate them, and what must hold.

use std::io::Cursor;
use std::path::Path;

use colibri_actors::kv::crash::{MemStorage, RecordingStorage, replay};
use colibri_actors::kv::{KvFile, KvLayout, KvLoad, KvRecords};

use super::Verdict;
use super::mutate::{Rng, byte_mutation, json_mutation, number_mutation};
use crate::gguf::build::GgufImage;
use crate::gguf::{Array, GgmlType, MAX_ARRAY_DEPTH, MAX_DIMS, Value, expert_slice};
use crate::model::family::ModelConfig;
use crate::quant::{ByteStore, QFormat};
use crate::runtime::limits;
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
            name: "coli-kv-recurrent",
            seeds: kv_state_seeds,
            mutate: bytes_mutate,
            check: kv_state_check,
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
        Target {
            name: "gguf-header",
            seeds: gguf_seeds,
            mutate: gguf_mutate,
            check: gguf_check,
        },
        Target {
            name: "gguf-tokenizer",
            seeds: gguf_tokenizer_seeds,
            mutate: gguf_mutate,
            check: gguf_tokenizer_check,
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

/// Every registered family's seeds, in registry order.
fn config_seeds() -> Vec<Vec<u8>> {
    crate::model::FAMILIES
        .iter()
        .flat_map(|f| f.fuzz_seeds())
        .map(|v| v.to_string().into_bytes())
        .collect()
}

/// An accepted config must satisfy its family's invariants
/// ([`crate::model::family::FamilyConfig::invariants`]).
fn config_check(input: &[u8]) -> Verdict {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(input) else {
        return Verdict::Refused;
    };
    let path = Path::new("config.json");
    match ModelConfig::from_json(path, v) {
        Ok(c) => match c.family().invariants() {
            Ok(()) => Verdict::Accepted,
            Err(broken) => Verdict::Broken(broken),
        },
        Err(_) => Verdict::Refused,
    }
}

// ---- .coli_kv --------------------------------------------------------------

const KV_LAYOUT: KvLayout = KvLayout {
    fingerprint: 0xF022,
    payload_bytes: 12,
    payload_kind: 0,
    state_bytes: 0,
};

/// Records of `layout` whose payload bytes are their token's low byte.
fn kv_records(layout: KvLayout, tokens: std::ops::Range<u32>) -> Option<KvRecords> {
    let mut r = KvRecords::new(layout);
    for t in tokens {
        r.push(t, &vec![t as u8; layout.payload_bytes]).ok()?;
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
        if let Some(r) = kv_records(KV_LAYOUT, toks.clone()) {
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

/// A state file with a recurrent part (40 bytes, so both areas and the
/// records sit in the first sectors a mutation touches).
const KV_STATE_LAYOUT: KvLayout = KvLayout {
    fingerprint: 0xF023,
    payload_bytes: 12,
    payload_kind: 0,
    state_bytes: 40,
};

/// The recurrent part saved after `n` records: it names its position.
fn kv_state_bytes(n: u64) -> Vec<u8> {
    (0..KV_STATE_LAYOUT.state_bytes)
        .map(|i| (n as u8) ^ (i as u8))
        .collect()
}

/// Appends (`Some(range)` at its position) and saves (`None`: after what
/// is held), through the real writer.
fn kv_state_image(steps: &[(u64, Option<std::ops::Range<u32>>)]) -> Vec<u8> {
    let (storage, log) = RecordingStorage::new(Vec::new());
    let Ok((mut f, _)) = KvFile::open_storage(
        Box::new(storage),
        Path::new("seed"),
        KV_STATE_LAYOUT,
        &mut |_, _| {},
    ) else {
        return Vec::new();
    };
    for (at, toks) in steps {
        let _ = match toks {
            Some(t) => kv_records(KV_STATE_LAYOUT, t.clone()).map(|r| f.append(*at, &r)),
            None => Some(f.save_state(*at, &kv_state_bytes(*at))),
        };
    }
    drop(f);
    let ops = log.lock().clone();
    replay(Vec::new(), &ops)
}

fn kv_state_seeds() -> Vec<Vec<u8>> {
    vec![
        kv_state_image(&[(0, Some(0..3)), (3, None)]),
        kv_state_image(&[
            (0, Some(0..5)),
            (5, None),
            (5, Some(5..7)),
            (7, None),
            (2, Some(20..22)),
        ]),
    ]
}

/// Loading never panics; what loads ends exactly at a recurrent part
/// whose bytes are whole; records load only with one; and a save after an
/// append is what the next load sees.
fn kv_state_check(input: &[u8]) -> Verdict {
    let (storage, log) = RecordingStorage::new(input.to_vec());
    let mut held = Vec::new();
    let Ok((mut f, load)) = KvFile::open_storage(
        Box::new(storage),
        Path::new("fuzz"),
        KV_STATE_LAYOUT,
        &mut |t, _| held.push(t),
    ) else {
        return Verdict::Refused;
    };
    let state = f.take_state();
    match (&load, &state) {
        (KvLoad::Loaded { .. }, Some((at, bytes)))
            if *at != held.len() as u64 || bytes.len() != KV_STATE_LAYOUT.state_bytes =>
        {
            return Verdict::Broken(format!(
                "state at {at} of {} bytes, {} records",
                bytes.len(),
                held.len()
            ));
        }
        (_, None) if !held.is_empty() => return Verdict::Broken("records loaded without a state".into()),
        _ => {}
    }
    let accepted = matches!(load, KvLoad::Loaded { .. }) && state.is_some();
    let Some(more) = kv_records(KV_STATE_LAYOUT, 900..902) else {
        return Verdict::Broken("test records".into());
    };
    let end = held.len() as u64 + 2;
    if let Err(e) = f
        .append(held.len() as u64, &more)
        .and_then(|()| f.save_state(end, &kv_state_bytes(end)))
    {
        return Verdict::Broken(format!("append and save after load: {e}"));
    }
    drop(f);
    let image = replay(input.to_vec(), &log.lock().clone());
    let mut again = Vec::new();
    let reopened = KvFile::open_storage(
        Box::new(MemStorage(image)),
        Path::new("fuzz"),
        KV_STATE_LAYOUT,
        &mut |t, _| again.push(t),
    )
    .map(|(mut f, _)| f.take_state());
    let want: Vec<u32> = held.iter().copied().chain([900, 901]).collect();
    match reopened {
        Ok(state) if again == want && state == Some((end, kv_state_bytes(end))) => {
            if accepted {
                Verdict::Accepted
            } else {
                Verdict::Refused
            }
        }
        Ok(_) => Verdict::Broken(format!(
            "reloaded {again:?}, wrote {want:?} and a state after them"
        )),
        Err(e) => Verdict::Broken(format!("reload: {e}")),
    }
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
        KvLoad::Missing | KvLoad::Mismatch { .. } | KvLoad::OtherKind { .. } if !held.is_empty() => {
            return Verdict::Broken("records visited from an ignored file".into());
        }
        _ => {}
    }
    let accepted = matches!(load, KvLoad::Loaded { .. });
    let Some(more) = kv_records(KV_LAYOUT, 900..902) else {
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
            Ok(Frame::Prompt {
                body,
                kv_slot,
                max_tokens,
                temperature,
                top_p,
                ..
            }) => {
                if body.len() > 4096 || kv_slot.is_some_and(|s| s >= FRAME_SLOTS) {
                    return Verdict::Broken(format!("PROMPT of {} bytes for slot {kv_slot:?}", body.len()));
                }
                if !within_limits(max_tokens, temperature, top_p) {
                    return Verdict::Broken(format!(
                        "PROMPT accepted max_tokens {max_tokens}, temperature {temperature}, top_p {top_p}"
                    ));
                }
                prompts += 1;
            }
            Ok(_) => {}
        }
    }
    Verdict::Broken("the reader stopped consuming input".into())
}

/// The values an accepted frame carries pass the limits every front end
/// shares (the decoders must not keep a range of their own).
fn within_limits(max_tokens: usize, temperature: f32, top_p: f32) -> bool {
    limits::max_tokens(&max_tokens.to_string()).is_ok()
        && limits::temperature(&temperature.to_string()).is_ok()
        && limits::top_p(&top_p.to_string()).is_ok()
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
                    && within_limits(s.max_tokens, s.temperature, s.top_p);
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

// ---- GGUF -----------------------------------------------------------------

/// A small model-shaped GGUF: every value type, nested arrays, F32 and
/// Q8_0 tensors, and one layer of stacked experts.
fn gguf_seed(version: u32, alignment: Option<u32>) -> Vec<u8> {
    let mut g = GgufImage::new();
    g.version = version;
    if let Some(a) = alignment {
        g.alignment = a as u64;
        g.kv("general.alignment", Value::U32(a));
    }
    g.kv("general.architecture", Value::String("olmoe".into()))
        .kv("olmoe.expert_count", Value::U32(3))
        .kv("olmoe.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("olmoe.rope.freq_base", Value::F64(1e4))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .kv("tokenizer.ggml.bos_token_id", Value::I32(1))
        .kv("general.size", Value::U64(1 << 40))
        .kv("general.small", Value::U8(7))
        .kv("general.neg", Value::I64(-3))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(vec!["a".into(), "bc".into(), "<|x|>".into()])),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1, 1, 3])),
        )
        .kv(
            "general.nested",
            Value::Array(Array::Array(vec![
                Array::U16(vec![1, 2]),
                Array::Bool(vec![true]),
            ])),
        );
    let f32s = |n: usize| {
        (0..n)
            .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let q8 = |blocks: usize| {
        (0..blocks)
            .flat_map(|b| {
                let mut blk = half::f16::from_f32(0.01 * (b + 1) as f32).to_le_bytes().to_vec();
                blk.extend((0..32).map(|i| (i as i8 - 16) as u8));
                blk
            })
            .collect::<Vec<u8>>()
    };
    g.tensor("token_embd.weight", &[8, 2], GgmlType::F32, &f32s(16))
        .tensor("blk.0.attn_q.weight", &[32, 2], GgmlType::Q8_0, &q8(2))
        .tensor("blk.0.ffn_gate_exps.weight", &[32, 2, 3], GgmlType::Q8_0, &q8(6))
        .tensor("blk.0.ffn_up_exps.weight", &[32, 2, 3], GgmlType::Q8_0, &q8(6))
        .tensor(
            "blk.0.ffn_down_exps.weight",
            &[2, 32, 3],
            GgmlType::F32,
            &f32s(192),
        )
        .tensor("output_norm.weight", &[8], GgmlType::F32, &f32s(8));
    g.to_bytes()
}

fn gguf_seeds() -> Vec<Vec<u8>> {
    let mut empty = GgufImage::new();
    empty.version = 2;
    empty.kv("general.architecture", Value::String("x".into()));
    vec![
        gguf_seed(3, None),
        gguf_seed(3, Some(64)),
        gguf_seed(2, Some(8)),
        empty.to_bytes(),
    ]
}

/// Integers that break counts, lengths, dims and offsets.
const GGUF_NUMBERS: &[u64] = &[
    0,
    1,
    2,
    3,
    4,
    5,
    8,
    9,
    12,
    13,
    31,
    32,
    33,
    63,
    64,
    65,
    255,
    256,
    65_535,
    65_536,
    1 << 31,
    u32::MAX as u64,
    1 << 32,
    1 << 40,
    i64::MAX as u64,
    1 << 63,
    u64::MAX,
];

/// Half the time an integer written over a field-sized stretch of the
/// header (where counts, lengths, types and offsets live), else byte edits.
pub(super) fn gguf_mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    if v.len() > 8 && rng.below(2) == 0 {
        for _ in 0..1 + rng.below(2) {
            let n = GGUF_NUMBERS[rng.below(GGUF_NUMBERS.len() as u64) as usize];
            let width = if rng.below(2) == 0 { 4 } else { 8 };
            let header = v.len().min(1200);
            let at = rng.below((header.saturating_sub(width)) as u64 + 1) as usize;
            let bytes = n.to_le_bytes();
            if let Some(dst) = v.get_mut(at..at + width) {
                dst.copy_from_slice(&bytes[..width]);
            }
        }
        return v;
    }
    bytes_mutate(rng, base, other)
}

fn array_depth_ok(v: &Value) -> bool {
    match v {
        Value::Array(a) => a.depth() <= MAX_ARRAY_DEPTH,
        _ => true,
    }
}

/// An accepted file's tensors lie inside it, aligned, sized by their type
/// and dims, without overlaps; experts split inside their tensor; every key
/// is found again and no array nests deeper than the bound.
fn gguf_check(input: &[u8]) -> Verdict {
    let Ok(g) = crate::gguf::parse(input) else {
        return Verdict::Refused;
    };
    let len = input.len() as u64;
    if !g.alignment.is_power_of_two() || !g.data_start.is_multiple_of(g.alignment) {
        return Verdict::Broken(format!("alignment {} / data start {}", g.alignment, g.data_start));
    }
    let mut ranges = Vec::new();
    for t in &g.tensors {
        let elems = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let ok = t.data.end <= len
            && t.data.start <= t.data.end
            && (1..=MAX_DIMS as usize).contains(&t.dims.len())
            && elems == Some(t.n_elements)
            && t.dims[0].is_multiple_of(t.ggml_type.block_size())
            && t.ggml_type.bytes_for(t.n_elements) == Some(t.n_bytes())
            && t.data.start == g.data_start + t.offset
            && t.offset.is_multiple_of(g.alignment)
            && g.tensor(&t.name) == Some(t);
        if !ok {
            return Verdict::Broken(format!("tensor {t:?} in a file of {len} bytes"));
        }
        if t.dims.len() == 3 {
            for e in 0..t.dims[2].min(16) {
                match expert_slice(t, e) {
                    Ok((o, l)) if o >= t.data.start && o + l <= t.data.end => {}
                    other => return Verdict::Broken(format!("{}: expert {e}: {other:?}", t.name)),
                }
            }
        }
        if t.n_bytes() > 0 {
            ranges.push(t.data.clone());
        }
    }
    ranges.sort_by_key(|r| r.start);
    if ranges.windows(2).any(|w| w[1].start < w[0].end) {
        return Verdict::Broken("overlapping tensors accepted".into());
    }
    for (k, v) in g.metadata.iter() {
        // The same entry (by address: a NaN value is not equal to itself).
        if !g.metadata.get(k).is_some_and(|found| std::ptr::eq(found, v)) || !array_depth_ok(v) {
            return Verdict::Broken(format!("key {k:?}"));
        }
    }
    let _ = g.metadata.get_count("olmoe.expert_count");
    let _ = g.metadata.get_float("olmoe.attention.layer_norm_rms_epsilon");
    let _ = g.metadata.get_str_array("tokenizer.ggml.tokens");
    Verdict::Accepted
}

// ---- GGUF tokenizer ---------------------------------------------------------

/// Vocab-only GGUF files: a byte-level BPE (tokens, types, merges, special
/// ids) and a SentencePiece one (scores, byte tokens, unknown and control
/// tokens), small enough that a mutant's header edits land in the arrays.
fn gguf_tokenizer_seeds() -> Vec<Vec<u8>> {
    let strings = |v: &[&str]| Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()));
    let mut bpe = GgufImage::new();
    bpe.kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("qwen2".into()))
        .kv(
            "tokenizer.ggml.tokens",
            strings(&["a", "b", "ab", "Ġ", "Ġab", "1", "<|e|>"]),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1, 1, 1, 1, 1, 1, 3])),
        )
        .kv("tokenizer.ggml.merges", strings(&["a b", "Ġ ab"]))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(6))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(6))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(true));
    let mut spm = GgufImage::new();
    spm.kv("tokenizer.ggml.model", Value::String("llama".into()))
        .kv(
            "tokenizer.ggml.tokens",
            strings(&[
                "<unk>", "<s>", "</s>", "<0xC3>", "<0xA9>", "▁", "a", "b", "ab", "▁ab",
            ]),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![2, 3, 3, 6, 6, 1, 1, 1, 1, 1])),
        )
        .kv(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32((0..10).map(|i| -(i as f32)).collect())),
        )
        .kv("tokenizer.ggml.add_space_prefix", Value::Bool(true));
    vec![bpe.to_bytes(), spm.to_bytes()]
}

/// An accepted vocabulary encodes a hostile text to ids of the vocabulary,
/// decodes them again, and its special ids are in range.
fn gguf_tokenizer_check(input: &[u8]) -> Verdict {
    let Ok(g) = crate::gguf::parse(input) else {
        return Verdict::Refused;
    };
    let Ok(t) = crate::gguf::tokenizer_from_gguf(&g.metadata) else {
        return Verdict::Refused;
    };
    let n = t.hf().get_vocab_size(true) as u32;
    let s = &t.special;
    if let Some(id) = [s.bos, s.eos, s.eot, s.eom, s.pad, s.unk, s.sep]
        .into_iter()
        .flatten()
        .find(|&id| id >= n)
    {
        return Verdict::Broken(format!("special id {id} of {n}"));
    }
    let text = "ab ab\u{e9}<|e|><s> 1\t\n\u{1F600}";
    match t.tokenizer().encode(text) {
        Ok(ids) => {
            if let Some(id) = ids.iter().find(|&&id| id >= n) {
                return Verdict::Broken(format!("id {id} of a {n}-token vocabulary"));
            }
            let _ = t.tokenizer().decode_with(&ids, true);
            Verdict::Accepted
        }
        Err(e) => Verdict::Broken(format!("an accepted vocabulary fails to encode: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gguf_tokenizer_seeds_are_accepted() {
        for s in gguf_tokenizer_seeds() {
            assert!(matches!(gguf_tokenizer_check(&s), Verdict::Accepted));
        }
    }

    #[test]
    fn the_gguf_seeds_parse_and_their_experts_split() {
        for s in gguf_seeds() {
            assert!(matches!(gguf_check(&s), Verdict::Accepted));
        }
        let g = crate::gguf::parse(&gguf_seed(3, Some(64))).expect("seed");
        assert_eq!(g.alignment, 64);
        assert_eq!(g.tensors.len(), 6);
        let gate = g.tensor("blk.0.ffn_gate_exps.weight").expect("gate");
        assert_eq!(
            expert_slice(gate, 2).expect("expert 2"),
            (gate.data.start + 2 * 68, 68)
        );
    }

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
        let unchecked: crate::model::olmoe::OlmoeConfig = serde_json::from_value(v).expect("deserializes");
        let r = std::panic::catch_unwind(|| crate::model::family::FamilyConfig::invariants(&unchecked));
        assert!(
            r.is_err(),
            "the invariant must trip on an unvalidated negative clip"
        );
    }
}
