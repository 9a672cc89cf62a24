//! Pipeline behaviour: retries and surfaced faults, cancellation, in-flight
//! dedup, demand-before-prefetch, pilot prefetch and recall.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use colibri_actors::{
    ExpertKey, ExpertSource, PipelineConfig, PipelineProfile, PipelineSource, Predictor, SourceError, Tag,
};
use common::{ControlledStorage, Fixture, MockExpert, TopK, fetch_checked, with_timeout};

fn keys(layer: u32, es: &[u32]) -> Vec<ExpertKey> {
    es.iter().map(|&e| ExpertKey::new(layer, e)).collect()
}

fn pipeline(
    fx: &Fixture,
    storage: Arc<ControlledStorage>,
    cfg: PipelineConfig,
) -> PipelineSource<MockExpert> {
    PipelineSource::with_storage(fx.map.clone(), storage, fx.decoder(), Some(Arc::new(TopK)), cfg)
        .expect("open")
}

/// Waits until `cond` holds. There is no deadline here, so a slow machine
/// only makes the test slower; a condition that never comes is a hang that
/// the test's `with_timeout` guard turns into a failure naming `_what`.
fn eventually(_what: &str, mut cond: impl FnMut() -> bool) {
    while !cond() {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Hang guard of each test, far above its running time on a loaded machine.
const GUARD_SECS: u64 = 120;

#[test]
fn demand_faults_are_retried() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(2, 8);
        let st = Arc::new(ControlledStorage::new(fx.pread(), None));
        st.fail_next.store(2, Ordering::SeqCst);
        st.short_next.store(1, Ordering::SeqCst);
        let src = pipeline(&fx, st.clone(), PipelineConfig::default());
        let ks = keys(0, &[1, 2, 3]);
        fetch_checked(&src, &fx, Tag::new(0, 0, 0), &ks).expect("retries hide three bad attempts");
        let p = src.profile();
        assert_eq!(p.failed_attempts, 3);
        assert_eq!(p.read_failures, 0);
        assert_eq!(p.misses, 3);
    });
}

#[test]
fn persistent_faults_surface_and_the_pipeline_survives() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(2, 8);
        let st = Arc::new(ControlledStorage::new(fx.pread(), None));
        st.always_fail.store(true, Ordering::SeqCst);
        let cfg = PipelineConfig {
            read_retries: 2,
            ..PipelineConfig::default()
        };
        let src = pipeline(&fx, st.clone(), cfg);
        let ks = keys(1, &[3]);
        let err = fetch_checked(&src, &fx, Tag::new(0, 0, 1), &ks).expect_err("must fail");
        let msg = err.to_string();
        match &err {
            SourceError::Read { key, path, .. } => {
                assert_eq!(*key, ks[0]);
                assert_eq!(path, &fx.map.files[((1 + 3) % 2) as usize]);
            }
            other => panic!("expected a read error, got {other:?}"),
        }
        assert!(msg.contains("L1/E3") && msg.contains("experts-0.bin"), "{msg}");
        assert_eq!(st.log.lock().len(), 3, "one attempt plus two retries");
        assert_eq!(src.profile().read_failures, 1);
        // The disk recovers; the same pipeline serves the next request.
        st.always_fail.store(false, Ordering::SeqCst);
        fetch_checked(&src, &fx, Tag::new(0, 1, 1), &keys(1, &[3, 4])).expect("recovered");
        // Unknown experts are refused cleanly.
        let err = fetch_checked(&src, &fx, Tag::new(0, 1, 1), &keys(7, &[0])).err();
        assert!(matches!(err, Some(SourceError::UnknownExpert { .. })), "{err:?}");
    });
}

#[test]
fn cancellation_is_prompt_and_stale_results_are_dropped() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(2, 8);
        let (open, gate) = crossbeam_channel::unbounded();
        let st = Arc::new(ControlledStorage::new(fx.pread(), Some(gate)));
        let src = Arc::new(pipeline(&fx, st.clone(), PipelineConfig::default()));
        src.advance(Tag::new(1, 0, 0));
        let (s2, fx_keys) = (src.clone(), keys(0, &[5]));
        let waiter = std::thread::spawn(move || {
            let r = s2.fetch(Tag::new(1, 0, 0), &fx_keys, &mut |_, _| Ok(()));
            matches!(r, Err(SourceError::Cancelled))
        });
        eventually("the miss is registered", || src.profile().misses == 1);
        // The read must be running (stuck at the gate), not still queued: a
        // queued read is cancelled before it starts and never goes stale.
        eventually("the read is at the gate", || {
            st.entered.load(Ordering::SeqCst) == 1
        });
        // Another thread cancels the generation while the read is stuck.
        src.advance(Tag::new(2, 0, 0));
        assert!(waiter.join().expect("waiter"), "fetch must return Cancelled");
        // A fetch of the old generation is refused at once.
        let r = src.fetch(Tag::new(1, 0, 0), &keys(0, &[6]), &mut |_, _| Ok(()));
        assert!(matches!(r, Err(SourceError::Cancelled)));
        // Let the stuck read finish: its result is stale and nobody wants it.
        for _ in 0..8 {
            let _ = open.send(());
        }
        eventually("the stale load is discarded", || {
            src.profile().stale_discarded == 1
        });
        assert_eq!(src.profile().cache_entries, 0);
        // The new generation works.
        for _ in 0..16 {
            let _ = open.send(());
        }
        fetch_checked(src.as_ref(), &fx, Tag::new(2, 0, 0), &keys(0, &[5])).expect("fetch");
    });
}

/// [`TopK`] that reports each prediction it makes. The pilot hands a
/// prediction to the coordinator before it starts the next one, so once a
/// second prediction has been reported, the first is in the coordinator's
/// inbox ahead of anything the test sends afterwards.
struct Reporting(crossbeam_channel::Sender<()>);

impl Predictor for Reporting {
    fn predict(&self, layer: u32, residual: &[f32], k: usize) -> Vec<u32> {
        let experts = TopK.predict(layer, residual, k);
        let _ = self.0.send(());
        experts
    }
}

/// A pipeline with one I/O worker whose disk holds every read until the test
/// sends a token on the returned gate, and reports every read reaching it;
/// its pilot predicts four experts and reports each prediction.
struct Gated {
    src: Arc<PipelineSource<MockExpert>>,
    storage: Arc<ControlledStorage>,
    open: crossbeam_channel::Sender<()>,
    entered: crossbeam_channel::Receiver<()>,
    predicted: crossbeam_channel::Receiver<()>,
}

impl Gated {
    fn new(fx: &Fixture) -> Self {
        let (open, gate) = crossbeam_channel::unbounded();
        let (entered_tx, entered) = crossbeam_channel::unbounded();
        let storage = Arc::new(ControlledStorage {
            notify: Some(entered_tx),
            ..ControlledStorage::new(fx.pread(), Some(gate))
        });
        let (predicted_tx, predicted) = crossbeam_channel::unbounded();
        let cfg = PipelineConfig {
            io_workers: 1,
            pilot_k: 4,
            ..PipelineConfig::default()
        };
        let src = PipelineSource::with_storage(
            fx.map.clone(),
            storage.clone(),
            fx.decoder(),
            Some(Arc::new(Reporting(predicted_tx))),
            cfg,
        )
        .expect("open");
        Self {
            src: Arc::new(src),
            storage,
            open,
            entered,
            predicted,
        }
    }

    /// Offers `residual` for `tag` twice and returns once the first
    /// prediction is in the coordinator's inbox (see [`Reporting`]); the
    /// second is identical, so it queues nothing more whenever it arrives.
    fn predict(&self, tag: Tag, residual: &[f32]) {
        for _ in 0..2 {
            self.src.pilot(tag, residual);
        }
        for _ in 0..2 {
            self.predicted.recv().expect("a prediction");
        }
    }

    /// Lets every read through from now on.
    fn open(&self) {
        for _ in 0..256 {
            let _ = self.open.send(());
        }
    }

    fn profile(&self) -> PipelineProfile {
        self.src.profile()
    }
}

/// Cancelling a request is announcing a new generation. A fetch waiting on
/// a disk that does not answer (a gate: slower than any disk, and no clock
/// involved) gets `Cancelled` while its read is still stuck; the prefetches
/// queued for the old generation are never read; the new generation is
/// served correct experts.
#[test]
fn a_new_generation_cancels_the_waiting_fetch_and_queued_prefetches() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(2, 16);
        let g = Gated::new(&fx);
        let old = Tag::new(1, 1, 0);
        g.src.advance(old);
        // The one worker starts this fetch's read; the disk holds it.
        let demanded = ExpertKey::new(0, 5);
        let waiter = {
            let s = g.src.clone();
            std::thread::spawn(move || s.fetch(old, &[demanded], &mut |_, _| Ok(())))
        };
        g.entered.recv().expect("the demand read reaches the disk");
        // Layer 1's prediction queues four prefetches behind it.
        let residual = common::residual(7, 1, 1, fx.experts, 4);
        g.predict(old.at_layer(1), &residual);
        let prefetched = keys(1, &TopK.predict(1, &residual, 4));
        // Another thread cancels the request.
        let new = Tag::new(2, 0, 0);
        let s = g.src.clone();
        std::thread::spawn(move || s.advance(new))
            .join()
            .expect("advance");
        // Nothing has passed the gate: the fetch returned without its read.
        let r = waiter.join().expect("waiter");
        assert!(matches!(r, Err(SourceError::Cancelled)), "{:?}", r.err());
        assert_eq!(g.storage.log.lock().len(), 0);
        // `advance` returns after the coordinator handled it: the queued
        // prefetches are cancelled already.
        let p = g.profile();
        assert_eq!((p.cancelled, p.loads_cancelled), (1, 4), "{p:?}");
        // The disk answers again. The new generation gets correct experts,
        // the stuck read's result is discarded, and the worker drops the
        // cancelled prefetches without reading them.
        g.open();
        let ks = [demanded, prefetched[0]];
        fetch_checked(g.src.as_ref(), &fx, new, &ks).expect("the new generation is served");
        eventually("the cancelled prefetches are dropped", || {
            g.profile().prefetch_skipped == 4
        });
        eventually("the stuck read is discarded", || g.profile().stale_discarded == 1);
        let p = g.profile();
        assert_eq!((p.prefetch_loads, p.prefetch_bytes), (0, 0), "{p:?}");
        assert_eq!(p.bytes_read, p.demand_bytes, "{p:?}");
        // Every read belongs to an expert some fetch asked for.
        let asked: Vec<(u32, u64)> = ks
            .iter()
            .flat_map(|&k| fx.map.extent(k).expect("extent").pieces.clone())
            .map(|piece| (piece.file, piece.offset))
            .collect();
        for read in g.storage.log.lock().iter() {
            assert!(asked.contains(read), "read {read:?} belongs to no fetched expert");
        }
        assert_eq!(g.profile().cache_entries, 2);
    });
}

/// When a layer's routing arrives while prefetches the pilot queued for it
/// are still waiting for the disk, the ones it did not pick are never read:
/// the disk goes on to what compute waits for. The picked ones load as
/// usual.
#[test]
fn a_routing_drops_the_unread_prefetches_it_did_not_pick() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(2, 16);
        let g = Gated::new(&fx);
        let step = Tag::new(1, 1, 0);
        g.src.advance(step);
        // The one worker holds layer 0's demand read at the gate.
        let demanded = ExpertKey::new(0, 5);
        let first = {
            let s = g.src.clone();
            std::thread::spawn(move || s.fetch(step, &[demanded], &mut |_, _| Ok(())))
        };
        g.entered.recv().expect("the demand read reaches the disk");
        // Four prefetches of layer 1 queue behind it.
        let residual = common::residual(11, 1, 1, fx.experts, 4);
        g.predict(step.at_layer(1), &residual);
        let guessed = keys(1, &TopK.predict(1, &residual, 4));
        // Layer 1 routes to two of the guesses and one expert nobody guessed.
        let unguessed = (0..fx.experts as u32)
            .map(|e| ExpertKey::new(1, e))
            .find(|k| !guessed.contains(k))
            .expect("16 experts, 4 guessed");
        let routed = vec![guessed[0], guessed[1], unguessed];
        let second = {
            let s = g.src.clone();
            let ks = routed.clone();
            std::thread::spawn(move || s.fetch(step.at_layer(1), &ks, &mut |_, _| Ok(())))
        };
        eventually("the two wrong guesses are dropped", || {
            g.profile().prefetch_dropped_unread == 2
        });
        g.open();
        first.join().expect("first").expect("layer 0 served");
        second.join().expect("second").expect("layer 1 served");
        let p = g.profile();
        assert_eq!(p.prefetch_dropped_unread, 2, "{p:?}");
        // Only what the two fetches asked for was read.
        let asked: Vec<(u32, u64)> = std::iter::once(demanded)
            .chain(routed.iter().copied())
            .flat_map(|k| fx.map.extent(k).expect("extent").pieces.clone())
            .map(|piece| (piece.file, piece.offset))
            .collect();
        for read in g.storage.log.lock().iter() {
            assert!(asked.contains(read), "read {read:?} belongs to no fetched expert");
        }
        for k in &guessed[2..] {
            let piece = fx.map.extent(*k).expect("extent").pieces[0].clone();
            assert!(
                !g.storage.log.lock().contains(&(piece.file, piece.offset)),
                "wrong guess {k} was read"
            );
        }
    });
}

/// A key pinned while a prefetch of it is still queued stays wanted when
/// that prefetch goes stale: the worker skips the prefetch and the pin loads
/// the expert anyway.
#[test]
fn a_pin_outlives_the_stale_prefetch_it_joined() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(2, 16);
        let g = Gated::new(&fx);
        let step = Tag::new(1, 1, 0);
        g.src.advance(step);
        // The one worker holds a pin's read at the gate.
        let first = ExpertKey::new(0, 0);
        g.src.pin(&[first]);
        g.entered.recv().expect("the pin's read reaches the disk");
        // Prefetches of layer 1 queue behind it; one of them gets pinned.
        let residual = common::residual(3, 1, 1, fx.experts, 4);
        g.predict(step.at_layer(1), &residual);
        let pinned = keys(1, &TopK.predict(1, &residual, 4))[0];
        g.src.pin(&[pinned]);
        // The next step makes the prefetches stale; the pinned one is spared.
        let next = Tag::new(1, 2, 0);
        g.src.advance(next);
        assert_eq!(g.profile().loads_cancelled, 3);
        g.open();
        eventually("both pinned experts are resident", || {
            g.profile().cache_entries == 2
        });
        fetch_checked(g.src.as_ref(), &fx, next.at_layer(1), &[pinned]).expect("fetch");
        let p = g.profile();
        assert_eq!((p.hits, p.misses), (1, 0), "{p:?}");
    });
}

#[test]
fn cancelled_queued_reads_are_never_issued() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(2, 8);
        let (open, gate) = crossbeam_channel::unbounded();
        let st = Arc::new(ControlledStorage::new(fx.pread(), Some(gate)));
        let cfg = PipelineConfig {
            io_workers: 1,
            ..PipelineConfig::default()
        };
        let src = Arc::new(pipeline(&fx, st.clone(), cfg));
        src.advance(Tag::new(1, 0, 0));
        let spawn_fetch = |e: u32| {
            let (s, k) = (src.clone(), keys(0, &[e]));
            std::thread::spawn(move || s.fetch(Tag::new(1, 0, 0), &k, &mut |_, _| Ok(())))
        };
        let a = spawn_fetch(1);
        eventually("first miss", || src.profile().misses == 1);
        // The one worker runs a's read (at the gate) before b queues behind it.
        eventually("a's read is running", || st.entered.load(Ordering::SeqCst) == 1);
        let b = spawn_fetch(2);
        eventually("second miss", || src.profile().misses == 2);
        src.advance(Tag::new(2, 0, 0));
        assert!(matches!(a.join().expect("a"), Err(SourceError::Cancelled)));
        assert!(matches!(b.join().expect("b"), Err(SourceError::Cancelled)));
        for _ in 0..4 {
            let _ = open.send(());
        }
        eventually("the running read is discarded", || {
            src.profile().stale_discarded == 1
        });
        let p = src.profile();
        assert_eq!(p.loads_cancelled, 1, "{p:?}");
        // Drain: only the read that was already running happened.
        fetch_checked(src.as_ref(), &fx, Tag::new(2, 0, 0), &keys(1, &[0])).expect("fetch");
        assert_eq!(st.log.lock().len(), 2);
    });
}

#[test]
fn concurrent_requests_share_one_read() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(2, 8);
        let (open, gate) = crossbeam_channel::unbounded();
        let st = Arc::new(ControlledStorage::new(fx.pread(), Some(gate)));
        let src = Arc::new(pipeline(&fx, st.clone(), PipelineConfig::default()));
        let fx = Arc::new(fx);
        let ks = keys(1, &[1, 2]); // experts 1 and 2: one span each
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (s, f, k) = (src.clone(), fx.clone(), ks.clone());
                std::thread::spawn(move || fetch_checked(s.as_ref(), &f, Tag::new(0, 0, 1), &k).is_ok())
            })
            .collect();
        eventually("all three registered", || src.profile().misses == 6);
        for _ in 0..2 {
            let _ = open.send(());
        }
        for t in threads {
            assert!(t.join().expect("thread"));
        }
        assert_eq!(st.log.lock().len(), 2, "one read per expert");
        assert_eq!(src.profile().inflight_joins, 4);
    });
}

#[test]
fn demand_goes_before_prefetch() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(2, 8);
        let (open, gate) = crossbeam_channel::unbounded();
        let st = Arc::new(ControlledStorage::new(fx.pread(), Some(gate)));
        let cfg = PipelineConfig {
            io_workers: 1,
            ..PipelineConfig::default()
        };
        let src = Arc::new(pipeline(&fx, st.clone(), cfg));
        // Background loads (pins use the prefetch queue); the one worker
        // takes the first and blocks on the gate.
        src.pin(&keys(0, &[1]));
        eventually("the worker holds the first load", || {
            st.entered.load(Ordering::SeqCst) == 1
        });
        src.pin(&keys(0, &[2, 4, 5]));
        let (s, k) = (src.clone(), keys(1, &[1]));
        let demand = std::thread::spawn(move || s.fetch(Tag::new(0, 0, 1), &k, &mut |_, _| Ok(())).is_ok());
        eventually("the demand read is in the I/O queue", || {
            src.profile().demand_queued == 1
        });
        for _ in 0..5 {
            let _ = open.send(());
        }
        assert!(demand.join().expect("demand"));
        eventually("all loads done", || src.profile().cache_entries == 5);
        let offset = |k: ExpertKey| fx.map.extent(k).map(|e| e.pieces[0].offset).expect("extent");
        let log: Vec<u64> = st.log.lock().iter().map(|&(_, o)| o).collect();
        assert_eq!(log.len(), 5);
        assert_eq!(log[0], offset(ExpertKey::new(0, 1)));
        assert_eq!(
            log[1],
            offset(ExpertKey::new(1, 1)),
            "demand read second: {log:?}"
        );
    });
}

#[test]
fn pilot_prefetches_and_measures_recall() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(4, 16);
        let st = Arc::new(ControlledStorage::new(fx.pread(), None));
        let src = pipeline(&fx, st, PipelineConfig::default());
        let k = 4;
        for s in 0..6u64 {
            let tag = Tag::new(3, s, 0);
            src.advance(tag);
            for l in 0..fx.layers {
                src.pilot(tag.at_layer(l), &common::residual(1, s, l, fx.experts, k));
                // Give the pilot time to run ahead, as attention would.
                eventually("prediction arrives", || {
                    src.profile().predictions > (s * 4 + u64::from(l))
                });
                let ks: Vec<ExpertKey> = common::routing(1, s, l, fx.experts, k)
                    .into_iter()
                    .map(|e| ExpertKey::new(l, e))
                    .collect();
                fetch_checked(&src, &fx, tag.at_layer(l), &ks).expect("fetch");
            }
        }
        let p = src.profile();
        // The residual hides one of four routed experts: recall 3/4.
        assert_eq!(p.pilot_routed, 6 * 4 * 4);
        assert_eq!(p.pilot_hits * 4, p.pilot_routed * 3);
        assert_eq!(src.stats().pilot_recall(), Some(0.75));
        assert!(p.prefetch_loads > 0, "{p:?}");
        // The hidden expert is the only one left to demand (when not cached).
        assert!(p.hits + p.inflight_joins >= p.pilot_hits, "{p:?}");
    });
}

#[test]
fn no_overlap_mode_reads_one_expert_at_a_time() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(2, 8);
        let st = Arc::new(ControlledStorage::new(fx.pread(), None));
        let cfg = PipelineConfig {
            overlap: false,
            io_workers: 4,
            ..PipelineConfig::default()
        };
        let src = pipeline(&fx, st.clone(), cfg);
        src.pilot(Tag::new(0, 0, 0), &common::residual(1, 0, 0, 8, 3));
        let ks = keys(0, &[0, 3, 5]);
        let mut order = Vec::new();
        src.fetch(Tag::new(0, 0, 0), &ks, &mut |i, e| {
            // When index i arrives, exactly i+1 experts were read: the next
            // read has not started.
            order.push((i, st.log.lock().len()));
            assert_eq!(e.key, ks[i]);
            Ok(())
        })
        .expect("fetch");
        assert_eq!(order, vec![(0, 1), (1, 2), (2, 3)]);
        // Hits come first, then misses one by one.
        let mut order = Vec::new();
        src.fetch(Tag::new(0, 0, 0), &keys(0, &[6, 3]), &mut |i, _| {
            order.push(i);
            Ok(())
        })
        .expect("fetch");
        assert_eq!(order, vec![1, 0]);
        assert_eq!(src.profile().prefetch_loads, 0);
    });
}

#[test]
fn sink_errors_stop_the_fetch_and_leave_the_pipeline_usable() {
    with_timeout(GUARD_SECS, || {
        let fx = Fixture::new(2, 8);
        let st = Arc::new(ControlledStorage::new(fx.pread(), None));
        let src = pipeline(&fx, st, PipelineConfig::default());
        let r = src.fetch(Tag::new(0, 0, 0), &keys(0, &[1, 2, 3]), &mut |_, _| {
            Err(SourceError::Compute("boom".into()))
        });
        assert!(matches!(r, Err(SourceError::Compute(_))));
        fetch_checked(&src, &fx, Tag::new(0, 0, 0), &keys(0, &[1, 2, 3, 4])).expect("next fetch");
    });
}

/// Not a check (speed is never asserted): prints how much load‖compute
/// overlap and the pilot save on a simulated slow disk with simulated
/// compute. `cargo test -p colibri-actors --test behaviour -- --ignored --nocapture`
#[test]
#[ignore]
fn overlap_report() {
    let fx = Fixture::new(8, 32);
    let k = 4;
    let run = |overlap: bool, pilot: bool| {
        let cfg = PipelineConfig {
            overlap,
            pilot,
            pilot_k: k,
            cache_cap: Some(4),
            io_workers: 4,
            disk_sim: Some("bw=20MB/s,lat=1ms,jitter=500us,seed=1".parse().expect("spec")),
            ..PipelineConfig::default()
        };
        let src =
            PipelineSource::open(fx.map.clone(), fx.decoder(), Some(Arc::new(TopK)), cfg).expect("open");
        let t0 = std::time::Instant::now();
        for s in 0..6u64 {
            let tag = Tag::new(0, s, 0);
            src.advance(tag);
            src.pilot(tag, &common::residual(2, s, 0, fx.experts, k));
            for l in 0..fx.layers {
                // attention
                std::thread::sleep(Duration::from_micros(500));
                if l + 1 < fx.layers {
                    src.pilot(tag.at_layer(l + 1), &common::residual(2, s, l + 1, fx.experts, k));
                }
                let ks: Vec<ExpertKey> = common::routing(2, s, l, fx.experts, k)
                    .into_iter()
                    .map(|e| ExpertKey::new(l, e))
                    .collect();
                src.fetch(tag.at_layer(l), &ks, &mut |_, _| {
                    std::thread::sleep(Duration::from_micros(700)); // expert matmul
                    Ok(())
                })
                .expect("fetch");
            }
        }
        (t0.elapsed().as_secs_f64(), src.profile())
    };
    let (base, pb) = run(false, false);
    let (ovl, po) = run(true, false);
    let (pil, pp) = run(true, true);
    eprintln!("no overlap {base:.3}s (wait {:.0}%)", 100.0 * pb.wait_fraction());
    eprintln!(
        "overlap    {ovl:.3}s (wait {:.0}%) x{:.2}",
        100.0 * po.wait_fraction(),
        base / ovl
    );
    eprintln!(
        "overlap+pilot {pil:.3}s (wait {:.0}%) x{:.2}, recall {:?}, prefetch loads {}",
        100.0 * pp.wait_fraction(),
        base / pil,
        pp.source_stats().pilot_recall(),
        pp.prefetch_loads
    );
}
