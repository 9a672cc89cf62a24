//! Synthetic shapes that a family keeps in its own folder.
//!
//! A family added after the first six does not grow [`super::Family`]'s
//! match arms: it implements [`SynthFamily`] beside its loader (tensor
//! names, config.json, the draw of its own tensors) and lists its presets
//! in its registration ([`crate::model::family::Family::synth_presets`]),
//! so `coli synth --preset` finds every shape through the one registry.

use std::fmt;
use std::sync::Arc;

use super::SynthSpec;

/// A tensor's name and shape.
pub type SynthTensor = (String, Vec<usize>);

/// What synth asks of a family whose shape lives in the family's folder.
/// The spec's shared fields (vocabulary, hidden size, layers, query heads,
/// experts, top-k, expert intermediate size, positions, RoPE base, norm
/// epsilon, formats, seed) are passed in; the implementor holds the rest.
pub trait SynthFamily: Send + Sync + fmt::Debug {
    /// config.json's `model_type`.
    fn model_type(&self) -> &'static str;

    /// The family's name in messages.
    fn name(&self) -> &'static str;

    /// The real model's end-of-text id (used when the vocabulary has it).
    fn eos_id(&self) -> usize;

    /// Size of one attention head.
    fn head_dim(&self, spec: &SynthSpec) -> usize;

    /// Layers with routed experts.
    fn sparse_layers(&self, spec: &SynthSpec) -> usize;

    /// config.json as transformers writes it for the family.
    fn config_json(&self, spec: &SynthSpec) -> serde_json::Value;

    /// Decoder layer `l`'s tensors under the names the family's loader
    /// reads (unsorted).
    fn layer_tensors(&self, spec: &SynthSpec, l: usize) -> Vec<SynthTensor>;

    /// The draw of the family's own tensors `(base, amplitude)`, where the
    /// shared rule (variance 1 / fan_in, norms around 1) does not fit; `None`
    /// keeps the shared rule.
    fn distribution(&self, _name: &str, _shape: &[usize]) -> Option<(f32, f32)> {
        None
    }

    /// The family's own sizes under `--scale` (`round(v, m)` scales `v`
    /// and rounds it to a multiple of `m`), or why it is not offered.
    fn scaled(&self, _round: &dyn Fn(usize, usize) -> usize) -> Result<Arc<dyn SynthFamily>, String> {
        Err(format!("--scale is not offered for {} presets", self.name()))
    }
}

/// A [`SynthFamily`] inside a [`super::Family`]: compared by what it
/// holds (its `Debug` form lists every field), so specs stay comparable.
#[derive(Clone, Debug)]
pub struct Registered(pub Arc<dyn SynthFamily>);

impl PartialEq for Registered {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

/// A named `coli synth --preset`, listed by the family that owns it.
pub struct SynthPreset {
    pub name: &'static str,
    pub build: fn() -> SynthSpec,
}

/// Every preset of every registered family, in registry order.
pub fn presets() -> impl Iterator<Item = &'static SynthPreset> {
    crate::model::FAMILIES
        .iter()
        .flat_map(|f| f.synth_presets().iter())
}
