//! Continuous batching must not change a sequence's numbers: a step that
//! runs several sequences together (some prefilling a chunk, some decoding a
//! token) gives each exactly the logits it gets when run alone, bit for bit,
//! on every family and on both activation paths.

use std::path::{Path, PathBuf};

use colibri::engine::{Engine, EngineOptions};
use colibri::model::lm::{BatchItem, LanguageModel, Logits, SequenceState};
use colibri_actors::Tag;

fn model_dir(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn load(rel: &str, int8_acts: bool, bits: u32) -> Engine {
    let opts = EngineOptions {
        int8_acts,
        expert_bits: bits,
        dense_bits: bits,
        ..EngineOptions::default()
    };
    Engine::load(&model_dir(rel), &opts).unwrap()
}

/// Token chunks of three sequences per step (empty: the sequence sits out).
fn schedule(vocab: u32) -> Vec<[Vec<u32>; 3]> {
    let t = |i: u32| (i * 7919 + 13) % vocab;
    vec![
        [(0..9).map(t).collect(), vec![], (20..23).map(t).collect()],
        [vec![t(40)], (50..56).map(t).collect(), vec![t(60)]],
        [vec![t(41)], vec![t(57)], vec![t(61)]],
        [(70..74).map(t).collect(), vec![t(58)], vec![t(62)]],
        [vec![t(42)], vec![], vec![t(63)]],
    ]
}

fn step(
    model: &mut dyn LanguageModel,
    states: &mut [Box<dyn SequenceState>],
    chunks: &[Vec<u32>],
    tag: Tag,
) -> Vec<Vec<f32>> {
    let mut items: Vec<BatchItem<'_>> = states
        .iter_mut()
        .zip(chunks)
        .filter(|(_, c)| !c.is_empty())
        .map(|(st, c)| BatchItem {
            tokens: c,
            state: st.as_mut(),
            logits: Logits::All,
        })
        .collect();
    model.forward_batch(&mut items, tag).unwrap()
}

fn check(rel: &str, int8_acts: bool, bits: u32) {
    let mut engine = load(rel, int8_acts, bits);
    let vocab = engine.model.vocab_size() as u32;
    let plan = schedule(vocab);
    // Together.
    let mut together: Vec<Box<dyn SequenceState>> = (0..3).map(|_| engine.model.new_state()).collect();
    let mut batched: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 3];
    for (s, chunks) in plan.iter().enumerate() {
        let tag = Tag::new(0, s as u64 + 1, 0);
        let out = step(engine.model.as_mut(), &mut together, chunks, tag);
        let mut it = out.into_iter();
        for (i, c) in chunks.iter().enumerate() {
            if !c.is_empty() {
                batched[i].push(it.next().unwrap());
            }
        }
    }
    // Alone, same chunks.
    let mut step_no = 100;
    for i in 0..3 {
        let mut st = engine.model.new_state();
        let mut k = 0;
        for chunks in &plan {
            if chunks[i].is_empty() {
                continue;
            }
            step_no += 1;
            let alone = engine
                .model
                .forward(&chunks[i], st.as_mut(), Tag::new(0, step_no, 0), Logits::All)
                .unwrap();
            assert!(
                alone == batched[i][k],
                "{rel} (int8 acts {int8_acts}, {bits} bits): sequence {i} chunk {k} differs when batched"
            );
            k += 1;
        }
        assert_eq!(st.len(), together[i].len());
    }
}

#[test]
fn olmoe_batched_step_equals_each_sequence_alone() {
    for (acts, bits) in [(true, 8), (false, 8), (true, 4), (false, 32)] {
        check("models/colibri-tiny", acts, bits);
    }
}

#[test]
fn glm_batched_step_equals_each_sequence_alone() {
    for rel in ["fixtures/glm-tiny", "fixtures/glm-mtp"] {
        for (acts, bits) in [(true, 8), (false, 32)] {
            check(rel, acts, bits);
        }
    }
}

#[test]
fn qwen3_moe_and_mixtral_batched_step_equals_each_sequence_alone() {
    for rel in ["fixtures/qwen3-moe-tiny", "fixtures/mixtral-tiny"] {
        for (acts, bits) in [(true, 8), (false, 4), (false, 32)] {
            check(rel, acts, bits);
        }
    }
}

#[test]
fn glm4_and_gpt_oss_batched_step_equals_each_sequence_alone() {
    // gpt-oss runs converted; its sinks, per-layer windows and expert biases
    // all go through the batched pass.
    let tmp = tempfile::tempdir().unwrap();
    let oss = tmp.path().join("gpt-oss");
    colibri::convert::convert(
        &model_dir("fixtures/gpt-oss-tiny"),
        &oss,
        colibri::quant::QFormat::F32,
        colibri::quant::QFormat::F32,
        None,
    )
    .unwrap();
    for dir in [model_dir("fixtures/glm4-moe-tiny"), oss] {
        for (acts, bits) in [(true, 8), (false, 32)] {
            check(dir.to_str().unwrap(), acts, bits);
        }
    }
}

#[test]
fn a_bad_token_fails_before_any_state_changes() {
    let mut engine = load("models/colibri-tiny", true, 8);
    let vocab = engine.model.vocab_size() as u32;
    let mut a = engine.model.new_state();
    let mut b = engine.model.new_state();
    let good = [1u32, 2, 3];
    let bad = [4u32, vocab + 5];
    let mut items = vec![
        BatchItem {
            tokens: &good,
            state: a.as_mut(),
            logits: Logits::Last,
        },
        BatchItem {
            tokens: &bad,
            state: b.as_mut(),
            logits: Logits::Last,
        },
    ];
    let err = engine
        .model
        .forward_batch(&mut items, Tag::new(0, 1, 0))
        .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    assert_eq!((a.len(), b.len()), (0, 0));
}
