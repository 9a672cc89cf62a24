//! The XML call block of Qwen3-Coder and Qwen3.5 / 3.6:
//! `<tool_call>\n<function=NAME>\n`, then per argument
//! `<parameter=K>\nV\n</parameter>\n`, then `</function>\n</tool_call>`.
//! The templates write a string value as it is and any other through
//! `tojson`, so a value is read back by the tool's declared schema, as
//! GLM's are ([`super::typed`]); the newline after the opening tag and
//! the one before the closing tag are the template's, not the value's.

use serde_json::Value;

use super::{Block, ToolCall, ToolSet, typed};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";
pub const FUNCTION_OPEN: &str = "<function=";
pub const FUNCTION_CLOSE: &str = "</function>";
pub const PARAM_OPEN: &str = "<parameter=";
pub const PARAM_CLOSE: &str = "</parameter>";

/// Longest name (of a function or a parameter) we wait for before deciding
/// the block is prose.
const MAX_NAME: usize = 256;

/// The block at the start of `buf` (which starts with [`OPEN`]). A block
/// the reply's end leaves unclosed still counts when its function is closed.
pub(crate) fn scan(buf: &str, at_end: bool, tools: &ToolSet) -> Block {
    let body = &buf[OPEN.len()..];
    let (inner, len) = match body.find(CLOSE) {
        Some(j) => (&body[..j], OPEN.len() + j + CLOSE.len()),
        None if at_end => (body, buf.len()),
        None => {
            return if could_open(body) {
                Block::Pending
            } else {
                Block::Bad
            };
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

/// Whether an unfinished block can still become a call: whitespace, then
/// `<function=` (or the start of it), then a name not longer than the bound.
fn could_open(body: &str) -> bool {
    let rest = body.trim_start();
    if rest.len() < FUNCTION_OPEN.len() {
        return FUNCTION_OPEN.starts_with(rest);
    }
    let Some(after) = rest.strip_prefix(FUNCTION_OPEN) else {
        return false;
    };
    match after.find('>') {
        Some(end) => end <= MAX_NAME,
        None => after.len() <= MAX_NAME && !after.contains(char::is_whitespace),
    }
}

/// `<function=NAME>`, its parameters, `</function>`.
fn parse(inner: &str, tools: &ToolSet) -> Option<ToolCall> {
    let rest = inner.trim_start().strip_prefix(FUNCTION_OPEN)?;
    let name_end = rest.find('>')?;
    let name = rest[..name_end].trim();
    if name.is_empty() || name.contains(char::is_whitespace) || name.contains('<') {
        return None;
    }
    let tool = tools.get(name)?;
    let mut rest = &rest[name_end + 1..];
    let mut args = serde_json::Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(FUNCTION_CLOSE) {
            if !after.trim().is_empty() {
                return None;
            }
            break;
        }
        let after_open = rest.strip_prefix(PARAM_OPEN)?;
        let key_end = after_open.find('>')?;
        let key = after_open[..key_end].trim();
        if key.is_empty() || key.contains('<') {
            return None;
        }
        let after_key = &after_open[key_end + 1..];
        let value_end = after_key.find(PARAM_CLOSE)?;
        let raw = &after_key[..value_end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        args.insert(key.to_string(), typed(raw, tool, key));
        rest = &after_key[value_end + PARAM_CLOSE.len()..];
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
            name: "get_weather".into(),
            description: None,
            parameters: Some(json!({
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                               "units": {"type": ["string", "null"]}, "opts": {"type": "object"}},
                "required": ["city"]
            })),
        }])
    }

    /// As Qwen3.5's template renders a call.
    const BLOCK: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n</function>\n</tool_call>";

    #[test]
    fn a_rendered_block_reads_back_with_typed_values() {
        let Block::Done { calls, len } = scan(BLOCK, false, &tools()) else {
            panic!("not read")
        };
        assert_eq!(len, BLOCK.len());
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            calls[0].arguments,
            json!({"city": "New York", "days": 3, "opts": {"a": [1, 2]}})
        );
    }

    #[test]
    fn a_value_keeps_its_inner_newlines_and_a_string_stays_text() {
        let b = "<tool_call>\n<function=get_weather>\n<parameter=city>\nline one\nline two\n</parameter>\n<parameter=units>\n42\n</parameter>\n</function>\n</tool_call>";
        let Block::Done { calls, .. } = scan(b, false, &tools()) else {
            panic!("not read")
        };
        assert_eq!(
            calls[0].arguments,
            json!({"city": "line one\nline two", "units": "42"})
        );
    }

    #[test]
    fn every_prefix_waits_and_the_reply_end_takes_an_unclosed_block() {
        for cut in 1..BLOCK.len() {
            if !BLOCK.is_char_boundary(cut) || cut < OPEN.len() {
                continue;
            }
            assert!(
                matches!(scan(&BLOCK[..cut], false, &tools()), Block::Pending),
                "{:?}",
                &BLOCK[..cut]
            );
        }
        let unclosed = &BLOCK[..BLOCK.len() - CLOSE.len()];
        assert!(matches!(scan(unclosed, true, &tools()), Block::Done { .. }));
    }

    #[test]
    fn unknown_tools_prose_and_broken_blocks_are_not_calls() {
        for b in [
            "<tool_call>\n<function=nope>\n</function>\n</tool_call>",
            "<tool_call> is how I call tools</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
        ] {
            assert!(matches!(scan(b, true, &tools()), Block::Bad), "{b:?}");
        }
        assert!(matches!(scan("<tool_call> is how", false, &tools()), Block::Bad));
    }
}
