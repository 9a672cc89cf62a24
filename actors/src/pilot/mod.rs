//! The pilot prefetcher actor.
//!
//! After layer L-1's attention the model offers the residual; the pilot asks
//! the model's [`Predictor`] (layer L's real router math on that residual)
//! which experts layer L will route to, and the coordinator starts loading
//! the non-resident ones as low-priority prefetches while layer L-1's experts
//! compute. Predictions for passed token steps are dropped unread.

mod msg;
mod recall;

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Receiver;

pub use msg::{PilotMsg, Prediction};
pub(crate) use recall::RecallTracker;

use crate::error::SourceError;
use crate::tag::TagClockReader;

/// Predicts a layer's routed experts from an earlier residual. Implemented by
/// the model (it owns the router weights); must be cheap next to a layer.
pub trait Predictor: Send + Sync {
    /// The `k` experts of `layer` most likely to be routed for `residual`
    /// (the hidden state after layer `layer - 1`'s attention).
    fn predict(&self, layer: u32, residual: &[f32], k: usize) -> Vec<u32>;
}

/// Starts the pilot thread. It runs until `inbox` closes; each prediction is
/// handed to `out`, and it stops early if `out` returns false (the receiver
/// is gone). A message whose tag is stale against `clock` is dropped without
/// predicting.
pub(crate) fn spawn(
    predictor: Arc<dyn Predictor>,
    k: usize,
    clock: TagClockReader,
    inbox: Receiver<PilotMsg>,
    out: Box<dyn Fn(Prediction) -> bool + Send>,
) -> Result<JoinHandle<()>, SourceError> {
    std::thread::Builder::new()
        .name("coli-pilot".into())
        .spawn(move || {
            for msg in inbox.iter() {
                if clock.is_stale(msg.tag) {
                    continue;
                }
                let experts = {
                    let _span =
                        tracing::debug_span!("pilot", layer = msg.tag.layer, step = msg.tag.step).entered();
                    predictor.predict(msg.tag.layer, &msg.residual, k)
                };
                let p = Prediction {
                    tag: msg.tag,
                    experts,
                };
                if !out(p) {
                    return;
                }
            }
        })
        .map_err(|e| SourceError::Shutdown(format!("cannot start the pilot thread: {e}")))
}
