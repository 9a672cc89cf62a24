//! GLM-4.7-Flash (`glm4_moe_lite`) against transformers 5
//! (fixtures/glm4-moe-lite-tiny/REF.json, written by
//! tools/make_glm4_moe_lite_fixture.py from a checkpoint transformers 5
//! saved): MLA with low-rank queries and interleaved RoPE, the sigmoid
//! router with its correction bias and a shared expert, dense and sparse
//! layers by `mlp_layer_types`. Token-exact in f32 (mapped, and streamed
//! with the pilot), at int8 against transformers on the int8 round-trip
//! weights, after `coli convert`; logits close to transformers'; a config
//! the engine cannot run is refused by name.

mod support;

use colibri::convert::convert;
use colibri::engine::{Engine, EngineOptions};
use colibri::model::family::ModelConfig;
use colibri::quant::QFormat;
use support::oracle::{
    exact, exact_kv, fixture, int8_acts, int8_oracle, int8_path, last_logits, max_diff, mismatches,
    ref_logits, reference, streamed,
};

const NAME: &str = "glm4-moe-lite-tiny";

#[test]
fn f32_is_token_exact_mapped_and_streamed() {
    let dir = fixture(NAME);
    let r = reference(&dir);
    exact(&dir, &r, &exact_kv());
    exact(&dir, &r, &streamed(exact_kv()));
}

#[test]
fn int8_is_token_exact_against_transformers_on_the_same_weights() {
    let dir = fixture(NAME);
    let int8 = int8_oracle(&dir);
    assert_ne!(
        int8.full_ids,
        reference(&dir).full_ids,
        "the int8 oracle tells int8 from f32"
    );
    exact(&dir, &int8, &int8_path());
    exact(&dir, &int8, &streamed(int8_path()));
}

/// Int8 activations approximate the int8 oracle: within one teacher-forced
/// position in eight (the fixture's margins are narrower than that path's
/// error).
#[test]
fn int8_activations_stay_close() {
    let dir = fixture(NAME);
    let int8 = int8_oracle(&dir);
    let (_, tf) = mismatches(&dir, &int8, &int8_acts());
    let total = int8.full_ids.len();
    assert!(tf * 8 <= total, "{tf}/{total} teacher-forced mismatches");
}

#[test]
fn coli_convert_keeps_it_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture(NAME);
    let out = tmp.path().join("int8");
    convert(&dir, &out, QFormat::Int8, QFormat::Int8, None).unwrap();
    exact(&out, &int8_oracle(&dir), &int8_path());
    exact(&out, &int8_oracle(&dir), &streamed(int8_path()));
    let f32_out = tmp.path().join("f32");
    convert(&dir, &f32_out, QFormat::F32, QFormat::F32, None).unwrap();
    exact(&f32_out, &reference(&dir), &exact_kv());
}

/// Logits at the last position of the greedy continuation: within 1e-3 of
/// transformers' in f32 and at int8 (each against its own oracle); the
/// default f16 KV cache within 1e-2.
#[test]
fn last_position_logits_are_close_to_transformers() {
    let dir = fixture(NAME);
    let (f32_ref, int8_ref) = (
        ref_logits(&dir, "logits_last"),
        ref_logits(&dir, "int8_logits_last"),
    );
    let mut e = Engine::load(&dir, &exact_kv()).unwrap();
    let d = max_diff(&last_logits(&mut e, &reference(&dir).full_ids), &f32_ref);
    let mut e = Engine::load(&dir, &int8_path()).unwrap();
    let d8 = max_diff(&last_logits(&mut e, &int8_oracle(&dir).full_ids), &int8_ref);
    let mut e = Engine::load(&dir, &EngineOptions::default()).unwrap();
    let d16 = max_diff(&last_logits(&mut e, &reference(&dir).full_ids), &f32_ref);
    eprintln!("|f32 - oracle| {d:.2e}, |int8 - int8 oracle| {d8:.2e}, |f16 KV - oracle| {d16:.2e}");
    assert!(d < 1e-3 && d8 < 1e-3 && d16 < 1e-2, "{d} {d8} {d16}");
}

/// What the engine cannot run is refused at load with the field named.
#[test]
fn configs_it_cannot_run_are_refused_by_name() {
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(NAME).join("config.json")).unwrap()).unwrap();
    let cases: [(&str, serde_json::Value, &str); 4] = [
        (
            "rope_parameters",
            serde_json::json!({"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
            "partial_rotary_factor",
        ),
        (
            "mlp_layer_types",
            serde_json::json!(["dense", "sparse"]),
            "mlp_layer_types",
        ),
        (
            "mlp_layer_types",
            serde_json::json!(["dense", "moe", "dense", "sparse"]),
            "mlp_layer_types",
        ),
        ("n_group", serde_json::json!(3), "n_group"),
    ];
    for (field, value, named) in cases {
        let mut c = cfg.clone();
        c[field] = value;
        let err = ModelConfig::from_json(std::path::Path::new("config.json"), c)
            .err()
            .unwrap_or_else(|| panic!("{field} accepted"));
        assert!(err.to_string().contains(named), "{field}: {err}");
    }
}
