//! Speculative decoding is lossless: greedy tokens are identical with drafts
//! on (MTP head or n-gram lookup) and off, on GLM and OLMoE fixtures.

use std::path::{Path, PathBuf};

use colibri::cli::validate::Reference;
use colibri::engine::speculative::{DraftMode, SpecOptions, Speculator};
use colibri::engine::{Engine, EngineOptions};
use colibri::sampling::{Sampler, SamplingParams};

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

fn prompt(name: &str) -> Vec<u32> {
    Reference::load(&dir(name).join("REF.json")).unwrap().prompt_ids
}

/// Generates `n` tokens (ignoring stop ids) in two turns, so the second turn
/// continues from the state the first left.
fn generate(name: &str, spec: Option<SpecOptions>, n: usize) -> (Vec<u32>, Option<Speculator>) {
    let mut engine = Engine::load(&dir(name), &EngineOptions::default()).unwrap();
    engine.stop_ids.clear();
    let mut s = engine.new_session();
    s.spec = spec.map(Speculator::new);
    let mut sampler = Sampler::new(SamplingParams::default());
    let mut out = s
        .generate(&mut engine, &prompt(name), n / 2, &mut sampler, &mut |_| true)
        .unwrap()
        .generated;
    out.extend(
        s.generate(&mut engine, &[], n - n / 2, &mut sampler, &mut |_| true)
            .unwrap()
            .generated,
    );
    assert_eq!(out.len(), n);
    assert_eq!(s.kv.len(), s.tokens.len());
    (out, s.spec)
}

fn always(mode: DraftMode, k: usize) -> SpecOptions {
    SpecOptions {
        mode,
        max_draft: k,
        min_acceptance: 0.0,
        ..SpecOptions::default()
    }
}

#[test]
fn mtp_drafts_do_not_change_greedy_output() {
    let (plain, _) = generate("glm-mtp", None, 40);
    for k in [1, 3] {
        let (spec, st) = generate("glm-mtp", Some(always(DraftMode::Mtp, k)), 40);
        let st = st.unwrap();
        eprintln!(
            "glm-mtp MTP k={k}: acceptance {:.2} ({}/{}), {:.2} tokens/forward",
            st.acceptance(),
            st.accepted,
            st.proposed,
            st.tokens_per_forward()
        );
        assert_eq!(st.using, Some(DraftMode::Mtp));
        assert!(st.proposed > 0);
        assert_eq!(spec, plain, "k={k}");
    }
}

#[test]
fn ngram_drafts_do_not_change_greedy_output() {
    for name in ["glm-tiny", "glm-mtp", "olmoe-tiny"] {
        let (plain, _) = generate(name, None, 48);
        let (spec, st) = generate(name, Some(always(DraftMode::Ngram, 4)), 48);
        let st = st.unwrap();
        eprintln!(
            "{name} n-gram: acceptance {:.2} ({}/{}), {:.2} tokens/forward",
            st.acceptance(),
            st.accepted,
            st.proposed,
            st.tokens_per_forward()
        );
        assert_eq!(spec, plain, "{name}");
    }
}

#[test]
fn drafting_turns_off_when_it_does_not_pay_and_without_a_head_falls_back() {
    let opts = SpecOptions {
        mode: DraftMode::Mtp,
        max_draft: 3,
        min_acceptance: 0.99,
        probe: 6,
    };
    let (plain, _) = generate("glm-tiny", None, 30);
    let (spec, st) = generate("glm-tiny", Some(opts), 30);
    let st = st.unwrap();
    // glm-tiny has no MTP head: n-gram lookup is used instead.
    assert_eq!(st.using, Some(DraftMode::Ngram));
    assert_eq!(spec, plain);

    let (_, st) = generate(
        "glm-mtp",
        Some(SpecOptions {
            probe: 6,
            min_acceptance: 0.99,
            ..SpecOptions::default()
        }),
        30,
    );
    let st = st.unwrap();
    assert!(st.off.is_some(), "random MTP weights cannot reach 99% acceptance");
}

#[test]
fn a_declared_but_missing_mtp_head_is_explained() {
    let tmp = std::env::temp_dir().join(format!("glm-no-mtp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    for f in ["model.safetensors", "generation_config.json", "REF.json"] {
        std::fs::copy(dir("glm-tiny").join(f), tmp.join(f)).unwrap();
    }
    let text = std::fs::read_to_string(dir("glm-tiny").join("config.json")).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
    cfg["num_nextn_predict_layers"] = 1.into();
    std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
    let engine = Engine::load(&tmp, &EngineOptions::default()).unwrap();
    let why = engine.model.draft_head().unwrap_err();
    assert!(why.contains("model.layers.3.eh_proj.weight"), "{why}");
    std::fs::remove_dir_all(&tmp).unwrap();
}
