//! The threads for the CPU work of a request before it reaches the decode
//! loop (parsing its JSON, rendering the chat template, tokenizing), so
//! the async threads only move bytes: an 8 MB body takes tens of
//! milliseconds to parse and far more to render, and on an async thread
//! that time stalls every connection it serves.
//!
//! Two lanes, each first come first served: small jobs on a few threads of
//! their own, large ones (by body size) on one [`LargeLane`] that the
//! caller runs on a thread it chooses. So a small request never waits
//! behind a large one, and large ones, one at a time, allocate from that
//! one thread only (the server gives it its main thread, for the reason in
//! [`super::memory`]).

use std::panic::{AssertUnwindSafe, catch_unwind};

use crossbeam_channel::{Receiver, Sender};
use tokio::sync::oneshot;

/// Why a job gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("the request's preparation panicked")]
    Panicked,
    #[error("the preparation threads are gone")]
    Gone,
}

type Job = Box<dyn FnOnce() + Send>;

/// Where jobs are sent. Dropping it ends the small lane's threads once
/// their queue is empty (they are not joined: the last owner of the pool
/// may be one of its own jobs) and the large lane's loop.
pub struct Pool {
    small: Sender<Job>,
    large: Sender<Job>,
}

/// The large jobs' queue, run by [`LargeLane::run_until`] on the thread
/// that calls it.
pub struct LargeLane {
    jobs: Receiver<Job>,
}

impl Pool {
    /// The pool with `small_threads` threads (at least one) named
    /// `coli-prepare-N`, and its large lane, which runs nowhere yet.
    pub fn new(small_threads: usize) -> std::io::Result<(Self, LargeLane)> {
        let (small, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..small_threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("coli-prepare-{i}"))
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })?;
        }
        let (large, jobs) = crossbeam_channel::unbounded::<Job>();
        Ok((Self { small, large }, LargeLane { jobs }))
    }

    /// Runs `f` in its lane and waits for it without blocking the caller's
    /// thread. When the caller stops waiting (the client went away) before
    /// the job starts, it is skipped. `after` runs on the job's thread once
    /// `f` and its captures are gone.
    pub async fn run<T, F, A>(&self, large: bool, f: F, after: A) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
        A: FnOnce() + Send + 'static,
    {
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            if !done.is_closed() {
                let r = catch_unwind(AssertUnwindSafe(f)).map_err(|_| PoolError::Panicked);
                let _ = done.send(r);
            }
            after();
        });
        let lane = if large { &self.large } else { &self.small };
        lane.send(job).map_err(|_| PoolError::Gone)?;
        result.await.map_err(|_| PoolError::Gone)?
    }
}

impl LargeLane {
    /// Runs large jobs on this thread until `stop` gets a message or is
    /// dropped, or the pool is gone; jobs still queued then are dropped
    /// (their callers get [`PoolError::Gone`]).
    pub fn run_until(self, stop: &Receiver<()>) {
        loop {
            crossbeam_channel::select! {
                recv(self.jobs) -> job => match job {
                    Ok(job) => job(),
                    Err(_) => return,
                },
                recv(stop) -> _ => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    }

    /// A pool whose large lane runs on a thread of its own until the
    /// returned sender is dropped.
    fn pool(small: usize) -> (Pool, Sender<()>) {
        let (pool, lane) = Pool::new(small).unwrap();
        let (stop_tx, stop) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || lane.run_until(&stop));
        (pool, stop_tx)
    }

    #[test]
    fn runs_off_the_calling_thread_and_returns_the_result() {
        let (pool, _stop) = pool(2);
        let caller = std::thread::current().id();
        for large in [false, true] {
            let (on, v) = runtime()
                .block_on(pool.run(large, move || (std::thread::current().id(), 7), || ()))
                .unwrap();
            assert_ne!(on, caller);
            assert_eq!(v, 7);
        }
    }

    #[test]
    fn a_panic_is_an_error_and_the_pool_keeps_working() {
        let (pool, _stop) = pool(1);
        let rt = runtime();
        for large in [false, true] {
            let r: Result<(), _> = rt.block_on(pool.run(large, || panic!("boom"), || ()));
            assert_eq!(r, Err(PoolError::Panicked));
            assert_eq!(rt.block_on(pool.run(large, || 3, || ())), Ok(3));
        }
    }

    #[test]
    fn after_runs_once_per_job() {
        let after = Arc::new(AtomicUsize::new(0));
        let (pool, _stop) = pool(1);
        let rt = runtime();
        for _ in 0..3 {
            let a = after.clone();
            let count = move || {
                a.fetch_add(1, Ordering::SeqCst);
            };
            assert_eq!(rt.block_on(pool.run(true, || 1, count)), Ok(1));
        }
        // `after` runs once the job's result is sent: one more job on the
        // same lane comes after it.
        assert_eq!(rt.block_on(pool.run(true, || 0, || ())), Ok(0));
        assert_eq!(after.load(Ordering::SeqCst), 3);
    }

    /// While a large job runs, small ones still run.
    #[test]
    fn a_small_job_passes_a_running_large_one() {
        let (pool, _stop) = pool(1);
        let pool = Arc::new(pool);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = oneshot::channel::<()>();
        let p = pool.clone();
        let big = rt.spawn(async move {
            let hold = move || {
                let _ = started_tx.send(());
                let _ = wait.recv();
            };
            p.run(true, hold, || ()).await
        });
        rt.block_on(async {
            started.await.unwrap();
            assert_eq!(pool.run(false, || 5, || ()).await, Ok(5));
        });
        release.send(()).unwrap();
        assert_eq!(rt.block_on(big).unwrap(), Ok(()));
    }

    /// A stopped large lane answers its callers rather than leaving them
    /// waiting.
    #[test]
    fn a_stopped_large_lane_is_an_error() {
        let (pool, lane) = Pool::new(1).unwrap();
        let (stop_tx, stop) = crossbeam_channel::bounded(1);
        stop_tx.send(()).unwrap();
        lane.run_until(&stop);
        let r = runtime().block_on(pool.run(true, || 1, || ()));
        assert_eq!(r, Err(PoolError::Gone));
    }
}
