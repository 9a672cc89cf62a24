//! Anthropic's `POST /v1/messages`: the request shape (`system`, text
//! blocks, `max_tokens` required, `stop_sequences`), the response shape,
//! its stream of named events, and errors in Anthropic's shape.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::response::sse::Event;
use serde_json::{Value, json};

use super::body::JsonBody;
use super::error::{AnthropicError, ApiError};
use super::generate::{self, Outcome};
use super::json::{Params, is_off, json_response, parse_object};
use super::prepare;
use super::request::{self, Generation};
use super::sse::{self, Format};
use super::state::Shared;
use crate::chat_template::ChatMessage;
use crate::runtime::limits;

/// The system prompt and the conversation.
fn conversation(p: &Params) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::new();
    if p.has("system") {
        let system = request::content_text(p, "system", false)?;
        out.push(ChatMessage::system(&system));
    }
    let list = p.required("messages", p.array("messages"))?;
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must hold at least one message",
        ));
    }
    for (i, m) in list.iter().enumerate() {
        let path = format!("messages[{i}]");
        let obj = m
            .as_object()
            .ok_or_else(|| ApiError::invalid(&path, format!("'{path}' must be an object")))?;
        let mp = Params::at(obj, &path);
        let role = match mp.required("role", mp.str("role"))? {
            r @ ("user" | "assistant") => r,
            other => {
                return Err(ApiError::invalid(
                    &mp.name("role"),
                    format!("role {other:?} is not supported (user, assistant)"),
                ));
            }
        };
        let content = request::content_text(&mp, "content", true)?;
        out.push(ChatMessage::new(role, &content));
    }
    Ok(out)
}

fn generation(p: &Params, st: &Shared) -> Result<Generation, ApiError> {
    p.str("model")?;
    let max_tokens = p.required("max_tokens", p.limit("max_tokens", limits::max_tokens))?;
    let sampling = request::sampling(p, &st.defaults, false)?;
    p.object("metadata")?;
    p.refuse_unless("tools", is_off, "tools are not supported")?;
    p.refuse_unless(
        "thinking",
        |v| is_off(v) || v.get("type").and_then(Value::as_str) == Some("disabled"),
        "extended thinking is not supported",
    )?;
    Ok(Generation {
        max_tokens,
        sampling,
        stop: request::stops(p, "stop_sequences", limits::ANTHROPIC_MAX_STOPS, false)?,
        stream: p.bool("stream")?.unwrap_or(false),
        constraint: None,
        constraint_param: None,
    })
}

/// Parses, checks, renders and tokenizes a messages call (on the
/// preparation threads).
fn prepare_messages(st: &Shared, body: Bytes) -> Result<(Generation, Vec<u32>), ApiError> {
    let obj = parse_object(&body)?;
    drop(body);
    let p = Params::new(&obj);
    let msgs = conversation(&p)?;
    let g = generation(&p, st)?;
    let info = st.handle.info();
    let text = info.template.render(&msgs, true).map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("the model's chat template refused the messages: {e}"),
        )
    })?;
    let prompt = prepare::encode(st, &text, "messages")?;
    Ok((g, prompt))
}

/// `POST /v1/messages`.
pub async fn messages(State(st): State<Shared>, body: JsonBody) -> Result<Response, AnthropicError> {
    let (g, prompt) = prepare::run(&st, body.0?, prepare_messages).await?;
    let job = generate::start(&st.handle, g.request(prompt))
        .await
        .map_err(|e| ApiError::from_request(&e, "messages"))?;
    let events = Events {
        id: st.next_id("msg_"),
        model: st.model().to_string(),
        prompt_tokens: job.prompt_tokens,
        cached_tokens: job.cached_tokens,
    };
    if g.stream {
        let head = vec![
            sse::named(
                "message_start",
                &json!({ "type": "message_start", "message": events.message(Vec::new(), None, 0) }),
            ),
            sse::named(
                "content_block_start",
                &json!({
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": { "type": "text", "text": "" },
                }),
            ),
            sse::named("ping", &json!({ "type": "ping" })),
        ];
        return Ok(sse::respond(job, head, events, "messages"));
    }
    let (text, o) = job
        .collect()
        .await
        .map_err(|e| ApiError::from_request(&e, "messages"))?;
    let content = vec![json!({ "type": "text", "text": text })];
    Ok(json_response(
        StatusCode::OK,
        &events.message(content, Some(&o), o.completion_tokens),
    ))
}

/// The message object and the stream's events.
struct Events {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// Prompt tokens not computed: Anthropic counts them as read from the
    /// cache, and `input_tokens` as the rest.
    cached_tokens: usize,
}

impl Events {
    fn message(&self, content: Vec<Value>, end: Option<&Outcome>, output_tokens: usize) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": end.map(Outcome::anthropic_reason),
            "stop_sequence": end.and_then(Outcome::stop_sequence),
            "usage": {
                "input_tokens": self.prompt_tokens - self.cached_tokens.min(self.prompt_tokens),
                "cache_read_input_tokens": self.cached_tokens,
                "cache_creation_input_tokens": 0,
                "output_tokens": output_tokens,
            },
        })
    }
}

impl Format for Events {
    fn text(&mut self, text: &str) -> Vec<Event> {
        vec![sse::named(
            "content_block_delta",
            &json!({
                "type": "content_block_delta",
                "index": 0,
                "delta": { "type": "text_delta", "text": text },
            }),
        )]
    }

    fn done(&mut self, o: &Outcome) -> Vec<Event> {
        vec![
            sse::named(
                "content_block_stop",
                &json!({ "type": "content_block_stop", "index": 0 }),
            ),
            sse::named(
                "message_delta",
                &json!({
                    "type": "message_delta",
                    "delta": { "stop_reason": o.anthropic_reason(), "stop_sequence": o.stop_sequence() },
                    "usage": { "output_tokens": o.completion_tokens },
                }),
            ),
            sse::named("message_stop", &json!({ "type": "message_stop" })),
        ]
    }

    fn failed(&mut self, err: &ApiError) -> Vec<Event> {
        vec![sse::named("error", &err.anthropic_body())]
    }
}
