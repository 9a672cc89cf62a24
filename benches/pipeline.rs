//! The expert pipeline on a simulated slow disk: overlapped fetches vs the
//! strict no-overlap mode vs every expert resident, on a small synthetic
//! model generated at start. The ratios printed first are measured in this
//! run (median of a few passes each); criterion then times each mode.

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use colibri::engine::{Engine, EngineOptions, Session};
use colibri::synth::{SynthSpec, decode_pass, synth, synthetic_prompt};
use criterion::{Criterion, criterion_group, criterion_main};

const TOKENS: usize = 4;
const DISK: &str = "bw=200MB/s,lat=1ms,seed=1";

struct Mode {
    name: &'static str,
    opts: EngineOptions,
    /// Decode the sequence once before timing, so a cache holding every
    /// expert has them all.
    warm: bool,
}

fn modes(spec: &SynthSpec) -> Vec<Mode> {
    let slow = EngineOptions {
        disk_sim: Some(DISK.into()),
        cache_cap: Some(spec.experts / 4),
        ..EngineOptions::default()
    };
    vec![
        Mode {
            name: "overlap",
            opts: slow.clone(),
            warm: false,
        },
        Mode {
            name: "no-overlap",
            opts: EngineOptions {
                overlap: false,
                ..slow.clone()
            },
            warm: false,
        },
        Mode {
            name: "resident",
            opts: EngineOptions {
                cache_cap: Some(spec.experts),
                disk_sim: None,
                ..slow
            },
            warm: true,
        },
    ]
}

fn load(dir: &Path, mode: &Mode, prompt: &[u32]) -> (Engine, Session) {
    let mut engine = Engine::load(dir, &mode.opts).expect("load the synthetic model");
    let mut session = engine.new_session();
    if mode.warm {
        decode_pass(&mut engine, &mut session, prompt, 0, TOKENS).expect("warm-up pass");
    }
    (engine, session)
}

fn median_secs(engine: &mut Engine, session: &mut Session, prompt: &[u32], reps: usize) -> (f64, Vec<u32>) {
    let mut times = Vec::with_capacity(reps);
    let mut tokens = Vec::new();
    for _ in 0..reps {
        let r = decode_pass(engine, session, prompt, 0, TOKENS).expect("decode pass");
        times.push(r.decode_secs);
        tokens = r.tokens;
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], tokens)
}

fn pipeline(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("small");
    let spec = SynthSpec {
        seed: 3,
        ..SynthSpec::small()
    };
    synth(&spec, &dir, None).expect("generate the synthetic model");
    let prompt = synthetic_prompt(spec.vocab, 8, 0);
    let modes = modes(&spec);

    // Ratios from this run.
    let mut secs = Vec::new();
    let mut reference: Option<Vec<u32>> = None;
    for mode in &modes {
        let (mut engine, mut session) = load(&dir, mode, &prompt);
        let (s, tokens) = median_secs(&mut engine, &mut session, &prompt, 5);
        match &reference {
            None => reference = Some(tokens),
            Some(r) => assert_eq!(r, &tokens, "{}: tokens differ from overlap mode", mode.name),
        }
        secs.push((mode.name, s));
    }
    let t = |name: &str| secs.iter().find(|(n, _)| *n == name).map_or(f64::NAN, |x| x.1);
    eprintln!("pipeline ({TOKENS} tokens, disk {DISK}, median of 5):");
    for (name, s) in &secs {
        eprintln!("  {name:<11} {:.1} tok/s", TOKENS as f64 / s);
    }
    eprintln!(
        "  overlap speed-up over no-overlap: {:.2}x",
        t("no-overlap") / t("overlap")
    );
    eprintln!(
        "  overlap speed / resident speed:   {:.2}",
        t("resident") / t("overlap")
    );

    let mut group = c.benchmark_group("pipeline");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for mode in &modes {
        let (mut engine, mut session) = load(&dir, mode, &prompt);
        group.bench_function(mode.name, |b| {
            b.iter(|| {
                black_box(decode_pass(&mut engine, &mut session, &prompt, 0, TOKENS).expect("decode pass"))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, pipeline);
criterion_main!(benches);
