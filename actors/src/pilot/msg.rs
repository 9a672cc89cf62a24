//! Messages of the pilot actor.

use crate::tag::Tag;

/// A residual to predict from; `tag.layer` is the layer to predict. The
/// pilot drops it unread once `tag`'s token step has passed.
pub struct PilotMsg {
    pub tag: Tag,
    pub residual: Vec<f32>,
}

/// The pilot's answer: the experts it expects `tag.layer` to route to.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub tag: Tag,
    pub experts: Vec<u32>,
}
