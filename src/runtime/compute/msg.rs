//! Messages of the layer-compute actor.

use crate::engine::Session;
use crate::model::lm::{ForwardError, Logits};
use colibri_actors::Tag;

/// One sequence's share of a step. The session travels with the message
/// (moved, not shared), so no lock guards the KV caches.
pub struct StepItem {
    /// Tokens to run after the positions the session's state holds.
    pub tokens: Vec<u32>,
    pub session: Session,
    pub logits: Logits,
    /// Draft this many tokens after `tokens` (one token: the sampled one)
    /// with the model's MTP head before the forward, append them to
    /// `tokens` and return every position's logits, so the step verifies
    /// them (0: no MTP draft). The head lives with the weights, so the
    /// compute actor drafts, not the loop.
    pub mtp_draft: usize,
}

/// A forward step for every sequence in `items`, answered on `reply`.
pub struct Step {
    pub tag: Tag,
    pub items: Vec<StepItem>,
    pub reply: flume::Sender<StepDone>,
}

/// The sessions back, with each item's logits or the step's error (the
/// sessions are then as they were before the step).
pub struct StepDone {
    pub items: Vec<StepItem>,
    pub result: Result<Vec<Vec<f32>>, ForwardError>,
    /// Seconds the forward pass took.
    pub secs: f64,
}
