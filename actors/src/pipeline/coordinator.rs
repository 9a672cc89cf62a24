//! The coordinator actor: sole owner of the expert cache, the table of loads
//! in flight, the waiting fetches and the pilot's recall records.
//!
//! Everything that changes residency happens on this one thread, in message
//! order, so there is nothing to lock. It never blocks on anyone: replies go
//! to per-fetch channels sized for every answer, and I/O requests that do not
//! fit the worker queues wait in a local overflow queue.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError, select};

use super::msg::{CoordMsg, Delivery, FetchMode};
use super::profile::Counters;
use crate::cache::ExpertCache;
use crate::error::SourceError;
use crate::expert::{ExpertKey, ExpertMap};
use crate::io::{IoEvent, IoPool, IoRequest, Priority, Ticket};
use crate::pilot::{Prediction, RecallTracker};
use crate::tag::{Tag, TagClock};

/// What the coordinator does besides serving fetches.
pub(crate) struct CoordFlags {
    /// Issue prefetches for predictions.
    pub prefetch: bool,
    /// Track pilot recall.
    pub pilot: bool,
}

/// A load in flight.
struct InFlight {
    load_id: u64,
    ticket: Arc<Ticket>,
    /// `(fetch id, index)` of fetches waiting for it.
    waiters: Vec<(u64, usize)>,
    /// A demand copy is queued (the load can no longer be skipped as stale).
    demand_sent: bool,
    /// Newest tag that wanted it: the prediction that queued it, a fetch
    /// waiting for it, or the clock when a pin queued it. Once this is stale
    /// and no live fetch waits, the load is dead (unless its key is pinned).
    tag: Tag,
}

/// A fetch with misses outstanding.
struct Pending<T> {
    tag: Tag,
    reply: Sender<Delivery<T>>,
    remaining: usize,
}

pub(crate) struct Coordinator<T> {
    map: Arc<ExpertMap>,
    cache: ExpertCache<T>,
    pool: IoPool<T>,
    io_tx: Sender<IoEvent<T>>,
    /// The newest announced token step; the coordinator is its only writer
    /// (in `on_advance`), the I/O workers and the pilot read it.
    clock: TagClock,
    counters: Arc<Counters>,
    /// Issue prefetches for predictions.
    prefetch: bool,
    /// Track pilot recall.
    pilot: bool,
    inflight: HashMap<ExpertKey, InFlight>,
    pending: HashMap<u64, Pending<T>>,
    overflow: VecDeque<IoRequest<T>>,
    next_load: u64,
    recall: RecallTracker,
    pins: HashSet<ExpertKey>,
}

/// `SourceError` is not `Clone` (it wraps `io::Error`); one failed read may
/// have several waiters, each gets an equivalent error.
fn duplicate(e: &SourceError) -> SourceError {
    match e {
        SourceError::UnknownExpert { key } => SourceError::UnknownExpert { key: *key },
        SourceError::Read { key, path, source } => SourceError::Read {
            key: *key,
            path: path.clone(),
            source: match source.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::new(source.kind(), source.to_string()),
            },
        },
        SourceError::Decode { key, reason } => SourceError::Decode {
            key: *key,
            reason: reason.clone(),
        },
        SourceError::Open { path, source } => SourceError::Open {
            path: path.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        SourceError::Cancelled => SourceError::Cancelled,
        SourceError::Shutdown(s) => SourceError::Shutdown(s.clone()),
        SourceError::Compute(s) => SourceError::Compute(s.clone()),
    }
}

impl<T: Send + Sync + 'static> Coordinator<T> {
    pub fn new(
        map: Arc<ExpertMap>,
        cache: ExpertCache<T>,
        pool: IoPool<T>,
        io_tx: Sender<IoEvent<T>>,
        clock: TagClock,
        counters: Arc<Counters>,
        flags: CoordFlags,
    ) -> Self {
        Self {
            map,
            cache,
            pool,
            io_tx,
            clock,
            counters,
            prefetch: flags.prefetch,
            pilot: flags.pilot,
            inflight: HashMap::new(),
            pending: HashMap::new(),
            overflow: VecDeque::new(),
            next_load: 0,
            recall: RecallTracker::default(),
            pins: HashSet::new(),
        }
    }

    /// The actor loop; returns on `Shutdown` or when every sender is gone.
    pub fn run(mut self, inbox: Receiver<CoordMsg<T>>, io_rx: Receiver<IoEvent<T>>) {
        loop {
            let msg = if self.overflow.is_empty() {
                select! {
                    recv(inbox) -> m => Some(m.map_err(|_| ())),
                    recv(io_rx) -> e => { if let Ok(e) = e { self.on_io(e) } None }
                }
            } else {
                select! {
                    recv(inbox) -> m => Some(m.map_err(|_| ())),
                    recv(io_rx) -> e => { if let Ok(e) = e { self.on_io(e) } None }
                    default(Duration::from_millis(1)) => None,
                }
            };
            match msg {
                Some(Ok(CoordMsg::Shutdown)) | Some(Err(())) => break,
                Some(Ok(m)) => self.on_msg(m),
                None => {}
            }
            self.flush_overflow();
        }
        // Workers blocked on a full reply queue must see it closed before we
        // wait for them.
        drop(io_rx);
        self.overflow.clear();
        let Coordinator { pool, .. } = self;
        pool.shutdown();
    }

    fn on_msg(&mut self, m: CoordMsg<T>) {
        match m {
            CoordMsg::Fetch {
                id,
                tag,
                items,
                mode,
                reply,
            } => self.on_fetch(id, tag, items, mode, reply),
            CoordMsg::Abandon { id } => {
                self.pending.remove(&id);
            }
            CoordMsg::Advance { tag, ack } => {
                self.on_advance(tag);
                let _ = ack.try_send(());
            }
            CoordMsg::Predicted(p) => self.on_predicted(p),
            CoordMsg::Pin { keys, pin } => self.on_pin(keys, pin),
            CoordMsg::Shutdown => {}
        }
    }

    /// The current token step (exact: the coordinator is the clock's writer).
    fn now(&self) -> Tag {
        self.clock.now()
    }

    fn publish_cache_gauges(&self) {
        Counters::set(&self.counters.cache_bytes, self.cache.bytes());
        Counters::set(&self.counters.cache_entries, self.cache.len() as u64);
        Counters::set(
            &self.counters.prefetch_used_bytes,
            self.cache.prefetch_used_bytes(),
        );
        Counters::set(
            &self.counters.prefetch_wasted_bytes,
            self.cache.prefetch_wasted_bytes(),
        );
    }

    fn on_fetch(
        &mut self,
        id: u64,
        tag: Tag,
        items: Vec<(usize, ExpertKey)>,
        mode: FetchMode,
        reply: Sender<Delivery<T>>,
    ) {
        if tag.is_stale_against(self.now()) {
            Counters::add(&self.counters.cancelled, 1);
            let _ = reply.try_send(Delivery::Cancelled);
            return;
        }
        for &(_, key) in &items {
            if let Err(e) = self.map.extent(key) {
                let _ = reply.try_send(Delivery::Failed(e));
                return;
            }
        }
        if mode != FetchMode::LoadOnly && self.pilot {
            let routed: Vec<u32> = items
                .iter()
                .filter(|(_, k)| k.layer == tag.layer)
                .map(|(_, k)| k.expert)
                .collect();
            self.recall.routed(tag, &routed);
            self.publish_recall();
        }
        if mode == FetchMode::Full && self.prefetch {
            self.drop_mispredicted(tag, &items);
        }
        let mut remaining = 0;
        let mut hits = Vec::new();
        for (idx, key) in items {
            let hit = if mode == FetchMode::LoadOnly {
                self.cache.peek(key)
            } else {
                let h = self.cache.lookup(key);
                let (total, per_layer) = match h {
                    Some(_) => (&self.counters.hits, &self.counters.layer_hits),
                    None => (&self.counters.misses, &self.counters.layer_misses),
                };
                Counters::add(total, 1);
                if let Some(c) = per_layer.get(key.layer as usize) {
                    Counters::add(c, 1);
                }
                h
            };
            if let Some(v) = hit {
                hits.push((idx, v));
            } else if mode == FetchMode::HitsOnly {
                let _ = reply.try_send(Delivery::Missing(idx));
            } else {
                self.add_waiter(key, tag, id, idx);
                remaining += 1;
            }
        }
        if !hits.is_empty() {
            // All resident experts in one message: one wake-up for compute.
            let _ = reply.try_send(Delivery::Experts(hits));
        }
        self.publish_cache_gauges();
        if remaining > 0 {
            self.pending.insert(
                id,
                Pending {
                    tag,
                    reply,
                    remaining,
                },
            );
        }
    }

    /// The routing of `tag`'s layer is now known: prefetches queued for that
    /// layer and step that it did not pick, and that no worker has started,
    /// are claimed here so they are never read. When the disk is the
    /// bottleneck such reads would sit in front of the next layer's
    /// prefetches; when it is not, they have finished already and nothing
    /// is dropped. (A wrong guess is worth no more than any other expert
    /// for later steps.)
    fn drop_mispredicted(&mut self, tag: Tag, items: &[(usize, ExpertKey)]) {
        let routed: HashSet<ExpertKey> = items.iter().map(|&(_, k)| k).collect();
        let dead: Vec<ExpertKey> = self
            .inflight
            .iter()
            .filter(|(key, f)| {
                key.layer == tag.layer
                    && !routed.contains(key)
                    && !f.demand_sent
                    && f.waiters.is_empty()
                    && (f.tag.generation, f.tag.step) == (tag.generation, tag.step)
                    && !self.pins.contains(key)
            })
            .map(|(&k, _)| k)
            .collect();
        for key in dead {
            // A claim that fails means a worker is reading it: let it land.
            if let Some(f) = self.inflight.get(&key)
                && f.ticket.claim()
            {
                self.inflight.remove(&key);
                Counters::add(&self.counters.prefetch_dropped_unread, 1);
            }
        }
    }

    fn new_load(&mut self) -> Arc<Ticket> {
        self.next_load += 1;
        Ticket::new(self.next_load)
    }

    fn add_waiter(&mut self, key: ExpertKey, tag: Tag, id: u64, idx: usize) {
        let io_tx = self.io_tx.clone();
        let demand = |ticket: Arc<Ticket>| IoRequest {
            tag,
            key,
            priority: Priority::Demand,
            pin: false,
            ticket,
            reply: io_tx,
        };
        let req = match self.inflight.get_mut(&key) {
            Some(f) => {
                Counters::add(&self.counters.inflight_joins, 1);
                f.waiters.push((id, idx));
                f.tag = f.tag.max(tag);
                if f.demand_sent {
                    return;
                }
                f.demand_sent = true;
                demand(f.ticket.clone())
            }
            None => {
                let ticket = self.new_load();
                self.inflight.insert(
                    key,
                    InFlight {
                        load_id: ticket.id,
                        ticket: ticket.clone(),
                        waiters: vec![(id, idx)],
                        demand_sent: true,
                        tag,
                    },
                );
                demand(ticket)
            }
        };
        self.submit_demand(req);
    }

    fn submit_demand(&mut self, req: IoRequest<T>) {
        if !self.overflow.is_empty() {
            self.overflow.push_back(req);
            return;
        }
        match self.pool.try_submit(req) {
            Ok(()) => Counters::add(&self.counters.demand_queued, 1),
            Err(TrySendError::Full(r)) => self.overflow.push_back(r),
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    fn flush_overflow(&mut self) {
        while let Some(req) = self.overflow.pop_front() {
            let demand = req.priority == Priority::Demand;
            match self.pool.try_submit(req) {
                Ok(()) if demand => Counters::add(&self.counters.demand_queued, 1),
                Ok(()) => {}
                Err(TrySendError::Full(r)) => {
                    self.overflow.push_front(r);
                    return;
                }
                Err(TrySendError::Disconnected(_)) => return,
            }
        }
    }

    /// Queues a low-priority load nobody waits for yet: a prefetch for
    /// `tag`'s step, or a pin's load (`pin`), which is never dropped as stale.
    fn submit_background(&mut self, key: ExpertKey, tag: Tag, pin: bool) {
        let ticket = self.new_load();
        let req = IoRequest {
            tag,
            key,
            priority: Priority::Prefetch,
            pin,
            ticket: ticket.clone(),
            reply: self.io_tx.clone(),
        };
        match self.pool.try_submit(req) {
            Ok(()) => {
                self.inflight.insert(
                    key,
                    InFlight {
                        load_id: ticket.id,
                        ticket,
                        waiters: Vec::new(),
                        demand_sent: false,
                        tag,
                    },
                );
            }
            Err(_) => Counters::add(&self.counters.prefetch_rejected, 1),
        }
    }

    fn deliver(&mut self, id: u64, d: Delivery<T>) {
        let Some(p) = self.pending.get_mut(&id) else {
            return;
        };
        if p.reply.try_send(d).is_err() {
            self.pending.remove(&id);
            return;
        }
        p.remaining -= 1;
        if p.remaining == 0 {
            self.pending.remove(&id);
        }
    }

    fn fail(&mut self, id: u64, e: SourceError) {
        if let Some(p) = self.pending.remove(&id) {
            let _ = p.reply.try_send(Delivery::Failed(e));
        }
    }

    fn on_io(&mut self, ev: IoEvent<T>) {
        match ev {
            IoEvent::Skipped { key, load_id } => {
                Counters::add(&self.counters.prefetch_skipped, 1);
                if self
                    .inflight
                    .get(&key)
                    .is_some_and(|f| f.load_id == load_id && !f.demand_sent)
                {
                    self.inflight.remove(&key);
                    // A stale prefetch of a key pinned since it was queued:
                    // the pin still wants it loaded.
                    if self.pins.contains(&key) && !self.cache.pin_resident(key) {
                        self.submit_background(key, self.now(), true);
                    }
                }
            }
            IoEvent::Loaded {
                key,
                load_id,
                priority,
                result,
                report,
            } => {
                let c = &self.counters;
                Counters::add(&c.bytes_read, report.bytes);
                let prefetched = priority == Priority::Prefetch;
                Counters::add(
                    if prefetched {
                        &c.prefetch_bytes
                    } else {
                        &c.demand_bytes
                    },
                    report.bytes,
                );
                Counters::add(&c.reads, report.reads);
                Counters::add(&c.read_ns, report.read_ns);
                Counters::add(&c.failed_attempts, report.failed_attempts);
                if self.inflight.get(&key).is_none_or(|f| f.load_id != load_id) {
                    // Its load was cancelled while the read ran.
                    if result.is_ok() {
                        Counters::add(&self.counters.stale_discarded, 1);
                    }
                    if prefetched {
                        self.cache.count_prefetch_wasted(report.bytes);
                    }
                    return;
                }
                let Some(f) = self.inflight.remove(&key) else {
                    return;
                };
                let live: Vec<(u64, usize)> = f
                    .waiters
                    .into_iter()
                    .filter(|(id, _)| self.pending.contains_key(id))
                    .collect();
                match result {
                    Ok(loaded) => {
                        Counters::add(
                            match priority {
                                Priority::Demand => &self.counters.demand_loads,
                                Priority::Prefetch => &self.counters.prefetch_loads,
                            },
                            1,
                        );
                        let pin = self.pins.contains(&key);
                        let wanted = pin || !live.is_empty() || !f.tag.is_stale_against(self.now());
                        if !wanted {
                            Counters::add(&self.counters.stale_discarded, 1);
                        }
                        let kept = wanted
                            && self
                                .cache
                                .insert(key, loaded.value.clone(), loaded.resident_bytes, pin);
                        match (prefetched, live.is_empty(), kept) {
                            (false, ..) => {}
                            (true, false, _) => self.cache.count_prefetch_used(report.bytes),
                            (true, true, true) => self.cache.mark_prefetched(key, report.bytes),
                            (true, true, false) => self.cache.count_prefetch_wasted(report.bytes),
                        }
                        self.publish_cache_gauges();
                        for (id, idx) in live {
                            self.deliver(id, Delivery::Expert(idx, loaded.value.clone()));
                        }
                    }
                    Err(e) => {
                        if live.is_empty() {
                            return;
                        }
                        if priority == Priority::Prefetch {
                            // Read as a prefetch (no retries) but compute now
                            // waits for it: retry as a demand load.
                            let ticket = self.new_load();
                            let req = IoRequest {
                                tag: f.tag,
                                key,
                                priority: Priority::Demand,
                                pin: false,
                                ticket: ticket.clone(),
                                reply: self.io_tx.clone(),
                            };
                            self.inflight.insert(
                                key,
                                InFlight {
                                    load_id: ticket.id,
                                    ticket,
                                    waiters: live,
                                    demand_sent: true,
                                    tag: f.tag,
                                },
                            );
                            self.submit_demand(req);
                        } else {
                            Counters::add(&self.counters.read_failures, 1);
                            for (id, _) in live {
                                self.fail(id, duplicate(&e));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Moves the clock to `tag` (when newer): fetches of older tags get
    /// `Cancelled`, and loads that only older tags wanted are dropped. A new
    /// generation is how a request is cancelled.
    fn on_advance(&mut self, tag: Tag) {
        if !self.clock.advance(tag) {
            return;
        }
        let stale: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.tag.is_stale_against(tag))
            .map(|(&id, _)| id)
            .collect();
        for id in stale {
            if let Some(p) = self.pending.remove(&id) {
                Counters::add(&self.counters.cancelled, 1);
                let _ = p.reply.try_send(Delivery::Cancelled);
            }
        }
        self.recall.prune(tag);
        // Loads that only older tags wanted and nobody live waits for (pins
        // excepted): queued ones are skipped unread (the coordinator claims
        // their ticket), running ones finish and are discarded. A later
        // request for the key starts a fresh load.
        let now = self.now();
        let dead: Vec<ExpertKey> = self
            .inflight
            .iter()
            .filter(|(key, f)| {
                f.tag.is_stale_against(now)
                    && !self.pins.contains(key)
                    && !f.waiters.iter().any(|(id, _)| self.pending.contains_key(id))
            })
            .map(|(&k, _)| k)
            .collect();
        for key in dead {
            if let Some(f) = self.inflight.remove(&key)
                && f.ticket.claim()
            {
                Counters::add(&self.counters.loads_cancelled, 1);
            }
        }
    }

    fn publish_recall(&self) {
        Counters::set(&self.counters.pilot_hits, self.recall.hits);
        Counters::set(&self.counters.pilot_routed, self.recall.routed);
        Counters::set(&self.counters.pilot_predicted, self.recall.predicted);
        Counters::set(&self.counters.pilot_unpredicted, self.recall.unpredicted);
        Counters::set(&self.counters.pilot_late, self.recall.late);
        let r = &self.recall;
        Counters::set(&self.counters.pilot_unpredicted_routed, r.unpredicted_routed);
        Counters::set(&self.counters.pilot_late_hits, r.late_hits);
        Counters::set(&self.counters.pilot_late_routed, r.late_routed);
    }

    fn on_predicted(&mut self, p: Prediction) {
        Counters::add(&self.counters.predictions, 1);
        if p.tag.is_stale_against(self.now()) {
            Counters::add(&self.counters.pilot_stale, 1);
            return;
        }
        if self.pilot {
            self.recall.predicted(p.tag, &p.experts);
            self.publish_recall();
        }
        if !self.prefetch {
            return;
        }
        for &e in &p.experts {
            let key = ExpertKey::new(p.tag.layer, e);
            if self.map.extent(key).is_err() || self.cache.touch(key) || self.inflight.contains_key(&key) {
                continue;
            }
            self.submit_background(key, p.tag, false);
        }
    }

    fn on_pin(&mut self, keys: Vec<ExpertKey>, pin: bool) {
        for key in keys {
            if !pin {
                self.pins.remove(&key);
                self.cache.unpin(key);
                continue;
            }
            if self.map.extent(key).is_err() {
                continue;
            }
            self.pins.insert(key);
            if self.cache.pin_resident(key) {
                continue;
            }
            // A load already in flight is kept for the pin: `on_advance`
            // spares pinned keys, and a stale prefetch the workers skip is
            // requeued as a pin's load (`on_io`).
            if !self.inflight.contains_key(&key) {
                self.submit_background(key, self.now(), true);
            }
        }
        self.publish_cache_gauges();
    }
}
