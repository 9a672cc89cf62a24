//! The compute thread. It runs inside its own rayon pool (`pool.install`),
//! so the thread that drives a step also takes its share of every matmul.

use std::thread::JoinHandle;
use std::time::Instant;

use colibri_actors::Tag;

use super::msg::{Step, StepDone, StepItem};
use crate::model::lm::{BatchItem, ForwardError, LanguageModel, Logits};

/// The decode loop's end of the actor.
pub struct ComputeHandle {
    tx: Option<flume::Sender<Step>>,
    join: Option<JoinHandle<()>>,
}

impl ComputeHandle {
    /// Starts the actor on `model` with `threads` compute threads (None:
    /// one per core).
    pub fn spawn(mut model: Box<dyn LanguageModel>, threads: Option<usize>) -> std::io::Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.unwrap_or(0))
            .stack_size(16 << 20)
            .thread_name(|i| format!("coli-compute-{i}"))
            .build()
            .map_err(std::io::Error::other)?;
        let (tx, rx) = flume::bounded::<Step>(1);
        let join = std::thread::Builder::new()
            .name("layer-compute".into())
            .spawn(move || {
                pool.install(|| {
                    for step in rx.iter() {
                        run_step(model.as_mut(), step);
                    }
                })
            })?;
        Ok(Self {
            tx: Some(tx),
            join: Some(join),
        })
    }

    /// Sends a step; `Err` gives it back when the actor is gone.
    pub fn send(&self, step: Step) -> Result<(), Step> {
        match &self.tx {
            Some(tx) => tx.send(step).map_err(|e| e.into_inner()),
            None => Err(step),
        }
    }
}

fn run_step(model: &mut dyn LanguageModel, step: Step) {
    let Step {
        tag,
        mut items,
        reply,
    } = step;
    let before: Vec<usize> = items.iter().map(|it| it.session.kv.len()).collect();
    let t0 = Instant::now();
    let drafted = mtp_drafts(model, &mut items, tag);
    let result = drafted.and_then(|()| {
        let _s = tracing::debug_span!("step", rows = items.iter().map(|i| i.tokens.len()).sum::<usize>())
            .entered();
        let mut batch: Vec<BatchItem<'_>> = items
            .iter_mut()
            .map(|it| BatchItem {
                tokens: &it.tokens,
                state: it.session.kv.as_mut(),
                logits: it.logits,
            })
            .collect();
        model.forward_batch(&mut batch, tag)
    });
    if result.is_err() {
        // A failed or cancelled step leaves no partial positions behind.
        for (it, &len) in items.iter_mut().zip(&before) {
            it.session.kv.truncate(len);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    // The loop may be gone (shutdown); nothing else to tell it then.
    let _ = reply.send(StepDone { items, result, secs });
}

/// Appends each MTP-drafting item's drafts to its tokens (all logits then
/// wanted, for verification). A draft leaves the state's positions as they
/// were; an item whose head proposes nothing steps as it would have.
fn mtp_drafts(model: &mut dyn LanguageModel, items: &mut [StepItem], tag: Tag) -> Result<(), ForwardError> {
    for it in items.iter_mut().filter(|it| it.mtp_draft > 0) {
        let Some(&next) = it.tokens.last() else {
            continue;
        };
        let drafts = model.draft(it.session.kv.as_mut(), next, it.mtp_draft, tag)?;
        if !drafts.is_empty() {
            it.tokens.extend_from_slice(&drafts);
            it.logits = Logits::All;
        }
    }
    Ok(())
}

impl Drop for ComputeHandle {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}
