//! gpt-oss's harmony replies: a sequence of messages, each a header up to
//! `<|message|>` (`<|channel|>CHANNEL`, maybe ` to=RECIPIENT` and
//! ` <|constrain|>json`) and a body up to `<|end|>` (`<|call|>` and
//! `<|return|>` end the reply: they are stop tokens). The generation prompt
//! ends with `<|start|>assistant`, so the reply starts inside the first
//! header; later messages start with `<|start|>assistant`.
//!
//! The `analysis` channel is reasoning; a message to `functions.NAME` is a
//! call whose body is the JSON arguments; everything else (`final`, and
//! `commentary` without a recipient) is content.

use super::stream::Out;
use super::text::{could_become, find_first, partial_suffix};
use super::{ToolCall, ToolSet, arguments_of_text};

pub const START: &str = "<|start|>";
pub const CHANNEL: &str = "<|channel|>";
pub const CONSTRAIN: &str = "<|constrain|>";
pub const MESSAGE: &str = "<|message|>";
pub const END: &str = "<|end|>";
pub const CALL: &str = "<|call|>";
pub const RETURN: &str = "<|return|>";

/// Longest header we wait for: longer (or a newline in it) means the model
/// is not writing harmony, and its text is content.
const MAX_HEADER: usize = 512;

/// Where a message's body goes.
#[derive(Debug, Clone, PartialEq)]
enum Route {
    Reasoning,
    Content,
    Call(String),
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Reading a header (the text so far is in the buffer).
    Header,
    Body(Route),
    /// After a message's end: the next `<|start|>` is expected.
    Between,
    /// Not harmony after all: everything is content.
    Plain,
}

#[derive(Debug)]
pub(crate) struct Harmony {
    tools: Option<ToolSet>,
    state: State,
    buf: String,
}

impl Harmony {
    pub(crate) fn new(tools: Option<ToolSet>) -> Self {
        Self {
            tools,
            state: State::Header,
            buf: String::new(),
        }
    }

    fn route(&self, header: &str) -> Route {
        let word_after = |tag: &str| {
            header.find(tag).map(|at| {
                let rest = &header[at + tag.len()..];
                let end = rest
                    .find(|c: char| c.is_whitespace() || c == '<')
                    .unwrap_or(rest.len());
                rest[..end].to_string()
            })
        };
        if let Some(recipient) = word_after("to=") {
            return match (recipient.strip_prefix("functions."), &self.tools) {
                (Some(name), Some(_)) => Route::Call(name.to_string()),
                // A built-in tool, or tools not asked for: its text is content.
                _ => Route::Content,
            };
        }
        match word_after(CHANNEL).as_deref() {
            Some("analysis") => Route::Reasoning,
            _ => Route::Content,
        }
    }

    pub(crate) fn push(&mut self, piece: &str, at_end: bool, out: &mut Out) {
        self.buf.push_str(piece);
        loop {
            match self.state.clone() {
                State::Plain => {
                    out.content(std::mem::take(&mut self.buf));
                    return;
                }
                State::Header => {
                    let found = self.buf.find(MESSAGE);
                    let header = &self.buf[..found.unwrap_or(self.buf.len())];
                    // Room for a marker cut short, so a header judged on part
                    // of the text is judged the same on all of it.
                    let limit = if found.is_some() {
                        MAX_HEADER
                    } else {
                        MAX_HEADER + MESSAGE.len()
                    };
                    if header.contains('\n') || header.len() > limit {
                        self.state = State::Plain;
                        continue;
                    }
                    match found {
                        Some(at) => {
                            let route = self.route(&self.buf[..at]);
                            self.buf.drain(..at + MESSAGE.len());
                            self.state = State::Body(route);
                        }
                        None if at_end => self.state = State::Plain,
                        None => return,
                    }
                }
                State::Between => {
                    let rest = self.buf.trim_start();
                    if let Some(after) = rest.strip_prefix(START) {
                        self.buf = after.to_string();
                        self.state = State::Header;
                        continue;
                    }
                    if !at_end && could_become(rest, START) {
                        return;
                    }
                    self.state = State::Plain;
                }
                State::Body(route) => {
                    let ends = [END, CALL, RETURN, START];
                    let found = find_first(&self.buf, &ends);
                    if let Route::Call(name) = &route {
                        let Some(at) = found.map(|(at, _)| at).or(at_end.then_some(self.buf.len())) else {
                            return;
                        };
                        let body: String = self.buf.drain(..at).collect();
                        match self.call(name, &body) {
                            Some(call) => out.call(call),
                            None => out.content(body),
                        }
                    } else {
                        let send = match found {
                            Some((at, _)) => at,
                            None if at_end => self.buf.len(),
                            None => self.buf.len() - partial_suffix(&self.buf, &ends),
                        };
                        let text: String = self.buf.drain(..send).collect();
                        if route == Route::Reasoning {
                            out.reasoning(text);
                        } else {
                            out.content(text);
                        }
                        if found.is_none() {
                            return;
                        }
                    }
                    match found {
                        Some((_, marker)) if marker == START => {
                            self.buf.drain(..START.len());
                            self.state = State::Header;
                        }
                        Some((_, marker)) => {
                            self.buf.drain(..marker.len());
                            self.state = State::Between;
                        }
                        None => return,
                    }
                }
            }
        }
    }

    fn call(&self, name: &str, body: &str) -> Option<ToolCall> {
        self.tools.as_ref()?.get(name)?;
        Some(ToolCall {
            name: name.to_string(),
            arguments: arguments_of_text(body)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::tool_calls::{CallSyntax, Dialect, ReplyParser, ToolSet, ToolSpec};
    use serde_json::json;

    fn dialect() -> Dialect {
        Dialect {
            calls: Some(CallSyntax::Harmony),
            think: false,
        }
    }

    fn tools() -> Option<ToolSet> {
        Some(ToolSet::new(vec![ToolSpec {
            name: "get_weather".into(),
            description: None,
            parameters: None,
        }]))
    }

    #[test]
    fn channels_and_calls() {
        let text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary \
                    to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Rome\"}";
        let r = ReplyParser::parse(dialect(), tools(), false, text);
        assert_eq!(r.reasoning, "Need weather.");
        assert_eq!(r.content, "");
        assert_eq!(r.calls.len(), 1);
        assert_eq!(r.calls[0].arguments, json!({"city": "Rome"}));
        let text =
            "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hi!";
        let r = ReplyParser::parse(dialect(), tools(), false, text);
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("Easy.", "Hi!"));
        // The rendered history form: the recipient in the role header.
        let text = " to=functions.get_weather<|channel|>commentary json<|message|>{}<|call|>";
        let r = ReplyParser::parse(dialect(), tools(), false, text);
        assert_eq!(r.calls.len(), 1);
    }

    #[test]
    fn no_tools_or_bad_calls_are_content() {
        let text = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"a\":";
        let r = ReplyParser::parse(dialect(), None, false, text);
        assert!(r.calls.is_empty());
        assert_eq!(r.content, "{\"a\":");
        let r = ReplyParser::parse(dialect(), tools(), false, text);
        assert!(r.calls.is_empty());
        assert_eq!(r.content, "{\"a\":");
        // Text that is not harmony at all.
        let r = ReplyParser::parse(dialect(), tools(), false, "Just words.\nMore.");
        assert_eq!(r.content, "Just words.\nMore.");
    }
}
