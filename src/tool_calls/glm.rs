//! GLM's call block (GLM-4.5 to 4.7, GLM-5): `<tool_call>NAME`, then per
//! argument `<arg_key>K</arg_key><arg_value>V</arg_value>`, then
//! `</tool_call>`; GLM-4.5/4.6 put newlines between the parts. The
//! templates write a string value as it is and any other through `tojson`,
//! so a value is read back by the tool's declared schema ([`super::typed`]).

use serde_json::Value;

use super::{Block, ToolCall, ToolSet, typed};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";
pub const KEY_OPEN: &str = "<arg_key>";
pub const KEY_CLOSE: &str = "</arg_key>";
pub const VALUE_OPEN: &str = "<arg_value>";
pub const VALUE_CLOSE: &str = "</arg_value>";

/// Longest name we wait for before deciding `<tool_call>` was prose.
const MAX_NAME: usize = 256;

/// The block at the start of `buf` (which starts with [`OPEN`]).
pub(crate) fn scan(buf: &str, at_end: bool, tools: &ToolSet) -> Block {
    let body = &buf[OPEN.len()..];
    let (inner, len) = match body.find(CLOSE) {
        Some(j) => (&body[..j], OPEN.len() + j + CLOSE.len()),
        None if at_end => (body, buf.len()),
        None => {
            // A name is one word up to its first tag; anything else is prose.
            let head = &body[..body.find('<').unwrap_or(body.len())];
            let word = head.trim();
            let bad = head.len() > MAX_NAME
                || word.contains(char::is_whitespace)
                || (body.contains('<') && word.is_empty());
            return if bad { Block::Bad } else { Block::Pending };
        }
    };
    match parse(inner, tools) {
        Some(call) => Block::Done {
            calls: vec![call],
            len,
        },
        None => Block::Bad,
    }
}

/// `NAME` and its `<arg_key>`/`<arg_value>` pairs.
fn parse(inner: &str, tools: &ToolSet) -> Option<ToolCall> {
    let name_end = inner.find(KEY_OPEN).unwrap_or(inner.len());
    let name = inner[..name_end].trim();
    if name.is_empty() || name.contains(char::is_whitespace) || name.contains('<') {
        return None;
    }
    let tool = tools.get(name)?;
    let mut args = serde_json::Map::new();
    let mut rest = &inner[name_end..];
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let after_key = rest.strip_prefix(KEY_OPEN)?;
        let key_end = after_key.find(KEY_CLOSE)?;
        let key = after_key[..key_end].trim();
        let after = after_key[key_end + KEY_CLOSE.len()..].trim_start();
        let after_value = after.strip_prefix(VALUE_OPEN)?;
        let value_end = after_value.find(VALUE_CLOSE)?;
        let raw = &after_value[..value_end];
        args.insert(key.to_string(), typed(raw, tool, key));
        rest = &after_value[value_end + VALUE_CLOSE.len()..];
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments: Value::Object(args),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::ToolSpec;
    use serde_json::json;

    fn tools() -> ToolSet {
        ToolSet::new(vec![ToolSpec {
            name: "search".into(),
            description: None,
            parameters: Some(json!({"type": "object", "properties": {
                "query": {"type": "string"}, "limit": {"type": "integer"},
                "exact": {"type": "boolean"}, "tags": {"type": "array"},
                "when": {"type": ["string", "null"]}, "any": {}
            }})),
        }])
    }

    #[test]
    fn values_follow_the_schema() {
        let text = "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>42</arg_value>\n\
                    <arg_key>limit</arg_key>\n<arg_value>5</arg_value>\n<arg_key>exact</arg_key>\n\
                    <arg_value>true</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>[\"a\", 1]</arg_value>\n\
                    <arg_key>when</arg_key>\n<arg_value>null</arg_value>\n<arg_key>any</arg_key>\n\
                    <arg_value>{\"k\": 1}</arg_value>\n<arg_key>extra</arg_key>\n<arg_value>7</arg_value>\n</tool_call>";
        let Block::Done { calls, len } = scan(text, false, &tools()) else {
            panic!("not done")
        };
        assert_eq!(len, text.len());
        assert_eq!(
            calls[0].arguments,
            json!({"query": "42", "limit": 5, "exact": true, "tags": ["a", 1],
                   "when": null, "any": {"k": 1}, "extra": "7"})
        );
        // A number parameter with text that is no number stays text.
        let compact = "<tool_call>search<arg_key>limit</arg_key><arg_value>many</arg_value></tool_call>";
        let Block::Done { calls, .. } = scan(compact, false, &tools()) else {
            panic!("not done")
        };
        assert_eq!(calls[0].arguments, json!({"limit": "many"}));
    }

    #[test]
    fn prose_and_broken_blocks_are_not_calls() {
        let t = tools();
        assert_eq!(scan("<tool_call>search\n<arg_key>q", false, &t), Block::Pending);
        assert_eq!(scan("<tool_call>search\n<arg_key>q", true, &t), Block::Bad);
        assert_eq!(scan("<tool_call> tags are XML", false, &t), Block::Bad);
        assert_eq!(scan("<tool_call>nope</tool_call>", false, &t), Block::Bad);
        assert_eq!(
            scan("<tool_call>search<arg_value>x</arg_value></tool_call>", false, &t),
            Block::Bad
        );
        assert!(matches!(
            scan("<tool_call>search</tool_call>", false, &t),
            Block::Done { .. }
        ));
    }
}
