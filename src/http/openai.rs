//! OpenAI's `POST /v1/chat/completions` and `POST /v1/completions`, with
//! and without streaming, in OpenAI's response shapes.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::response::sse::Event;
use serde_json::{Value, json};

use super::body::JsonBody;
use super::chat::{self, ChatPrompt, call_id};
use super::error::ApiError;
use super::generate::{self, Outcome};
use super::json::{Params, is_off, json_response, parse_object};
use super::prepare;
use super::request::{self, Defaults, Generation};
use super::sse::{self, Format};
use super::state::{Shared, unix_now};
use super::{history, tools};
use crate::runtime::limits;
use crate::tool_calls::{Delta, Reply, ToolCall};

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
            special_tokens: false,
        },
        include_usage,
    })
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
fn prepare_chat(st: &Shared, body: Bytes) -> Result<(Call, ChatPrompt), ApiError> {
    let obj = parse_object(&body)?;
    drop(body);
    let p = Params::new(&obj);
    p.refuse_unless("functions", is_off, "functions are not supported, use tools")?;
    let info = st.handle.info();
    let tools = tools::openai(&p)?;
    let messages = history::openai(&p, info.template.dialect())?;
    let mut kwargs = chat::template_kwargs(&p)?;
    if let Some(effort) = p.str("reasoning_effort")? {
        kwargs
            .entry("reasoning_effort")
            .or_insert_with(|| Value::from(effort));
    }
    let mut c = call(&p, &st.defaults, &["max_completion_tokens", "max_tokens"])?;
    let prompt = chat::prepare(st, &messages, tools.as_ref(), kwargs, &mut c.generation)?;
    Ok((c, prompt))
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(st): State<Shared>, body: JsonBody) -> Result<Response, ApiError> {
    let (c, prompt) = prepare::run(&st, body.0?, prepare_chat).await?;
    let job = generate::start(&st.handle, c.generation.request(prompt.ids))
        .await
        .map_err(|e| c.generation.refusal(&e, "messages"))?;
    let chunks = Chunks {
        id: st.next_id("chatcmpl-"),
        created: unix_now(),
        model: st.model().to_string(),
        include_usage: c.include_usage,
        chat: true,
        calls: 0,
    };
    if c.generation.stream {
        let head = vec![sse::data(
            &chunks.chunk(json!({"role": "assistant", "content": ""}), None),
        )];
        return Ok(sse::respond(
            job,
            head,
            chunks,
            prompt.reading.parser(),
            "messages",
        ));
    }
    let (text, o) = job
        .collect()
        .await
        .map_err(|e| ApiError::from_request(&e, "messages"))?;
    let reply = prompt.reading.parse(&text);
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "id": chunks.id,
            "object": "chat.completion",
            "created": chunks.created,
            "model": chunks.model,
            "choices": [{
                "index": 0,
                "message": message(&reply, &chunks.id),
                "logprobs": null,
                "finish_reason": o.openai_chat_reason(reply.calls.len()),
            }],
            "usage": usage(&o),
            "timings": timings(&o),
        }),
    ))
}

/// A reply's `message`: `content` (null when the reply only called tools),
/// `reasoning_content` and `tool_calls` when there are any.
fn message(reply: &Reply, response_id: &str) -> Value {
    let content = if reply.content.is_empty() && !reply.calls.is_empty() {
        Value::Null
    } else {
        Value::from(reply.content.as_str())
    };
    let mut m = json!({ "role": "assistant", "content": content, "refusal": null });
    if !reply.reasoning.is_empty() {
        m["reasoning_content"] = Value::from(reply.reasoning.as_str());
    }
    if !reply.calls.is_empty() {
        let calls: Vec<Value> = reply
            .calls
            .iter()
            .enumerate()
            .map(|(i, c)| tool_call(c, &call_id("call_", response_id, i)))
            .collect();
        m["tool_calls"] = Value::from(calls);
    }
    m
}

fn tool_call(c: &ToolCall, id: &str) -> Value {
    json!({
        "id": id,
        "type": "function",
        "function": { "name": c.name, "arguments": c.arguments_json() },
    })
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
        calls: 0,
    };
    if c.generation.stream {
        return Ok(sse::respond(job, Vec::new(), chunks, None, "prompt"));
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
    /// Tool calls streamed so far (their `index`).
    calls: usize,
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

impl Chunks {
    /// The chunks of a piece of the reply. A call is two chunks: its index,
    /// id, type and name with empty arguments, then its arguments.
    fn pieces(&mut self, delta: Delta) -> Vec<Value> {
        let pieces = match (delta, self.chat) {
            (Delta::Content(t), false) => vec![json!(t)],
            (Delta::Content(t), true) => vec![json!({ "content": t })],
            (Delta::Reasoning(t), _) => vec![json!({ "reasoning_content": t })],
            (Delta::Call(c), _) => {
                let index = self.calls;
                self.calls += 1;
                let id = call_id("call_", &self.id, index);
                vec![
                    json!({ "tool_calls": [{
                        "index": index, "id": id, "type": "function",
                        "function": { "name": c.name, "arguments": "" },
                    }] }),
                    json!({ "tool_calls": [{ "index": index, "function": { "arguments": c.arguments_json() } }] }),
                ]
            }
        };
        pieces.into_iter().map(|p| self.chunk(p, None)).collect()
    }
}

impl Format for Chunks {
    fn delta(&mut self, delta: Delta) -> Vec<Event> {
        self.pieces(delta).iter().map(sse::data).collect()
    }

    fn done(&mut self, o: &Outcome) -> Vec<Event> {
        let (empty, reason) = if self.chat {
            (json!({}), o.openai_chat_reason(self.calls))
        } else {
            (json!(""), o.openai_reason())
        };
        let mut last = self.chunk(empty, Some(reason));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::generate::StopKind;
    use crate::tool_calls::{CallSyntax, Dialect, ReplyParser, ToolSet, ToolSpec};

    fn tools() -> ToolSet {
        ToolSet::new(vec![ToolSpec {
            name: "get_weather".into(),
            description: None,
            parameters: None,
        }])
    }

    const HERMES: Dialect = Dialect {
        calls: Some(CallSyntax::Hermes),
        think: true,
    };

    /// A reply as a model would write it: reasoning, text, two calls.
    const TEXT: &str = "<think>\nThe user wants weather.\n</think>\n\nChecking both.\n<tool_call>\n\
        {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n\
        {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";

    fn chunks() -> Chunks {
        Chunks {
            id: "chatcmpl-abc".into(),
            created: 1,
            model: "m".into(),
            include_usage: false,
            chat: true,
            calls: 0,
        }
    }

    fn outcome() -> Outcome {
        Outcome {
            stop: StopKind::EndTurn,
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens: 40,
            prefilled: 10,
            prompt_secs: 0.0,
            predicted_secs: 0.0,
        }
    }

    #[test]
    fn a_reply_with_calls_is_a_message_with_tool_calls() {
        let reply = ReplyParser::parse(HERMES, Some(tools()), false, TEXT);
        let m = message(&reply, "chatcmpl-abc");
        assert_eq!(m["content"], "Checking both.");
        assert_eq!(m["reasoning_content"], "The user wants weather.");
        assert_eq!(m["tool_calls"][1]["id"], "call_abc_1");
        assert_eq!(m["tool_calls"][1]["type"], "function");
        assert_eq!(m["tool_calls"][1]["function"]["name"], "get_weather");
        assert_eq!(m["tool_calls"][1]["function"]["arguments"], "{\"city\":\"Rome\"}");
        assert_eq!(outcome().openai_chat_reason(reply.calls.len()), "tool_calls");
        // Only calls: no content.
        let only = ReplyParser::parse(
            HERMES,
            Some(tools()),
            false,
            &TEXT[TEXT.find("<tool_call>").unwrap_or(0)..],
        );
        assert!(message(&only, "chatcmpl-abc")["content"].is_null());
        assert!(message(&only, "chatcmpl-abc").get("reasoning_content").is_none());
    }

    /// The streamed chunks, put back together, are the unstreamed message.
    #[test]
    fn streamed_chunks_add_up_to_the_message() {
        let whole = ReplyParser::parse(HERMES, Some(tools()), false, TEXT);
        let mut c = chunks();
        let mut p = ReplyParser::new(HERMES, Some(tools()), false);
        let mut values = Vec::new();
        for piece in TEXT.as_bytes().chunks(5) {
            let piece = String::from_utf8_lossy(piece).to_string();
            for d in p.push(&piece) {
                values.extend(c.pieces(d));
            }
        }
        for d in p.finish() {
            values.extend(c.pieces(d));
        }
        let (mut content, mut reasoning) = (String::new(), String::new());
        let mut calls: Vec<Value> = Vec::new();
        for v in &values {
            let d = &v["choices"][0]["delta"];
            content.push_str(d["content"].as_str().unwrap_or(""));
            reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                let i = tc["index"].as_u64().unwrap_or(99) as usize;
                if i == calls.len() {
                    assert!(tc["id"].is_string() && tc["function"]["name"].is_string(), "{tc}");
                    calls.push(json!({"id": tc["id"], "type": tc["type"], "function": {"name": tc["function"]["name"], "arguments": ""}}));
                }
                let args = format!(
                    "{}{}",
                    calls[i]["function"]["arguments"].as_str().unwrap_or(""),
                    tc["function"]["arguments"].as_str().unwrap_or("")
                );
                calls[i]["function"]["arguments"] = json!(args);
            }
        }
        let m = message(&whole, "chatcmpl-abc");
        assert_eq!(content, m["content"]);
        assert_eq!(reasoning, m["reasoning_content"]);
        assert_eq!(Value::from(calls), m["tool_calls"]);
        assert_eq!(c.calls, 2);
    }
}
