//! Placement never changes what is delivered: every cache size, worker
//! count, backend, pilot setting and disk speed yields the same experts with
//! the same bytes for every fetch.

mod common;

use std::sync::Arc;

use colibri_actors::storage::SplitMix64;
use colibri_actors::{BlockingSource, PipelineConfig, PipelineSource, SimSpec};
use common::{Fixture, TopK, run_workload, with_timeout};

const LAYERS: u32 = 4;
const EXPERTS: u32 = 16;
const K: usize = 4;
const STEPS: u64 = 5;
const SEED: u64 = 11;

fn configs() -> Vec<PipelineConfig> {
    let sims: [Option<&str>; 3] = [
        None,
        Some("bw=40MB/s,lat=100us,seed=3"),
        Some("bw=200MB/s,lat=20us,jitter=400us,spike=0.05:2ms,seed=4"),
    ];
    let caps = [Some(0), Some(1), Some(2), Some(3), Some(8), None];
    let workers = [1, 2, 3, 4, 8, 16];
    let mut out = Vec::new();
    // Every cache cap and every worker count at least once, with the other
    // settings drawn by a seeded generator.
    let mut r = SplitMix64::new(99);
    for i in 0..30 {
        let sim = sims[r.below(3) as usize].map(|s| s.parse::<SimSpec>().expect("spec"));
        let mmap = r.chance(0.3);
        out.push(PipelineConfig {
            io_workers: workers[i % workers.len()],
            cache_cap: caps[i % caps.len()],
            ram_budget_bytes: r.chance(0.3).then(|| 8192 * (1 + r.below(20))),
            pilot: r.chance(0.6),
            pilot_k: K,
            pilot_thread: r.chance(0.5),
            direct: !mmap && r.chance(0.5),
            mmap,
            drop_cache: r.chance(0.2),
            disk_sim: sim,
            overlap: r.chance(0.8),
            read_retries: 3,
        });
    }
    out
}

#[test]
fn every_placement_delivers_the_same_experts() {
    with_timeout(120, || {
        let fx = Arc::new(Fixture::new(LAYERS, EXPERTS));
        let reference = {
            let src = BlockingSource::open(fx.map.clone(), fx.decoder()).expect("open");
            run_workload(&src, &fx, SEED, STEPS, K)
        };
        assert_eq!(reference.len(), (LAYERS as u64 * STEPS) as usize);
        for cfg in configs() {
            let label = format!("{cfg:?}");
            let src = PipelineSource::open(fx.map.clone(), fx.decoder(), Some(Arc::new(TopK)), cfg.clone())
                .expect("open pipeline");
            let got = run_workload(&src, &fx, SEED, STEPS, K);
            assert_eq!(got, reference, "{label}");
            let p = src.profile();
            assert_eq!(p.hits + p.misses, (LAYERS as u64) * STEPS * K as u64, "{label}");
            if let Some(b) = cfg.ram_budget_bytes {
                assert!(p.cache_bytes <= b, "{label}: {} > {b}", p.cache_bytes);
            }
            if cfg.cache_cap == Some(0) {
                assert_eq!(p.hits, 0, "{label}");
            }
            if !cfg.overlap {
                assert_eq!(p.prefetch_loads, 0, "{label}");
            }
            if cfg.cache_cap.is_none() && cfg.ram_budget_bytes.is_none() {
                // Everything stays: each distinct expert is read at most once.
                assert!(
                    p.demand_loads + p.prefetch_loads <= (LAYERS * EXPERTS) as u64,
                    "{label}"
                );
            }
        }
    });
}

#[test]
fn direct_io_on_a_real_filesystem() {
    // The temp dir sits on the build machine's disk (ext4 here): O_DIRECT
    // really runs. On tmpfs the backend falls back and still must agree.
    with_timeout(60, || {
        let fx = Fixture::new(3, 8);
        let cfg = PipelineConfig {
            direct: true,
            io_workers: 3,
            cache_cap: Some(2),
            ..PipelineConfig::default()
        };
        let reference = {
            let src = BlockingSource::open(fx.map.clone(), fx.decoder()).expect("open");
            run_workload(&src, &fx, 5, 4, 3)
        };
        let src = PipelineSource::open(fx.map.clone(), fx.decoder(), None, cfg).expect("open");
        assert_eq!(src.profile().storage, "direct");
        assert_eq!(run_workload(&src, &fx, 5, 4, 3), reference);
    });
}
