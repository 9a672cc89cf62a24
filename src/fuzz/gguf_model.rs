//! The `gguf-model` target: whole GGUF models, mutated, loaded by the
//! engine and run. A GGUF from the internet reaches far more than the
//! header parser: the family's metadata mapping, the tensor renaming and
//! expert slicing, the loaders' shape checks, the ggml block kernels. A
//! mutant that loads must then run a forward pass to the end.
//!
//! Seeds are tiny models of every architecture colibri reads from GGUF
//! (OLMoE, Qwen3-MoE, GLM-4.x MoE with a dense layer, a shared expert and
//! biases, DeepSeek `deepseek2` with MLA's split projections and YaRN,
//! Qwen3-Next and Qwen3.5 with a linear and a full-attention layer),
//! Q8_0 matrices and F32 vectors, with a byte-level BPE
//! vocabulary. Each check writes the mutant to a temporary file (the
//! engine maps files), so this target runs far fewer inputs than the
//! parser targets (tests/fuzz_parsers.rs).

use std::path::PathBuf;

use super::Verdict;
use super::targets::Target;
use crate::engine::{Engine, EngineOptions, Placement};
use crate::gguf::build::GgufImage;
use crate::gguf::{Array, GgmlType, Value};
use crate::model::lm::Logits;

const HIDDEN: u64 = 32;
const VOCAB: u64 = 8;
const EXPERTS: u64 = 4;
const FF: u64 = 32;
const HEAD_DIM: u64 = 16;

/// The target (not in [`super::all_targets`]: each input loads a model).
pub fn gguf_model_target() -> Target {
    Target {
        name: "gguf-model",
        seeds: model_seeds,
        mutate: super::targets::gguf_mutate,
        check: model_check,
    }
}

fn f32s(n: u64, salt: u64) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let x = ((i * 7 + salt * 13) % 17) as f32 / 17.0 - 0.5;
            x.to_le_bytes()
        })
        .collect()
}

fn ones(n: u64) -> Vec<u8> {
    (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect()
}

fn q8(elems: u64, salt: u64) -> Vec<u8> {
    (0..elems / 32)
        .flat_map(|b| {
            let mut blk = half::f16::from_f32(0.01).to_le_bytes().to_vec();
            blk.extend((0..32u64).map(|i| (((i + b * 3 + salt) % 31) as i8 - 15) as u8));
            blk
        })
        .collect()
}

/// A tiny model of `arch`: `kv_heads` key/value heads of [`HEAD_DIM`],
/// `dense_first` a dense FFN in layer 0, `glm` GLM's own tensors.
/// A layer's router and stacked routed experts (`e` experts of `FF`
/// columns over `h`), as every MoE seed lays them out.
fn routed_experts(g: &mut GgufImage, t: &dyn Fn(&str) -> String, h: u64, e: u64, salt: u64) {
    g.tensor(
        &t("ffn_gate_inp.weight"),
        &[h, e],
        GgmlType::F32,
        &f32s(h * e, salt),
    )
    .tensor(
        &t("ffn_gate_exps.weight"),
        &[h, FF, e],
        GgmlType::Q8_0,
        &q8(h * FF * e, salt + 7),
    )
    .tensor(
        &t("ffn_up_exps.weight"),
        &[h, FF, e],
        GgmlType::Q8_0,
        &q8(h * FF * e, salt + 8),
    )
    .tensor(
        &t("ffn_down_exps.weight"),
        &[FF, h, e],
        GgmlType::Q8_0,
        &q8(FF * h * e, salt + 9),
    );
}

fn model_seed(arch: &str, layers: u64, kv_heads: u64, dense_first: bool, glm: bool) -> Vec<u8> {
    let mut g = GgufImage::new();
    let k = |s: &str| format!("{arch}.{s}");
    let strings = |v: &[&str]| Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()));
    g.kv("general.architecture", Value::String(arch.into()))
        .kv(&k("block_count"), Value::U32(layers as u32))
        .kv(&k("context_length"), Value::U32(64))
        .kv(&k("embedding_length"), Value::U32(HIDDEN as u32))
        .kv(&k("feed_forward_length"), Value::U32(FF as u32))
        .kv(&k("expert_feed_forward_length"), Value::U32(FF as u32))
        .kv(&k("attention.head_count"), Value::U32(2))
        .kv(&k("attention.head_count_kv"), Value::U32(kv_heads as u32))
        .kv(&k("attention.key_length"), Value::U32(HEAD_DIM as u32))
        .kv(&k("attention.value_length"), Value::U32(HEAD_DIM as u32))
        .kv(&k("rope.freq_base"), Value::F32(10_000.0))
        .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
        .kv(&k("expert_count"), Value::U32(EXPERTS as u32))
        .kv(&k("expert_used_count"), Value::U32(2))
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("qwen2".into()))
        .kv(
            "tokenizer.ggml.tokens",
            strings(&["a", "b", "ab", "Ġ", "Ġab", "1", "c", "<|e|>"]),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1, 1, 1, 1, 1, 1, 1, 3])),
        )
        .kv("tokenizer.ggml.merges", strings(&["a b", "Ġ ab"]))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(7));
    if glm {
        g.kv(&k("expert_shared_count"), Value::U32(1))
            .kv(&k("leading_dense_block_count"), Value::U32(1))
            .kv(&k("expert_gating_func"), Value::U32(2))
            .kv(&k("expert_weights_scale"), Value::F32(2.5))
            .kv(&k("expert_weights_norm"), Value::Bool(true))
            .kv(&k("rope.dimension_count"), Value::U32(8));
    }
    let (h, kv) = (HIDDEN, kv_heads * HEAD_DIM);
    g.tensor(
        "token_embd.weight",
        &[h, VOCAB],
        GgmlType::Q8_0,
        &q8(h * VOCAB, 1),
    )
    .tensor("output_norm.weight", &[h], GgmlType::F32, &ones(h))
    .tensor("output.weight", &[h, VOCAB], GgmlType::Q8_0, &q8(h * VOCAB, 2));
    for l in 0..layers {
        let t = |s: &str| format!("blk.{l}.{s}");
        let salt = 10 * (l + 1);
        let norm_width = if arch == "olmoe" { h } else { HEAD_DIM };
        let k_norm_width = if arch == "olmoe" { kv } else { HEAD_DIM };
        g.tensor(&t("attn_norm.weight"), &[h], GgmlType::F32, &ones(h))
            .tensor(&t("attn_q.weight"), &[h, h], GgmlType::Q8_0, &q8(h * h, salt))
            .tensor(
                &t("attn_k.weight"),
                &[h, kv],
                GgmlType::Q8_0,
                &q8(h * kv, salt + 1),
            )
            .tensor(
                &t("attn_v.weight"),
                &[h, kv],
                GgmlType::Q8_0,
                &q8(h * kv, salt + 2),
            )
            .tensor(
                &t("attn_output.weight"),
                &[h, h],
                GgmlType::Q8_0,
                &q8(h * h, salt + 3),
            )
            .tensor(
                &t("attn_q_norm.weight"),
                &[norm_width],
                GgmlType::F32,
                &ones(norm_width),
            )
            .tensor(
                &t("attn_k_norm.weight"),
                &[k_norm_width],
                GgmlType::F32,
                &ones(k_norm_width),
            );
        let post = if glm {
            "post_attention_norm.weight"
        } else {
            "ffn_norm.weight"
        };
        g.tensor(&t(post), &[h], GgmlType::F32, &ones(h));
        if glm {
            g.tensor(&t("attn_q.bias"), &[h], GgmlType::F32, &f32s(h, salt))
                .tensor(&t("attn_k.bias"), &[kv], GgmlType::F32, &f32s(kv, salt + 1))
                .tensor(&t("attn_v.bias"), &[kv], GgmlType::F32, &f32s(kv, salt + 2));
        }
        if dense_first && l == 0 {
            g.tensor(
                &t("ffn_gate.weight"),
                &[h, FF],
                GgmlType::Q8_0,
                &q8(h * FF, salt + 4),
            )
            .tensor(
                &t("ffn_up.weight"),
                &[h, FF],
                GgmlType::Q8_0,
                &q8(h * FF, salt + 5),
            )
            .tensor(
                &t("ffn_down.weight"),
                &[FF, h],
                GgmlType::Q8_0,
                &q8(FF * h, salt + 6),
            );
            continue;
        }
        let e = EXPERTS;
        routed_experts(&mut g, &t, h, e, salt);
        if glm {
            g.tensor(&t("exp_probs_b.bias"), &[e], GgmlType::F32, &f32s(e, salt))
                .tensor(
                    &t("ffn_gate_shexp.weight"),
                    &[h, FF],
                    GgmlType::Q8_0,
                    &q8(h * FF, salt + 4),
                )
                .tensor(
                    &t("ffn_up_shexp.weight"),
                    &[h, FF],
                    GgmlType::Q8_0,
                    &q8(h * FF, salt + 5),
                )
                .tensor(
                    &t("ffn_down_shexp.weight"),
                    &[FF, h],
                    GgmlType::Q8_0,
                    &q8(FF * h, salt + 6),
                );
        }
    }
    g.to_bytes()
}

/// A tiny DeepSeek-V3-shaped `deepseek2` model: q_lora, MLA with the split
/// `attn_k_b` / `attn_v_b`, a dense first layer, a shared expert, a biased
/// sigmoid router and YaRN scaling.
fn deepseek2_seed() -> Vec<u8> {
    const ARCH: &str = "deepseek2";
    const HEADS: u64 = 2;
    const Q_LORA: u64 = 32;
    const KV_LORA: u64 = 32;
    const NOPE: u64 = 32;
    const ROPE: u64 = 16;
    const V: u64 = 32;
    let base = model_seed(ARCH, 2, 1, true, true);
    let Ok(parsed) = crate::gguf::parse(&base) else {
        return base;
    };
    let mut g = GgufImage::new();
    let k = |s: &str| format!("{ARCH}.{s}");
    for (key, v) in parsed.metadata.iter() {
        let replaced = [
            "attention.key_length",
            "attention.value_length",
            "attention.head_count",
            "rope.dimension_count",
        ];
        if !replaced.iter().any(|r| key == k(r)) {
            g.kv(key, v.clone());
        }
    }
    g.kv(&k("attention.head_count"), Value::U32(HEADS as u32))
        .kv(&k("attention.q_lora_rank"), Value::U32(Q_LORA as u32))
        .kv(&k("attention.kv_lora_rank"), Value::U32(KV_LORA as u32))
        .kv(&k("attention.key_length"), Value::U32((KV_LORA + ROPE) as u32))
        .kv(&k("attention.value_length"), Value::U32(KV_LORA as u32))
        .kv(&k("attention.key_length_mla"), Value::U32((NOPE + ROPE) as u32))
        .kv(&k("attention.value_length_mla"), Value::U32(V as u32))
        .kv(&k("rope.dimension_count"), Value::U32(ROPE as u32))
        .kv(&k("expert_group_count"), Value::U32(2))
        .kv(&k("expert_group_used_count"), Value::U32(1))
        .kv(&k("rope.scaling.type"), Value::String("yarn".into()))
        .kv(&k("rope.scaling.factor"), Value::F32(4.0))
        .kv(&k("rope.scaling.original_context_length"), Value::U32(16))
        .kv(&k("rope.scaling.yarn_log_multiplier"), Value::F32(0.1));
    let h = HIDDEN;
    for t in &parsed.tensors {
        let name = t.name.as_str();
        // model_seed's attention is replaced by MLA's.
        if [
            "attn_q.",
            "attn_k.",
            "attn_v.",
            "attn_output.",
            "attn_q_norm",
            "attn_k_norm",
        ]
        .iter()
        .any(|p| name.contains(p))
        {
            continue;
        }
        let Some(bytes) = base.get(t.data.start as usize..t.data.end as usize) else {
            return base;
        };
        let name = name.replace("post_attention_norm", "ffn_norm");
        g.tensor(&name, &t.dims, t.ggml_type, bytes);
    }
    for l in 0..2u64 {
        let t = |s: &str| format!("blk.{l}.{s}");
        let salt = 40 * (l + 1);
        let qk = HEADS * (NOPE + ROPE);
        g.tensor(
            &t("attn_q_a.weight"),
            &[h, Q_LORA],
            GgmlType::Q8_0,
            &q8(h * Q_LORA, salt),
        )
        .tensor(
            &t("attn_q_a_norm.weight"),
            &[Q_LORA],
            GgmlType::F32,
            &ones(Q_LORA),
        )
        .tensor(
            &t("attn_q_b.weight"),
            &[Q_LORA, qk],
            GgmlType::Q8_0,
            &q8(Q_LORA * qk, salt + 1),
        )
        .tensor(
            &t("attn_kv_a_mqa.weight"),
            &[h, KV_LORA + ROPE],
            GgmlType::Q8_0,
            &q8(h * (KV_LORA + ROPE), salt + 2),
        )
        .tensor(
            &t("attn_kv_a_norm.weight"),
            &[KV_LORA],
            GgmlType::F32,
            &ones(KV_LORA),
        )
        .tensor(
            &t("attn_k_b.weight"),
            &[NOPE, KV_LORA, HEADS],
            GgmlType::Q8_0,
            &q8(NOPE * KV_LORA * HEADS, salt + 3),
        )
        .tensor(
            &t("attn_v_b.weight"),
            &[KV_LORA, V, HEADS],
            GgmlType::Q8_0,
            &q8(KV_LORA * V * HEADS, salt + 4),
        )
        .tensor(
            &t("attn_output.weight"),
            &[HEADS * V, h],
            GgmlType::Q8_0,
            &q8(HEADS * V * h, salt + 5),
        );
    }
    g.to_bytes()
}

/// A tiny hybrid model of `arch` (`qwen3next` or `qwen35moe`): layer 0
/// Gated DeltaNet (one key head, two value heads), layer 1 gated full
/// attention, both MoE with a gated shared expert, in the tensors llama.cpp's
/// converter writes.
fn hybrid_seed(arch: &str) -> Vec<u8> {
    let mut g = GgufImage::new();
    let k = |s: &str| format!("{arch}.{s}");
    let strings = |v: &[&str]| Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()));
    let (h, d, e) = (HIDDEN, HEAD_DIM, EXPERTS);
    // Linear layer: 1 key head and 2 value heads of `d`.
    let (conv, vdim) = (2 * d + 2 * d, 2 * d);
    g.kv("general.architecture", Value::String(arch.into()))
        .kv(&k("block_count"), Value::U32(2))
        .kv(&k("context_length"), Value::U32(64))
        .kv(&k("embedding_length"), Value::U32(h as u32))
        .kv(&k("feed_forward_length"), Value::U32(FF as u32))
        .kv(&k("expert_feed_forward_length"), Value::U32(FF as u32))
        .kv(&k("expert_shared_feed_forward_length"), Value::U32(FF as u32))
        .kv(&k("attention.head_count"), Value::U32(2))
        .kv(&k("attention.head_count_kv"), Value::U32(1))
        .kv(&k("attention.key_length"), Value::U32(d as u32))
        .kv(&k("attention.value_length"), Value::U32(d as u32))
        .kv(&k("rope.freq_base"), Value::F32(10_000.0))
        .kv(&k("rope.dimension_count"), Value::U32(4))
        .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))
        .kv(&k("expert_count"), Value::U32(e as u32))
        .kv(&k("expert_used_count"), Value::U32(2))
        .kv(&k("ssm.conv_kernel"), Value::U32(4))
        .kv(&k("ssm.state_size"), Value::U32(d as u32))
        .kv(&k("ssm.group_count"), Value::U32(1))
        .kv(&k("ssm.time_step_rank"), Value::U32(2))
        .kv(&k("ssm.inner_size"), Value::U32(vdim as u32))
        .kv(
            &k("attention.recurrent_layers"),
            Value::Array(Array::Bool(vec![true, false])),
        )
        .kv(&k("full_attention_interval"), Value::U32(2))
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("qwen2".into()))
        .kv(
            "tokenizer.ggml.tokens",
            strings(&["a", "b", "ab", "Ġ", "Ġab", "1", "c", "<|e|>"]),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1, 1, 1, 1, 1, 1, 1, 3])),
        )
        .kv("tokenizer.ggml.merges", strings(&["a b", "Ġ ab"]))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(7));
    let q = |g: &mut GgufImage, name: String, cols: u64, rows: u64, salt: u64| {
        g.tensor(&name, &[cols, rows], GgmlType::Q8_0, &q8(cols * rows, salt));
    };
    let f = |g: &mut GgufImage, name: String, n: u64, salt: u64| {
        g.tensor(&name, &[n], GgmlType::F32, &f32s(n, salt));
    };
    q(&mut g, "token_embd.weight".into(), h, VOCAB, 1);
    q(&mut g, "output.weight".into(), h, VOCAB, 2);
    g.tensor("output_norm.weight", &[h], GgmlType::F32, &ones(h));
    for l in 0..2u64 {
        let t = |s: &str| format!("blk.{l}.{s}");
        let salt = 10 * (l + 1);
        g.tensor(&t("attn_norm.weight"), &[h], GgmlType::F32, &ones(h))
            .tensor(&t("post_attention_norm.weight"), &[h], GgmlType::F32, &ones(h));
        if l == 0 {
            q(&mut g, t("attn_qkv.weight"), h, conv, salt);
            q(&mut g, t("attn_gate.weight"), h, vdim, salt + 1);
            if arch == "qwen35moe" {
                q(&mut g, t("ssm_beta.weight"), h, 2, salt + 2);
                q(&mut g, t("ssm_alpha.weight"), h, 2, salt + 3);
            } else {
                q(&mut g, t("ssm_ba.weight"), h, 4, salt + 2);
            }
            g.tensor(
                &t("ssm_conv1d.weight"),
                &[4, conv],
                GgmlType::F32,
                &f32s(4 * conv, salt),
            );
            f(&mut g, t("ssm_dt.bias"), 2, salt + 1);
            f(&mut g, t("ssm_a"), 2, salt + 2);
            g.tensor(&t("ssm_norm.weight"), &[d], GgmlType::F32, &ones(d));
            q(&mut g, t("ssm_out.weight"), vdim, h, salt + 4);
        } else {
            q(&mut g, t("attn_q.weight"), h, 2 * 2 * d, salt);
            q(&mut g, t("attn_k.weight"), h, d, salt + 1);
            q(&mut g, t("attn_v.weight"), h, d, salt + 2);
            q(&mut g, t("attn_output.weight"), 2 * d, h, salt + 3);
            g.tensor(&t("attn_q_norm.weight"), &[d], GgmlType::F32, &ones(d))
                .tensor(&t("attn_k_norm.weight"), &[d], GgmlType::F32, &ones(d));
        }
        routed_experts(&mut g, &t, h, e, salt);
        q(&mut g, t("ffn_gate_shexp.weight"), h, FF, salt + 4);
        q(&mut g, t("ffn_up_shexp.weight"), h, FF, salt + 5);
        q(&mut g, t("ffn_down_shexp.weight"), FF, h, salt + 6);
        f(&mut g, t("ffn_gate_inp_shexp.weight"), h, salt + 3);
    }
    g.to_bytes()
}

pub(super) fn model_seeds() -> Vec<Vec<u8>> {
    vec![
        model_seed("olmoe", 2, 2, false, false),
        model_seed("qwen3moe", 2, 1, false, false),
        model_seed("glm4moe", 2, 1, true, true),
        deepseek2_seed(),
        hybrid_seed("qwen3next"),
        hybrid_seed("qwen35moe"),
    ]
}

/// Where this thread writes its mutants (one file at a time, removed after).
fn scratch() -> PathBuf {
    let tid = format!("{:?}", std::thread::current().id());
    let tid: String = tid.chars().filter(char::is_ascii_digit).collect();
    std::env::temp_dir().join(format!("coli-fuzz-model-{}-{tid}.gguf", std::process::id()))
}

/// A mutant the engine loads must run: a forward pass over three ids gives
/// one logit per vocabulary entry.
fn model_check(input: &[u8]) -> Verdict {
    if crate::gguf::parse(input).is_err() {
        return Verdict::Refused;
    }
    let path = scratch();
    if std::fs::write(&path, input).is_err() {
        return Verdict::Broken(format!("cannot write {}", path.display()));
    }
    let opts = EngineOptions {
        placement: Placement::Mapped,
        ..EngineOptions::default()
    };
    let verdict = match Engine::load(&path, &opts) {
        Err(_) => Verdict::Refused,
        Ok(mut engine) => {
            let vocab = engine.model.vocab_size();
            let ids = [0u32, 1, 2].map(|i| i % vocab.max(1) as u32);
            let mut state = engine.model.new_state();
            let tag = engine.next_tag();
            match engine.model.forward(&ids, state.as_mut(), tag, Logits::Last) {
                Ok(l) if l.len() == vocab => Verdict::Accepted,
                Ok(l) => Verdict::Broken(format!("{} logits for a vocabulary of {vocab}", l.len())),
                // A run-time refusal (an expert whose bytes do not decode)
                // is an error, not a crash.
                Err(_) => Verdict::Refused,
            }
        }
    };
    let _ = std::fs::remove_file(&path);
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_loads_and_runs() {
        for (i, s) in model_seeds().iter().enumerate() {
            match model_check(s) {
                Verdict::Accepted => {}
                Verdict::Refused => {
                    let path = scratch();
                    std::fs::write(&path, s).unwrap();
                    let e = Engine::load(&path, &EngineOptions::default())
                        .err()
                        .map(|e| e.to_string());
                    let _ = std::fs::remove_file(&path);
                    panic!("seed {i} refused: {e:?}");
                }
                Verdict::Broken(w) => panic!("seed {i}: {w}"),
            }
        }
    }
}
