//! One I/O worker thread: take a request (demand first), read the expert's
//! extent with one contiguous read per span, decode it, reply.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, TryRecvError, select};

use super::msg::{IoEvent, IoRequest, LoadedExpert, Priority, ReadReport};
use crate::buffer::{AlignedBuf, BufPool};
use crate::error::SourceError;
use crate::expert::{ExpertKey, ExpertMap};
use crate::source::{ExpertDecoder, MAX_READ_GAP};
use crate::storage::Storage;
use crate::tag::TagClockReader;

/// What every worker shares: immutable, except the tag clock the coordinator
/// advances.
pub(crate) struct WorkerCtx<T> {
    pub storage: Arc<dyn Storage>,
    pub map: Arc<ExpertMap>,
    pub decoder: Arc<dyn ExpertDecoder<T>>,
    /// The newest announced token step; stale prefetches are dropped
    /// against it.
    pub clock: TagClockReader,
    pub retries: u32,
    /// Where read buffers come from and evicted ones go back to.
    pub buffers: BufPool,
}

pub(crate) fn run<T: Send + Sync + 'static>(
    ctx: WorkerCtx<T>,
    demand: Receiver<IoRequest<T>>,
    prefetch: Receiver<IoRequest<T>>,
) {
    loop {
        let req = match demand.try_recv() {
            Ok(r) => r,
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => {
                select! {
                    recv(demand) -> r => match r { Ok(r) => r, Err(_) => return },
                    recv(prefetch) -> r => match r { Ok(r) => r, Err(_) => return },
                }
            }
        };
        handle(&ctx, req);
    }
}

fn handle<T: Send + Sync + 'static>(ctx: &WorkerCtx<T>, req: IoRequest<T>) {
    if req.is_droppable(ctx.clock.now()) {
        // Unclaimed: a demand copy of the same load may still be queued.
        let _ = req.reply.send(IoEvent::Skipped {
            key: req.key,
            load_id: req.ticket.id,
        });
        return;
    }
    if !req.ticket.claim() {
        return;
    }
    let attempts = match req.priority {
        Priority::Demand => 1 + ctx.retries,
        Priority::Prefetch => 1,
    };
    let mut report = ReadReport::default();
    let mut result = Err(SourceError::Cancelled);
    for attempt in 0..attempts {
        result = load(ctx, req.key, &mut report);
        match &result {
            Ok(_) | Err(SourceError::Decode { .. }) | Err(SourceError::UnknownExpert { .. }) => break,
            Err(e) => {
                report.failed_attempts += 1;
                if req.priority == Priority::Prefetch {
                    tracing::warn!(key = %req.key, error = %e, "prefetch read failed; ignored");
                } else if attempt + 1 < attempts {
                    tracing::debug!(key = %req.key, attempt, error = %e, "demand read failed; retrying");
                } else {
                    tracing::warn!(key = %req.key, attempts, error = %e, "demand read failed");
                }
            }
        }
    }
    let _ = req.reply.send(IoEvent::Loaded {
        key: req.key,
        load_id: req.ticket.id,
        priority: req.priority,
        result,
        report,
    });
}

fn load<T>(
    ctx: &WorkerCtx<T>,
    key: ExpertKey,
    report: &mut ReadReport,
) -> Result<LoadedExpert<T>, SourceError> {
    let (buf, piece_at) = {
        let _span = tracing::debug_span!("expert_read", layer = key.layer, expert = key.expert).entered();
        let t0 = Instant::now();
        let r = read_extent(ctx.storage.as_ref(), &ctx.map, &ctx.buffers, key, report);
        report.read_ns += t0.elapsed().as_nanos() as u64;
        r?
    };
    let decoded = catch_unwind(AssertUnwindSafe(|| {
        ctx.decoder.decode(key, Arc::new(buf), &piece_at)
    }))
    .unwrap_or_else(|_| Err("the decoder panicked".to_string()))
    .map_err(|reason| SourceError::Decode { key, reason })?;
    let resident_bytes = ctx.decoder.resident_bytes(&decoded) as u64;
    Ok(LoadedExpert {
        value: Arc::new(decoded),
        resident_bytes,
    })
}

/// Reads an expert's extent into one aligned buffer, one storage request per
/// contiguous span; a short read fails the attempt.
fn read_extent(
    storage: &dyn Storage,
    map: &ExpertMap,
    buffers: &BufPool,
    key: ExpertKey,
    report: &mut ReadReport,
) -> Result<(AlignedBuf, Vec<usize>), SourceError> {
    let extent = map.extent(key)?;
    let (spans, piece_at) = extent.plan_reads(MAX_READ_GAP);
    let total: u64 = spans.iter().map(|s| s.len).sum();
    let mut buf = buffers.take(total as usize);
    let mut at = 0usize;
    for s in &spans {
        let path = || {
            storage
                .path(s.file)
                .or_else(|| map.files.get(s.file as usize).map(|p| p.as_path()))
                .map(|p| p.to_path_buf())
                .unwrap_or_default()
        };
        let want = s.len as usize;
        report.reads += 1;
        let n = storage
            .read_into(s.file, s.offset, &mut buf, at, want)
            .map_err(|source| SourceError::Read {
                key,
                path: path(),
                source,
            })?;
        if n != want {
            return Err(SourceError::Read {
                key,
                path: path(),
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("short read: {n} of {} bytes at offset {}", s.len, s.offset),
                ),
            });
        }
        report.bytes += n as u64;
        at += n;
    }
    Ok((buf, piece_at))
}
