//! DeepSeek's call block: `<｜tool▁calls▁begin｜>`, one or more
//! `<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`, `<｜tool▁calls▁end｜>`.
//! A call is `TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```` in DeepSeek-V3's
//! template (TYPE is `function`) and `NAME<｜tool▁sep｜>ARGS` in V3.1's;
//! both are read whatever the template.

use super::{Block, ToolCall, ToolSet, arguments_of_text};

pub const OPEN: &str = "<｜tool▁calls▁begin｜>";
pub const CLOSE: &str = "<｜tool▁calls▁end｜>";
pub const CALL_OPEN: &str = "<｜tool▁call▁begin｜>";
pub const CALL_CLOSE: &str = "<｜tool▁call▁end｜>";
pub const SEP: &str = "<｜tool▁sep｜>";

/// The block at the start of `buf` (which starts with [`OPEN`]). At the
/// reply's end, calls without the closing marker still count.
pub(crate) fn scan(buf: &str, at_end: bool, tools: &ToolSet) -> Block {
    let mut calls = Vec::new();
    let mut at = OPEN.len();
    loop {
        let rest = buf[at..].trim_start();
        at = buf.len() - rest.len();
        if rest.starts_with(CLOSE) {
            return done(calls, at + CLOSE.len());
        }
        if let Some(body) = rest.strip_prefix(CALL_OPEN) {
            let Some(end) = body.find(CALL_CLOSE) else {
                return if at_end { Block::Bad } else { Block::Pending };
            };
            match call(&body[..end], tools) {
                Some(c) => calls.push(c),
                None => return Block::Bad,
            }
            at += CALL_OPEN.len() + end + CALL_CLOSE.len();
            continue;
        }
        if at_end {
            return if rest.is_empty() {
                done(calls, at)
            } else {
                Block::Bad
            };
        }
        if CLOSE.starts_with(rest) || CALL_OPEN.starts_with(rest) {
            return Block::Pending;
        }
        return Block::Bad;
    }
}

fn done(calls: Vec<ToolCall>, len: usize) -> Block {
    if calls.is_empty() {
        Block::Bad
    } else {
        Block::Done { calls, len }
    }
}

/// One call's text between its markers.
fn call(body: &str, tools: &ToolSet) -> Option<ToolCall> {
    let (before, after) = body.split_once(SEP)?;
    let (name, args) = match after.find("```") {
        // V3: the name on the separator's line, then a fenced JSON block.
        Some(fence) => {
            let name = after[..fence].trim();
            let block = &after[fence + 3..];
            let block = block.strip_prefix("json").unwrap_or(block);
            let end = block.rfind("```")?;
            if !block[end + 3..].trim().is_empty() {
                return None;
            }
            (name, &block[..end])
        }
        None => (before.trim(), after),
    };
    tools.get(name)?;
    Some(ToolCall {
        name: name.to_string(),
        arguments: arguments_of_text(args)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::ToolSpec;
    use serde_json::json;

    fn tools() -> ToolSet {
        let t = |n: &str| ToolSpec {
            name: n.into(),
            description: None,
            parameters: None,
        };
        ToolSet::new(vec![t("get_weather"), t("time")])
    }

    #[test]
    fn both_versions_are_read() {
        let v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n\
                  {\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>time\n\
                  ```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let Block::Done { calls, len } = scan(v3, false, &tools()) else {
            panic!("v3")
        };
        assert_eq!(len, v3.len());
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, json!({"city": "Oslo"}));
        let v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>time<｜tool▁sep｜>{\"tz\": \"UTC\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let Block::Done { calls, .. } = scan(v31, false, &tools()) else {
            panic!("v3.1")
        };
        assert_eq!(calls[0].name, "time");
        assert_eq!(calls[0].arguments, json!({"tz": "UTC"}));
        // Unfinished, then broken.
        let cut = |n: usize| {
            let mut at = v31.len() - n;
            while !v31.is_char_boundary(at) {
                at -= 1;
            }
            &v31[..at]
        };
        assert_eq!(scan(cut(10), false, &tools()), Block::Pending);
        assert_eq!(scan(cut(30), true, &tools()), Block::Bad);
        assert!(matches!(
            scan(&v31[..v31.len() - CLOSE.len()], true, &tools()),
            Block::Done { .. }
        ));
        assert_eq!(scan("<｜tool▁calls▁begin｜>oops", false, &tools()), Block::Bad);
    }
}
