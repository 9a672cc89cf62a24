//! A few threads for the CPU work of a request before it reaches the
//! decode loop (parsing its JSON, rendering the chat template,
//! tokenizing), so the async threads only move bytes: an 8 MB body takes
//! tens of milliseconds to parse and far more to tokenize, and on an async
//! thread that time stalls every connection it serves.
//!
//! Jobs run in the order they come. Large ones (by body size) may hold at
//! most all threads but one, so a small request never waits behind a
//! queue of large ones for more than the job already running on that
//! thread.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use tokio::sync::{Semaphore, oneshot};

/// Why a job gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("the request's preparation panicked")]
    Panicked,
    #[error("the preparation threads are gone")]
    Gone,
}

type Job = Box<dyn FnOnce() + Send>;

/// The threads, and the permits large jobs need.
pub struct Pool {
    /// Dropping it ends the threads once the queue is empty (they are not
    /// joined: the last owner of the pool may be one of its own jobs).
    tx: crossbeam_channel::Sender<Job>,
    large: Arc<Semaphore>,
}

impl Pool {
    /// `threads` threads named `coli-prepare-N` (at least one).
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let n = threads.max(1);
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..n {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("coli-prepare-{i}"))
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })?;
        }
        Ok(Self {
            tx,
            large: Arc::new(Semaphore::new((n - 1).max(1))),
        })
    }

    /// Runs `f` on a pool thread and waits for it without blocking the
    /// caller's thread. `large` jobs first wait for one of the permits that
    /// keep a thread free for small ones. When the caller stops waiting
    /// (the client went away) before the job starts, it is skipped.
    /// `after` runs on the pool thread once `f` and its captures are gone.
    pub async fn run<T, F, A>(&self, large: bool, f: F, after: A) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
        A: FnOnce() + Send + 'static,
    {
        let permit = if large {
            Some(self.large.clone().acquire_owned().await.map_err(|_| PoolError::Gone)?)
        } else {
            None
        };
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            if !done.is_closed() {
                let r = catch_unwind(AssertUnwindSafe(f)).map_err(|_| PoolError::Panicked);
                let _ = done.send(r);
            }
            after();
            drop(permit);
        });
        self.tx.send(job).map_err(|_| PoolError::Gone)?;
        result.await.map_err(|_| PoolError::Gone)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    }

    #[test]
    fn runs_off_the_calling_thread_and_returns_the_result() {
        let pool = Pool::new(2).unwrap();
        let caller = std::thread::current().id();
        let (on, v) = runtime()
            .block_on(pool.run(false, move || (std::thread::current().id(), 7), || ()))
            .unwrap();
        assert_ne!(on, caller);
        assert_eq!(v, 7);
    }

    #[test]
    fn a_panic_is_an_error_and_the_pool_keeps_working() {
        let pool = Pool::new(1).unwrap();
        let rt = runtime();
        let r: Result<(), _> = rt.block_on(pool.run(false, || panic!("boom"), || ()));
        assert_eq!(r, Err(PoolError::Panicked));
        assert_eq!(rt.block_on(pool.run(false, || 3, || ())), Ok(3));
    }

    #[test]
    fn after_runs_once_per_job() {
        let after = Arc::new(AtomicUsize::new(0));
        let pool = Pool::new(1).unwrap();
        let rt = runtime();
        for _ in 0..3 {
            let a = after.clone();
            let count = move || {
                a.fetch_add(1, Ordering::SeqCst);
            };
            assert_eq!(rt.block_on(pool.run(true, || 1, count)), Ok(1));
        }
        // `after` runs once the job's result is sent: one more job on the
        // one thread comes after it.
        assert_eq!(rt.block_on(pool.run(false, || 0, || ())), Ok(0));
        assert_eq!(after.load(Ordering::SeqCst), 3);
    }

    /// With every large permit taken by a job that waits, a small job still
    /// runs.
    #[test]
    fn a_small_job_passes_a_blocked_large_one() {
        let pool = Arc::new(Pool::new(2).unwrap());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = oneshot::channel::<()>();
        let p = pool.clone();
        let big = rt.spawn(async move {
            p.run(
                true,
                move || {
                    let _ = started_tx.send(());
                    let _ = wait.recv();
                },
                || (),
            )
            .await
        });
        rt.block_on(async {
            started.await.unwrap();
            assert_eq!(pool.run(false, || 5, || ()).await, Ok(5));
        });
        release.send(()).unwrap();
        assert_eq!(rt.block_on(big).unwrap(), Ok(()));
    }
}
