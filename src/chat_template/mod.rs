//! Chat templates: turning a conversation into the text a model was tuned on.
//!
//! Models ship their format as a Jinja template in `tokenizer_config.json`
//! (`chat_template`). We render it with minijinja configured like Hugging Face
//! does (`trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`,
//! `strftime_now`, transformers' `tojson`, Python string and dict methods
//! through minijinja-contrib's pycompat; see `hf.rs`), so the prompt matches
//! what the model saw in training. When a checkout has no template, a built-in
//! one ([`ChatFormat`], chosen by the model's family) stands in.
//!
//! `coli serve` keeps the conversation in the KV cache, so it needs only the
//! text a new user turn adds: [`ChatTemplate::render_turn`].

mod builtin;
mod error;
mod hf;
mod template;

pub use builtin::ChatFormat;
pub use error::TemplateError;
pub use template::{
    ChatMessage, ChatTemplate, Clock, MessageFunction, MessageToolCall, RESERVED_VARIABLES, RenderOptions,
};
