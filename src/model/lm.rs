//! What the engine needs from any model family, so generation, serving,
//! validation and benchmarks are written once for OLMoE, GLM and what follows.

use std::sync::Arc;

use colibri_actors::{ExpertSource, SourceError, Tag};

use crate::model::expert::ExpertWeights;
use crate::model::kv_cache::KvTypes;
pub use crate::model::sequence_state::SequenceState;

/// Which positions' logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (generation).
    Last,
    /// Every new token's, row-major `[n, vocab]` (teacher forcing, draft verification).
    All,
    /// None (prefill of a prompt whose continuation is already known).
    None,
}

/// Why a forward pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("token id {id} at position {pos} is outside the vocabulary ({vocab})")]
    Token { id: u32, pos: usize, vocab: usize },
    #[error("context full: {have} + {add} positions exceed {max}")]
    Context { have: usize, add: usize, max: usize },
    #[error("the sequence state does not belong to this model")]
    State,
    #[error(transparent)]
    Expert(#[from] SourceError),
}

/// One sequence's share of a batched forward step: its new tokens, its
/// state, and which of its logits to return.
pub struct BatchItem<'a> {
    pub tokens: &'a [u32],
    pub state: &'a mut dyn SequenceState,
    pub logits: Logits,
}

/// One sequence of a batch with its state as the family's own type.
pub type TypedItem<'a, S> = (&'a [u32], &'a mut S, Logits);

/// The batch's states as the family's own state type `S` (each item with
/// its tokens and logits choice); `ForwardError::State` if one is not.
pub fn downcast_batch<'a, S: 'static>(
    items: &'a mut [BatchItem<'_>],
) -> Result<Vec<TypedItem<'a, S>>, ForwardError> {
    items
        .iter_mut()
        .map(|it| {
            let st = it
                .state
                .as_any_mut()
                .downcast_mut::<S>()
                .ok_or(ForwardError::State)?;
            Ok((it.tokens, st, it.logits))
        })
        .collect()
}

/// A family's batched forward pass over its own state type. What
/// [`LanguageModel::forward`] and [`LanguageModel::forward_batch`] do
/// before it (downcast each state to the family's type, a single sequence
/// as a batch of one) is written here once, so each family's
/// `LanguageModel` implementation calls [`Self::forward_one`] and
/// [`Self::forward_many`] instead of repeating it.
pub trait BatchedForward {
    /// The family's [`SequenceState`].
    type State: SequenceState + 'static;

    /// One pass over the new tokens of several sequences.
    fn run_batch(
        &mut self,
        seqs: &mut [TypedItem<'_, Self::State>],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError>;

    /// [`LanguageModel::forward`]: one sequence as a batch of one.
    fn forward_one(
        &mut self,
        tokens: &[u32],
        state: &mut dyn SequenceState,
        tag: Tag,
        logits: Logits,
    ) -> Result<Vec<f32>, ForwardError> {
        let st = state
            .as_any_mut()
            .downcast_mut::<Self::State>()
            .ok_or(ForwardError::State)?;
        let mut out = self.run_batch(&mut [(tokens, st, logits)], tag)?;
        Ok(out.pop().unwrap_or_default())
    }

    /// [`LanguageModel::forward_batch`]: every state downcast, then one pass.
    fn forward_many(&mut self, items: &mut [BatchItem<'_>], tag: Tag) -> Result<Vec<Vec<f32>>, ForwardError> {
        let mut seqs = downcast_batch::<Self::State>(items)?;
        self.run_batch(&mut seqs, tag)
    }
}

/// Checks that `tokens` can follow `have` positions: ids inside the
/// vocabulary, positions inside the context. Run for every sequence before
/// a batched step touches any state, so a bad request fails alone.
pub fn check_tokens(tokens: &[u32], have: usize, vocab: usize, max: usize) -> Result<(), ForwardError> {
    if have + tokens.len() > max {
        return Err(ForwardError::Context {
            have,
            add: tokens.len(),
            max,
        });
    }
    match tokens.iter().position(|&id| id as usize >= vocab) {
        Some(t) => Err(ForwardError::Token {
            id: tokens[t],
            pos: have + t,
            vocab,
        }),
        None => Ok(()),
    }
}

/// Rows of `logits` wanted from a sequence of `n` new tokens.
pub fn logit_rows(logits: Logits, n: usize) -> std::ops::Range<usize> {
    match logits {
        Logits::None => 0..0,
        Logits::Last => n.saturating_sub(1)..n,
        Logits::All => 0..n,
    }
}

/// A causal language model whose routed experts come from an expert source.
pub trait LanguageModel: Send {
    fn vocab_size(&self) -> usize;
    fn max_positions(&self) -> usize;
    /// A u64 digest of the shapes that make a sequence state valid
    /// (guards conversation files against another model).
    fn fingerprint(&self) -> u64;
    fn new_state(&self) -> Box<dyn SequenceState>;
    /// How the states [`Self::new_state`] makes from now on store their
    /// keys and values (`--kv-type`). A family whose state has no such
    /// choice keeps f32 and returns false.
    fn set_kv_types(&mut self, _kv: KvTypes) -> bool {
        false
    }
    /// Runs `tokens` after the positions in `state`, appending theirs.
    fn forward(
        &mut self,
        tokens: &[u32],
        state: &mut dyn SequenceState,
        tag: Tag,
        logits: Logits,
    ) -> Result<Vec<f32>, ForwardError>;
    /// Runs one step for several sequences at once (continuous batching):
    /// every sequence's new tokens go through one pass, so each dense weight
    /// and each routed expert is read once for all of them. A sequence's
    /// numbers are the same as when it runs alone. Returns each item's
    /// logits, in item order. On error the states may hold partial
    /// positions: the caller truncates them back. Families without a batched
    /// pass run the items one after another.
    fn forward_batch(
        &mut self,
        items: &mut [BatchItem<'_>],
        tag: Tag,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let mut out = Vec::with_capacity(items.len());
        for it in items.iter_mut() {
            out.push(self.forward(it.tokens, &mut *it.state, tag, it.logits)?);
        }
        Ok(out)
    }
    fn source(&self) -> &Arc<dyn ExpertSource<ExpertWeights>>;
    /// Bytes of resident (non-expert) weights.
    fn dense_bytes(&self) -> usize;
    /// Bytes of resident weights every forward step reads whole: all but
    /// the embedding table, of which a step gathers only its tokens' rows
    /// (what bandwidth bounds count).
    fn step_dense_bytes(&self) -> usize {
        self.dense_bytes()
    }
    /// Up to `k` draft tokens to follow `next` (the token about to occupy
    /// position `state.len()`), from the model's own next-token (MTP) head.
    /// Leaves `state`'s positions unchanged. Models without a head return none.
    fn draft(
        &mut self,
        _state: &mut dyn SequenceState,
        _next: u32,
        _k: usize,
        _tag: Tag,
    ) -> Result<Vec<u32>, ForwardError> {
        Ok(Vec::new())
    }
    /// Whether [`Self::draft`] can propose anything; `Err` says why not.
    fn draft_head(&self) -> Result<(), String> {
        Err("this model family has no next-token (MTP) head".into())
    }
}

/// FNV-1a over a list of numbers: stable across builds and platforms.
pub fn fingerprint(parts: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The wanted logits of every sequence of a batched pass: the rows each
/// sequence asks for (`seqs[i] = (new tokens, logits choice)`, rows back to
/// back in `x` of `[Σ n_i, hidden]`) through the final norm and one
/// `lm_head` product; returned per sequence, in order.
pub fn output_logits(
    x: &[f32],
    hidden: usize,
    seqs: &[(usize, Logits)],
    final_norm: &[f32],
    eps: f32,
    lm_head: &crate::quant::QMatrix,
) -> Vec<Vec<f32>> {
    let vocab = lm_head.rows();
    let mut rows = Vec::new();
    let mut row0 = 0;
    for &(n, want) in seqs {
        rows.extend(logit_rows(want, n).map(|t| row0 + t));
        row0 += n;
    }
    let mut xs = vec![0f32; rows.len() * hidden];
    for (i, &t) in rows.iter().enumerate() {
        crate::model::ops::rms_norm(
            &x[t * hidden..(t + 1) * hidden],
            final_norm,
            eps,
            &mut xs[i * hidden..(i + 1) * hidden],
        );
    }
    let mut all = vec![0f32; rows.len() * vocab];
    if !rows.is_empty() {
        lm_head.matmul(&xs, rows.len(), &mut all);
    }
    let mut out = Vec::with_capacity(seqs.len());
    let mut at = 0;
    for &(n, want) in seqs {
        let k = logit_rows(want, n).len();
        out.push(all[at * vocab..(at + k) * vocab].to_vec());
        at += k;
    }
    out
}
