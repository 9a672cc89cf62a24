//! Generation tags: every message about work for a token carries one, so work
//! that belongs to a cancelled request or a passed token step can be recognised
//! and dropped by whoever holds it, without locks on shared state.

/// Identifies the token step and layer a piece of work belongs to.
///
/// `generation` changes when a request is cancelled or finished; `step` counts
/// forward passes within a generation. A tag is stale when a newer
/// `(generation, step)` has been announced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag {
    pub generation: u64,
    pub step: u64,
    pub layer: u32,
}

impl Tag {
    pub fn new(generation: u64, step: u64, layer: u32) -> Self {
        Self {
            generation,
            step,
            layer,
        }
    }

    /// The same token step at another layer.
    pub fn at_layer(self, layer: u32) -> Self {
        Self { layer, ..self }
    }

    /// True when `self` belongs to an older token step than `current`.
    pub fn is_stale_against(self, current: Tag) -> bool {
        (self.generation, self.step) < (current.generation, current.step)
    }
}
