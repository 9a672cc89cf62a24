//! Qwen3's (Hermes') call block: `<tool_call>`, a JSON object
//! `{"name": N, "arguments": {...}}`, `</tool_call>`. Qwen3's template
//! writes `<tool_call>\n{"name": "N", "arguments": ARGS}\n</tool_call>`,
//! ARGS as the client gave it when a string, else through `tojson`.

use super::{Block, ToolSet, call_of_json, json_after};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// The block at the start of `buf` (which starts with [`OPEN`]). A block
/// the reply's end leaves unclosed still counts when its JSON is whole.
pub(crate) fn scan(buf: &str, at_end: bool, tools: &ToolSet) -> Block {
    let (value, end) = match json_after(buf, OPEN, at_end, &['{']) {
        Ok(v) => v,
        Err(b) => return b,
    };
    let after = &buf[end..];
    let rest = after.trim_start();
    let used = end + (after.len() - rest.len());
    let len = if rest.starts_with(CLOSE) {
        used + CLOSE.len()
    } else if rest.is_empty() && at_end {
        used
    } else if !at_end && CLOSE.starts_with(rest) {
        return Block::Pending;
    } else {
        return Block::Bad;
    };
    match call_of_json(&value, tools) {
        Some(call) => Block::Done {
            calls: vec![call],
            len,
        },
        None => Block::Bad,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::{ToolCall, ToolSpec};
    use serde_json::json;

    fn tools() -> ToolSet {
        ToolSet::new(vec![ToolSpec {
            name: "get_weather".into(),
            description: None,
            parameters: None,
        }])
    }

    #[test]
    fn a_block_is_whole_pending_or_bad() {
        let t = tools();
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>rest";
        let done = scan(text, false, &t);
        assert_eq!(
            done,
            Block::Done {
                calls: vec![ToolCall {
                    name: "get_weather".into(),
                    arguments: json!({"city": "Paris"})
                }],
                len: text.len() - 4
            }
        );
        for cut in [12, 30, text.len() - 8] {
            assert_eq!(scan(&text[..cut], false, &t), Block::Pending, "{cut}");
        }
        assert_eq!(
            scan("<tool_call>\n{\"name\": \"get_weather\"", true, &t),
            Block::Bad
        );
        assert_eq!(scan("<tool_call> is a tag", false, &t), Block::Bad);
        // An unknown tool is no call.
        assert_eq!(
            scan(
                "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>",
                false,
                &t
            ),
            Block::Bad
        );
        // Arguments as JSON text, and a block the end leaves open.
        let open = "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"a\\\": 1}\"}";
        assert!(matches!(scan(open, true, &t), Block::Done { len, .. } if len == open.len()));
        assert_eq!(scan(open, false, &t), Block::Pending);
        assert_eq!(
            scan(
                "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}} trailing",
                false,
                &t
            ),
            Block::Bad
        );
    }
}
