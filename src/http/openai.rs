//! OpenAI's `POST /v1/chat/completions` and `POST /v1/completions`, with
//! and without streaming, in OpenAI's response shapes.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::response::sse::Event;
use serde_json::{Value, json};

use super::body::JsonBody;
use super::error::ApiError;
use super::generate::{self, Outcome};
use super::json::{Params, is_off, json_response, parse_object};
use super::prepare;
use super::request::{self, Defaults, Generation};
use super::sse::{self, Format};
use super::state::{Shared, unix_now};
use crate::chat_template::ChatMessage;
use crate::runtime::limits;

/// The parameters both endpoints share, validated.
struct Call {
    generation: Generation,
    include_usage: bool,
}

fn call(p: &Params, d: &Defaults, budget_names: &[&str]) -> Result<Call, ApiError> {
    p.str("model")?;
    if let Some(n) = p.u64("n")?
        && n != 1
    {
        return Err(ApiError::invalid(
            "n",
            format!("only n = 1 is supported, got {n}"),
        ));
    }
    let sampling = request::sampling(p, d, true)?;
    // Accepted and ignored (docs/http-api.md), but still checked.
    p.f64_in("presence_penalty", -2.0, false, 2.0)?;
    p.f64_in("frequency_penalty", -2.0, false, 2.0)?;
    p.str("user")?;
    p.refuse_unless("logprobs", is_off, "log probabilities are not supported")?;
    p.refuse_unless("top_logprobs", is_off, "log probabilities are not supported")?;
    let stop = request::stops(p, "stop", limits::OPENAI_MAX_STOPS, true)?;
    let stream = p.bool("stream")?.unwrap_or(false);
    let constraint = super::constraint::parse(p)?;
    let include_usage = match p.object("stream_options")? {
        Some(o) => Params::at(o, "stream_options")
            .bool("include_usage")?
            .unwrap_or(false),
        None => false,
    };
    Ok(Call {
        generation: Generation {
            max_tokens: request::max_tokens(p, budget_names, d)?,
            sampling,
            stop,
            stream,
            constraint_param: constraint.as_ref().map(|c| c.param.clone()),
            constraint: constraint.map(|c| c.spec),
        },
        include_usage,
    })
}

/// The conversation of a chat request.
fn chat_messages(p: &Params) -> Result<Vec<ChatMessage>, ApiError> {
    let list = p.required("messages", p.array("messages"))?;
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must hold at least one message",
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let path = format!("messages[{i}]");
        let obj = m
            .as_object()
            .ok_or_else(|| ApiError::invalid(&path, format!("'{path}' must be an object")))?;
        let mp = Params::at(obj, &path);
        let role = match mp.required("role", mp.str("role"))? {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            other => {
                return Err(ApiError::invalid(
                    &mp.name("role"),
                    format!("role {other:?} is not supported (system, developer, user, assistant)"),
                ));
            }
        };
        let content = match (mp.has("content"), role) {
            // An assistant turn that only called tools has no content.
            (false, "assistant") => String::new(),
            _ => request::content_text(&mp, "content", true)?,
        };
        out.push(ChatMessage::new(role, &content));
    }
    Ok(out)
}

fn usage(o: &Outcome) -> Value {
    json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": o.cached_tokens },
    })
}

/// llama-server's `timings`: prompt tokens computed (`prompt_n`) and
/// reused (`cache_n`), the prefill and the generation with their speeds.
fn timings(o: &Outcome) -> Value {
    let per_second = |n: usize, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    json!({
        "cache_n": o.cached_tokens,
        "prompt_n": o.prefilled,
        "prompt_ms": o.prompt_secs * 1e3,
        "prompt_per_second": per_second(o.prefilled, o.prompt_secs),
        "predicted_n": o.completion_tokens,
        "predicted_ms": o.predicted_secs * 1e3,
        "predicted_per_second": per_second(o.completion_tokens, o.predicted_secs),
    })
}

/// Parses, checks, renders and tokenizes a chat call (on the preparation
/// threads).
fn prepare_chat(st: &Shared, body: Bytes) -> Result<(Call, Vec<u32>), ApiError> {
    let obj = parse_object(&body)?;
    drop(body);
    let p = Params::new(&obj);
    p.refuse_unless("tools", is_off, "tools are not supported")?;
    p.refuse_unless("functions", is_off, "functions are not supported")?;
    let messages = chat_messages(&p)?;
    let c = call(&p, &st.defaults, &["max_completion_tokens", "max_tokens"])?;
    let info = st.handle.info();
    let text = info.template.render(&messages, true).map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("the model's chat template refused the messages: {e}"),
        )
    })?;
    let prompt = prepare::encode(st, &text, "messages")?;
    Ok((c, prompt))
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(st): State<Shared>, body: JsonBody) -> Result<Response, ApiError> {
    let (c, prompt) = prepare::run(&st, body.0?, prepare_chat).await?;
    let job = generate::start(&st.handle, c.generation.request(prompt))
        .await
        .map_err(|e| c.generation.refusal(&e, "messages"))?;
    let chunks = Chunks {
        id: st.next_id("chatcmpl-"),
        created: unix_now(),
        model: st.model().to_string(),
        include_usage: c.include_usage,
        chat: true,
    };
    if c.generation.stream {
        let head = vec![sse::data(
            &chunks.chunk(json!({"role": "assistant", "content": ""}), None),
        )];
        return Ok(sse::respond(job, head, chunks, "messages"));
    }
    let (text, o) = job
        .collect()
        .await
        .map_err(|e| ApiError::from_request(&e, "messages"))?;
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "id": chunks.id,
            "object": "chat.completion",
            "created": chunks.created,
            "model": chunks.model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": text, "refusal": null },
                "logprobs": null,
                "finish_reason": o.openai_reason(),
            }],
            "usage": usage(&o),
            "timings": timings(&o),
        }),
    ))
}

/// The prompt of a completions request: a string, one string in an
/// array, or token ids.
fn completion_prompt(p: &Params, st: &Shared) -> Result<Vec<u32>, ApiError> {
    let encode = |s: &str| prepare::encode(st, s, "prompt");
    let ids = |items: &[Value]| {
        items
            .iter()
            .map(|v| {
                v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                    ApiError::invalid("prompt", "token ids in 'prompt' must be whole numbers below 2^32")
                })
            })
            .collect::<Result<Vec<u32>, _>>()
    };
    let one_prompt = || {
        ApiError::invalid(
            "prompt",
            "'prompt' must be a string, an array holding one string, or an array of token ids \
             (one prompt per request)",
        )
    };
    match p.get("prompt") {
        None => Err(ApiError::invalid("prompt", "'prompt' is required")),
        Some(Value::String(s)) => encode(s),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => encode(s),
            [Value::Array(inner)] => ids(inner),
            items if !items.is_empty() && items.iter().all(Value::is_number) => ids(items),
            _ => Err(one_prompt()),
        },
        Some(_) => Err(one_prompt()),
    }
}

/// Parses, checks and tokenizes a completions call (on the preparation
/// threads).
fn prepare_completion(st: &Shared, body: Bytes) -> Result<(Call, Vec<u32>), ApiError> {
    let obj = parse_object(&body)?;
    drop(body);
    let p = Params::new(&obj);
    p.refuse_unless("suffix", is_off, "suffix is not supported")?;
    p.refuse_unless("echo", is_off, "echo is not supported")?;
    p.refuse_unless(
        "best_of",
        |v| v.as_u64() == Some(1),
        "only best_of = 1 is supported",
    )?;
    let prompt = completion_prompt(&p, st)?;
    let c = call(&p, &st.defaults, &["max_tokens"])?;
    Ok((c, prompt))
}

/// `POST /v1/completions`.
pub async fn completions(State(st): State<Shared>, body: JsonBody) -> Result<Response, ApiError> {
    let (c, prompt) = prepare::run(&st, body.0?, prepare_completion).await?;
    let job = generate::start(&st.handle, c.generation.request(prompt))
        .await
        .map_err(|e| c.generation.refusal(&e, "prompt"))?;
    let chunks = Chunks {
        id: st.next_id("cmpl-"),
        created: unix_now(),
        model: st.model().to_string(),
        include_usage: c.include_usage,
        chat: false,
    };
    if c.generation.stream {
        return Ok(sse::respond(job, Vec::new(), chunks, "prompt"));
    }
    let (text, o) = job
        .collect()
        .await
        .map_err(|e| ApiError::from_request(&e, "prompt"))?;
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "id": chunks.id,
            "object": "text_completion",
            "created": chunks.created,
            "model": chunks.model,
            "choices": [{
                "text": text,
                "index": 0,
                "logprobs": null,
                "finish_reason": o.openai_reason(),
            }],
            "usage": usage(&o),
            "timings": timings(&o),
        }),
    ))
}

/// The streamed shapes of both endpoints (`chat`: chat.completion.chunk
/// with deltas, else text_completion with text pieces).
struct Chunks {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    chat: bool,
}

impl Chunks {
    fn object(&self) -> &'static str {
        if self.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        }
    }

    /// One chunk: `piece` is the delta (chat) or the text (completions).
    fn chunk(&self, piece: Value, finish: Option<&str>) -> Value {
        let choice = if self.chat {
            json!({ "index": 0, "delta": piece, "logprobs": null, "finish_reason": finish })
        } else {
            json!({ "text": piece, "index": 0, "logprobs": null, "finish_reason": finish })
        };
        let mut v = json!({
            "id": self.id,
            "object": self.object(),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }
}

fn done_marker() -> Event {
    Event::default().data("[DONE]")
}

impl Format for Chunks {
    fn text(&mut self, text: &str) -> Vec<Event> {
        let piece = if self.chat {
            json!({ "content": text })
        } else {
            json!(text)
        };
        vec![sse::data(&self.chunk(piece, None))]
    }

    fn done(&mut self, o: &Outcome) -> Vec<Event> {
        let empty = if self.chat { json!({}) } else { json!("") };
        let mut last = self.chunk(empty, Some(o.openai_reason()));
        last["timings"] = timings(o);
        let mut out = vec![sse::data(&last)];
        if self.include_usage {
            out.push(sse::data(&json!({
                "id": self.id,
                "object": self.object(),
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage(o),
                "timings": timings(o),
            })));
        }
        out.push(done_marker());
        out
    }

    fn failed(&mut self, err: &ApiError) -> Vec<Event> {
        vec![sse::data(&err.openai_body()), done_marker()]
    }
}
