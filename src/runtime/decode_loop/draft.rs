//! Speculative decoding in the decode loop: which draft a decoding request
//! brings to the next step, and which of the step's positions survive its
//! verification.
//!
//! A request with a draft contributes its sampled token plus the draft to
//! the batched step (all logits wanted); [`super::active::Active::verify`]
//! then takes the longest agreed prefix plus the model's own next token,
//! and [`kept_positions`] says how far the slot's state is truncated back.
//! Drafts depend only on the request's own history (n-gram lookup) or its
//! own state (the MTP head), never on the batch, so a request's tokens are
//! the same whatever runs beside it.

use super::active::Active;
use super::slots::common_prefix;
use crate::engine::speculative::{DraftMode, MAX_VERIFY_TOKENS, ngram_draft};

/// What a decoding request adds to its next step.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Nothing: one token, as without drafts.
    None,
    /// These draft tokens after the sampled one (n-gram lookup).
    Tokens(Vec<u32>),
    /// Up to this many tokens from the MTP head, drafted by the compute
    /// actor that holds it.
    Mtp(usize),
}

/// The draft of request `a`, whose `history` ends with its sampled, not yet
/// computed token. At most the tokens the reply may still take (so the
/// verified positions stay inside the context) and what one verification
/// forward holds.
pub(super) fn plan(a: &Active, history: &[u32], mode: DraftMode) -> Plan {
    let Some(spec) = a.spec.as_ref() else {
        return Plan::None;
    };
    if spec.off.is_some() {
        return Plan::None;
    }
    let k = spec
        .opts
        .max_draft
        .min(MAX_VERIFY_TOKENS - 1)
        .min(a.budget.saturating_sub(a.generated));
    if k == 0 {
        return Plan::None;
    }
    match mode {
        DraftMode::Ngram => {
            let d = ngram_draft(history, k);
            if d.is_empty() { Plan::None } else { Plan::Tokens(d) }
        }
        DraftMode::Mtp | DraftMode::Auto => Plan::Mtp(k),
    }
}

/// Positions of the slot's state to keep after a verification: the
/// history up to and including the token the draft followed (at `base`),
/// then each draft token the reply kept, but never the reply's last token,
/// which stays pending for the next step as every sampled token does.
pub(super) fn kept_positions(history: &[u32], base: usize, drafts: &[u32]) -> usize {
    let after = history.get(base + 1..).unwrap_or(&[]);
    let agreed = common_prefix(after, drafts).min(after.len().saturating_sub(1));
    base + 1 + agreed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_positions_stop_before_the_pending_token() {
        // History ..., 7 (at 2), then the reply took drafts 8, 9 and its own 5.
        let h = [1, 2, 7, 8, 9, 5];
        assert_eq!(kept_positions(&h, 2, &[8, 9, 4]), 5);
        // Every draft agreed and the bonus token is pending.
        assert_eq!(kept_positions(&h, 2, &[8, 9, 5]), 5);
        // The first draft was rejected: only the token before it stays.
        assert_eq!(kept_positions(&[1, 2, 7, 3], 2, &[8, 9]), 3);
        // A stop after the first accepted draft: that draft is pending.
        assert_eq!(kept_positions(&[1, 2, 7, 8], 2, &[8, 9]), 3);
    }
}
