//! `--kv-type` on the bundled model: f32 (the default) is the token-exact
//! path it always was; f16 and q8 caches run, stay close, and shrink what
//! `coli plan` budgets for the KV cache.

mod support;

use std::path::{Path, PathBuf};

use colibri::cli::validate::{Reference, greedy, teacher_forcing};
use colibri::engine::{Engine, EngineOptions};
use colibri::model::kv_cache::{KvType, KvTypes};
use colibri::model::lm::Logits;
use colibri_actors::Tag;

fn bundled() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny")
}

fn opts(types: KvTypes) -> EngineOptions {
    EngineOptions {
        kv_types: types,
        ..EngineOptions::default()
    }
}

/// Greedy and teacher-forcing matches against the bundled model's REF.json.
fn matches(o: &EngineOptions) -> ((usize, usize), (usize, usize)) {
    let r = Reference::load(&bundled().join("REF.json")).unwrap();
    let mut engine = Engine::load(&bundled(), o).unwrap();
    (
        greedy(&mut engine, &r).unwrap(),
        teacher_forcing(&mut engine, &r).unwrap(),
    )
}

fn last_logits(o: &EngineOptions) -> Vec<f32> {
    let r = Reference::load(&bundled().join("REF.json")).unwrap();
    let mut engine = Engine::load(&bundled(), o).unwrap();
    let mut st = engine.model.new_state();
    engine
        .model
        .forward(&r.full_ids, st.as_mut(), Tag::new(0, 1, 0), Logits::Last)
        .unwrap()
}

/// f16 is the default (half of f32's memory, llama.cpp's default too); on
/// the bundled model it keeps every token of the oracle, and naming it is
/// the same computation bit for bit. f32 stays token-exact.
#[test]
fn f16_is_the_default_and_f32_is_token_exact() {
    assert_eq!(EngineOptions::default().kv_types, KvTypes::both(KvType::F16));
    let default = last_logits(&EngineOptions::default());
    assert_eq!(last_logits(&opts(KvTypes::both(KvType::F16))), default);
    let ((g, gt), (t, tt)) = matches(&opts(KvTypes::both(KvType::F32)));
    assert_eq!((g, t), (gt, tt), "greedy {g}/{gt}, teacher forcing {t}/{tt}");
}

/// The bundled (trained) model's margins are wide enough for the compact
/// types: f16 keeps every token; q8 (about 0.4% error per value) keeps all
/// but at most two of them, and its logits stay within 0.05 of f32's.
#[test]
fn compact_caches_stay_close_on_the_bundled_model() {
    let exact = last_logits(&opts(KvTypes::both(KvType::F32)));
    for (t, max_miss, max_logit) in [
        (KvTypes::both(KvType::F16), 0, 0.01),
        (KvTypes::both(KvType::Q8), 2, 0.05),
        (
            KvTypes {
                k: KvType::F16,
                v: KvType::Q8,
            },
            2,
            0.05,
        ),
    ] {
        let ((g, gt), (tf, tt)) = matches(&opts(t));
        assert!(
            gt - g <= max_miss && tt - tf <= max_miss,
            "{t}: greedy {g}/{gt}, tf {tf}/{tt}"
        );
        let got = last_logits(&opts(t));
        let d = exact
            .iter()
            .zip(&got)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(d <= max_logit, "{t}: logits {d} from f32");
        eprintln!("{t}: greedy {g}/{gt}, teacher forcing {tf}/{tt}, |logits - f32| {d:.2e}");
    }
}

fn coli(args: &[&str]) -> std::process::Output {
    support::coli_command().args(args).output()
}

#[test]
fn the_flag_reaches_run_and_plan() {
    let model = bundled();
    let m = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            m,
            "--prompt-ids",
            "1,2,3,4",
            "--max-tokens",
            "8",
            "--ids",
        ];
        args.extend_from_slice(extra);
        let o = coli(&args);
        assert!(
            o.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let plain = run(&[]);
    assert_eq!(run(&["--kv-type", "f16"]), plain);
    assert!(!run(&["--kv-type", "f32"]).is_empty());
    assert!(!run(&["--kv-type", "q8"]).is_empty());
    assert!(!run(&["--kv-type-k", "f16", "--kv-type-v", "q8"]).is_empty());
    let bad = coli(&["run", "--model", m, "--prompt-ids", "1", "--kv-type", "bf16"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("expected f32, f16 or q8"), "{err}");

    let kv_bytes = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            m,
            "--json",
            "--probe-mb",
            "1",
            "--probe-experts",
            "4",
        ];
        args.extend_from_slice(extra);
        let o = coli(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let p: serde_json::Value = serde_json::from_slice(&o.stdout).expect("plan --json is JSON");
        p["kv_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("kv_bytes in {p}"))
    };
    let f32s = kv_bytes(&["--kv-type", "f32"]);
    assert_eq!(kv_bytes(&[]) * 2, f32s);
    assert_eq!(kv_bytes(&["--kv-type", "f16"]) * 2, f32s);
    // q8: 34 bytes per 32 values where f32 takes 128 (kv_dim a multiple of 32).
    let q8 = kv_bytes(&["--kv-type", "q8"]);
    assert!(q8 * 128 >= f32s * 34 && q8 < f32s / 3, "{q8} vs {f32s}");
}
