//! Errors that end a `coli serve` session.

/// Why the serve loop stopped before EOF.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("serve configuration: {0}")]
    Config(String),
    #[error("reading the request stream: {0}")]
    Input(#[source] std::io::Error),
    #[error("writing the reply stream: {0}")]
    Output(#[source] std::io::Error),
    #[error("engine failed while {what}: {source}")]
    Engine {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
