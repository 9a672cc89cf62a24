//! MiniMax-M2's call block: `<minimax:tool_call>\n`, then per call
//! `<invoke name="NAME">\n`, per argument
//! `<parameter name="K">V</parameter>\n`, `</invoke>\n`, and after the last
//! call `</minimax:tool_call>`. Several `<invoke>`s in one block are
//! parallel calls. The template writes a string value as it is and any
//! other through `tojson`, so a value is read back by the tool's declared
//! schema ([`super::typed`]); a value is the exact text between its tags.
//!
//! A name is read in double quotes as the template writes it, in single
//! quotes, or bare up to the `>`. A block is the calls only when every
//! `<invoke>` in it is a complete call of an offered tool; else the whole
//! block is content.

use serde_json::Value;

use super::{Block, ToolCall, ToolSet, typed};

pub const OPEN: &str = "<minimax:tool_call>";
pub const CLOSE: &str = "</minimax:tool_call>";
pub const INVOKE_OPEN: &str = "<invoke name=";
pub const INVOKE_CLOSE: &str = "</invoke>";
pub const PARAM_OPEN: &str = "<parameter name=";
pub const PARAM_CLOSE: &str = "</parameter>";

/// Longest name (of a tool or a parameter) we wait for before deciding
/// the block is prose.
const MAX_NAME: usize = 256;

/// How far a piece of a block got.
#[derive(Debug, PartialEq)]
enum Step<T> {
    /// Read: the value and the bytes it took.
    Done(T, usize),
    /// Cut off: more text may complete it.
    Pending,
    /// Not what the format writes.
    Bad,
}

/// The block at the start of `buf` (which starts with [`OPEN`]). At the
/// reply's end, complete calls without the closing marker still count.
pub(crate) fn scan(buf: &str, at_end: bool, tools: &ToolSet) -> Block {
    let body = &buf[OPEN.len()..];
    let (inner, complete) = match body.find(CLOSE) {
        Some(j) => (&body[..j], true),
        None => (body, at_end),
    };
    match invokes(inner, complete, tools) {
        Step::Done(calls, _) => {
            let close = if inner.len() < body.len() { CLOSE.len() } else { 0 };
            Block::Done {
                calls,
                len: OPEN.len() + inner.len() + close,
            }
        }
        Step::Pending => Block::Pending,
        Step::Bad => Block::Bad,
    }
}

/// The calls in `inner`, the text after [`OPEN`] (up to [`CLOSE`] when
/// `complete`, else as far as the reply has come).
fn invokes(inner: &str, complete: bool, tools: &ToolSet) -> Step<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut at = 0;
    loop {
        let rest = inner[at..].trim_start();
        at = inner.len() - rest.len();
        if let Some(after) = rest.strip_prefix(INVOKE_OPEN) {
            match invoke(after, tools) {
                Step::Done(call, n) => {
                    calls.push(call);
                    at += INVOKE_OPEN.len() + n;
                    continue;
                }
                Step::Pending if !complete => return Step::Pending,
                Step::Pending | Step::Bad => return Step::Bad,
            }
        }
        if complete {
            return if rest.is_empty() && !calls.is_empty() {
                Step::Done(calls, inner.len())
            } else {
                Step::Bad
            };
        }
        if CLOSE.starts_with(rest) || INVOKE_OPEN.starts_with(rest) {
            return Step::Pending;
        }
        return Step::Bad;
    }
}

/// One call after its `<invoke name=`: the name, `>`, the parameters, and
/// `</invoke>`.
fn invoke(s: &str, tools: &ToolSet) -> Step<ToolCall> {
    let (name, mut at) = match name_attr(s) {
        Step::Done(name, n) => (name, n),
        Step::Pending => return Step::Pending,
        Step::Bad => return Step::Bad,
    };
    let Some(tool) = tools.get(name) else {
        return Step::Bad;
    };
    let mut args = serde_json::Map::new();
    loop {
        let rest = s[at..].trim_start();
        at = s.len() - rest.len();
        if rest.starts_with(INVOKE_CLOSE) {
            let call = ToolCall {
                name: name.to_string(),
                arguments: Value::Object(args),
            };
            return Step::Done(call, at + INVOKE_CLOSE.len());
        }
        if let Some(after) = rest.strip_prefix(PARAM_OPEN) {
            let (key, n) = match name_attr(after) {
                Step::Done(key, n) => (key, n),
                Step::Pending => return Step::Pending,
                Step::Bad => return Step::Bad,
            };
            let value = &after[n..];
            let Some(end) = value.find(PARAM_CLOSE) else {
                return Step::Pending;
            };
            args.insert(key.to_string(), typed(&value[..end], tool, key));
            at += PARAM_OPEN.len() + n + end + PARAM_CLOSE.len();
            continue;
        }
        if INVOKE_CLOSE.starts_with(rest) || PARAM_OPEN.starts_with(rest) {
            return Step::Pending;
        }
        return Step::Bad;
    }
}

/// A name attribute's value and the tag's `>`: `"NAME">`, `'NAME'>` or
/// `NAME>`. A name is not empty and holds no tag bracket or line break.
fn name_attr(s: &str) -> Step<&str> {
    let quote = match s.chars().next() {
        None => return Step::Pending,
        Some(q @ ('"' | '\'')) => Some(q),
        Some(_) => None,
    };
    let start = quote.map_or(0, char::len_utf8);
    let body = &s[start..];
    let end = match quote {
        Some(q) => body.find(q),
        None => body.find('>'),
    };
    let Some(end) = end else {
        let plausible = body.len() <= MAX_NAME && !body.contains(['<', '>', '\n']);
        return if plausible { Step::Pending } else { Step::Bad };
    };
    let name = body[..end].trim();
    if name.is_empty() || end > MAX_NAME || name.contains(['<', '>', '\n']) {
        return Step::Bad;
    }
    let mut at = start + end;
    if let Some(q) = quote {
        at += q.len_utf8();
        let rest = s[at..].trim_start();
        if rest.is_empty() {
            return Step::Pending;
        }
        if !rest.starts_with('>') {
            return Step::Bad;
        }
        at = s.len() - rest.len();
    }
    Step::Done(name, at + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::ToolSpec;
    use serde_json::json;

    fn tools() -> ToolSet {
        ToolSet::new(vec![
            ToolSpec {
                name: "get_weather".into(),
                description: None,
                parameters: Some(json!({
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                   "units": {"type": ["string", "null"]}, "opts": {"type": "object"},
                                   "exact": {"type": "boolean"}},
                    "required": ["city"]
                })),
            },
            ToolSpec {
                name: "now".into(),
                description: None,
                parameters: None,
            },
        ])
    }

    /// As MiniMax-M2's template renders two parallel calls.
    const BLOCK: &str = "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">New York</parameter>\n<parameter name=\"days\">3</parameter>\n<parameter name=\"opts\">{\"a\": [1, 2]}</parameter>\n</invoke>\n<invoke name=\"now\">\n</invoke>\n</minimax:tool_call>";

    #[test]
    fn a_rendered_block_reads_back_as_parallel_calls_with_typed_values() {
        let Block::Done { calls, len } = scan(BLOCK, false, &tools()) else {
            panic!("not read")
        };
        assert_eq!(len, BLOCK.len());
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            calls[0].arguments,
            json!({"city": "New York", "days": 3, "opts": {"a": [1, 2]}})
        );
        assert_eq!(calls[1].name, "now");
        assert_eq!(calls[1].arguments, json!({}));
        // Text after the block is not the block's.
        let more = format!("{BLOCK}\nDone.");
        assert!(matches!(scan(&more, false, &tools()), Block::Done { len, .. } if len == BLOCK.len()));
    }

    #[test]
    fn a_value_is_the_text_between_its_tags_typed_by_the_schema() {
        let b = "<minimax:tool_call><invoke name=\"get_weather\"><parameter name=\"city\">\n two\nlines </parameter><parameter name=\"units\">42</parameter><parameter name=\"days\">many</parameter><parameter name=\"exact\">true</parameter><parameter name=\"extra\">7</parameter></invoke></minimax:tool_call>";
        let Block::Done { calls, .. } = scan(b, false, &tools()) else {
            panic!("not read")
        };
        assert_eq!(
            calls[0].arguments,
            json!({"city": "\n two\nlines ", "units": "42", "days": "many", "exact": true, "extra": "7"})
        );
    }

    #[test]
    fn names_in_single_quotes_or_bare_are_read() {
        for b in [
            "<minimax:tool_call><invoke name='get_weather'><parameter name='city'>Oslo</parameter></invoke></minimax:tool_call>",
            "<minimax:tool_call><invoke name=get_weather><parameter name=city>Oslo</parameter></invoke></minimax:tool_call>",
            "<minimax:tool_call><invoke name=\"get_weather\" ><parameter name=\"city\" >Oslo</parameter></invoke></minimax:tool_call>",
        ] {
            let Block::Done { calls, .. } = scan(b, false, &tools()) else {
                panic!("not read: {b}")
            };
            assert_eq!(calls[0].arguments, json!({"city": "Oslo"}), "{b}");
        }
    }

    #[test]
    fn every_prefix_waits_and_the_reply_end_takes_only_complete_calls() {
        for cut in OPEN.len()..BLOCK.len() {
            if !BLOCK.is_char_boundary(cut) {
                continue;
            }
            let head = &BLOCK[..cut];
            assert_eq!(scan(head, false, &tools()), Block::Pending, "{head:?}");
            // At the reply's end a block cut inside a call is not calls.
            let at_end = scan(head, true, &tools());
            if head.trim_end().ends_with(INVOKE_CLOSE) {
                assert!(matches!(at_end, Block::Done { .. }), "{head:?}");
            } else {
                assert_eq!(at_end, Block::Bad, "{head:?}");
            }
        }
        let unclosed = &BLOCK[..BLOCK.len() - CLOSE.len()];
        assert!(matches!(scan(unclosed, true, &tools()), Block::Done { calls, .. } if calls.len() == 2));
    }

    #[test]
    fn unknown_tools_prose_and_broken_blocks_are_not_calls() {
        for b in [
            // A tool not offered, or one bad call among good ones.
            "<minimax:tool_call>\n<invoke name=\"rm_rf\">\n</invoke>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"now\">\n</invoke>\n<invoke name=\"rm_rf\">\n</invoke>\n</minimax:tool_call>",
            // Prose, no calls, or a call in another format.
            "<minimax:tool_call> is how I call tools</minimax:tool_call>",
            "<minimax:tool_call>\n</minimax:tool_call>",
            "<minimax:tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</minimax:tool_call>",
            // Unclosed parts, text between the tags, an empty name.
            "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris\n</invoke>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"now\">\nso\n</invoke>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"now\">\n</invoke>\nand then\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"\">\n</invoke>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"now\" x>\n</invoke>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"ci\nty\">x</parameter>\n</invoke>\n</minimax:tool_call>",
        ] {
            assert_eq!(scan(b, true, &tools()), Block::Bad, "{b:?}");
            assert_eq!(scan(b, false, &tools()), Block::Bad, "{b:?}");
        }
        // Found to be prose before the block ends.
        for b in [
            "<minimax:tool_call> is how",
            "<minimax:tool_call>\n<invoke name=\"rm_rf\">",
            "<minimax:tool_call>\n<invoke name=\"now\">\nwell",
            "<minimax:tool_call>\n<invoke name=\"now",
        ] {
            let expect = if b.ends_with("now") {
                Block::Pending
            } else {
                Block::Bad
            };
            assert_eq!(scan(b, false, &tools()), expect, "{b:?}");
        }
        let long = format!("<minimax:tool_call><invoke name=\"{}", "x".repeat(MAX_NAME + 1));
        assert_eq!(scan(&long, false, &tools()), Block::Bad);
    }
}
