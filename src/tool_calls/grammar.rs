//! The grammar that forces a tool call (`tool_choice` `required`, a named
//! tool, Anthropic's `any` and `tool`), in llguidance's Lark dialect
//! (guidance-ai/llguidance `docs/syntax.md`): the reply is the family's
//! call block and nothing else, each call's arguments held to the tool's
//! JSON schema with `%json {...}`, the tool's name fixed.
//!
//! A marker that is a special token of the model's tokenizer is written as
//! its id (`<[151657]>`): llguidance keeps special tokens apart from text,
//! so a quoted string could only be spelled with ordinary tokens, which is
//! not what the model was trained on. Other markers are quoted strings, and
//! text before one is a lazy regex that ends at it. When the family reasons
//! between `<think>` and `</think>`, the reasoning comes first: it must
//! when the prompt opened it, may when the prompt did neither, and does not
//! when the prompt closed it (thinking switched off).

use serde_json::{Value, json};

use super::dialect::{CallSyntax, Dialect, THINK_CLOSE, THINK_OPEN};
use super::{ToolSpec, deepseek, glm, harmony, hermes, minimax, mistral, qwen_xml};
use crate::grammar::compile::with_json_options;

/// What must be called.
#[derive(Debug, Clone, Copy)]
pub struct Forced<'a> {
    /// The tools the call may name: all offered ones, or the one named.
    pub tools: &'a [ToolSpec],
    /// More than one call may follow (`parallel_tool_calls`).
    pub parallel: bool,
    /// The prompt left the reply inside `<think>`.
    pub in_reasoning: bool,
    /// The prompt closed the reasoning itself ([`Dialect::ends_reasoning`]):
    /// the call comes at once, no `<think>` before it.
    pub after_reasoning: bool,
}

/// The Lark grammar forcing a call in `dialect`'s format; `None` when the
/// dialect has no call format or no tool is given. `special(marker)` is
/// the id of `marker` when the tokenizer holds it as a special token.
pub fn forced_call(
    dialect: Dialect,
    f: &Forced<'_>,
    special: &dyn Fn(&str) -> Option<u32>,
) -> Option<String> {
    let syntax = dialect.calls?;
    if f.tools.is_empty() {
        return None;
    }
    let mut g = Lark {
        rules: Vec::new(),
        special,
        fresh: 0,
    };
    let prefix = if dialect.think && syntax != CallSyntax::Harmony && (f.in_reasoning || !f.after_reasoning) {
        let close = g.until(THINK_CLOSE);
        if f.in_reasoning {
            format!("{close} sp? ")
        } else {
            let open = g.lit(THINK_OPEN);
            g.rules.push(format!("think: {open} {close} sp?"));
            "think? ".to_string()
        }
    } else {
        String::new()
    };
    let calls = match syntax {
        CallSyntax::Hermes => g.hermes(f),
        CallSyntax::QwenXml => g.qwen_xml(f),
        CallSyntax::Glm { newlines } => g.glm(f, newlines),
        CallSyntax::DeepSeek { fenced } => g.deepseek(f, fenced),
        CallSyntax::Mistral => g.mistral(f),
        CallSyntax::MiniMax => g.minimax(f),
        CallSyntax::Harmony => g.harmony(f),
    };
    let start = format!("start: {prefix}{calls}");
    let mut out = vec![start];
    out.append(&mut g.rules);
    if out.iter().any(|rule| rule.contains("sp?")) {
        out.push("sp: /[ \\t\\r\\n]+/".to_string());
    }
    Some(out.join("\n") + "\n")
}

/// A grammar being written: its rules after `start`.
struct Lark<'s> {
    rules: Vec<String>,
    special: &'s dyn Fn(&str) -> Option<u32>,
    fresh: usize,
}

/// `text` as a Lark string literal (JSON's escapes are Lark's).
fn quoted(text: &str) -> String {
    Value::from(text).to_string()
}

/// `text` matched literally in a regex between slashes.
fn regex_escaped(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$/-".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A tool's parameters in the schema's property order: name, schema, and
/// whether it is required (the formats that write one block per argument).
fn params(tool: &ToolSpec) -> Vec<(String, Value, bool)> {
    let schema = tool.parameters_schema();
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    schema
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, p)| (k.clone(), p.clone(), required.contains(&k.as_str())))
        .collect()
}

/// A schema as `%json` takes it, with the JSON options every constraint
/// gets ([`with_json_options`]: bounded whitespace, so a model cannot spend
/// its budget on blank lines inside a call). Lenient: an agent's tool
/// schemas may use keywords the constraint cannot enforce, and a forced
/// call is better approximated than refused.
fn schema_text(v: &Value) -> String {
    with_json_options(v, false).to_string()
}

impl Lark<'_> {
    /// A marker: its special token, or the string.
    fn lit(&self, marker: &str) -> String {
        match (self.special)(marker) {
            Some(id) => format!("<[{id}]>"),
            None => quoted(marker),
        }
    }

    /// Any text, then `marker`.
    fn until(&mut self, marker: &str) -> String {
        if let Some(id) = (self.special)(marker) {
            return format!("/(?s:.*)/ <[{id}]>");
        }
        self.fresh += 1;
        let name = format!("text{}", self.fresh);
        self.rules
            .push(format!("{name}[lazy]: /(?s:.*){}/", regex_escaped(marker)));
        name
    }

    /// A rule `name: alternatives` over one body per tool; its name.
    fn per_tool(
        &mut self,
        name: &str,
        f: &Forced<'_>,
        mut body: impl FnMut(&mut Self, &ToolSpec) -> String,
    ) -> String {
        let mut alts = Vec::new();
        for (i, tool) in f.tools.iter().enumerate() {
            let b = body(self, tool);
            let rule = format!("{name}_{i}");
            self.rules.push(format!("{rule}: {b}"));
            alts.push(rule);
        }
        self.rules.push(format!("{name}: {}", alts.join(" | ")));
        name.to_string()
    }

    /// `one`, then more of it after `sep` when calls may be parallel.
    fn repeated(&mut self, one: &str, sep: &str, f: &Forced<'_>) -> String {
        if f.parallel {
            self.rules.push(format!("calls: {one} ({sep}{one})*"));
            "calls".to_string()
        } else {
            one.to_string()
        }
    }

    /// `{"name": N, "arguments": {...}}` for any of the tools.
    fn name_and_arguments(f: &Forced<'_>) -> Value {
        let one = |t: &ToolSpec| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters_schema()},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        };
        match f.tools {
            [t] => one(t),
            ts => json!({"anyOf": ts.iter().map(one).collect::<Vec<_>>()}),
        }
    }

    fn hermes(&mut self, f: &Forced<'_>) -> String {
        let (open, close) = (self.lit(hermes::OPEN), self.lit(hermes::CLOSE));
        let json = schema_text(&Self::name_and_arguments(f));
        self.rules
            .push(format!("call: {open} \"\\n\" %json {json} \"\\n\" {close}"));
        self.repeated("call", "\"\\n\" ", f)
    }

    /// Qwen3.5's parameters come in the schema's property order (required
    /// ones always, the others optionally); a `string` parameter's value is
    /// any text up to `</parameter>`, any other a JSON value of its schema.
    fn qwen_xml(&mut self, f: &Forced<'_>) -> String {
        let call = self.per_tool("call", f, |g, tool| {
            let mut parts = vec![
                g.lit(qwen_xml::OPEN),
                quoted(&format!("\n{}{}>\n", qwen_xml::FUNCTION_OPEN, tool.name)),
            ];
            for (key, prop, required) in params(tool) {
                let mut pair = vec![quoted(&format!("{}{key}>\n", qwen_xml::PARAM_OPEN))];
                if prop.get("type").and_then(Value::as_str) == Some("string") {
                    pair.push(g.until(qwen_xml::PARAM_CLOSE));
                } else {
                    pair.push(format!("%json {}", schema_text(&prop)));
                    pair.push(quoted(&format!("\n{}", qwen_xml::PARAM_CLOSE)));
                }
                pair.push("\"\\n\"".into());
                let pair = pair.join(" ");
                parts.push(if required { pair } else { format!("({pair})?") });
            }
            parts.push(quoted(qwen_xml::FUNCTION_CLOSE));
            parts.push("\"\\n\"".into());
            parts.push(g.lit(qwen_xml::CLOSE));
            parts.join(" ")
        });
        self.repeated(&call, "\"\\n\" ", f)
    }

    /// GLM's pairs come in the schema's property order (required ones
    /// always, the others optionally); a `string` parameter's value is any
    /// text up to `</arg_value>`, any other a JSON value of its schema.
    fn glm(&mut self, f: &Forced<'_>, newlines: bool) -> String {
        let nl = if newlines { "\n" } else { "" };
        let call = self.per_tool("call", f, |g, tool| {
            let mut parts = vec![g.lit(glm::OPEN), quoted(&format!("{}{nl}", tool.name))];
            for (key, prop, required) in params(tool) {
                let mut pair = vec![g.lit(glm::KEY_OPEN), quoted(&key), g.lit(glm::KEY_CLOSE)];
                if newlines {
                    pair.push("\"\\n\"".into());
                }
                pair.push(g.lit(glm::VALUE_OPEN));
                if prop.get("type").and_then(Value::as_str) == Some("string") {
                    pair.push(g.until(glm::VALUE_CLOSE));
                } else {
                    pair.push(format!("%json {}", schema_text(&prop)));
                    pair.push(g.lit(glm::VALUE_CLOSE));
                }
                if newlines {
                    pair.push("\"\\n\"".into());
                }
                let pair = pair.join(" ");
                parts.push(if required { pair } else { format!("({pair})?") });
            }
            parts.push(g.lit(glm::CLOSE));
            parts.join(" ")
        });
        let sep = if newlines { "\"\\n\" " } else { "" };
        self.repeated(&call, sep, f)
    }

    fn deepseek(&mut self, f: &Forced<'_>, fenced: bool) -> String {
        let (open, close) = (self.lit(deepseek::OPEN), self.lit(deepseek::CLOSE));
        let call = self.per_tool("call", f, |g, tool| {
            let json = schema_text(&tool.parameters_schema());
            let (begin, sep, end) = (
                g.lit(deepseek::CALL_OPEN),
                g.lit(deepseek::SEP),
                g.lit(deepseek::CALL_CLOSE),
            );
            if fenced {
                let head = quoted(&format!("{}\n```json\n", tool.name));
                format!("{begin} \"function\" {sep} {head} %json {json} \"\\n```\" {end}")
            } else {
                format!("{begin} {} {sep} %json {json} {end}", quoted(&tool.name))
            }
        });
        let calls = self.repeated(&call, "\"\\n\"? ", f);
        format!("{open} {calls} {close}")
    }

    /// MiniMax-M2's calls are `<invoke>`s in one block, their parameters in
    /// the schema's property order (required ones always, the others
    /// optionally); a `string` parameter's value is any text up to
    /// `</parameter>`, any other a JSON value of its schema.
    fn minimax(&mut self, f: &Forced<'_>) -> String {
        let call = self.per_tool("call", f, |g, tool| {
            let mut parts = vec![quoted(&format!("{}\"{}\">\n", minimax::INVOKE_OPEN, tool.name))];
            for (key, prop, required) in params(tool) {
                let mut pair = vec![quoted(&format!("{}\"{key}\">", minimax::PARAM_OPEN))];
                if prop.get("type").and_then(Value::as_str) == Some("string") {
                    pair.push(g.until(minimax::PARAM_CLOSE));
                } else {
                    pair.push(format!("%json {}", schema_text(&prop)));
                    pair.push(quoted(minimax::PARAM_CLOSE));
                }
                pair.push("\"\\n\"".into());
                let pair = pair.join(" ");
                parts.push(if required { pair } else { format!("({pair})?") });
            }
            parts.push(quoted(&format!("{}\n", minimax::INVOKE_CLOSE)));
            parts.join(" ")
        });
        let calls = self.repeated(&call, "", f);
        let (open, close) = (self.lit(minimax::OPEN), self.lit(minimax::CLOSE));
        format!("{open} \"\\n\" {calls} {close}")
    }

    fn mistral(&mut self, f: &Forced<'_>) -> String {
        let mut array = json!({"type": "array", "items": Self::name_and_arguments(f), "minItems": 1});
        if !f.parallel {
            array["maxItems"] = json!(1);
        }
        format!("{} \" \"? %json {}", self.lit(mistral::OPEN), schema_text(&array))
    }

    fn harmony(&mut self, f: &Forced<'_>) -> String {
        let (channel, message) = (self.lit(harmony::CHANNEL), self.lit(harmony::MESSAGE));
        let analysis_end = self.until(harmony::END);
        let start = self.lit(harmony::START);
        self.rules.push(format!(
            "analysis: {channel} \"analysis\" {message} {analysis_end} {start} \"assistant\""
        ));
        let call = self.per_tool("call", f, |g, tool| {
            let head = quoted(&format!("commentary to=functions.{} ", tool.name));
            format!(
                "{channel} {head} {} \"json\" {message} %json {} {}",
                g.lit(harmony::CONSTRAIN),
                schema_text(&tool.parameters_schema()),
                g.lit(harmony::CALL)
            )
        });
        format!("analysis? {call}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> ToolSpec {
        ToolSpec {
            name: "get_weather".into(),
            description: Some("Weather".into()),
            parameters: Some(json!({
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            })),
        }
    }

    fn time() -> ToolSpec {
        ToolSpec {
            name: "time".into(),
            description: None,
            parameters: None,
        }
    }

    fn none(_: &str) -> Option<u32> {
        None
    }

    /// The JSON of every `%json` in `g` parses.
    fn json_parts(g: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut rest = g;
        while let Some(at) = rest.find("%json ") {
            let mut it = serde_json::Deserializer::from_str(&rest[at + 6..]).into_iter::<Value>();
            let v = it.next().expect("json after %json").expect("valid json");
            rest = &rest[at + 6 + it.byte_offset()..];
            out.push(v);
        }
        out
    }

    fn dialect(calls: CallSyntax, think: bool) -> Dialect {
        Dialect {
            calls: Some(calls),
            think,
        }
    }

    #[test]
    fn hermes_one_tool_with_optional_reasoning() {
        let tools = [weather()];
        let f = Forced {
            tools: &tools,
            parallel: false,
            in_reasoning: false,
            after_reasoning: false,
        };
        let g = forced_call(dialect(CallSyntax::Hermes, true), &f, &none).unwrap();
        let json = schema_text(
            &json!({"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}},"required":["name","arguments"],"additionalProperties":false}),
        );
        assert_eq!(
            g,
            format!(
                "start: think? call\n\
                 text1[lazy]: /(?s:.*)<\\/think>/\n\
                 think: \"<think>\" text1 sp?\n\
                 call: \"<tool_call>\" \"\\n\" %json {json} \"\\n\" \"</tool_call>\"\n\
                 sp: /[ \\t\\r\\n]+/\n"
            )
        );
        assert_eq!(json_parts(&g).len(), 1);
    }

    #[test]
    fn a_prompt_that_closed_the_reasoning_is_followed_by_the_call() {
        let tools = [weather()];
        let f = Forced {
            tools: &tools,
            parallel: false,
            in_reasoning: false,
            after_reasoning: true,
        };
        for (syntax, start) in [
            (CallSyntax::Hermes, "start: call\n"),
            (CallSyntax::MiniMax, "start: \"<minimax:tool_call>\""),
        ] {
            let g = forced_call(dialect(syntax, true), &f, &none).unwrap();
            assert!(g.starts_with(start), "{g}");
            assert!(!g.contains("think"), "{g}");
        }
    }

    #[test]
    fn special_markers_are_token_ids_and_calls_may_repeat() {
        let tools = [weather(), time()];
        let f = Forced {
            tools: &tools,
            parallel: true,
            in_reasoning: true,
            after_reasoning: false,
        };
        let special = |m: &str| match m {
            "<tool_call>" => Some(151657),
            "</tool_call>" => Some(151658),
            "</think>" => Some(151668),
            _ => None,
        };
        let g = forced_call(dialect(CallSyntax::Hermes, true), &f, &special).unwrap();
        assert!(g.starts_with("start: /(?s:.*)/ <[151668]> sp? calls\n"), "{g}");
        assert!(g.contains("call: <[151657]> \"\\n\" %json {\"anyOf\":["), "{g}");
        assert!(g.contains("calls: call (\"\\n\" call)*"), "{g}");
        let parts = json_parts(&g);
        assert_eq!(parts[0]["anyOf"][1]["properties"]["name"]["const"], "time");
        assert_eq!(
            parts[0]["anyOf"][1]["properties"]["arguments"],
            json!({"type": "object"})
        );
    }

    #[test]
    fn glm_pairs_follow_the_schema() {
        let tools = [weather()];
        let f = Forced {
            tools: &tools,
            parallel: false,
            in_reasoning: false,
            after_reasoning: false,
        };
        let g = forced_call(dialect(CallSyntax::Glm { newlines: false }, false), &f, &none).unwrap();
        let int = schema_text(&json!({"type": "integer"}));
        assert_eq!(
            g,
            format!(
                "start: call\n\
             text1[lazy]: /(?s:.*)<\\/arg_value>/\n\
             call_0: \"<tool_call>\" \"get_weather\" \"<arg_key>\" \"city\" \"</arg_key>\" \"<arg_value>\" text1 \
             (\"<arg_key>\" \"days\" \"</arg_key>\" \"<arg_value>\" %json {int} \"</arg_value>\")? \
             \"</tool_call>\"\n\
             call: call_0\n"
            )
        );
        let g = forced_call(dialect(CallSyntax::Glm { newlines: true }, false), &f, &none).unwrap();
        assert!(
            g.contains("\"<tool_call>\" \"get_weather\\n\" \"<arg_key>\" \"city\" \"</arg_key>\" \"\\n\""),
            "{g}"
        );
    }

    #[test]
    fn minimax_invokes_follow_the_schema_in_one_block() {
        let tools = [weather(), time()];
        let f = Forced {
            tools: &tools,
            parallel: true,
            in_reasoning: true,
            after_reasoning: false,
        };
        let special = |m: &str| match m {
            "<minimax:tool_call>" => Some(200052),
            "</minimax:tool_call>" => Some(200053),
            "</think>" => Some(200051),
            _ => None,
        };
        let g = forced_call(dialect(CallSyntax::MiniMax, true), &f, &special).unwrap();
        let int = schema_text(&json!({"type": "integer"}));
        assert_eq!(
            g,
            format!(
                "start: /(?s:.*)/ <[200051]> sp? <[200052]> \"\\n\" calls <[200053]>\n\
                 text1[lazy]: /(?s:.*)<\\/parameter>/\n\
                 call_0: \"<invoke name=\\\"get_weather\\\">\\n\" \"<parameter name=\\\"city\\\">\" text1 \"\\n\" \
                 (\"<parameter name=\\\"days\\\">\" %json {int} \"</parameter>\" \"\\n\")? \"</invoke>\\n\"\n\
                 call_1: \"<invoke name=\\\"time\\\">\\n\" \"</invoke>\\n\"\n\
                 call: call_0 | call_1\n\
                 calls: call (call)*\n\
                 sp: /[ \\t\\r\\n]+/\n"
            )
        );
        let one = Forced {
            tools: &tools[1..],
            parallel: false,
            in_reasoning: false,
            after_reasoning: false,
        };
        let g = forced_call(dialect(CallSyntax::MiniMax, true), &one, &none).unwrap();
        assert!(
            g.starts_with("start: think? \"<minimax:tool_call>\" \"\\n\" call \"</minimax:tool_call>\"\n"),
            "{g}"
        );
    }

    #[test]
    fn harmony_deepseek_and_mistral() {
        let tools = [time()];
        let f = Forced {
            tools: &tools,
            parallel: false,
            in_reasoning: false,
            after_reasoning: false,
        };
        let ids = |m: &str| {
            [
                harmony::CHANNEL,
                harmony::MESSAGE,
                harmony::END,
                harmony::START,
                harmony::CONSTRAIN,
                harmony::CALL,
            ]
            .iter()
            .position(|x| *x == m)
            .map(|i| 200_000 + i as u32)
        };
        let g = forced_call(dialect(CallSyntax::Harmony, false), &f, &ids).unwrap();
        let obj = schema_text(&json!({"type": "object"}));
        assert_eq!(
            g,
            format!(
                "start: analysis? call\n\
             analysis: <[200000]> \"analysis\" <[200001]> /(?s:.*)/ <[200002]> <[200003]> \"assistant\"\n\
             call_0: <[200000]> \"commentary to=functions.time \" <[200004]> \"json\" <[200001]> \
             %json {obj} <[200005]>\n\
             call: call_0\n"
            )
        );
        let g = forced_call(dialect(CallSyntax::DeepSeek { fenced: true }, true), &f, &none).unwrap();
        assert!(
            g.contains(&format!("call_0: \"<｜tool▁call▁begin｜>\" \"function\" \"<｜tool▁sep｜>\" \"time\\n```json\\n\" %json {obj} \"\\n```\" \"<｜tool▁call▁end｜>\"")),
            "{g}"
        );
        assert!(
            g.starts_with("start: think? \"<｜tool▁calls▁begin｜>\" call \"<｜tool▁calls▁end｜>\"\n"),
            "{g}"
        );
        let g = forced_call(dialect(CallSyntax::Mistral, false), &f, &none).unwrap();
        assert!(
            g.starts_with("start: \"[TOOL_CALLS]\" \" \"? %json {\"type\":\"array\""),
            "{g}"
        );
        assert_eq!(json_parts(&g)[0]["maxItems"], 1);
        assert!(forced_call(Dialect::NONE, &f, &none).is_none());
        let empty = Forced { tools: &[], ..f };
        assert!(forced_call(dialect(CallSyntax::Mistral, false), &empty, &none).is_none());
    }
}
