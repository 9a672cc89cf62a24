//! Synthetic shapes, each kept in its family's folder.
//!
//! Every family implements [`SynthFamily`] beside its loader (tensor
//! names, config.json, the checks its loader would make, the draw of its
//! own tensors) and lists its presets in its registration
//! ([`crate::model::family::Family::synth_presets`]), so `coli synth
//! --preset` finds every shape through the one registry and the shared
//! spec never matches on a family.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use super::{DecoderShape, SpecError, SynthSpec};

/// A tensor's name and shape.
pub type SynthTensor = (String, Vec<usize>);

/// What synth asks of a family. The spec's shared fields (vocabulary,
/// hidden size, layers, query heads, experts, top-k, expert intermediate
/// size, positions, RoPE base, norm epsilon, formats, seed) are passed in;
/// the implementor holds the rest.
pub trait SynthFamily: Send + Sync + fmt::Debug {
    /// config.json's `model_type`.
    fn model_type(&self) -> &'static str;

    /// The family's name in messages.
    fn name(&self) -> &'static str;

    /// The real model's end-of-text id (used when the vocabulary has it).
    fn eos_id(&self) -> usize;

    /// A Llama-style decoder's grouped-query attention, whose heads have
    /// their own size rather than hidden / heads, so shared code and tests
    /// can size heads and KV without knowing the family; `None` where the
    /// attention is another kind.
    fn decoder(&self) -> Option<&DecoderShape> {
        None
    }

    /// Size of one attention head; by default the decoder's own, else
    /// hidden / heads.
    fn head_dim(&self, spec: &SynthSpec) -> usize {
        self.decoder().map_or(spec.hidden / spec.heads, |a| a.head_dim)
    }

    /// Layers with routed experts; by default every layer (a family with
    /// dense leading layers subtracts them).
    fn sparse_layers(&self, spec: &SynthSpec) -> usize {
        spec.layers
    }

    /// config.json as transformers writes it for the family.
    fn config_json(&self, spec: &SynthSpec) -> serde_json::Value;

    /// Decoder layer `l`'s tensors under the names the family's loader
    /// reads (unsorted).
    fn layer_tensors(&self, spec: &SynthSpec, l: usize) -> Vec<SynthTensor>;

    /// What the engine would refuse later, refused before a byte is
    /// written (the spec has checked that every size is non-zero and top-k
    /// fits). By default the registry's check: formats the loaders read, a
    /// sparse layer, and the family's own config validation on the
    /// config.json this spec writes ([`SynthSpec::check_registered`]); a
    /// family whose messages or formats differ checks its own way.
    fn validate(&self, spec: &SynthSpec) -> Result<(), SpecError> {
        spec.check_registered()
    }

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

    /// The multiple `--scale` rounds the hidden size to: 64 by default, so
    /// int4 groups up to 64 still divide it (heads of their own size do
    /// not depend on it); a family whose heads are hidden / `heads` asks
    /// for a multiple that keeps them whole.
    fn hidden_multiple(&self, _heads: usize) -> usize {
        64
    }
}

/// A spec's [`SynthFamily`]: compared by what it holds (its `Debug` form
/// lists every field), so specs stay comparable.
#[derive(Clone, Debug)]
pub struct Registered(pub Arc<dyn SynthFamily>);

impl PartialEq for Registered {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

impl Deref for Registered {
    type Target = dyn SynthFamily;

    fn deref(&self) -> &Self::Target {
        &*self.0
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
