//! The serving runtime: the decode-loop actor (sessions, admission,
//! sampling, stop rules) and the layer-compute actor (weights, compute
//! threads, one batched forward step at a time), and the [`limits`] every
//! front end checks a request's values against. Front ends submit
//! [`GenRequest`]s through a [`LoopHandle`] and read [`Event`]s back; the
//! engine below never depends on a front end.

pub mod compute;
pub mod constraint;
pub mod decode_loop;
pub mod limits;
pub mod prompt_cache;
pub mod request;
pub mod stop;
#[cfg(test)]
pub(crate) mod test_state;

pub use decode_loop::{
    Canceller, DecodeLoop, LoopConfig, LoopError, LoopHandle, MetricsSnapshot, ModelInfo, RequestStream,
};
pub use request::{
    Event, Finish, FinishReason, GenRequest, MAX_SLOTS, PromptMode, RequestError, RequestId, SlotChoice,
    Usage,
};
