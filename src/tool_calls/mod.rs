//! Tool calls and reasoning in a model's reply: reading them out of the
//! generated text, in the format the model family's own chat template
//! writes them, and the grammar that forces a call.
//!
//! - [`dialect`]: the formats ([`CallSyntax`]), which one a template shows;
//! - [`stream`]: the incremental parser ([`ReplyParser`]): fed pieces of
//!   text, it emits content, reasoning and whole tool calls ([`Delta`]);
//! - [`hermes`], [`qwen_xml`], [`glm`], [`deepseek`], [`mistral`],
//!   [`minimax`]: one call block of each format; [`harmony`]: gpt-oss's messages, which carry both reasoning
//!   and calls;
//! - [`grammar`]: the Lark grammar (llguidance's dialect) that forces a
//!   call in a format, for `tool_choice` `required` or a named tool.
//!
//! A call is emitted only once it is complete and valid (a known tool, JSON
//! arguments), so a call is never invented from a malformed one: that text
//! stays content. A streamed reply therefore gets each call whole, and the
//! streamed pieces add up to the reply parsed at once.

pub mod deepseek;
pub mod dialect;
pub mod glm;
pub mod grammar;
pub mod harmony;
pub mod hermes;
pub mod minimax;
pub mod mistral;
pub mod qwen_xml;
pub mod stream;
mod text;

pub use dialect::{CallSyntax, Dialect, THINK_CLOSE, THINK_OPEN};
pub use stream::ReplyParser;

use serde_json::Value;

/// A tool the request offers: its name, and the JSON schema of its
/// arguments (an object schema; `None`: no declared parameters).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
}

impl ToolSpec {
    /// The declared schema of argument `key`, if the parameters name it.
    pub fn property(&self, key: &str) -> Option<&Value> {
        self.parameters.as_ref()?.get("properties")?.get(key)
    }

    /// The arguments' schema, an empty object schema when none is declared.
    pub fn parameters_schema(&self) -> Value {
        self.parameters
            .clone()
            .unwrap_or_else(|| serde_json::json!({"type": "object"}))
    }
}

/// The tools a reply may call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolSet {
    pub tools: Vec<ToolSpec>,
}

impl ToolSet {
    pub fn new(tools: Vec<ToolSpec>) -> Self {
        Self { tools }
    }

    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|t| t.name == name)
    }
}

/// One call the model made: a tool's name and its arguments (a JSON object).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Value,
}

impl ToolCall {
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub fn arguments_json(&self) -> String {
        self.arguments.to_string()
    }
}

/// A piece of a parsed reply, in reply order.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// Text of the answer.
    Content(String),
    /// Text of the reasoning.
    Reasoning(String),
    /// A whole tool call.
    Call(ToolCall),
}

/// A whole reply, put together from its deltas.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
}

impl Reply {
    pub fn add(&mut self, d: Delta) {
        match d {
            Delta::Content(t) => self.content.push_str(&t),
            Delta::Reasoning(t) => self.reasoning.push_str(&t),
            Delta::Call(c) => self.calls.push(c),
        }
    }

    pub fn from_deltas(deltas: impl IntoIterator<Item = Delta>) -> Self {
        let mut r = Reply::default();
        for d in deltas {
            r.add(d);
        }
        r
    }
}

/// The JSON value that follows `open` at the start of `buf` (after
/// whitespace), when it begins with one of `starts`: the value and the
/// bytes of `buf` up to its end; else how the block stands (a value the
/// buffer cuts off is pending until the reply ends).
pub(crate) fn json_after(
    buf: &str,
    open: &str,
    at_end: bool,
    starts: &[char],
) -> Result<(Value, usize), Block> {
    let body = &buf[open.len()..];
    let json = body.trim_start();
    let lead = open.len() + body.len() - json.len();
    if json.is_empty() {
        return Err(if at_end { Block::Bad } else { Block::Pending });
    }
    if !json.starts_with(starts) {
        return Err(Block::Bad);
    }
    let mut values = serde_json::Deserializer::from_str(json).into_iter::<Value>();
    match values.next() {
        Some(Ok(v)) => Ok((v, lead + values.byte_offset())),
        Some(Err(e)) if e.is_eof() && !at_end => Err(Block::Pending),
        _ => Err(Block::Bad),
    }
}

/// A call from a decoded JSON object `{"name": N, "arguments": {...}}`
/// (`parameters` is taken for `arguments`; the arguments may also be JSON
/// text holding an object). `None` when it is not one, or `N` is not offered.
pub(crate) fn call_of_json(v: &Value, tools: &ToolSet) -> Option<ToolCall> {
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?;
    tools.get(name)?;
    let arguments = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(a @ Value::Object(_)) => a.clone(),
        Some(Value::String(s)) => arguments_of_text(s)?,
        Some(_) => return None,
    };
    Some(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

/// Arguments written as JSON text: an object, or nothing at all (`{}`).
pub(crate) fn arguments_of_text(s: &str) -> Option<Value> {
    if s.trim().is_empty() {
        return Some(Value::Object(Default::default()));
    }
    match serde_json::from_str::<Value>(s) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

/// `raw` as the value of argument `key` of `tool`, for the formats that
/// write each argument as text (GLM's, Qwen3.5's XML, MiniMax-M2's): their
/// templates write a string as it is and anything else through `tojson`,
/// so a `string` parameter stays text, a number, boolean, object or array
/// parameter is JSON, and text that does not parse as the declared type
/// stays text (as does the value of a parameter the schema does not name).
pub(crate) fn typed(raw: &str, tool: &ToolSpec, key: &str) -> Value {
    let text = || Value::String(raw.to_string());
    let Some(schema) = tool.property(key) else {
        return text();
    };
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if types == ["string"] {
        return text();
    }
    match serde_json::from_str::<Value>(raw) {
        // A string parameter that may also be something else keeps the text
        // unless it parsed as one of its other types.
        Ok(Value::String(_)) if types.contains(&"string") => text(),
        Ok(v) if types.is_empty() || types.iter().any(|t| is_type(&v, t)) => v,
        _ => text(),
    }
}

/// Whether `v` is of JSON schema type `t`.
fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|x| x.fract() == 0.0),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => false,
    }
}

/// What a call block scan found (`buf` starts at the block's opening marker).
#[derive(Debug, PartialEq)]
pub(crate) enum Block {
    /// The block may still complete: more text is needed.
    Pending,
    /// Complete: these calls, written in the first `len` bytes.
    Done { calls: Vec<ToolCall>, len: usize },
    /// Not a valid call: the opening marker is content.
    Bad,
}
