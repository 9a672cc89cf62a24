//! Messages of the pilot actor.

use crate::tag::Tag;

/// A residual to predict from; `tag.layer` is the layer to predict.
pub struct PilotMsg {
    pub tag: Tag,
    /// The pipeline epoch when it was offered (stale ones are dropped).
    pub epoch: u64,
    pub residual: Vec<f32>,
}

/// The pilot's answer: the experts it expects `tag.layer` to route to.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub tag: Tag,
    pub epoch: u64,
    pub experts: Vec<u32>,
}
