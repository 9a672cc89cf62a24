//! Errors of loading and rendering chat templates.

use std::path::PathBuf;

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: `chat_template` has an unexpected shape: {what}")]
    Shape { path: PathBuf, what: String },
    #[error("chat template from {origin} does not compile: {source}")]
    Syntax {
        origin: String,
        #[source]
        source: minijinja::Error,
    },
    #[error("rendering the chat template from {origin}: {source}")]
    Render {
        origin: String,
        #[source]
        source: minijinja::Error,
    },
}
