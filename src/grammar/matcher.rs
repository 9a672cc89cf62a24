//! One request's place in its grammar: the set of tokens it may sample
//! next (computed ahead, while the forward step that produces the logits
//! runs), masking logits with it, and committing the sampled token.

use llguidance::Matcher;
use llguidance::toktrie::SimpleVob;

/// Why enforcing a constraint failed in the middle of a reply (a limit of
/// llguidance's, such as its per-token work budget, not a bad request).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the constraint could not be enforced: {0}")]
pub struct EnforceError(pub String);

/// A request's constraint: the compiled grammar's state after the tokens
/// committed so far.
pub struct Constrained {
    /// Boxed: llguidance's parser state is large, and a constraint travels
    /// by value in the loop's messages.
    matcher: Box<Matcher>,
    /// The next token's mask, once computed.
    next: Option<Result<SimpleVob, EnforceError>>,
}

/// What committing a token left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// More tokens may (or must) follow.
    Open,
    /// The grammar is complete and allows nothing more but an end token.
    Complete,
}

impl Constrained {
    /// Starts at the grammar's beginning with its first mask computed, so
    /// a grammar that allows no first token is refused before admission.
    pub(super) fn start(matcher: Matcher) -> Result<Self, String> {
        let mut c = Self {
            matcher: Box::new(matcher),
            next: None,
        };
        c.prepare();
        match &c.next {
            Some(Err(e)) => Err(e.0.clone()),
            _ => Ok(c),
        }
    }

    /// Whether [`Self::prepare`] has work to do.
    pub fn needs_mask(&self) -> bool {
        self.next.is_none()
    }

    /// Computes the next token's mask, if not yet known. Only the tokens
    /// committed so far decide it, so it may run before the logits exist.
    pub fn prepare(&mut self) {
        if self.next.is_none() {
            let r = self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| EnforceError(short(&e)));
            self.next = Some(r);
        }
    }

    /// Sets the logits of every token the grammar does not allow next to
    /// minus infinity (so any sampler, greedy or not, draws an allowed one).
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), EnforceError> {
        self.prepare();
        let mask = self
            .next
            .take()
            .unwrap_or_else(|| Err(EnforceError("no mask was computed".into())))?;
        apply(&mask, logits);
        Ok(())
    }

    /// Moves past the sampled `token` (one the mask allowed).
    pub fn commit(&mut self, token: u32) -> Result<Progress, EnforceError> {
        self.next = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| EnforceError(short(&e)))?;
        Ok(if self.matcher.is_stopped() {
            Progress::Complete
        } else {
            Progress::Open
        })
    }
}

/// `-inf` for every logit whose token `mask` does not allow; logits past
/// the mask (none when the mask has the model's vocabulary) too.
pub fn apply(mask: &SimpleVob, logits: &mut [f32]) {
    let n = logits.len();
    mask.iter_unset_entries(|i| {
        if i < n {
            logits[i] = f32::NEG_INFINITY;
        }
    });
    if let Some(rest) = logits.get_mut(mask.len()..) {
        rest.fill(f32::NEG_INFINITY);
    }
}

/// The first line of llguidance's error (later lines dump parser state).
fn short(e: &anyhow::Error) -> String {
    let s = e.to_string();
    let line = s.lines().next().unwrap_or_default();
    match line.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &line[..i]),
        None => line.to_string(),
    }
}
