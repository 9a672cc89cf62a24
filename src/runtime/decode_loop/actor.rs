//! The decode-loop thread: admission, one batched step at a time, sampling
//! and stop rules, cancellation, and mirroring slots to their state files.
//!
//! Each turn of the loop: take messages (blocking only when idle), admit
//! queued requests into free slots, then run one step in which every active
//! request contributes its next chunk (a prompt chunk of at most
//! `prefill_chunk` tokens, or its one decode token). While the compute actor
//! works, the loop keeps answering messages; cancelling every request of the
//! running step starts a new tag generation, so the step's expert loads are
//! dropped as stale and the step ends early.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use colibri_actors::{ExpertSource, Tag};
use rayon::prelude::*;

use super::active::{Active, Next};
use super::draft::{Plan, kept_positions, plan};
use super::metrics::Metrics;
use super::msg::{LoopMsg, Reply};
use super::slots::{Slot, choose_free, common_prefix};
use crate::engine::speculative::{DraftMode, SpecOptions, Speculator};
use crate::engine::{Session, SlotStore};
use crate::grammar::Constrained;
use crate::model::expert::ExpertWeights;
use crate::model::lm::Logits;
use crate::model::sequence_state::{copy_prefix, reachable};
use crate::runtime::compute::{ComputeHandle, Step, StepDone, StepItem};
use crate::runtime::limits;
use crate::runtime::prompt_cache::{BLOCK, PromptCache};
use crate::runtime::request::{
    Event, FinishReason, GenRequest, PromptMode, RequestError, RequestId, SlotChoice, Usage,
};
use crate::runtime::stop::StopMatcher;
use crate::sampling::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// A request waiting for a slot.
pub(super) struct Queued {
    id: RequestId,
    req: GenRequest,
    events: flume::Sender<Event>,
    constraint: Option<Constrained>,
}

/// Settings the loop runs with (see [`super::LoopConfig`]).
pub(super) struct Limits {
    pub max_ctx: usize,
    pub queue_cap: usize,
    pub prefill_chunk: usize,
    pub vocab: usize,
    /// The drafter (resolved against the model's head) and its settings.
    pub draft: Option<(DraftMode, SpecOptions)>,
}

pub(super) struct LoopActor {
    pub limits: Limits,
    pub compute: Option<ComputeHandle>,
    pub source: Arc<dyn ExpertSource<ExpertWeights>>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub stop_ids: Vec<u32>,
    pub slots: Vec<Slot>,
    /// Histories evicted from slots, for conversations that come back.
    pub cache: PromptCache,
    pub store: Option<SlotStore>,
    pub diag: Box<dyn Write + Send>,
    pub metrics: Arc<Metrics>,
    pub inbox: flume::Receiver<LoopMsg>,
    pub active: Vec<Active>,
    pub queue: VecDeque<Queued>,
    pub generation: u64,
    pub step: u64,
    pub admissions: u64,
    pub shutdown: Option<Reply<()>>,
    pub flushes: Vec<Reply<()>>,
}

impl LoopActor {
    pub fn run(mut self) {
        loop {
            let idle = self.active.is_empty() && self.queue.is_empty();
            if idle && self.shutdown.is_some() {
                break;
            }
            if idle {
                // The last step may have ended the last request: the gauges
                // must say so while the loop sleeps.
                self.publish_gauges();
                match self.inbox.recv() {
                    Ok(m) => self.on_msg(m),
                    // Every handle is gone: nobody can talk to us again.
                    Err(_) => break,
                }
            }
            while let Ok(m) = self.inbox.try_recv() {
                self.on_msg(m);
            }
            if !self.flushes.is_empty() {
                self.flush();
            }
            self.admit();
            self.publish_gauges();
            if !self.active.is_empty() {
                self.run_step();
            }
        }
        self.close();
    }

    fn publish_gauges(&self) {
        Metrics::set(&self.metrics.queue_depth, self.queue.len() as u64);
        Metrics::set(&self.metrics.active, self.active.len() as u64);
    }

    fn on_msg(&mut self, msg: LoopMsg) {
        match msg {
            LoopMsg::Submit {
                id,
                req,
                events,
                constraint,
            } => self.submit(id, req, events, constraint.map(|c| *c)),
            LoopMsg::Cancel { id } => self.cancel(id),
            LoopMsg::SlotTokens { slot, reply } => {
                let r = self.idle_slot(slot).map(|s| s.tokens().to_vec());
                let _ = reply.send(r);
            }
            LoopMsg::Truncate { slot, len, reply } => {
                let r = self.truncate(slot, len);
                let _ = reply.send(r);
            }
            LoopMsg::Reset { slot, reply } => {
                let r = self.truncate(slot, 0);
                let _ = reply.send(r);
            }
            // Answered between steps, once idle slots' last tokens are in.
            LoopMsg::Flush { reply } => self.flushes.push(reply),
            LoopMsg::Shutdown { reply } => {
                let ids: Vec<RequestId> = self
                    .queue
                    .iter()
                    .map(|q| q.id)
                    .chain(self.active.iter().map(|a| a.id))
                    .collect();
                for id in ids {
                    self.cancel(id);
                }
                self.shutdown = Some(reply);
            }
        }
    }

    /// A slot no request is using.
    fn idle_slot(&self, slot: usize) -> Result<&Slot, RequestError> {
        let slots = self.slots.len();
        let s = self
            .slots
            .get(slot)
            .ok_or(RequestError::BadSlot { slot, slots })?;
        if s.owner.is_some() || s.session.is_none() {
            return Err(RequestError::SlotBusy(slot));
        }
        Ok(s)
    }

    fn truncate(&mut self, slot: usize, len: usize) -> Result<(), RequestError> {
        self.idle_slot(slot)?;
        if let Some(session) = self.slots[slot].session.as_mut() {
            if len == 0 {
                session.reset();
            } else {
                session.truncate(len);
            }
        }
        self.with_store(|st| {
            if len == 0 {
                st.reset(slot)
            } else {
                st.truncate(slot, len)
            }
        });
        Ok(())
    }

    /// Runs a store operation; a failure turns saving off (with a message)
    /// instead of failing the conversation.
    fn with_store(&mut self, op: impl FnOnce(&mut SlotStore) -> Result<(), colibri_actors::kv::KvError>) {
        let Some(store) = self.store.as_mut() else {
            return;
        };
        if let Err(e) = op(store) {
            let _ = writeln!(
                self.diag,
                "coli: saving the conversation failed ({e}); conversations will not be saved"
            );
            self.store = None;
        }
    }

    /// Queues the positions `slot` computed since the last call.
    fn append_to_store(&mut self, slot: usize) {
        let (Some(store), Some(session)) = (self.store.as_mut(), self.slots[slot].session.as_ref()) else {
            return;
        };
        if let Err(e) = store.append_new(slot, session) {
            let _ = writeln!(
                self.diag,
                "coli: saving the conversation failed ({e}); conversations will not be saved"
            );
            self.store = None;
        }
    }

    /// Queues what `slot` computed and, for a state with a recurrent part,
    /// saves that part: called where a turn ends.
    fn save_slot_state(&mut self, slot: usize) {
        let (Some(store), Some(session)) = (self.store.as_mut(), self.slots[slot].session.as_ref()) else {
            return;
        };
        if let Err(e) = store.save_state(slot, session) {
            let _ = writeln!(
                self.diag,
                "coli: saving the conversation failed ({e}); conversations will not be saved"
            );
            self.store = None;
        }
    }

    fn submit(
        &mut self,
        id: RequestId,
        req: GenRequest,
        events: flume::Sender<Event>,
        constraint: Option<Constrained>,
    ) {
        Metrics::add(&self.metrics.requests, 1);
        let refuse = |e: RequestError| {
            let _ = events.send(Event::Failed(e));
        };
        if self.shutdown.is_some() {
            return refuse(RequestError::Shutdown);
        }
        if self.active.iter().any(|a| a.id == id) || self.queue.iter().any(|q| q.id == id) {
            return refuse(RequestError::DuplicateId(id));
        }
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= self.limits.vocab) {
            return refuse(RequestError::BadToken {
                id: bad,
                vocab: self.limits.vocab,
            });
        }
        if let SlotChoice::Exact(slot) = req.slot {
            let slots = self.slots.len();
            if slot >= slots {
                return refuse(RequestError::BadSlot { slot, slots });
            }
            let queued_there = self.queue.iter().any(|q| q.req.slot == req.slot);
            if self.slots[slot].owner.is_some() || queued_there {
                return refuse(RequestError::SlotBusy(slot));
            }
        }
        if req.prompt.is_empty() && req.mode == PromptMode::Replace {
            return refuse(RequestError::EmptyPrompt);
        }
        if !limits::fits_context(req.prompt.len(), self.limits.max_ctx) {
            return refuse(RequestError::ContextExceeded {
                used: req.prompt.len(),
                limit: self.limits.max_ctx,
            });
        }
        if self.queue.len() >= self.limits.queue_cap {
            Metrics::add(&self.metrics.rejected, 1);
            return refuse(RequestError::QueueFull(self.queue.len()));
        }
        self.queue.push_back(Queued {
            id,
            req,
            events,
            constraint,
        });
    }

    /// Moves queued requests into free slots, oldest first.
    fn admit(&mut self) {
        // Requests whose reader left while they waited.
        self.queue.retain(|q| {
            let gone = q.events.is_disconnected();
            if gone {
                Metrics::add(&self.metrics.cancelled, 1);
            }
            !gone
        });
        if self.shutdown.is_some() {
            return;
        }
        let mut i = 0;
        while i < self.queue.len() {
            let q = &self.queue[i];
            let slot = match q.req.slot {
                SlotChoice::Exact(s) => {
                    (self.slots[s].owner.is_none() && self.slots[s].session.is_some()).then_some(s)
                }
                SlotChoice::Any => choose_free(&self.slots, &q.req.prompt),
            };
            match slot {
                Some(s) => {
                    if let Some(q) = self.queue.remove(i) {
                        self.start(q, s);
                    }
                }
                None => i += 1,
            }
        }
    }

    /// Puts the prompt into the slot's history and makes the request active.
    fn start(&mut self, q: Queued, slot: usize) {
        let Queued {
            id,
            req,
            events,
            constraint,
        } = q;
        let Some(mut session) = self.slots[slot].session.take() else {
            let _ = events.send(Event::Failed(RequestError::SlotBusy(slot)));
            return;
        };
        // Checked before the slot changes: a refused request leaves it as it was.
        let held_after = match req.mode {
            PromptMode::Replace => req.prompt.len(),
            PromptMode::Append => session.tokens.len() + req.prompt.len(),
        };
        let refused = if !limits::fits_context(held_after, self.limits.max_ctx) {
            Some(RequestError::ContextExceeded {
                used: held_after,
                limit: self.limits.max_ctx,
            })
        } else if held_after == 0 {
            Some(RequestError::EmptyPrompt)
        } else {
            None
        };
        if let Some(e) = refused {
            self.slots[slot].session = Some(session);
            let _ = events.send(Event::Failed(e));
            return;
        }
        let mut truncated_to = None;
        match req.mode {
            PromptMode::Replace => {
                // Reuse the common prefix, but always compute the prompt's
                // last token: its logits start the reply.
                let keep = common_prefix(&session.tokens, &req.prompt).min(req.prompt.len() - 1);
                let computed = session.kv.len().min(session.tokens.len());
                if keep < computed {
                    // Another conversation's history is overwritten: what
                    // it computed lives on in the prompt cache.
                    self.cache
                        .insert(&session.tokens[..computed], session.kv.as_ref());
                }
                if keep < session.tokens.len() {
                    session.truncate(keep);
                    truncated_to = Some(keep);
                }
                session.tokens.extend_from_slice(&req.prompt[keep..]);
            }
            PromptMode::Append => session.tokens.extend_from_slice(&req.prompt),
        }
        let restored = self.restore_prefix(slot, &mut session);
        if session.kv.len() == session.tokens.len() && session.last_logits.is_none() {
            // Nothing to compute and no logits kept (a restored slot): the
            // last token is computed again to start the reply.
            let n = session.kv.len();
            session.kv.truncate(n.saturating_sub(1));
        }
        let held = session.tokens.len();
        let prefill = held - session.kv.len();
        let budget = limits::reply_budget(held, req.max_tokens, self.limits.max_ctx);
        self.slots[slot].session = Some(session);
        if let Some(len) = truncated_to {
            self.with_store(|st| st.truncate(slot, len));
        }
        self.admissions += 1;
        Metrics::add(&self.metrics.restored_tokens, restored as u64);
        Metrics::set(&self.metrics.prompt_cache_bytes, self.cache.used_bytes());
        let s = &mut self.slots[slot];
        s.owner = Some(id);
        s.last_used = self.admissions;
        Metrics::add(&self.metrics.prompt_tokens, req.prompt.len() as u64);
        Metrics::add(&self.metrics.prefilled_tokens, prefill as u64);
        let started = Event::Started {
            slot,
            context_tokens: held,
            prefill,
        };
        let gone = events.send(started).is_err();
        self.active.push(Active {
            id,
            slot,
            events,
            sampler: Sampler::new(req.sampling),
            stop: StopMatcher::new(&req.stop),
            detok: StreamDecoder::with_special(req.special_tokens),
            budget,
            generated: 0,
            emitted: 0,
            usage: Usage {
                prompt_tokens: req.prompt.len(),
                prefilled: prefill,
                completion_tokens: 0,
            },
            started: Instant::now(),
            first_token_secs: None,
            stats_before: self.source.stats(),
            cancelled: gone,
            spec: match (&self.limits.draft, &constraint) {
                (Some((_, o)), None) => Some(Speculator::new(o.clone())),
                _ => None,
            },
            constraint,
        });
        let idx = self.active.len() - 1;
        if gone {
            self.end(idx, FinishReason::Cancelled, false);
        } else if budget == 0 && prefill == 0 {
            self.end(idx, FinishReason::Length, true);
        } else if prefill == 0 {
            // Logits already known (a continuation of a computed history).
            self.after_logits(idx, None);
        }
    }

    /// Extends `session` (slot `slot`'s, taken out) past the positions it
    /// already has with positions computed after the same tokens elsewhere:
    /// another slot's history or the prompt cache, whichever gives more of
    /// them. Never the last token, which is computed for its logits.
    /// Returns the positions copied.
    ///
    /// A recurrent state can only take positions up to a snapshot (a
    /// checkpoint of the donor slot, or a cached block's), and is then
    /// asked for a checkpoint at the block boundary where its prompt leaves
    /// what the others hold, so that the shared part is restorable there
    /// next time (see the prompt cache's documentation).
    fn restore_prefix(&mut self, slot: usize, session: &mut Session) -> usize {
        let want = session.tokens.len().saturating_sub(1);
        let have = session.kv.len();
        // `--prompt-cache-mb 0` turns copying off altogether (the slot's
        // own history is still reused).
        if have >= want || !self.cache.enabled() {
            return 0;
        }
        let tokens = &session.tokens[..want];
        // Per other slot: the tokens it shares with this prompt, and the
        // positions of them it can give.
        let donors: Vec<(usize, usize, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != slot)
            .filter_map(|(i, s)| {
                let from = s.session.as_ref()?;
                let shared = common_prefix(s.tokens(), tokens).min(s.computed());
                Some((i, shared, reachable(from.kv.as_ref(), have, shared)))
            })
            .collect();
        let donor = donors
            .iter()
            .map(|&(i, _, n)| (i, n))
            .max_by_key(|&(_, n)| n)
            .filter(|&(_, n)| n > have);
        let cached = self.cache.longest(tokens);
        let copied = match donor {
            Some((i, n)) if n >= cached => match self.slots[i].session.as_ref() {
                Some(from) => copy_prefix(from.kv.as_ref(), session.kv.as_mut(), n),
                None => 0,
            },
            _ if cached > have => self.cache.restore(tokens, session.kv.as_mut()),
            _ => 0,
        };
        if !session.kv.positional() {
            let shared = donors
                .iter()
                .map(|&(_, shared, _)| shared)
                .chain([self.cache.matched(tokens)])
                .max()
                .unwrap_or(0);
            let branch = shared / BLOCK * BLOCK;
            if branch > session.kv.len() {
                session.kv.keep_checkpoint(branch);
            }
        }
        if copied > 0 {
            session.last_logits = None;
        }
        copied
    }

    fn cancel(&mut self, id: RequestId) {
        if let Some(i) = self.queue.iter().position(|q| q.id == id) {
            if let Some(q) = self.queue.remove(i) {
                Metrics::add(&self.metrics.cancelled, 1);
                let _ = q.events.send(Event::Done(crate::runtime::request::Finish {
                    reason: FinishReason::Cancelled,
                    usage: Usage {
                        prompt_tokens: q.req.prompt.len(),
                        ..Usage::default()
                    },
                    emitted: 0,
                    length_limited: false,
                    first_token_secs: 0.0,
                    total_secs: 0.0,
                    hit_pct: 0.0,
                }));
            }
            return;
        }
        let Some(i) = self.active.iter().position(|a| a.id == id) else {
            return;
        };
        if self.slots[self.active[i].slot].session.is_some() {
            self.end(i, FinishReason::Cancelled, false);
        } else {
            // In the running step: ends when the step returns.
            self.active[i].cancelled = true;
        }
    }

    /// Ends request `i`: tells its owner and frees its slot.
    fn end(&mut self, i: usize, reason: FinishReason, length_limited: bool) {
        let a = self.active.remove(i);
        let finish = a.finish(reason, length_limited, self.source.stats());
        match reason {
            FinishReason::Cancelled => Metrics::add(&self.metrics.cancelled, 1),
            _ => Metrics::add(&self.metrics.completed, 1),
        }
        self.slots[a.slot].owner = None;
        self.save_slot_state(a.slot);
        self.publish_gauges();
        let _ = a.events.send(Event::Done(finish));
    }

    fn fail(&mut self, i: usize, err: RequestError) {
        let a = self.active.remove(i);
        Metrics::add(&self.metrics.failed, 1);
        self.slots[a.slot].owner = None;
        self.publish_gauges();
        let _ = a.events.send(Event::Failed(err));
    }

    /// Samples request `i`'s next token from `logits` (None: the session's
    /// kept logits) and ends it if a stop rule says so.
    fn after_logits(&mut self, i: usize, logits: Option<Vec<f32>>) {
        let slot = self.active[i].slot;
        let Some(session) = self.slots[slot].session.as_mut() else {
            return;
        };
        if let Some(l) = logits {
            session.last_logits = Some(l);
        }
        let Some(mut l) = session.last_logits.take() else {
            self.fail(i, RequestError::Engine("no logits to sample from".into()));
            return;
        };
        let a = &mut self.active[i];
        if a.budget == 0 {
            session.last_logits = Some(l);
            self.end(i, FinishReason::Length, true);
            return;
        }
        let next = a.sample(
            &mut l,
            &mut session.tokens,
            &self.stop_ids,
            self.tokenizer.as_deref(),
        );
        Metrics::add(&self.metrics.generated_tokens, 1);
        let cancelled = a.cancelled;
        match next {
            _ if cancelled => self.end(i, FinishReason::Cancelled, false),
            Next::Continue => {}
            Next::Finished(reason, limited) => self.end(i, reason, limited),
            Next::Failed(e) => self.fail(i, RequestError::Engine(e.to_string())),
        }
    }

    /// Truncates slot `slot`'s state after a verification of `drafts`
    /// (computed at the end of its state) to the positions the history
    /// kept ([`kept_positions`]); `taken` tokens were added to the history
    /// (0: none, the drafts are all dropped).
    fn keep_positions(&mut self, slot: usize, drafts: &[u32], taken: usize) {
        let Some(session) = self.slots[slot].session.as_mut() else {
            return;
        };
        // The step ran the token before the draft and the draft.
        let base = session.kv.len().saturating_sub(drafts.len() + 1);
        let keep = if taken == 0 {
            base + 1
        } else {
            kept_positions(&session.tokens, base, drafts)
        };
        session.kv.truncate(keep.min(session.tokens.len()));
    }

    /// Request `i`'s tokens after a step that verified `drafts` (its
    /// `logits`: one row per computed position); ends it if a stop rule
    /// says so. Returns the tokens it took.
    fn after_verify(&mut self, i: usize, logits: Option<Vec<f32>>, drafts: &[u32]) -> u64 {
        let slot = self.active[i].slot;
        let Some(rows) = logits else {
            self.keep_positions(slot, drafts, 0);
            self.fail(i, RequestError::Engine("no logits to verify a draft with".into()));
            return 0;
        };
        let Some(session) = self.slots[slot].session.as_mut() else {
            return 0;
        };
        let a = &mut self.active[i];
        let (next, taken, accepted) = a.verify(
            &rows,
            self.limits.vocab,
            drafts,
            &mut session.tokens,
            &self.stop_ids,
            self.tokenizer.as_deref(),
        );
        let judged = taken.min(drafts.len());
        if let Some(spec) = a.spec.as_mut() {
            spec.record(judged, accepted);
            spec.forwards += 1;
            spec.tokens += taken as u64;
        }
        let cancelled = a.cancelled;
        self.keep_positions(slot, drafts, taken);
        Metrics::add(&self.metrics.generated_tokens, taken as u64);
        Metrics::add(&self.metrics.draft_proposed, judged as u64);
        Metrics::add(&self.metrics.draft_accepted, accepted as u64);
        Metrics::add(&self.metrics.draft_verifies, 1);
        match next {
            _ if cancelled => self.end(i, FinishReason::Cancelled, false),
            Next::Continue => {}
            Next::Finished(reason, limited) => self.end(i, reason, limited),
            Next::Failed(e) => self.fail(i, RequestError::Engine(e.to_string())),
        }
        taken as u64
    }

    /// One forward step over every active request.
    fn run_step(&mut self) {
        let chunk = self.limits.prefill_chunk.max(1);
        let mut items = Vec::with_capacity(self.active.len());
        let mut owners = Vec::with_capacity(self.active.len());
        // Requests that sample after this step and need a mask for it.
        let mut masks = Vec::new();
        for a in &self.active {
            let Some(session) = self.slots[a.slot].session.take() else {
                continue;
            };
            let done = session.kv.len().min(session.tokens.len());
            let pending = &session.tokens[done..];
            let mut n = pending.len().min(chunk);
            // A chunk ends where the state wants a checkpoint, so the next
            // one starts (and takes it) there.
            if let Some(w) = session.kv.wanted_checkpoint()
                && w > done
                && w < done + n
            {
                n = w - done;
            }
            let mut logits = if n == pending.len() {
                Logits::Last
            } else {
                Logits::None
            };
            if logits == Logits::Last && a.constraint.as_ref().is_some_and(Constrained::needs_mask) {
                masks.push(a.id);
            }
            let mut tokens = pending[..n].to_vec();
            let mut mtp_draft = 0;
            if let (Some((mode, _)), Logits::Last, 1) = (&self.limits.draft, logits, n) {
                match plan(a, &session.tokens, *mode) {
                    Plan::None => {}
                    Plan::Tokens(d) => {
                        tokens.extend_from_slice(&d);
                        logits = Logits::All;
                    }
                    Plan::Mtp(k) => mtp_draft = k,
                }
            }
            items.push(StepItem {
                tokens,
                session,
                logits,
                mtp_draft,
            });
            owners.push(a.id);
        }
        if items.is_empty() {
            return;
        }
        self.step += 1;
        let tag = Tag::new(self.generation, self.step, 0);
        let rows: usize = items.iter().map(|it| it.tokens.len()).sum();
        let (reply, done) = flume::bounded(1);
        let step = Step { tag, items, reply };
        let sent = match self.compute.as_ref() {
            Some(c) => c.send(step),
            None => Err(step),
        };
        let t0 = Instant::now();
        if sent.is_ok() {
            self.prepare_masks(&masks);
        }
        let outcome = match sent {
            Ok(()) => self.wait_step(&done, &owners),
            Err(step) => StepDone {
                items: step.items,
                result: Err(crate::model::lm::ForwardError::Expert(
                    colibri_actors::SourceError::Shutdown("the compute actor stopped".into()),
                )),
                secs: 0.0,
            },
        };
        let secs = t0.elapsed().as_secs_f64();
        Metrics::add(&self.metrics.steps, 1);
        Metrics::add(&self.metrics.step_rows, owners.len() as u64);
        Metrics::add(&self.metrics.step_micros, (secs * 1e6) as u64);
        tracing::debug!(rows, seqs = owners.len(), secs, "step");
        self.after_step(outcome, &owners, secs);
    }

    /// Computes the masks of the constrained requests in `ids` while the
    /// compute actor runs the step that gives their logits, in parallel when
    /// there are several. A mask depends only on the tokens committed
    /// before, so the tokens sampled do not depend on the thread count.
    fn prepare_masks(&mut self, ids: &[RequestId]) {
        if ids.is_empty() {
            return;
        }
        let t0 = Instant::now();
        let mut todo: Vec<&mut Constrained> = self
            .active
            .iter_mut()
            .filter(|a| ids.contains(&a.id))
            .filter_map(|a| a.constraint.as_mut())
            .collect();
        if todo.len() == 1 {
            todo[0].prepare();
        } else {
            todo.par_iter_mut().for_each(|c| c.prepare());
        }
        tracing::debug!(masks = todo.len(), secs = t0.elapsed().as_secs_f64(), "masks");
    }

    /// Waits for the step while answering messages; when every request of
    /// the step has been cancelled, abandons its work (new generation).
    fn wait_step(&mut self, done: &flume::Receiver<StepDone>, owners: &[RequestId]) -> StepDone {
        enum Got {
            Done(Result<StepDone, flume::RecvError>),
            Msg(Result<LoopMsg, flume::RecvError>),
        }
        let mut aborted = false;
        let mut inbox_open = true;
        let inbox = self.inbox.clone();
        loop {
            let got = if inbox_open {
                flume::Selector::new()
                    .recv(done, Got::Done)
                    .recv(&inbox, Got::Msg)
                    .wait()
            } else {
                Got::Done(done.recv())
            };
            match got {
                Got::Done(Ok(d)) => return d,
                // The compute actor sends its reply and drops the sender at
                // once; a selector can see the disconnection before the
                // queued reply. A plain receive returns that reply if it is
                // there, and fails at once if the actor really stopped.
                Got::Done(Err(_)) if let Ok(d) = done.recv() => return d,
                Got::Done(Err(_)) => {
                    return StepDone {
                        items: Vec::new(),
                        result: Err(crate::model::lm::ForwardError::Expert(
                            colibri_actors::SourceError::Shutdown("the compute actor stopped".into()),
                        )),
                        secs: 0.0,
                    };
                }
                Got::Msg(Ok(m)) => self.on_msg(m),
                Got::Msg(Err(_)) => inbox_open = false,
            }
            let all_cancelled = owners.iter().all(|id| {
                self.active
                    .iter()
                    .find(|a| a.id == *id)
                    .is_none_or(|a| a.cancelled)
            });
            if all_cancelled && !aborted {
                aborted = true;
                self.generation += 1;
                self.step += 1;
                self.source.advance(Tag::new(self.generation, self.step, 0));
            }
        }
    }

    fn after_step(&mut self, outcome: StepDone, owners: &[RequestId], _secs: f64) {
        let StepDone { items, result, secs } = outcome;
        let mut outs = match result {
            Ok(v) => Some(v.into_iter()),
            Err(e) => {
                let msg = e.to_string();
                // Sessions back first (their state is as before the step).
                for (it, id) in items.into_iter().zip(owners) {
                    if let Some(a) = self.active.iter().find(|a| a.id == *id) {
                        self.slots[a.slot].session = Some(it.session);
                    }
                }
                for id in owners {
                    if let Some(i) = self.active.iter().position(|a| a.id == *id) {
                        if self.active[i].cancelled {
                            self.end(i, FinishReason::Cancelled, false);
                        } else {
                            self.fail(i, RequestError::Engine(msg.clone()));
                        }
                    }
                }
                return;
            }
        };
        let mut produced = 0u64;
        for (it, id) in items.into_iter().zip(owners) {
            let logits = outs.as_mut().and_then(|o| o.next());
            let Some(i) = self.active.iter().position(|a| a.id == *id) else {
                continue;
            };
            let slot = self.active[i].slot;
            if it.logits == Logits::All {
                // A verified draft: the step computed the sampled token,
                // then the draft (by the loop's n-gram lookup or the
                // compute actor's MTP head).
                let drafts = it.tokens.get(1..).unwrap_or(&[]);
                let mut session = it.session;
                session.last_logits = None;
                self.slots[slot].session = Some(session);
                if self.active[i].cancelled {
                    self.keep_positions(slot, drafts, 0);
                    self.append_to_store(slot);
                    self.end(i, FinishReason::Cancelled, false);
                    continue;
                }
                produced += self.after_verify(i, logits, drafts);
                self.append_to_store(slot);
                continue;
            }
            let wanted = it.logits == Logits::Last;
            let mut session = it.session;
            if !wanted {
                session.last_logits = None;
            }
            self.slots[slot].session = Some(session);
            self.append_to_store(slot);
            if self.active[i].cancelled {
                self.end(i, FinishReason::Cancelled, false);
                continue;
            }
            if wanted {
                produced += 1;
                self.after_logits(i, logits);
            }
        }
        if secs > 0.0 && produced > 0 {
            let rate = produced as f64 / secs;
            let old = f64::from_bits(
                self.metrics
                    .recent_tok_per_s
                    .load(std::sync::atomic::Ordering::Relaxed),
            );
            let ewma = if old > 0.0 { 0.8 * old + 0.2 * rate } else { rate };
            Metrics::set(&self.metrics.recent_tok_per_s, ewma.to_bits());
        }
    }

    /// Computes the tokens idle slots hold but have not run yet (a reply's
    /// last sampled token, computed lazily), so the state files hold the
    /// whole conversation.
    fn catch_up(&mut self) {
        if self.store.is_none() {
            return;
        }
        let chunk = self.limits.prefill_chunk.max(1);
        loop {
            let mut items = Vec::new();
            let mut slots = Vec::new();
            for (i, s) in self.slots.iter_mut().enumerate() {
                if s.owner.is_some() {
                    continue;
                }
                let pending = s
                    .session
                    .as_ref()
                    .map_or(0, |x| x.tokens.len().saturating_sub(x.kv.len()));
                if pending == 0 {
                    continue;
                }
                let Some(session) = s.session.take() else {
                    continue;
                };
                let from = session.kv.len();
                let n = pending.min(chunk);
                items.push(StepItem {
                    tokens: session.tokens[from..from + n].to_vec(),
                    logits: if n == pending { Logits::Last } else { Logits::None },
                    session,
                    mtp_draft: 0,
                });
                slots.push(i);
            }
            if items.is_empty() {
                return;
            }
            self.step += 1;
            let (reply, done) = flume::bounded(1);
            let step = Step {
                tag: Tag::new(self.generation, self.step, 0),
                items,
                reply,
            };
            let outcome = match self.compute.as_ref().map(|c| c.send(step)) {
                Some(Ok(())) => done.recv().ok(),
                Some(Err(step)) => Some(StepDone {
                    items: step.items,
                    result: Err(crate::model::lm::ForwardError::State),
                    secs: 0.0,
                }),
                None => None,
            };
            let Some(StepDone { items, result, .. }) = outcome else {
                return;
            };
            let failed = result.is_err();
            let mut outs = result.ok().map(|v| v.into_iter());
            for (it, slot) in items.into_iter().zip(slots) {
                let logits = outs.as_mut().and_then(|o| o.next());
                let mut session = it.session;
                let last = it.logits == Logits::Last;
                if last {
                    session.last_logits = logits;
                }
                self.slots[slot].session = Some(session);
                if last {
                    self.save_slot_state(slot);
                } else {
                    self.append_to_store(slot);
                }
            }
            if failed {
                return;
            }
        }
    }

    /// Answers the waiting flush requests once everything is on disk.
    fn flush(&mut self) {
        self.catch_up();
        let r = match self.store.as_mut() {
            Some(st) => st.flush().map_err(|e| RequestError::Engine(e.to_string())),
            None => Ok(()),
        };
        for reply in std::mem::take(&mut self.flushes) {
            let _ = reply.send(r.clone());
        }
    }

    fn close(mut self) {
        for q in std::mem::take(&mut self.queue) {
            let _ = q.events.send(Event::Failed(RequestError::Shutdown));
        }
        while !self.active.is_empty() {
            self.end(0, FinishReason::Cancelled, false);
        }
        self.catch_up();
        let mut result = Ok(());
        for reply in std::mem::take(&mut self.flushes) {
            let _ = reply.send(Ok(()));
        }
        if let Some(store) = self.store.take()
            && let Err(e) = store.close()
        {
            let _ = writeln!(self.diag, "coli: saving the conversation failed: {e}");
            result = Err(RequestError::Engine(e.to_string()));
        }
        // Joins the compute thread.
        self.compute = None;
        if let Some(reply) = self.shutdown.take() {
            let _ = reply.send(result);
        }
    }
}
