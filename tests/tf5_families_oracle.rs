//! GLM-4.7-Flash (`glm4_moe_lite`), DeepSeek-V3.2 (`deepseek_v32`) and
//! MiniMax-M2 (`minimax_m2`) against transformers 5
//! (fixtures/{glm4-moe-lite-tiny,deepseek-v32-tiny,minimax-m2-tiny}/
//! REF.json, written by tools/make_tf5_family_fixtures.py from checkpoints
//! transformers 5 saved). The first two: MLA with low-rank queries and
//! interleaved RoPE, the sigmoid router with its correction bias and a
//! shared expert, dense and sparse layers by `mlp_layer_types`; DeepSeek-V3.2
//! adds the DSA indexer on every layer (rotate-half RoPE in it) with a
//! selection smaller than the context, and two expert groups. MiniMax-M2:
//! GQA with q/k RMSNorm over the whole projection, partial rotary, Mixtral's
//! expert names and the sigmoid router with its correction bias.
//! Token-exact in f32 (mapped, and streamed with the pilot), at int8
//! against transformers on the int8 round-trip weights, after `coli
//! convert`; logits close to transformers'; configs the engine cannot run
//! are refused by name.

mod support;

use std::path::Path;

use colibri::convert::convert;
use colibri::model::family::ModelConfig;
use colibri::quant::QFormat;
use support::oracle::{
    assert_last_logits_close, exact, exact_kv, exact_mapped_and_streamed, fixture, int8_acts_tf_mismatches,
    int8_oracle, int8_path, mismatches, reference,
};

const FIXTURES: [&str; 3] = ["glm4-moe-lite-tiny", "deepseek-v32-tiny", "minimax-m2-tiny"];

#[test]
fn f32_is_token_exact_mapped_and_streamed() {
    for name in FIXTURES {
        let dir = fixture(name);
        let r = reference(&dir);
        exact_mapped_and_streamed(&dir, &r, exact_kv());
    }
}

#[test]
fn int8_is_token_exact_against_transformers_on_the_same_weights() {
    for name in FIXTURES {
        let dir = fixture(name);
        let int8 = int8_oracle(&dir);
        exact_mapped_and_streamed(&dir, &int8, int8_path());
    }
}

/// Int8 activations approximate the int8 oracle (the fixtures' margins are
/// narrower than that path's error): within one teacher-forced position in
/// three (measured 6, 7 and 2 of 28; DeepSeek-V3.2's indexer turns a small
/// error into another selection).
#[test]
fn int8_activations_stay_close() {
    for name in FIXTURES {
        let (tf, total) = int8_acts_tf_mismatches(&fixture(name));
        eprintln!("{name}: int8 activations, {tf}/{total} teacher-forced mismatches");
        assert!(tf * 3 <= total, "{name}: {tf}/{total} teacher-forced mismatches");
    }
}

#[test]
fn coli_convert_keeps_them_exact() {
    let tmp = tempfile::tempdir().unwrap();
    for name in FIXTURES {
        let dir = fixture(name);
        let out = tmp.path().join(format!("{name}-int8"));
        convert(&dir, &out, QFormat::Int8, QFormat::Int8, None).unwrap();
        exact_mapped_and_streamed(&out, &int8_oracle(&dir), int8_path());
        let f32_out = tmp.path().join(format!("{name}-f32"));
        convert(&dir, &f32_out, QFormat::F32, QFormat::F32, None).unwrap();
        exact(&f32_out, &reference(&dir), &exact_kv());
    }
}

/// Logits at the last position of the greedy continuation: within 1e-3 of
/// transformers' in f32 and at int8 (each against its own oracle); the
/// default f16 KV cache within 1e-2.
#[test]
fn last_position_logits_are_close_to_transformers() {
    for name in FIXTURES {
        assert_last_logits_close(name, &fixture(name));
    }
}

/// The DeepSeek-V3.2 fixture's indexer selection decides tokens: with a
/// selection as large as the context (DSA off) the same weights give
/// other tokens, so its exactness above is the indexer's too.
#[test]
fn the_dsa_selection_decides_the_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture(FIXTURES[1]);
    let off = tmp.path().join("dense-attention");
    std::fs::create_dir(&off).unwrap();
    for f in ["model.safetensors", "generation_config.json"] {
        std::fs::copy(dir.join(f), off.join(f)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    cfg["index_topk"] = 1000.into();
    std::fs::write(off.join("config.json"), cfg.to_string()).unwrap();
    let (g, t) = mismatches(&off, &reference(&dir), &exact_kv());
    assert!(g + t > 0, "the selection changed nothing");
}

/// What the engine cannot run is refused at load with the field named.
#[test]
fn configs_they_cannot_run_are_refused_by_name() {
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).unwrap()).unwrap()
    };
    let cases: [(&str, &str, serde_json::Value, &str); 8] = [
        (
            FIXTURES[0],
            "rope_parameters",
            serde_json::json!({"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
            "partial_rotary_factor",
        ),
        (
            FIXTURES[0],
            "mlp_layer_types",
            serde_json::json!(["dense", "sparse"]),
            "mlp_layer_types",
        ),
        (FIXTURES[0], "n_group", serde_json::json!(3), "n_group"),
        (
            FIXTURES[1],
            "layer_types",
            serde_json::json!([
                "indexed_attention",
                "sliding_attention",
                "indexed_attention",
                "indexed_attention"
            ]),
            "layer_type",
        ),
        (FIXTURES[1], "index_topk", serde_json::json!(0), "index_topk"),
        (FIXTURES[1], "q_lora_rank", serde_json::Value::Null, "q_lora_rank"),
        (
            FIXTURES[2],
            "rope_parameters",
            serde_json::json!({"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 1.5}),
            "partial_rotary_factor",
        ),
        (
            FIXTURES[2],
            "scoring_func",
            serde_json::json!("softmax"),
            "scoring_func",
        ),
    ];
    for (name, field, value, named) in cases {
        let mut c = read(name);
        c[field] = value;
        let err = ModelConfig::from_json(Path::new("config.json"), c)
            .err()
            .unwrap_or_else(|| panic!("{name}: {field} accepted"));
        assert!(err.to_string().contains(named), "{name}: {field}: {err}");
    }
}
