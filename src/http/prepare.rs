//! From a request's bytes to its prompt tokens, on the preparation pool
//! ([`super::pool`]): the handlers give their parse-check-render step to
//! [`run`], and that step tokenizes through [`encode`], which refuses a
//! prompt as soon as its length shows it cannot fit the context.

use axum::body::Bytes;

use super::body::LARGE_BODY;
use super::error::ApiError;
use super::memory;
use super::state::Shared;
use crate::runtime::limits;

/// Runs `step` on the body off the async threads.
pub async fn run<T, F>(st: &Shared, body: Bytes, step: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&Shared, Bytes) -> Result<T, ApiError> + Send + 'static,
{
    let large = body.len() >= LARGE_BODY;
    let shared = st.clone();
    let after = move || {
        if large {
            memory::release_freed();
        }
    };
    st.pool
        .run(large, move || step(&shared, body), after)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
}

/// The tokens of `text`, the prompt held by parameter `prompt_param`.
///
/// A prompt that cannot fit is refused before tokenizing when its length
/// alone shows it: every token covers at most a fixed number of bytes
/// (the tokenizer's span, see [`crate::tokenizer::bound`]), so `B` bytes
/// are at least `ceil(B / span)` tokens, and when that already leaves no
/// room in the context the answer is known. Otherwise the text is
/// tokenized and the decode loop checks the exact count.
pub fn encode(st: &Shared, text: &str, prompt_param: &str) -> Result<Vec<u32>, ApiError> {
    let info = st.handle.info();
    let tok = info.tokenizer().map_err(|e| ApiError::internal(e.to_string()))?;
    if let Ok(least) = tok.min_tokens(text.len())
        && !limits::fits_context(least, info.max_ctx)
    {
        st.counters.refused_by_length.inc();
        return Err(ApiError::context_exceeded(
            prompt_param,
            &format!("at least {least}"),
            info.max_ctx,
        ));
    }
    st.counters.tokenized.inc();
    tok.encode(text).map_err(|e| ApiError::internal(e.to_string()))
}
