//! Errors as clients of each API expect them: OpenAI's
//! `{"error":{"message","type","param","code"}}` and Anthropic's
//! `{"type":"error","error":{"type","message"}}`, with the HTTP status
//! that goes with each (docs/http-api.md lists them).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::json::json_response;
use crate::runtime::RequestError;

/// Seconds a client is told to wait after a full queue.
pub const RETRY_AFTER_SECS: u64 = 1;

/// One failed call, in API-neutral terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type` (`invalid_request_error`, `server_error`, ...).
    pub kind: &'static str,
    pub message: String,
    /// The request parameter at fault, when one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// A bad parameter (400), naming it.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// A body that is not a JSON object (400).
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", what).with_code("not_found")
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", message)
            .with_code("method_not_allowed")
    }

    /// No key, or the wrong one (401).
    pub fn unauthorized(key_given: bool) -> Self {
        let message = if key_given {
            "Incorrect API key provided."
        } else {
            "Missing API key: send it as `Authorization: Bearer KEY`."
        };
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message).with_code("invalid_api_key")
    }

    /// The server's own fault (500).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// A body over `--max-body` (413).
    pub fn too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "The request body is larger than this server accepts (--max-body).",
        )
        .with_code("request_too_large")
    }

    /// A body that did not arrive in time (408, `--body-timeout-s`).
    pub fn body_timeout(secs: u64) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!("The request body did not arrive within {secs} s (--body-timeout-s)."),
        )
        .with_code("request_timeout")
    }

    /// A body cut off or badly framed (bad chunked encoding).
    pub fn unreadable_body(why: impl std::fmt::Display) -> Self {
        Self::malformed(format!("Cannot read the request body: {why}"))
    }

    /// A body sent as something other than JSON (415).
    pub fn media_type(got: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            format!(
                "The request body must be JSON (content-type: application/json), got content-type {got:?}."
            ),
        )
        .with_code("unsupported_media_type")
    }

    /// What the HTTP layer answers by itself, for a request that never got
    /// as far as a handler: a head that does not parse (400), a head too
    /// large (431), a target too long (414), or a head that did not arrive
    /// in time (408, `--header-timeout-s`).
    pub fn framing(status: StatusCode) -> Self {
        let (message, code) = match status.as_u16() {
            408 => (
                "The request head did not arrive in time (--header-timeout-s).",
                "request_timeout",
            ),
            414 => ("The request target is too long.", "uri_too_long"),
            431 => (
                "The request head is too large.",
                "request_header_fields_too_large",
            ),
            _ => (
                "The request is not valid HTTP/1.1 (request line, a header, or the body's framing).",
                "malformed_request",
            ),
        };
        Self::new(status, "invalid_request_error", message).with_code(code)
    }

    /// A prompt longer than the context: `used` is the token count, or
    /// "at least N" when it was known from the prompt's length alone.
    pub fn context_exceeded(prompt_param: &str, used: &str, limit: usize) -> Self {
        Self::invalid(
            prompt_param,
            format!(
                "This model's maximum context length is {limit} tokens. However, your {prompt_param} \
                 resulted in {used} tokens. Please reduce the length of the {prompt_param}."
            ),
        )
        .with_code("context_length_exceeded")
    }

    /// A request the decode loop refused or failed; `prompt_param` is the
    /// parameter that held the prompt (`messages`, `prompt`).
    pub fn from_request(e: &RequestError, prompt_param: &str) -> Self {
        match e {
            RequestError::QueueFull(_) => Self {
                retry_after: Some(RETRY_AFTER_SECS),
                ..Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    "The server is busy: every slot is in use and the admission queue is full. Retry later.",
                )
                .with_code("rate_limit_exceeded")
            },
            RequestError::ContextExceeded { used, limit } => {
                Self::context_exceeded(prompt_param, &used.to_string(), *limit)
            }
            RequestError::EmptyPrompt => Self::invalid(prompt_param, format!("The {prompt_param} is empty.")),
            RequestError::BadToken { id, vocab } => Self::invalid(
                prompt_param,
                format!("Token id {id} is outside the vocabulary ({vocab} tokens)."),
            ),
            RequestError::Shutdown | RequestError::Cancelled => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "The server is shutting down.",
            )
            .with_code("shutting_down"),
            // The front end names the field it came from where it can
            // (`Generation::refusal`).
            RequestError::Constraint(c) => Self::malformed(c.to_string()),
            other => Self::internal(other.to_string()),
        }
    }

    /// The OpenAI body.
    pub fn openai_body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// Anthropic's error type for this status.
    pub fn anthropic_kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The Anthropic body.
    pub fn anthropic_body(&self) -> Value {
        let message = match &self.param {
            Some(p) if !self.message.contains(p.as_str()) => format!("{p}: {}", self.message),
            _ => self.message.clone(),
        };
        json!({
            "type": "error",
            "error": { "type": self.anthropic_kind(), "message": message },
        })
    }

    /// The same error in Anthropic's shape.
    pub fn anthropic(self) -> AnthropicError {
        AnthropicError(self)
    }

    fn respond(&self, body: &Value) -> Response {
        let mut r = json_response(self.status, body);
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.respond(&self.openai_body())
    }
}

/// An [`ApiError`] answered in Anthropic's shape.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.respond(&self.0.anthropic_body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_full_is_429_with_retry_after() {
        let e = ApiError::from_request(&RequestError::QueueFull(3), "messages");
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        let r = e.into_response();
        assert_eq!(
            r.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()),
            Some("1")
        );
    }

    #[test]
    fn context_exceeded_names_the_prompt_parameter() {
        let e = ApiError::from_request(&RequestError::ContextExceeded { used: 90, limit: 64 }, "prompt");
        let b = e.openai_body();
        assert_eq!(b["error"]["code"], "context_length_exceeded");
        assert_eq!(b["error"]["param"], "prompt");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn anthropic_shape_has_type_error() {
        let b = ApiError::invalid("max_tokens", "is required").anthropic_body();
        assert_eq!(b["type"], "error");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["message"], "max_tokens: is required");
    }
}
