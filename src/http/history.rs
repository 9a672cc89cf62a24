//! A chat request's conversation as the chat template gets it: OpenAI's
//! messages (assistant `tool_calls`, `tool` results, `reasoning_content`)
//! and Anthropic's content blocks (`tool_use`, `tool_result`, `thinking`)
//! become [`ChatMessage`]s, each call's arguments and id in the form the
//! model's template wants ([`MessageToolCall::function`]).

use serde_json::Value;

use super::error::ApiError;
use super::json::Params;
use super::request;
use crate::chat_template::{ChatMessage, MessageToolCall};
use crate::tool_calls::{Dialect, arguments_of_text};

/// The list under `messages`, non-empty.
fn message_list<'a>(p: &Params<'a>) -> Result<&'a Vec<Value>, ApiError> {
    let list = p.required("messages", p.array("messages"))?;
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "'messages' must hold at least one message",
        ));
    }
    Ok(list)
}

fn object_at<'a>(v: &'a Value, at: &str) -> Result<&'a serde_json::Map<String, Value>, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::invalid(at, format!("'{at}' must be an object")))
}

/// A tool result must answer a call made earlier in the conversation.
fn answers_a_call(id: &str, calls: &[String], at: &str) -> Result<(), ApiError> {
    if calls.iter().any(|c| c == id) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            at,
            format!("'{at}' is {id:?}, which no earlier assistant tool call has as its id"),
        ))
    }
}

/// OpenAI's `messages`.
pub fn openai(p: &Params, dialect: Dialect) -> Result<Vec<ChatMessage>, ApiError> {
    let list = message_list(p)?;
    let mut out = Vec::with_capacity(list.len());
    let mut call_ids: Vec<String> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let path = format!("messages[{i}]");
        let mp = Params::at(object_at(m, &path)?, &path);
        let role = match mp.required("role", mp.str("role"))? {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(ApiError::invalid(
                    &mp.name("role"),
                    format!("role {other:?} is not supported (system, developer, user, assistant, tool)"),
                ));
            }
        };
        let content = match (mp.has("content"), role) {
            // An assistant turn that only called tools has no content.
            (false, "assistant") => String::new(),
            _ => request::content_text(&mp, "content", true)?,
        };
        let mut msg = ChatMessage::new(role, &content);
        msg.name = mp.str("name")?.map(str::to_string);
        if role == "assistant" {
            if let Some(r) = mp.str("reasoning_content")?.or(mp.str("reasoning")?) {
                msg = msg.with_reasoning(r);
            }
            for (j, c) in mp
                .array("tool_calls")?
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .enumerate()
            {
                let at = format!("{path}.tool_calls[{j}]");
                let cp = Params::at(object_at(c, &at)?, &at);
                if let Some(t) = cp.str("type")?
                    && t != "function"
                {
                    let at = cp.name("type");
                    return Err(ApiError::invalid(
                        &at,
                        format!("'{at}' must be \"function\", got {t:?}"),
                    ));
                }
                let id = cp.required("id", cp.str("id"))?;
                let f = cp.required("function", cp.object("function"))?;
                let fat = cp.name("function");
                let fp = Params::at(f, &fat);
                let name = fp.required("name", fp.str("name"))?;
                let text = fp.str("arguments")?.unwrap_or("");
                let arguments = arguments_of_text(text).ok_or_else(|| {
                    let at = fp.name("arguments");
                    ApiError::invalid(&at, format!("'{at}' must be a JSON object written as a string"))
                })?;
                msg.tool_calls.push(MessageToolCall::function(
                    id,
                    name,
                    arguments,
                    Some(text),
                    dialect,
                ));
                call_ids.push(id.to_string());
            }
        } else if mp.has("tool_calls") {
            let at = mp.name("tool_calls");
            return Err(ApiError::invalid(
                &at,
                format!("'{at}': only assistant messages have tool calls"),
            ));
        }
        if role == "tool" {
            let id = mp.required("tool_call_id", mp.str("tool_call_id"))?;
            answers_a_call(id, &call_ids, &mp.name("tool_call_id"))?;
            msg.tool_call_id = Some(dialect.template_call_id(id));
        }
        out.push(msg);
    }
    Ok(out)
}

/// What an Anthropic message's content blocks hold.
#[derive(Default)]
struct Blocks {
    texts: Vec<String>,
    thinking: Vec<String>,
    calls: Vec<MessageToolCall>,
    /// `(tool_use_id, content)` of `tool_result` blocks.
    results: Vec<(String, String)>,
}

fn blocks(mp: &Params, role: &str, dialect: Dialect, call_ids: &mut Vec<String>) -> Result<Blocks, ApiError> {
    let mut b = Blocks::default();
    let list = match mp.get("content") {
        Some(Value::Array(list)) => list,
        _ => {
            b.texts.push(request::content_text(mp, "content", true)?);
            return Ok(b);
        }
    };
    let full = mp.name("content");
    for (j, block) in list.iter().enumerate() {
        let at = format!("{full}[{j}]");
        let q = Params::at(object_at(block, &at)?, &at);
        let kind = q.required("type", q.str("type"))?;
        let only = |want: &str| {
            if role == want {
                Ok(())
            } else {
                let at = q.name("type");
                Err(ApiError::invalid(
                    &at,
                    format!("'{at}': {kind} blocks belong in {want} messages"),
                ))
            }
        };
        match kind {
            "text" => b.texts.push(q.required("text", q.str("text"))?.to_string()),
            "thinking" => {
                only("assistant")?;
                b.thinking
                    .push(q.required("thinking", q.str("thinking"))?.to_string());
            }
            "redacted_thinking" => only("assistant")?,
            "tool_use" => {
                only("assistant")?;
                let id = q.required("id", q.str("id"))?;
                let name = q.required("name", q.str("name"))?;
                let input = q.required("input", q.object("input"))?;
                b.calls.push(MessageToolCall::function(
                    id,
                    name,
                    Value::Object(input.clone()),
                    None,
                    dialect,
                ));
                call_ids.push(id.to_string());
            }
            "tool_result" => {
                only("user")?;
                let id = q.required("tool_use_id", q.str("tool_use_id"))?;
                answers_a_call(id, call_ids, &q.name("tool_use_id"))?;
                let content = request::content_text(&q, "content", false)?;
                b.results.push((dialect.template_call_id(id), content));
            }
            other => {
                let at = q.name("type");
                return Err(ApiError::invalid(
                    &at,
                    format!(
                        "'{at}': content of type {other:?} is not supported \
                         (text, tool_use, tool_result, thinking)"
                    ),
                ));
            }
        }
    }
    Ok(b)
}

/// Anthropic's `system` and `messages`. A user message's `tool_result`
/// blocks become `tool` messages ahead of its text.
pub fn anthropic(p: &Params, dialect: Dialect) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::new();
    if p.has("system") {
        let system = request::content_text(p, "system", false)?;
        out.push(ChatMessage::system(&system));
    }
    let list = message_list(p)?;
    let mut call_ids = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let path = format!("messages[{i}]");
        let mp = Params::at(object_at(m, &path)?, &path);
        let role = match mp.required("role", mp.str("role"))? {
            r @ ("user" | "assistant") => r,
            other => {
                return Err(ApiError::invalid(
                    &mp.name("role"),
                    format!("role {other:?} is not supported (user, assistant)"),
                ));
            }
        };
        let b = blocks(&mp, role, dialect, &mut call_ids)?;
        let has_results = !b.results.is_empty();
        for (id, content) in b.results {
            out.push(ChatMessage::tool(&id, &content));
        }
        if role == "user" && has_results && b.texts.is_empty() {
            continue;
        }
        let mut msg = ChatMessage::new(role, &b.texts.join("\n"));
        if !b.thinking.is_empty() {
            msg = msg.with_reasoning(&b.thinking.join("\n"));
        }
        msg.tool_calls = b.calls;
        out.push(msg);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::CallSyntax;
    use serde_json::json;

    use crate::http::json::object_of as obj;

    const HERMES: Dialect = Dialect {
        calls: Some(CallSyntax::Hermes),
        think: true,
    };

    #[test]
    fn openai_calls_and_results() {
        let m = obj(json!({"messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "reasoning_content": "Check.",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
        ]}));
        let msgs = openai(&Params::new(&m), HERMES).unwrap();
        assert_eq!(msgs[1].tool_calls[0].function.arguments, json!({"city": "Oslo"}));
        assert_eq!(msgs[1].reasoning_content.as_deref(), Some("Check."));
        assert_eq!(msgs[2], ChatMessage::tool("call_1", "sunny"));
        // DeepSeek's templates get the arguments as the client wrote them.
        let ds = Dialect {
            calls: Some(CallSyntax::DeepSeek { fenced: true }),
            think: true,
        };
        let msgs = openai(&Params::new(&m), ds).unwrap();
        assert_eq!(
            msgs[1].tool_calls[0].function.arguments,
            json!("{\"city\": \"Oslo\"}")
        );
    }

    #[test]
    fn openai_refusals_name_the_parameter() {
        let call = json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}});
        let cases = [
            (
                json!([{"role": "tool", "content": "x"}]),
                "messages[0].tool_call_id",
            ),
            (
                json!([{"role": "tool", "content": "x", "tool_call_id": "c"}]),
                "messages[0].tool_call_id",
            ),
            (
                json!([{"role": "tool", "tool_call_id": "c"}]),
                "messages[0].content",
            ),
            (
                json!([{"role": "user", "content": "x", "tool_calls": [call]}]),
                "messages[0].tool_calls",
            ),
            (
                json!([{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]),
                "messages[0].tool_calls[0].id",
            ),
            (
                json!([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[1]"}}]}]),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                json!([{"role": "assistant", "tool_calls": [{"id": "c", "type": "code", "function": {"name": "f"}}]}]),
                "messages[0].tool_calls[0].type",
            ),
            (json!([{"role": "function", "content": "x"}]), "messages[0].role"),
        ];
        for (messages, param) in cases {
            let m = obj(json!({ "messages": messages }));
            let e = openai(&Params::new(&m), HERMES).err();
            assert_eq!(e.and_then(|e| e.param), Some(param.to_string()), "{messages}");
        }
    }

    #[test]
    fn anthropic_blocks() {
        let m = obj(json!({"system": "S", "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Check.", "signature": ""},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "And tomorrow?"}]},
        ]}));
        let msgs = anthropic(&Params::new(&m), HERMES).unwrap();
        let roles: Vec<&str> = msgs.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(msgs[2].content, "Looking.");
        assert_eq!(msgs[2].thinking.as_deref(), Some("Check."));
        assert_eq!(msgs[2].tool_calls[0].function.name, "get_weather");
        assert_eq!(msgs[3], ChatMessage::tool("toolu_1", "sunny"));
        assert_eq!(msgs[4].content, "And tomorrow?");
        let cases = [
            (
                json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]),
                "messages[0].content[0].tool_use_id",
            ),
            (
                json!([{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]),
                "messages[0].content[0].type",
            ),
            (
                json!([{"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "f"}]}]),
                "messages[0].content[0].input",
            ),
            (
                json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
                "messages[0].content[0].type",
            ),
        ];
        for (messages, param) in cases {
            let m = obj(json!({ "messages": messages }));
            let e = anthropic(&Params::new(&m), HERMES).err();
            assert_eq!(e.and_then(|e| e.param), Some(param.to_string()), "{messages}");
        }
    }
}
