//! What an API call becomes in the runtime: server defaults for what the
//! call leaves out, and the [`GenRequest`] (any free slot, the prompt as
//! the whole sequence so a slot's matching prefix is reused).

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::error::ApiError;
use super::json::Params;
use crate::runtime::limits;
use crate::runtime::{GenRequest, PromptMode, RequestError, SlotChoice};
use crate::sampling::SamplingParams;

/// What a request gets for parameters it does not send (the serve flags).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Defaults {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    /// None: a fresh seed per request.
    pub seed: Option<u64>,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            max_tokens: 256,
            temperature: 0.7,
            top_p: 1.0,
            top_k: 0,
            seed: None,
        }
    }
}

/// Parameters shared by every generation endpoint, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `response_format`, `grammar` or a forced tool call, when asked for.
    pub constraint: Option<crate::runtime::constraint::ConstraintSpec>,
    /// The parameter `constraint` came from, which the 400 names when it
    /// does not compile (None: `tools`, where forced tool calls come from).
    pub constraint_param: Option<String>,
    /// Special tokens in the reply's text (chat replies whose markers the
    /// server reads: [`crate::tool_calls`]).
    pub special_tokens: bool,
}

impl Generation {
    /// The runtime request for `prompt`.
    pub fn request(&self, prompt: Vec<u32>) -> GenRequest {
        GenRequest {
            slot: SlotChoice::Any,
            mode: PromptMode::Replace,
            prompt,
            max_tokens: self.max_tokens,
            sampling: self.sampling,
            stop: self.stop.clone(),
            constraint: self.constraint.clone(),
            special_tokens: self.special_tokens,
        }
    }

    /// The API error for a request the loop refused: a constraint that does
    /// not compile is a 400 naming the parameter it came from; the rest is
    /// [`ApiError::from_request`] (`prompt_param` holds the prompt).
    pub fn refusal(&self, e: &RequestError, prompt_param: &str) -> ApiError {
        match e {
            RequestError::Constraint(c) => {
                let param = self.constraint_param.as_deref().unwrap_or("tools");
                ApiError::invalid(param, format!("Invalid '{param}': {c}"))
            }
            other => ApiError::from_request(other, prompt_param),
        }
    }
}

/// Sampling parameters from what the call gave (checked by the shared
/// limits), else the defaults. `seed`: whether the endpoint takes one.
pub fn sampling(p: &Params, d: &Defaults, seed: bool) -> Result<SamplingParams, ApiError> {
    let given = if seed {
        p.limit("seed", limits::seed)?
    } else {
        None
    };
    Ok(SamplingParams {
        temperature: p
            .limit("temperature", limits::temperature)?
            .unwrap_or(d.temperature),
        top_p: p.limit("top_p", limits::top_p)?.unwrap_or(d.top_p),
        top_k: p.limit("top_k", limits::top_k)?.unwrap_or(d.top_k),
        seed: given.or(d.seed).unwrap_or_else(fresh_seed),
    })
}

/// A token budget from the first of `names` the call gives, else the default.
pub fn max_tokens(p: &Params, names: &[&str], d: &Defaults) -> Result<usize, ApiError> {
    for name in names {
        if let Some(n) = p.limit(name, limits::max_tokens)? {
            return Ok(n);
        }
    }
    Ok(d.max_tokens)
}

/// Stop strings: a string or an array of at most `max` strings.
pub fn stops(p: &Params, name: &str, max: usize, allow_single: bool) -> Result<Vec<String>, ApiError> {
    let full = p.name(name);
    let list = match p.get(name) {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) if allow_single => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::invalid(&full, format!("'{full}' must hold strings only")))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            let what = if allow_single {
                "a string or an array of strings"
            } else {
                "an array of strings"
            };
            return Err(ApiError::invalid(&full, format!("'{full}' must be {what}")));
        }
    };
    limits::stops(list, max).map_err(|e| ApiError::invalid(&full, format!("'{full}' {e}")))
}

/// Text content: a string, or an array of `{"type": "text", "text": ...}`
/// parts (OpenAI's content parts, Anthropic's text blocks), joined with
/// newlines. Other part types are refused, naming the part.
pub fn content_text(p: &Params, name: &str, required: bool) -> Result<String, ApiError> {
    let full = p.name(name);
    match p.get(name) {
        None if required => Err(ApiError::invalid(&full, format!("'{full}' is required"))),
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let path = format!("{full}[{j}]");
                let obj = part
                    .as_object()
                    .ok_or_else(|| ApiError::invalid(&path, format!("'{path}' must be an object")))?;
                let q = Params::at(obj, &path);
                match q.required("type", q.str("type"))? {
                    "text" => texts.push(q.required("text", q.str("text"))?.to_string()),
                    other => {
                        let at = q.name("type");
                        return Err(ApiError::invalid(
                            &at,
                            format!("'{at}': content of type {other:?} is not supported, only \"text\""),
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(ApiError::invalid(
            &full,
            format!("'{full}' must be a string or an array of text parts"),
        )),
    }
}

/// A seed for requests that name none: different per request.
fn fresh_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::limits::OPENAI_MAX_STOPS as MAX_STOPS;
    use serde_json::json;

    use crate::http::json::object_of as obj;

    #[test]
    fn stop_accepts_a_string_or_up_to_four() {
        let m = obj(json!({"a": "x", "b": ["x", "", "y"], "c": ["1", "2", "3", "4", "5"], "d": 3}));
        let p = Params::new(&m);
        assert_eq!(stops(&p, "a", MAX_STOPS, true).ok(), Some(vec!["x".to_string()]));
        assert_eq!(
            stops(&p, "b", MAX_STOPS, true).ok(),
            Some(vec!["x".into(), "y".into()])
        );
        assert!(stops(&p, "c", MAX_STOPS, true).is_err());
        assert!(stops(&p, "d", MAX_STOPS, true).is_err());
        assert!(stops(&p, "a", MAX_STOPS, false).is_err());
        assert_eq!(stops(&p, "none", MAX_STOPS, true).ok(), Some(vec![]));
    }

    #[test]
    fn content_is_a_string_or_text_parts() {
        let m = obj(json!({
            "s": "hi",
            "parts": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "image": [{"type": "image_url", "image_url": {}}],
            "num": 4,
        }));
        let p = Params::at(&m, "messages[0]");
        assert_eq!(content_text(&p, "s", true).ok(), Some("hi".into()));
        assert_eq!(content_text(&p, "parts", true).ok(), Some("a\nb".into()));
        let e = content_text(&p, "image", true).err();
        assert_eq!(e.and_then(|e| e.param), Some("messages[0].image[0].type".into()));
        assert!(content_text(&p, "num", true).is_err());
        assert!(content_text(&p, "missing", true).is_err());
        assert_eq!(content_text(&p, "missing", false).ok(), Some(String::new()));
    }

    #[test]
    fn max_tokens_prefers_the_first_name_and_refuses_zero() {
        let d = Defaults::default();
        let m = obj(json!({"max_completion_tokens": 5, "max_tokens": 9, "zero": 0}));
        let p = Params::new(&m);
        assert_eq!(
            max_tokens(&p, &["max_completion_tokens", "max_tokens"], &d).ok(),
            Some(5)
        );
        assert_eq!(max_tokens(&p, &["missing"], &d).ok(), Some(d.max_tokens));
        assert!(max_tokens(&p, &["zero"], &d).is_err());
    }
}
