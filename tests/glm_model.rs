//! GLM model-level properties on the committed fixtures: the absorbed and
//! expanded MLA forms agree, the DSA selection really restricts attention,
//! and truncating the sequence state (rejected drafts) restores it exactly.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use colibri::cli::validate::Reference;
use colibri::model::glm::GlmConfig;
use colibri::model::glm::{self, Form, Glm, GlmState};
use colibri::model::lm::{Logits, SequenceState};
use colibri::model::olmoe::LoadOptions;
use colibri::st::Checkpoint;
use colibri_actors::{BlockingSource, Tag};

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

fn load(name: &str) -> (Glm, Reference) {
    let d = dir(name);
    let cfg = GlmConfig::load(&d).unwrap();
    let ck = Checkpoint::open(&d).unwrap();
    let with_mtp = glm::mtp_available(&cfg, &ck).is_ok();
    let opts = LoadOptions::default();
    let dense = Arc::new(glm::load_dense(&cfg, &ck, opts, with_mtp).unwrap());
    let (map, codec) = glm::expert_map(&cfg, &ck, opts, with_mtp).unwrap();
    let source = Arc::new(BlockingSource::open(map, Box::new(codec)).unwrap());
    let r = Reference::load(&d.join("REF.json")).unwrap();
    (Glm::new(cfg, dense, source, None), r)
}

fn run(m: &mut Glm, ids: &[u32]) -> Vec<f32> {
    let mut st = m.new_glm_state();
    m.forward_glm(ids, &mut st, Tag::new(0, 1, 0), Logits::All)
        .unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn absorbed_and_expanded_forms_agree() {
    for name in ["glm-tiny", "glm-mtp"] {
        let (mut m, r) = load(name);
        m.form = Form::Expanded;
        let a = run(&mut m, &r.full_ids);
        m.form = Form::Absorbed;
        let b = run(&mut m, &r.full_ids);
        let scale = a.iter().map(|v| v.abs()).fold(0.0, f32::max);
        let d = max_diff(&a, &b);
        assert!(
            d <= 1e-4 * scale.max(1.0),
            "{name}: max |expanded - absorbed| = {d} (scale {scale})"
        );
    }
}

#[test]
fn dsa_selection_changes_the_result() {
    let (mut m, r) = load("glm-tiny");
    assert!(r.full_ids.len() > m.cfg.index_topk());
    let sparse = run(&mut m, &r.full_ids);
    m.cfg.index_topk = Some(10_000);
    let dense = run(&mut m, &r.full_ids);
    let v = m.cfg.vocab_size;
    let k = 6;
    // Identical while every query sees at most index_topk keys...
    assert!(max_diff(&sparse[..k * v], &dense[..k * v]) < 1e-5);
    // ...and different once the indexer restricts attention.
    assert!(max_diff(&sparse[k * v..], &dense[k * v..]) > 1e-3);
}

#[test]
fn truncation_restores_the_state_exactly() {
    let (mut m, r) = load("glm-mtp");
    m.form = Form::Absorbed; // batch-invariant, so chunked and whole runs are bitwise equal
    let ids = &r.full_ids;
    let whole = run(&mut m, ids);
    let v = m.cfg.vocab_size;
    let mut st: GlmState = m.new_glm_state();
    let half = ids.len() / 2;
    m.forward_glm(&ids[..half], &mut st, Tag::new(0, 1, 0), Logits::None)
        .unwrap();
    let bytes_before = st.position_bytes(half - 1);
    // Rejected drafts: run garbage, then drop it.
    m.forward_glm(&[3, 4, 5, 6], &mut st, Tag::new(0, 2, 0), Logits::None)
        .unwrap();
    st.truncate(half);
    assert_eq!(st.len(), half);
    assert_eq!(st.position_bytes(half - 1), bytes_before);
    let rest = m
        .forward_glm(&ids[half..], &mut st, Tag::new(0, 3, 0), Logits::All)
        .unwrap();
    assert_eq!(rest, whole[half * v..].to_vec());
    // Records round-trip into a fresh state that continues identically.
    let mut copy = m.new_glm_state();
    for p in 0..half {
        assert!(copy.push_position_bytes(&st.position_bytes(p)));
    }
    let again = m
        .forward_glm(&ids[half..], &mut copy, Tag::new(0, 4, 0), Logits::All)
        .unwrap();
    assert_eq!(again, rest);
}
