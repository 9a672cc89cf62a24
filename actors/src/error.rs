//! Errors the runtime reports to the model and the front ends.

use std::path::PathBuf;

use crate::expert::ExpertKey;

/// Why an expert could not be delivered.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("expert {key} is not in the expert map")]
    UnknownExpert { key: ExpertKey },
    #[error("reading expert {key} from {path}: {source}")]
    Read {
        key: ExpertKey,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("decoding expert {key}: {reason}")]
    Decode { key: ExpertKey, reason: String },
    #[error("opening expert file {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the request was cancelled")]
    Cancelled,
    #[error("the expert pipeline shut down: {0}")]
    Shutdown(String),
    #[error("compute callback failed: {0}")]
    Compute(String),
}
