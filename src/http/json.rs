//! Request bodies in, JSON replies out. Bodies are read as a JSON object
//! and each parameter through a typed getter whose error names it, so a
//! client learns which parameter was wrong (never a panic, whatever the
//! bytes).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::runtime::limits::LimitError;

/// A JSON reply with its content type.
pub fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The body as a JSON object.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::malformed("The request body must be a JSON object.")),
        Err(e) => Err(ApiError::malformed(format!(
            "We could not parse the JSON body of your request: {e}"
        ))),
    }
}

/// Typed access to an object's fields; `null` counts as absent. `path` is
/// the object's own place in the request (`""` for the body,
/// `messages[2]` for a message), prefixed to the names in errors.
#[derive(Clone, Copy)]
pub struct Params<'a> {
    obj: &'a Map<String, Value>,
    path: &'a str,
}

impl<'a> Params<'a> {
    pub fn new(obj: &'a Map<String, Value>) -> Self {
        Self { obj, path: "" }
    }

    pub fn at(obj: &'a Map<String, Value>, path: &'a str) -> Self {
        Self { obj, path }
    }

    /// The full name of field `name`, as errors print it.
    pub fn name(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    fn bad(&self, name: &str, what: &str, v: &Value) -> ApiError {
        let full = self.name(name);
        ApiError::invalid(&full, format!("'{full}' must be {what}, got {}", short(v)))
    }

    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub fn f64(&self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.bad(name, "a number", v)),
        }
    }

    /// A number in `lo..=hi` (`lo_open`: excluding `lo`).
    pub fn f64_in(&self, name: &str, lo: f64, lo_open: bool, hi: f64) -> Result<Option<f64>, ApiError> {
        let Some(x) = self.f64(name)? else { return Ok(None) };
        let above = if lo_open { x > lo } else { x >= lo };
        if above && x <= hi {
            return Ok(Some(x));
        }
        let full = self.name(name);
        let open = if lo_open { "(" } else { "[" };
        Err(ApiError::invalid(
            &full,
            format!("'{full}' must be in {open}{lo}, {hi}], got {x}"),
        ))
    }

    /// A whole number >= 0.
    pub fn u64(&self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.bad(name, "a whole number >= 0", v)),
        }
    }

    /// A generation parameter, checked by the limit every front end shares
    /// ([`crate::runtime::limits`]): the value as JSON writes it goes through
    /// the parser a flag or a frame field goes through, so the same value
    /// gets the same words (a string is not a number: `"2"` is refused).
    pub fn limit<T>(
        &self,
        name: &str,
        check: fn(&str) -> Result<T, LimitError>,
    ) -> Result<Option<T>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        check(&v.to_string()).map(Some).map_err(|e| {
            let full = self.name(name);
            ApiError::invalid(&full, format!("'{full}' {e}"))
        })
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.bad(name, "a boolean", v)),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.bad(name, "a string", v)),
        }
    }

    pub fn object(&self, name: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_object()
                .map(Some)
                .ok_or_else(|| self.bad(name, "an object", v)),
        }
    }

    pub fn array(&self, name: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| self.bad(name, "an array", v)),
        }
    }

    /// A required field.
    pub fn required<T>(&self, name: &str, v: Result<Option<T>, ApiError>) -> Result<T, ApiError> {
        v?.ok_or_else(|| {
            let full = self.name(name);
            ApiError::invalid(&full, format!("'{full}' is required"))
        })
    }

    /// A parameter this server cannot honour, refused when it asks for more
    /// than the default (`allowed` says what is fine).
    pub fn refuse_unless(
        &self,
        name: &str,
        allowed: impl Fn(&Value) -> bool,
        why: &str,
    ) -> Result<(), ApiError> {
        match self.get(name) {
            Some(v) if !allowed(v) => {
                let full = self.name(name);
                Err(ApiError::invalid(&full, format!("'{full}': {why}")).with_code("unsupported_parameter"))
            }
            _ => Ok(()),
        }
    }
}

/// A value for an error message, cut short.
fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

/// `Value` is false, zero, an empty string/array or null.
pub fn is_off(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// `v` as an object, empty when it is none: what the tests of the request
/// parsers build their `Params` from.
#[cfg(test)]
pub(crate) fn object_of(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use super::object_of as obj;

    #[test]
    fn malformed_bodies_are_errors_not_panics() {
        for body in [&b"{"[..], b"[1,2]", b"\"x\"", b"", b"\xff\xfe", b"{\"a\":1}}"] {
            let e = parse_object(body).err();
            assert!(e.is_some_and(|e| e.status == StatusCode::BAD_REQUEST), "{body:?}");
        }
    }

    #[test]
    fn getters_name_the_parameter() {
        let m = obj(json!({"temperature": "hot", "top_p": 0.0, "n": -1, "seed": -5, "x": null}));
        let p = Params::new(&m);
        assert_eq!(
            p.f64("temperature").err().and_then(|e| e.param),
            Some("temperature".into())
        );
        let e = p.f64_in("top_p", 0.0, true, 1.0).err();
        assert_eq!(e.and_then(|e| e.param), Some("top_p".into()));
        assert!(p.u64("n").is_err());
        assert_eq!(
            p.limit("seed", crate::runtime::limits::seed).ok().flatten(),
            Some(-5i64 as u64)
        );
        let e = p.limit("n", crate::runtime::limits::max_tokens).err();
        assert_eq!(
            e.map(|e| e.message),
            Some("'n' must be a whole number >= 1, got -1".to_string())
        );
        let e = p.limit("temperature", crate::runtime::limits::temperature).err();
        assert_eq!(
            e.map(|e| e.message),
            Some("'temperature' must be a number in [0, 2], got \"hot\"".to_string())
        );
        assert_eq!(p.str("x").ok(), Some(None));
        let inner = obj(json!({"role": 3}));
        let q = Params::at(&inner, "messages[1]");
        assert_eq!(
            q.str("role").err().and_then(|e| e.param),
            Some("messages[1].role".into())
        );
    }
}
