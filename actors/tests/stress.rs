//! Stress: a slow, jittery, faulty simulated disk, a decode loop, and another
//! thread cancelling generations at random. Nothing wrong is ever delivered,
//! nothing hangs, the cache stays within its byte budget, and the pipeline
//! still serves a clean request at the end.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use colibri_actors::storage::SplitMix64;
use colibri_actors::{ExpertKey, ExpertSource, PipelineConfig, PipelineSource, SimSpec, SourceError, Tag};
use common::{Fixture, TopK, fetch_checked, residual, routing, with_timeout};

const LAYERS: u32 = 4;
const EXPERTS: u32 = 16;
const K: usize = 4;
const FETCHES: u64 = 250;

#[derive(Debug, Default)]
struct Outcome {
    ok: u64,
    cancelled: u64,
    read_errors: u64,
}

fn stress(cfg: PipelineConfig, seed: u64) -> Outcome {
    let fx = Arc::new(Fixture::new(LAYERS, EXPERTS));
    let budget = cfg.ram_budget_bytes;
    let src = Arc::new(
        PipelineSource::open(fx.map.clone(), fx.decoder(), Some(Arc::new(TopK)), cfg).expect("open pipeline"),
    );
    let generation = Arc::new(AtomicU64::new(1));
    let done = Arc::new(AtomicBool::new(false));

    let canceller = {
        let (src, generation, done) = (src.clone(), generation.clone(), done.clone());
        std::thread::spawn(move || {
            let mut r = SplitMix64::new(seed);
            let mut n = 0u64;
            // At least one cancellation whatever the scheduler does (on a
            // loaded machine this thread may first run after the workload
            // ends); the pauses only spread the others out.
            loop {
                std::thread::sleep(Duration::from_micros(500 + r.below(6000)));
                let g = generation.fetch_add(1, Ordering::SeqCst) + 1;
                src.advance(Tag::new(g, 0, 0));
                n += 1;
                if done.load(Ordering::SeqCst) {
                    break;
                }
            }
            n
        })
    };
    let monitor = {
        let (src, done) = (src.clone(), done.clone());
        std::thread::spawn(move || {
            let mut max = 0;
            while !done.load(Ordering::SeqCst) {
                max = max.max(src.profile().cache_bytes);
                std::thread::sleep(Duration::from_micros(300));
            }
            max
        })
    };

    let mut out = Outcome::default();
    let mut r = SplitMix64::new(seed ^ 0xABCD);
    let mut step = 0u64;
    let mut fetches = 0u64;
    'outer: while fetches < FETCHES {
        let g = generation.load(Ordering::SeqCst);
        step += 1;
        let tag = Tag::new(g, step, 0);
        src.advance(tag);
        for l in 0..LAYERS {
            if l + 1 < LAYERS {
                src.pilot(tag.at_layer(l + 1), &residual(seed, step, l + 1, EXPERTS, K));
            }
            let keys: Vec<ExpertKey> = routing(seed, r.below(50), l, EXPERTS, K)
                .into_iter()
                .map(|e| ExpertKey::new(l, e))
                .collect();
            fetches += 1;
            match fetch_checked(src.as_ref(), &fx, tag.at_layer(l), &keys) {
                Ok(_) => out.ok += 1,
                Err(SourceError::Cancelled) => {
                    out.cancelled += 1;
                    continue 'outer;
                }
                Err(SourceError::Read { .. }) => out.read_errors += 1,
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
    }
    done.store(true, Ordering::SeqCst);
    let cancels = canceller.join().expect("canceller");
    let max_bytes = monitor.join().expect("monitor");
    if let Some(b) = budget {
        assert!(max_bytes <= b, "cache held {max_bytes} bytes, budget {b}");
        assert!(src.profile().cache_bytes <= b);
    }
    assert!(cancels > 0);
    // A long-running server survives: a clean request on a fresh generation.
    let g = generation.fetch_add(1, Ordering::SeqCst) + 1;
    src.advance(Tag::new(g, 0, 0));
    let keys: Vec<ExpertKey> = (0..EXPERTS).map(|e| ExpertKey::new(2, e)).collect();
    fetch_checked(src.as_ref(), &fx, Tag::new(g, 0, 2), &keys).expect("final request");
    out
}

fn faulty(seed: u64) -> Option<SimSpec> {
    Some(
        format!("bw=100MB/s,lat=100us,jitter=500us,spike=0.02:3ms,fail=0.05,short=0.05,seed={seed}")
            .parse()
            .expect("spec"),
    )
}

#[test]
fn faulty_disk_with_random_cancellation() {
    with_timeout(60, || {
        let mut total = Outcome::default();
        let cases = [
            (1, Some(60_000), None, true, false, false),
            (4, Some(40_000), Some(2), true, false, true),
            (16, Some(100_000), None, false, true, false),
            (3, None, Some(1), true, false, false),
        ];
        for (i, &(workers, budget, cap, pilot, direct, mmap)) in cases.iter().enumerate() {
            let cfg = PipelineConfig {
                io_workers: workers,
                cache_cap: cap,
                ram_budget_bytes: budget,
                pilot,
                pilot_k: K,
                direct,
                mmap,
                disk_sim: faulty(i as u64 + 1),
                read_retries: 6,
                ..PipelineConfig::default()
            };
            let o = stress(cfg, 100 + i as u64);
            eprintln!("case {i}: {o:?}");
            total.ok += o.ok;
            total.cancelled += o.cancelled;
            total.read_errors += o.read_errors;
        }
        assert!(total.ok > 0, "{total:?}");
        assert!(total.cancelled > 0, "no fetch was ever cancelled: {total:?}");
    });
}

#[test]
fn faults_without_retries_surface_but_never_corrupt() {
    with_timeout(60, || {
        let fx = Fixture::new(LAYERS, EXPERTS);
        let cfg = PipelineConfig {
            io_workers: 4,
            cache_cap: Some(1),
            disk_sim: Some("lat=50us,fail=0.2,short=0.2,seed=5".parse().expect("spec")),
            read_retries: 0,
            ..PipelineConfig::default()
        };
        let src = PipelineSource::open(fx.map.clone(), fx.decoder(), None, cfg).expect("open");
        let (mut ok, mut failed) = (0, 0);
        for s in 0..60u64 {
            let l = (s % u64::from(LAYERS)) as u32;
            let keys: Vec<ExpertKey> = routing(9, s, l, EXPERTS, K)
                .into_iter()
                .map(|e| ExpertKey::new(l, e))
                .collect();
            match fetch_checked(&src, &fx, Tag::new(0, s, l), &keys) {
                Ok(_) => ok += 1,
                Err(SourceError::Read { key, .. }) => {
                    assert!(keys.contains(&key));
                    failed += 1
                }
                Err(e) => panic!("unexpected: {e}"),
            }
        }
        assert!(ok > 0 && failed > 0, "ok {ok} failed {failed}");
    });
}
