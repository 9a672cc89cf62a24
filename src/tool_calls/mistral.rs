//! Mistral's and Mixtral's calls: `[TOOL_CALLS]`, then a JSON array of
//! `{"name": N, "arguments": {...}}` objects (the templates also write the
//! call's `id`, which the model does not need to repeat).

use serde_json::Value;

use super::{Block, ToolSet, call_of_json, json_after};

pub const OPEN: &str = "[TOOL_CALLS]";

/// The block at the start of `buf` (which starts with [`OPEN`]).
pub(crate) fn scan(buf: &str, at_end: bool, tools: &ToolSet) -> Block {
    let (value, end) = match json_after(buf, OPEN, at_end, &['[', '{']) {
        Ok(v) => v,
        Err(b) => return b,
    };
    let items = match value {
        Value::Array(items) => items,
        one @ Value::Object(_) => vec![one],
        _ => return Block::Bad,
    };
    let calls: Option<Vec<_>> = items.iter().map(|v| call_of_json(v, tools)).collect();
    match calls {
        Some(calls) if !calls.is_empty() => Block::Done { calls, len: end },
        _ => Block::Bad,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::ToolSpec;
    use serde_json::json;

    #[test]
    fn an_array_of_calls() {
        let tools = ToolSet::new(vec![ToolSpec {
            name: "f".into(),
            description: None,
            parameters: None,
        }]);
        let text = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": 1}, \"id\": \"abcdefghi\"}, \
                    {\"name\": \"f\", \"arguments\": \"{}\"}] after";
        let Block::Done { calls, len } = scan(text, false, &tools) else {
            panic!("not done")
        };
        assert_eq!(&text[len..], " after");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, json!({"x": 1}));
        assert_eq!(calls[1].arguments, json!({}));
        assert_eq!(scan(&text[..30], false, &tools), Block::Pending);
        assert_eq!(scan(&text[..30], true, &tools), Block::Bad);
        assert_eq!(scan("[TOOL_CALLS] []", false, &tools), Block::Bad);
        assert_eq!(scan("[TOOL_CALLS] hello", false, &tools), Block::Bad);
    }
}
