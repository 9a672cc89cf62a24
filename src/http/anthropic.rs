//! Anthropic's `POST /v1/messages`: the request shape (`system`, content
//! blocks with tool use and results, `tools`, `tool_choice`, `thinking`,
//! `max_tokens` required, `stop_sequences`), the response shape (thinking,
//! text and `tool_use` blocks), its stream of named events, and errors in
//! Anthropic's shape.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::response::sse::Event;
use serde_json::{Value, json};

use super::body::JsonBody;
use super::chat::{self, ChatPrompt, call_id};
use super::error::{AnthropicError, ApiError};
use super::generate::{self, Outcome};
use super::json::{Params, json_response, parse_object};
use super::prepare;
use super::request::{self, Generation};
use super::sse::{self, Format};
use super::state::Shared;
use super::{history, tools};
use crate::runtime::limits;
use crate::tool_calls::{Delta, Reply};

fn generation(p: &Params, st: &Shared) -> Result<Generation, ApiError> {
    p.str("model")?;
    let max_tokens = p.required("max_tokens", p.limit("max_tokens", limits::max_tokens))?;
    let sampling = request::sampling(p, &st.defaults, false)?;
    p.object("metadata")?;
    Ok(Generation {
        max_tokens,
        sampling,
        stop: request::stops(p, "stop_sequences", limits::ANTHROPIC_MAX_STOPS, false)?,
        stream: p.bool("stream")?.unwrap_or(false),
        constraint: None,
        constraint_param: None,
        special_tokens: false,
    })
}

/// `thinking` (`{"type": "enabled", "budget_tokens": N}` or `{"type":
/// "disabled"}`) as the template variables that switch reasoning on or off
/// (`enable_thinking` for Qwen3's and GLM's templates, `thinking` for
/// DeepSeek's). The budget is checked, not enforced: `max_tokens` bounds
/// reasoning and answer together.
fn thinking(p: &Params) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut kwargs = serde_json::Map::new();
    let Some(t) = p.object("thinking")? else {
        return Ok(kwargs);
    };
    let q = Params::at(t, "thinking");
    let on = match q.required("type", q.str("type"))? {
        "enabled" => {
            q.required("budget_tokens", q.limit("budget_tokens", limits::max_tokens))?;
            true
        }
        "disabled" => false,
        other => {
            return Err(ApiError::invalid(
                "thinking.type",
                format!("'thinking.type' must be \"enabled\" or \"disabled\", got {other:?}"),
            ));
        }
    };
    kwargs.insert("enable_thinking".into(), Value::from(on));
    kwargs.insert("thinking".into(), Value::from(on));
    Ok(kwargs)
}

/// Parses, checks, renders and tokenizes a messages call (on the
/// preparation threads).
fn prepare_messages(st: &Shared, body: Bytes) -> Result<(Generation, ChatPrompt), ApiError> {
    let obj = parse_object(&body)?;
    drop(body);
    let p = Params::new(&obj);
    let info = st.handle.info();
    let tools = tools::anthropic(&p)?;
    let msgs = history::anthropic(&p, info.template.dialect())?;
    let mut g = generation(&p, st)?;
    let prompt = chat::prepare(st, &msgs, tools.as_ref(), thinking(&p)?, &mut g)?;
    Ok((g, prompt))
}

/// `POST /v1/messages`.
pub async fn messages(State(st): State<Shared>, body: JsonBody) -> Result<Response, AnthropicError> {
    let (g, prompt) = prepare::run(&st, body.0?, prepare_messages).await?;
    let job = generate::start(&st.handle, g.request(prompt.ids))
        .await
        .map_err(|e| g.refusal(&e, "messages"))?;
    let parser = prompt.reading.parser();
    let mut events = Events {
        id: st.next_id("msg_"),
        model: st.model().to_string(),
        prompt_tokens: job.prompt_tokens,
        cached_tokens: job.cached_tokens,
        open: None,
        blocks: 0,
        calls: 0,
    };
    if g.stream {
        let mut head = vec![sse::named(
            "message_start",
            &json!({ "type": "message_start", "message": events.message(Vec::new(), None, 0) }),
        )];
        // Plain text goes in one block, opened at once; a reply the parser
        // splits opens its blocks as their kind changes.
        if parser.is_none() {
            head.extend(named(events.start(Block::Text)));
        }
        head.push(sse::named("ping", &json!({ "type": "ping" })));
        return Ok(sse::respond(job, head, events, parser, "messages"));
    }
    let (text, o) = job
        .collect()
        .await
        .map_err(|e| ApiError::from_request(&e, "messages"))?;
    let reply = prompt.reading.parse(&text);
    events.calls = reply.calls.len();
    let content = events.content(&reply);
    Ok(json_response(
        StatusCode::OK,
        &events.message(content, Some(&o), o.completion_tokens),
    ))
}

/// An event's name and data, before it becomes an [`Event`].
type Named = (&'static str, Value);

fn named(events: Vec<Named>) -> Vec<Event> {
    events.into_iter().map(|(n, v)| sse::named(n, &v)).collect()
}

/// The kind of text block open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
}

/// The message object and the stream's events.
struct Events {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// Prompt tokens not computed: Anthropic counts them as read from the
    /// cache, and `input_tokens` as the rest.
    cached_tokens: usize,
    /// The text block open in the stream (the last one started).
    open: Option<Block>,
    /// Blocks started so far (the next one's index).
    blocks: usize,
    calls: usize,
}

impl Events {
    fn message(&self, content: Vec<Value>, end: Option<&Outcome>, output_tokens: usize) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": end.map(|o| o.anthropic_chat_reason(self.calls)),
            "stop_sequence": end.and_then(Outcome::stop_sequence),
            "usage": {
                "input_tokens": self.prompt_tokens - self.cached_tokens.min(self.prompt_tokens),
                "cache_read_input_tokens": self.cached_tokens,
                "cache_creation_input_tokens": 0,
                "output_tokens": output_tokens,
            },
        })
    }

    fn tool_use_id(&self, index: usize) -> String {
        call_id("toolu_", &self.id, index)
    }

    /// A whole reply's blocks: the reasoning, the text, the calls (at least
    /// one block: an empty text when the reply is empty).
    fn content(&self, reply: &Reply) -> Vec<Value> {
        let mut out = Vec::new();
        if !reply.reasoning.is_empty() {
            out.push(json!({ "type": "thinking", "thinking": reply.reasoning, "signature": "" }));
        }
        if !reply.content.is_empty() {
            out.push(json!({ "type": "text", "text": reply.content }));
        }
        for (i, c) in reply.calls.iter().enumerate() {
            out.push(json!({ "type": "tool_use", "id": self.tool_use_id(i), "name": c.name, "input": c.arguments }));
        }
        if out.is_empty() {
            out.push(json!({ "type": "text", "text": "" }));
        }
        out
    }

    /// Closes the open block, if any.
    fn stop(&mut self) -> Vec<Named> {
        let Some(kind) = self.open.take() else {
            return Vec::new();
        };
        let index = self.blocks - 1;
        let mut out = Vec::new();
        if kind == Block::Thinking {
            out.push((
                "content_block_delta",
                json!({ "type": "content_block_delta", "index": index,
                         "delta": { "type": "signature_delta", "signature": "" } }),
            ));
        }
        out.push((
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": index }),
        ));
        out
    }

    /// Starts a `kind` block (closing another).
    fn start(&mut self, kind: Block) -> Vec<Named> {
        let mut out = self.stop();
        let block = match kind {
            Block::Text => json!({ "type": "text", "text": "" }),
            Block::Thinking => json!({ "type": "thinking", "thinking": "", "signature": "" }),
        };
        out.push((
            "content_block_start",
            json!({ "type": "content_block_start", "index": self.blocks, "content_block": block }),
        ));
        self.blocks += 1;
        self.open = Some(kind);
        out
    }

    /// A text or thinking delta, in a block of its kind.
    fn text(&mut self, kind: Block, text: String) -> Vec<Named> {
        let mut out = if self.open == Some(kind) {
            Vec::new()
        } else {
            self.start(kind)
        };
        let delta = match kind {
            Block::Text => json!({ "type": "text_delta", "text": text }),
            Block::Thinking => json!({ "type": "thinking_delta", "thinking": text }),
        };
        out.push((
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": self.blocks - 1, "delta": delta }),
        ));
        out
    }
}

impl Events {
    /// The events of a piece of the reply. A call is a `tool_use` block of
    /// its own: started with empty input, one `input_json_delta` with the
    /// whole input, stopped.
    fn pieces(&mut self, delta: Delta) -> Vec<Named> {
        match delta {
            Delta::Content(t) => self.text(Block::Text, t),
            Delta::Reasoning(t) => self.text(Block::Thinking, t),
            Delta::Call(c) => {
                let mut out = self.stop();
                let index = self.blocks;
                out.push((
                    "content_block_start",
                    json!({ "type": "content_block_start", "index": index, "content_block": {
                        "type": "tool_use", "id": self.tool_use_id(self.calls), "name": c.name, "input": {},
                    } }),
                ));
                out.push((
                    "content_block_delta",
                    json!({ "type": "content_block_delta", "index": index,
                             "delta": { "type": "input_json_delta", "partial_json": c.arguments_json() } }),
                ));
                out.push((
                    "content_block_stop",
                    json!({ "type": "content_block_stop", "index": index }),
                ));
                self.blocks += 1;
                self.calls += 1;
                out
            }
        }
    }

    /// The events that close a finished reply.
    fn end(&mut self, o: &Outcome) -> Vec<Named> {
        let mut out = if self.blocks == 0 {
            self.start(Block::Text)
        } else {
            Vec::new()
        };
        out.extend(self.stop());
        out.push((
            "message_delta",
            json!({
                "type": "message_delta",
                "delta": { "stop_reason": o.anthropic_chat_reason(self.calls), "stop_sequence": o.stop_sequence() },
                "usage": { "output_tokens": o.completion_tokens },
            }),
        ));
        out.push(("message_stop", json!({ "type": "message_stop" })));
        out
    }
}

impl Format for Events {
    fn delta(&mut self, delta: Delta) -> Vec<Event> {
        named(self.pieces(delta))
    }

    fn done(&mut self, o: &Outcome) -> Vec<Event> {
        named(self.end(o))
    }

    fn failed(&mut self, err: &ApiError) -> Vec<Event> {
        vec![sse::named("error", &err.anthropic_body())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::generate::StopKind;
    use crate::tool_calls::{CallSyntax, Dialect, ReplyParser, ToolSet, ToolSpec};

    const GLM: Dialect = Dialect {
        calls: Some(CallSyntax::Glm { newlines: false }),
        think: true,
    };

    /// A GLM-5 reply (its prompt opened the reasoning): reasoning, text, a call.
    const TEXT: &str = "Need the weather.</think>Let me check.<tool_call>get_weather\
        <arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>";

    fn tools() -> ToolSet {
        ToolSet::new(vec![ToolSpec {
            name: "get_weather".into(),
            description: None,
            parameters: Some(
                json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}),
            ),
        }])
    }

    fn events() -> Events {
        Events {
            id: "msg_abc".into(),
            model: "m".into(),
            prompt_tokens: 3,
            cached_tokens: 0,
            open: None,
            blocks: 0,
            calls: 0,
        }
    }

    #[test]
    fn streamed_events_add_up_to_the_message() {
        let whole = ReplyParser::parse(GLM, Some(tools()), true, TEXT);
        let e = events();
        let content = e.content(&whole);
        assert_eq!(
            content,
            vec![
                json!({"type": "thinking", "thinking": "Need the weather.", "signature": ""}),
                json!({"type": "text", "text": "Let me check."}),
                json!({"type": "tool_use", "id": "toolu_abc_0", "name": "get_weather", "input": {"city": "Oslo", "days": 2}}),
            ]
        );
        let o = Outcome {
            stop: StopKind::EndTurn,
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 30,
            prefilled: 3,
            prompt_secs: 0.0,
            predicted_secs: 0.0,
        };
        let mut e = events();
        let mut p = ReplyParser::new(GLM, Some(tools()), true);
        let mut named = Vec::new();
        for piece in TEXT.as_bytes().chunks(3) {
            for d in p.push(&String::from_utf8_lossy(piece)) {
                named.extend(e.pieces(d));
            }
        }
        for d in p.finish() {
            named.extend(e.pieces(d));
        }
        named.extend(e.end(&o));
        // Put the blocks back together from the events.
        let mut blocks: Vec<Value> = Vec::new();
        let mut json_parts: Vec<String> = Vec::new();
        for (name, v) in &named {
            assert_eq!(v["type"], *name);
            match *name {
                "content_block_start" => {
                    assert_eq!(v["index"].as_u64(), Some(blocks.len() as u64));
                    blocks.push(v["content_block"].clone());
                    json_parts.push(String::new());
                }
                "content_block_delta" => {
                    let i = v["index"].as_u64().unwrap_or(99) as usize;
                    let d = &v["delta"];
                    match d["type"].as_str() {
                        Some("text_delta") => {
                            let t = format!(
                                "{}{}",
                                blocks[i]["text"].as_str().unwrap_or(""),
                                d["text"].as_str().unwrap_or("")
                            );
                            blocks[i]["text"] = json!(t);
                        }
                        Some("thinking_delta") => {
                            let t = format!(
                                "{}{}",
                                blocks[i]["thinking"].as_str().unwrap_or(""),
                                d["thinking"].as_str().unwrap_or("")
                            );
                            blocks[i]["thinking"] = json!(t);
                        }
                        Some("signature_delta") => {}
                        Some("input_json_delta") => {
                            json_parts[i].push_str(d["partial_json"].as_str().unwrap_or(""))
                        }
                        other => panic!("delta {other:?}"),
                    }
                }
                "content_block_stop" => {
                    let i = v["index"].as_u64().unwrap_or(99) as usize;
                    if blocks[i]["type"] == "tool_use" {
                        blocks[i]["input"] = serde_json::from_str(&json_parts[i]).unwrap_or(Value::Null);
                    }
                }
                "message_delta" => assert_eq!(v["delta"]["stop_reason"], "tool_use"),
                "message_stop" => {}
                other => panic!("event {other}"),
            }
        }
        assert_eq!(blocks, content);
    }

    #[test]
    fn an_empty_reply_still_has_a_text_block() {
        let mut e = events();
        let names: Vec<&str> = e
            .end(&Outcome {
                stop: StopKind::Length,
                prompt_tokens: 1,
                cached_tokens: 0,
                completion_tokens: 1,
                prefilled: 1,
                prompt_secs: 0.0,
                predicted_secs: 0.0,
            })
            .iter()
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(
            names,
            [
                "content_block_start",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(
            e.content(&Reply::default()),
            vec![json!({"type": "text", "text": ""})]
        );
    }
}
