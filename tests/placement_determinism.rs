//! Placement may change speed, never tokens: the same greedy continuation
//! whatever the cache size, pilot, I/O workers, read path, disk speed or
//! the pins the usage history sets.

use std::path::Path;

use colibri::engine::usage::PinMode;
use colibri::engine::{Engine, EngineOptions, Placement};
use colibri::sampling::{Sampler, SamplingParams};

fn generate(
    dir: &Path,
    opts: &EngineOptions,
    prompt: &[u32],
    n: usize,
    sampling: SamplingParams,
) -> Vec<u32> {
    let mut engine = Engine::load(dir, opts).unwrap_or_else(|e| panic!("{opts:?}: {e}"));
    engine.stop_ids.clear();
    let mut session = engine.new_session();
    let mut sampler = Sampler::new(sampling);
    session
        .generate(&mut engine, prompt, n, &mut sampler, &mut |_| true)
        .unwrap_or_else(|e| panic!("{opts:?}: {e}"))
        .generated
}

/// Placements over `base`'s numeric choices.
fn placements(base: &EngineOptions) -> Vec<EngineOptions> {
    let base = || base.clone();
    vec![
        EngineOptions {
            cache_cap: Some(1),
            pilot: false,
            io_workers: 1,
            ..base()
        },
        EngineOptions {
            cache_cap: Some(0),
            io_workers: 16,
            ..base()
        },
        EngineOptions {
            cache_cap: Some(3),
            direct: true,
            ..base()
        },
        EngineOptions {
            cache_cap: Some(2),
            mmap: true,
            io_workers: 2,
            ..base()
        },
        EngineOptions {
            cache_cap: Some(1),
            disk_sim: Some("bw=40MB/s,lat=1ms,jitter=2ms,spike=0.05:5ms,seed=7".into()),
            ..base()
        },
        EngineOptions {
            cache_cap: Some(2),
            overlap: false,
            ..base()
        },
        EngineOptions {
            pilot_k: Some(1),
            ram_gb: Some(64.0),
            ..base()
        },
        // The private cache with room for everything, and the mapped
        // placement forced (the default `auto` maps these small models).
        EngineOptions {
            placement: Placement::Streamed,
            ..base()
        },
        EngineOptions {
            placement: Placement::Mapped,
            io_workers: 1,
            ..base()
        },
    ]
}

fn check(dir: &Path, prompt: &[u32], n: usize, sampling: SamplingParams) {
    check_over(dir, prompt, n, sampling, &EngineOptions::default());
}

fn check_over(dir: &Path, prompt: &[u32], n: usize, sampling: SamplingParams, base: &EngineOptions) {
    let reference = generate(dir, base, prompt, n, sampling);
    assert_eq!(reference.len(), n);
    for opts in placements(base) {
        assert_eq!(
            generate(dir, &opts, prompt, n, sampling),
            reference,
            "{}: {opts:?}",
            dir.display()
        );
    }
}

#[test]
fn greedy_tokens_do_not_depend_on_placement() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    check(
        &root.join("fixtures/olmoe-odd"),
        &[5, 17, 3, 250, 99],
        12,
        SamplingParams::default(),
    );
}

#[test]
fn glm_greedy_tokens_do_not_depend_on_placement() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // glm-tiny: 2 sparse layers of 8 experts; glm-mtp: 1 sparse layer + MTP.
    check(
        &root.join("fixtures/glm-tiny"),
        &[7, 21, 3, 190, 44, 9],
        12,
        SamplingParams::default(),
    );
    check(
        &root.join("fixtures/glm-mtp"),
        &[5, 17, 3, 150, 99],
        12,
        SamplingParams::default(),
    );
}

/// The int8-activation kernels are as placement-independent as the f32
/// ones: quantized experts and dense part, OLMoE and GLM.
#[test]
fn int8_activation_tokens_do_not_depend_on_placement() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let base = EngineOptions {
        expert_bits: 4,
        dense_bits: 8,
        int8_acts: true,
        ..EngineOptions::default()
    };
    check_over(
        &root.join("fixtures/olmoe-odd"),
        &[5, 17, 3, 250, 99],
        12,
        SamplingParams::default(),
        &base,
    );
    check_over(
        &root.join("fixtures/glm-tiny"),
        &[7, 21, 3, 190, 44, 9],
        12,
        SamplingParams::default(),
        &base,
    );
}

#[test]
fn seeded_sampling_does_not_depend_on_placement() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sampling = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 40,
        seed: 42,
    };
    check(
        &root.join("models/colibri-tiny"),
        &[1, 200, 300, 17],
        10,
        sampling,
    );
}

#[test]
fn int8_converted_container_matches_load_time_quantization() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("fixtures/olmoe-tiny");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    colibri::convert::convert(
        &src,
        &out,
        colibri::quant::QFormat::Int8,
        colibri::quant::QFormat::Int8,
        None,
    )
    .unwrap();
    let at_bits = EngineOptions {
        expert_bits: 8,
        dense_bits: 8,
        ..EngineOptions::default()
    };
    let prompt = [3, 1, 4, 1, 5, 9, 2, 6];
    let a = generate(&src, &at_bits, &prompt, 16, SamplingParams::default());
    let b = generate(
        &out,
        &EngineOptions::default(),
        &prompt,
        16,
        SamplingParams::default(),
    );
    assert_eq!(a, b);
}

#[test]
fn auto_placement_maps_what_fits_and_streams_the_rest() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/olmoe-odd");
    let placement = |opts: EngineOptions| {
        let engine = Engine::load(&dir, &opts).unwrap_or_else(|e| panic!("{opts:?}: {e}"));
        engine.profile().map(|p| p.placement).unwrap_or("none")
    };
    assert_eq!(placement(EngineOptions::default()), "mapped");
    // Options only the streaming pipeline has choose it.
    for opts in [
        EngineOptions {
            cache_cap: Some(1),
            ..EngineOptions::default()
        },
        EngineOptions {
            disk_sim: Some("bw=1GB/s".into()),
            ..EngineOptions::default()
        },
        EngineOptions {
            overlap: false,
            ..EngineOptions::default()
        },
        EngineOptions {
            placement: Placement::Streamed,
            ..EngineOptions::default()
        },
    ] {
        assert_eq!(placement(opts), "streamed");
    }
}

/// Generates with the usage history of `state` (recording into it, pins
/// from it): the tokens, how many experts were pinned at start-up, and the
/// pins per layer at the end.
fn generate_with_history(
    dir: &Path,
    opts: &EngineOptions,
    prompt: &[u32],
    n: usize,
    state: &Path,
) -> (Vec<u32>, usize, Vec<Vec<u32>>) {
    let mut engine = Engine::load(dir, opts).unwrap_or_else(|e| panic!("{opts:?}: {e}"));
    engine.stop_ids.clear();
    let (recorder, start) = engine
        .start_usage(Some(state), &PinMode::Auto)
        .unwrap_or_else(|e| panic!("{opts:?}: {e}"));
    let mut session = engine.new_session();
    let mut sampler = Sampler::new(SamplingParams::default());
    let tokens = session
        .generate(&mut engine, prompt, n, &mut sampler, &mut |_| true)
        .unwrap_or_else(|e| panic!("{opts:?}: {e}"))
        .generated;
    let pinned = engine.usage().pinned();
    recorder
        .expect("a state directory records")
        .finish()
        .expect("history written");
    (tokens, start.pinned, pinned)
}

/// Replaces the state directory's routing trace with one in which LRU at
/// `cap` keeps losing a hot expert to a scan (period `cap + 1` steps: the
/// hot expert with `k - 1` scan experts, then `k` scan experts a step), so
/// the replay takes pins and the run that follows is pinned, if the cache
/// holds more than one token's experts and fewer than all. Returns whether
/// it does.
fn pinning_pays(state: &Path, cap: usize) -> bool {
    use colibri::routing::{RoutingTrace, file};
    let path = state.join(colibri::engine::usage::TRACE_FILE);
    let real = file::load(&path).expect("readable").expect("written").trace;
    let routed: Vec<u32> = (0..real.layers as u32)
        .filter(|&l| real.bytes_of(l) > 0)
        .collect();
    let (k, e) = (real.top_k, real.experts as u32);
    let mut t = RoutingTrace::new(real.layers, real.experts, k, real.expert_bytes.clone());
    // Each layer scans experts 1.. in turn.
    let mut scan = vec![0u32; real.layers];
    for step in 0..3000 {
        let mut keys = Vec::new();
        for &l in &routed {
            let mut picks: Vec<u32> = Vec::new();
            if step % (cap + 1) == 0 {
                picks.push(0);
            }
            while picks.len() < k {
                let s = &mut scan[l as usize];
                *s = *s % (e - 1) + 1;
                picks.push(*s);
            }
            keys.extend(picks.into_iter().map(|x| colibri_actors::ExpertKey::new(l, x)));
        }
        t.push_step(&keys);
    }
    file::save(&path, &t, None).expect("trace written");
    k < cap && cap < real.experts
}

/// Pins from the usage history (chosen at start-up by replaying the
/// recorded routing, re-evaluated while it runs every `REPIN_EVERY` steps)
/// change which experts stay resident, never the tokens; the pins stay
/// within their share of `--cache-cap` and leave at least one slot to LRU.
#[test]
fn pins_from_the_usage_history_do_not_change_tokens() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let n = 2 * colibri::engine::usage::REPIN_EVERY as usize + 6;
    for (model, prompt) in [
        ("fixtures/olmoe-odd", &[5u32, 17, 3, 250, 99][..]),
        ("fixtures/glm-tiny", &[7, 21, 3, 190, 44, 9][..]),
        ("models/colibri-tiny", &[1, 200, 300, 17][..]),
    ] {
        let dir = root.join(model);
        let reference = generate(
            &dir,
            &EngineOptions::default(),
            prompt,
            n,
            SamplingParams::default(),
        );
        let state = tempfile::tempdir().unwrap();
        for (round, cap, share) in [(0, 3, 1.0), (1, 3, 1.0), (2, 4, 0.5), (3, 5, 1.0), (4, 6, 1.0)] {
            let opts = EngineOptions {
                placement: Placement::Streamed,
                cache_cap: Some(cap),
                pilot: round % 2 == 0,
                io_workers: 1 + round,
                pin_share: share,
                ..EngineOptions::default()
            };
            let pays = round > 0 && pinning_pays(state.path(), cap);
            let (tokens, at_start, pinned) = generate_with_history(&dir, &opts, prompt, n, state.path());
            assert_eq!(tokens, reference, "{model} {opts:?}");
            assert_eq!(
                at_start > 0,
                pays,
                "{model}: round {round}, cap {cap}: pins only where they pay"
            );
            let room = ((cap as f64 * share) as usize).min(cap - 1);
            for layer in &pinned {
                assert!(
                    layer.len() <= room,
                    "{model}: {pinned:?} over {share} of cap {cap}"
                );
            }
        }
    }
}
