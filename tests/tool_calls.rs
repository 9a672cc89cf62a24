//! Tool calls and reasoning read back out of replies: what a family's own
//! template writes for an assistant turn with tool calls parses back to the
//! same calls (property-tested over names and arguments, through the
//! template fixtures shaped like the published templates and through the
//! built-in formats), and feeding a reply in random pieces gives what
//! parsing it whole gives.

use std::path::Path;

use colibri::chat_template::{ChatFormat, ChatMessage, ChatTemplate, MessageToolCall, RenderOptions};
use colibri::tool_calls::{CallSyntax, Delta, Dialect, Reply, ReplyParser, ToolCall, ToolSet, ToolSpec};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// The tools' names in [`tool_list`], which [`renamed`] replaces.
const NAMES: [&str; 3] = ["get_weather", "search_files", "now"];

/// The offered tools: a string, integer, enum, boolean, array and object
/// parameter between them, and one without parameters.
fn tool_list() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}}),
        json!({"type": "function", "function": {"name": "search_files", "description": "Search", "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}, "exact": {"type": "boolean"},
                           "tags": {"type": "array", "items": {"type": "string"}}, "filter": {"type": "object"},
                           "score": {"type": "number"}}}}}),
        json!({"type": "function", "function": {"name": "now", "description": "The time", "parameters": {"type": "object", "properties": {}}}}),
    ]
}

fn tool_set() -> ToolSet {
    tool_set_of(&tool_list())
}

fn tool_set_of(list: &[Value]) -> ToolSet {
    ToolSet::new(
        list.iter()
            .map(|t| ToolSpec {
                name: t["function"]["name"].as_str().unwrap().to_string(),
                description: t["function"]["description"].as_str().map(str::to_string),
                parameters: Some(t["function"]["parameters"].clone()),
            })
            .collect(),
    )
}

/// Function names as the APIs allow them, three different ones.
fn names() -> impl Strategy<Value = [String; 3]> {
    let name = || proptest::string::string_regex("[a-zA-Z_][a-zA-Z0-9_-]{0,20}").unwrap();
    (name(), name(), name())
        .prop_filter("distinct names", |(a, b, c)| a != b && b != c && a != c)
        .prop_map(|(a, b, c)| [a, b, c])
}

/// The tools and calls with [`NAMES`] replaced by `names`.
fn renamed(names: &[String; 3], calls: &[ToolCall]) -> (Vec<Value>, Vec<ToolCall>) {
    let rename = |n: &str| {
        NAMES
            .iter()
            .position(|m| *m == n)
            .map_or_else(|| n.to_string(), |i| names[i].clone())
    };
    let mut list = tool_list();
    for t in &mut list {
        let n = rename(t["function"]["name"].as_str().unwrap_or(""));
        t["function"]["name"] = Value::from(n);
    }
    let calls = calls
        .iter()
        .map(|c| ToolCall {
            name: rename(&c.name),
            arguments: c.arguments.clone(),
        })
        .collect();
    (list, calls)
}

/// Text a value may hold: quotes, backslashes, newlines, angle brackets
/// and non-ASCII included.
fn any_text() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[a-zA-Z0-9 _.,:;!?'\"\\\\/<>{}()\\[\\]\n\té😀-]{0,24}").unwrap()
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-1_000_000i64..1_000_000).prop_map(Value::from),
        (-1.0e6f64..1.0e6).prop_map(|x| json!((x * 1000.0).round() / 1000.0)),
        Just(json!(1e-7)),
        Just(json!(2.5e20)),
    ]
}

fn small_object() -> impl Strategy<Value = Value> {
    proptest::collection::vec(
        (
            "[a-z]{1,6}",
            prop_oneof![
                any_text().prop_map(Value::from),
                number(),
                any::<bool>().prop_map(Value::from)
            ],
        ),
        0..3,
    )
    .prop_map(|kv| Value::Object(kv.into_iter().collect()))
}

/// A call to one of the tools, its arguments typed by the tool's schema.
fn call() -> impl Strategy<Value = ToolCall> {
    let weather = (
        any_text(),
        proptest::option::of(-100i64..100),
        proptest::option::of(prop_oneof![Just("c"), Just("f")]),
    )
        .prop_map(|(city, days, units)| {
            let mut a = Map::new();
            a.insert("city".into(), city.into());
            if let Some(d) = days {
                a.insert("days".into(), d.into());
            }
            if let Some(u) = units {
                a.insert("units".into(), u.into());
            }
            ToolCall {
                name: "get_weather".into(),
                arguments: Value::Object(a),
            }
        });
    let search = (
        proptest::option::of(any_text()),
        proptest::option::of(0i64..1000),
        proptest::option::of(any::<bool>()),
        proptest::option::of(proptest::collection::vec(any_text(), 0..3)),
        proptest::option::of(small_object()),
        proptest::option::of(number()),
    )
        .prop_map(|(query, limit, exact, tags, filter, score)| {
            let mut a = Map::new();
            let mut put = |k: &str, v: Option<Value>| {
                if let Some(v) = v {
                    a.insert(k.into(), v);
                }
            };
            put("query", query.map(Value::from));
            put("limit", limit.map(Value::from));
            put("exact", exact.map(Value::from));
            put("tags", tags.map(Value::from));
            put("filter", filter);
            put("score", score);
            ToolCall {
                name: "search_files".into(),
                arguments: Value::Object(a),
            }
        });
    let now = Just(ToolCall {
        name: "now".into(),
        arguments: json!({}),
    });
    prop_oneof![weather, search, now]
}

/// Content without markers and without whitespace at its edges (which
/// templates trim).
fn content() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        proptest::string::string_regex("[a-zA-Z0-9][a-zA-Z0-9 ,.!?'\n]{0,30}[a-zA-Z0-9.!?]").unwrap(),
    ]
}

/// How one template writes an assistant turn with calls.
struct Case {
    name: &'static str,
    template: ChatTemplate,
    /// The dialect the template must show.
    dialect: Dialect,
    /// The assistant turn ends before this (the end-of-turn token).
    end: &'static str,
    /// Most calls one turn renders.
    max_calls: usize,
    /// The template writes a call turn's content (Mistral's drop it) and
    /// where it lands when read back (gpt-oss's become the analysis).
    content: Where,
}

#[derive(Clone, Copy, PartialEq)]
enum Where {
    Content,
    Reasoning,
    Dropped,
}

fn fixture(name: &str) -> ChatTemplate {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/chat-templates")
        .join(name);
    let src = std::fs::read_to_string(&path).unwrap();
    ChatTemplate::new(&src, "<s>", "</s>", name).unwrap()
}

fn cases() -> Vec<Case> {
    let d = |calls, think| Dialect {
        calls: Some(calls),
        think,
    };
    let hermes = d(CallSyntax::Hermes, true);
    let glm45 = d(CallSyntax::Glm { newlines: true }, true);
    let glm5 = d(CallSyntax::Glm { newlines: false }, true);
    let harmony = d(CallSyntax::Harmony, false);
    let deepseek = d(CallSyntax::DeepSeek { fenced: true }, true);
    let mistral = d(CallSyntax::Mistral, false);
    let qwen_xml = d(CallSyntax::QwenXml, false);
    let minimax = d(CallSyntax::MiniMax, true);
    let case = |name, template, dialect, end, max_calls, content| Case {
        name,
        template,
        dialect,
        end,
        max_calls,
        content,
    };
    vec![
        case(
            "qwen3-tools",
            fixture("qwen3-tools.jinja"),
            hermes,
            "<|im_end|>",
            3,
            Where::Content,
        ),
        case(
            "qwen35-xml-tools",
            fixture("qwen35-xml-tools.jinja"),
            qwen_xml,
            "<|im_end|>",
            3,
            Where::Content,
        ),
        case(
            "minimax-m2-tools",
            fixture("minimax-m2-tools.jinja"),
            minimax,
            "[e~[",
            3,
            Where::Content,
        ),
        case(
            "glm-tools",
            fixture("glm-tools.jinja"),
            glm45,
            "",
            3,
            Where::Content,
        ),
        case(
            "gpt-oss-tools",
            fixture("gpt-oss-tools.jinja"),
            harmony,
            "<|call|>",
            1,
            Where::Reasoning,
        ),
        case(
            "deepseek-tools",
            fixture("deepseek-tools.jinja"),
            deepseek,
            "<｜end▁of▁sentence｜>",
            3,
            Where::Content,
        ),
        case(
            "mistral-tools",
            fixture("mistral-tools.jinja"),
            mistral,
            "</s>",
            3,
            Where::Dropped,
        ),
        case(
            "builtin ChatMl",
            ChatTemplate::builtin(ChatFormat::CHATML),
            hermes,
            "<|im_end|>",
            3,
            Where::Content,
        ),
        case(
            "builtin Glm4",
            ChatTemplate::builtin(ChatFormat::GLM4),
            glm45,
            "",
            3,
            Where::Content,
        ),
        case(
            "builtin Glm",
            ChatTemplate::builtin(ChatFormat::GLM),
            glm5,
            "",
            3,
            Where::Content,
        ),
        case(
            "builtin Harmony",
            ChatTemplate::builtin(ChatFormat::HARMONY),
            harmony,
            "<|call|>",
            1,
            Where::Reasoning,
        ),
        case(
            "builtin DeepSeek",
            ChatTemplate::builtin(ChatFormat::DEEPSEEK),
            deepseek,
            "<｜end▁of▁sentence｜>",
            3,
            Where::Content,
        ),
        case(
            "builtin Mistral",
            ChatTemplate::builtin(ChatFormat::MISTRAL),
            mistral,
            "</s>",
            3,
            Where::Dropped,
        ),
    ]
}

/// The reasoning of a turn whose generation prompt opened it (MiniMax-M2's
/// `<think>\n`): a reply to such a prompt starts inside its reasoning.
const THOUGHT: &str = "Which tool fits?\nThis one.";

/// The text the model would have written for an assistant turn with
/// `calls` to `list`'s tools, as `case`'s template renders it, whether the
/// prompt opened reasoning (then the turn reasons [`THOUGHT`] first), and
/// the reply parsed back.
fn round_trip(case: &Case, list: &[Value], content: &str, calls: &[ToolCall]) -> (String, bool, Reply) {
    let tools = Some(list.to_vec());
    let user = ChatMessage::user("What now?");
    let prompt = case
        .template
        .render_with(
            std::slice::from_ref(&user),
            &RenderOptions {
                add_generation_prompt: true,
                tools: tools.clone(),
                kwargs: Map::new(),
            },
        )
        .unwrap();
    let in_reasoning = case.dialect.starts_in_reasoning(&prompt);
    let mut turn = ChatMessage::assistant(content);
    if in_reasoning {
        turn = turn.with_reasoning(THOUGHT);
    }
    for (i, c) in calls.iter().enumerate() {
        let id = format!("call_{i}");
        turn.tool_calls.push(MessageToolCall::function(
            &id,
            &c.name,
            c.arguments.clone(),
            None,
            case.dialect,
        ));
    }
    let full = case
        .template
        .render_with(
            &[user, turn],
            &RenderOptions {
                add_generation_prompt: false,
                tools,
                kwargs: Map::new(),
            },
        )
        .unwrap_or_else(|e| panic!("{}: {e:?}", case.name));
    // The built-in ChatML format opens the reply with an empty think block
    // that a finished turn does not show: the reply is what follows the part
    // both share, and that is all they may differ by.
    let mut common = full
        .bytes()
        .zip(prompt.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    if common < prompt.len() {
        // Back to a line start, not inside the marker both begin with `<`.
        common = full[..common].rfind('\n').map_or(0, |at| at + 1);
    }
    let unshared = prompt[common..].replace("<think>", "").replace("</think>", "");
    assert!(
        unshared.trim().is_empty(),
        "{}: {full:?} does not continue {prompt:?}",
        case.name
    );
    let mut reply = &full[common..];
    if !case.end.is_empty()
        && let Some(at) = reply.rfind(case.end)
    {
        reply = &reply[..at];
    }
    let parsed = ReplyParser::parse(case.dialect, Some(tool_set_of(list)), in_reasoning, reply);
    (reply.to_string(), in_reasoning, parsed)
}

#[test]
fn templates_show_their_dialect() {
    for case in cases() {
        assert_eq!(case.template.dialect(), case.dialect, "{}", case.name);
    }
}

#[test]
fn a_rendered_call_parses_back() {
    let case = &cases()[0];
    let call = ToolCall {
        name: "get_weather".into(),
        arguments: json!({"city": "Paris", "days": 2}),
    };
    let (text, _, reply) = round_trip(case, &tool_list(), "Let me check.", std::slice::from_ref(&call));
    assert_eq!(
        text,
        "<think>\n\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>"
    );
    assert_eq!(reply.content, "Let me check.");
    assert_eq!(reply.calls, vec![call]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_format_reads_back_what_its_template_writes(
        content in content(),
        calls in proptest::collection::vec(call(), 1..4),
        names in names(),
    ) {
        let (list, calls) = renamed(&names, &calls);
        for case in cases() {
            let calls = &calls[..calls.len().min(case.max_calls)];
            let (text, in_reasoning, reply) = round_trip(&case, &list, &content, calls);
            prop_assert_eq!(&reply.calls, &calls.to_vec(), "{}: {:?}", case.name, text);
            let thought = if in_reasoning { THOUGHT } else { "" };
            let (got, other, other_is) = match case.content {
                Where::Content => (&reply.content, &reply.reasoning, thought),
                Where::Reasoning => (&reply.reasoning, &reply.content, ""),
                Where::Dropped => (&reply.content, &reply.reasoning, thought),
            };
            if case.content != Where::Dropped {
                prop_assert_eq!(got, &content, "{}: {:?}", case.name, text);
            }
            prop_assert_eq!(other, other_is, "{}: {:?}", case.name, text);
            // Piece by piece, the same.
            let streamed = chunked(case.dialect, tool_set_of(&list), in_reasoning, &text, &[3, 1, 7, 2]);
            prop_assert_eq!(&streamed, &reply, "{}", case.name);
        }
    }
}

/// `text` fed in pieces of the given byte lengths (cycled, moved to
/// character boundaries).
fn chunked(dialect: Dialect, tools: ToolSet, in_reasoning: bool, text: &str, sizes: &[usize]) -> Reply {
    let mut p = ReplyParser::new(dialect, Some(tools), in_reasoning);
    let mut deltas: Vec<Delta> = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < text.len() {
        let mut end = (at + sizes[i % sizes.len()].max(1)).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        deltas.extend(p.push(&text[at..end]));
        at = end;
        i += 1;
    }
    deltas.extend(p.finish());
    Reply::from_deltas(deltas)
}

/// Pieces a reply may be made of, for each format: text full of marker
/// fragments, reasoning, well-formed calls and broken ones.
fn segment(syntax: CallSyntax) -> impl Strategy<Value = String> {
    let frag = prop_oneof![
        any_text(),
        Just("<".to_string()),
        Just("<think>".to_string()),
        Just("</think>".to_string()),
        Just("<tool_call>".to_string()),
        Just("</tool_call>".to_string()),
        Just("<arg_key>x</arg_key>".to_string()),
        Just("<function=now>".to_string()),
        Just("</parameter>".to_string()),
        Just("<minimax:tool_call>".to_string()),
        Just("<invoke name=\"now\">".to_string()),
        Just("</invoke>".to_string()),
        Just("</minimax:tool_call>".to_string()),
        Just("[TOOL_CALLS]".to_string()),
        Just("<｜tool▁calls▁begin｜>".to_string()),
        Just("<|channel|>".to_string()),
        Just("<|message|>".to_string()),
        Just("<|end|>".to_string()),
        Just("<|start|>assistant".to_string()),
        Just("\n\n".to_string()),
        Just("{\"name\": \"now\"".to_string()),
    ];
    let good = call().prop_map(move |c| written(syntax, &c));
    prop_oneof![3 => frag, 1 => good]
}

/// `call` as `syntax` writes it.
fn written(syntax: CallSyntax, c: &ToolCall) -> String {
    let args = c.arguments.to_string();
    match syntax {
        CallSyntax::Hermes => format!(
            "<tool_call>\n{{\"name\": \"{}\", \"arguments\": {args}}}\n</tool_call>",
            c.name
        ),
        CallSyntax::Glm { newlines } => {
            let nl = if newlines { "\n" } else { "" };
            let mut s = format!("<tool_call>{}{nl}", c.name);
            for (k, v) in c.arguments.as_object().unwrap() {
                let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                s.push_str(&format!(
                    "<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>{nl}"
                ));
            }
            s + "</tool_call>"
        }
        CallSyntax::QwenXml => {
            let mut s = format!("<tool_call>\n<function={}>\n", c.name);
            for (k, v) in c.arguments.as_object().unwrap() {
                let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                s.push_str(&format!("<parameter={k}>\n{v}\n</parameter>\n"));
            }
            s + "</function>\n</tool_call>"
        }
        CallSyntax::MiniMax => {
            let mut s = format!("<minimax:tool_call>\n<invoke name=\"{}\">\n", c.name);
            for (k, v) in c.arguments.as_object().unwrap() {
                let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                s.push_str(&format!("<parameter name=\"{k}\">{v}</parameter>\n"));
            }
            s + "</invoke>\n</minimax:tool_call>"
        }
        CallSyntax::Harmony => format!(
            "<|start|>assistant<|channel|>commentary to=functions.{} <|constrain|>json<|message|>{args}<|end|>",
            c.name
        ),
        CallSyntax::DeepSeek { .. } => format!(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{}\n```json\n{args}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            c.name
        ),
        CallSyntax::Mistral => format!(
            "[TOOL_CALLS] [{{\"name\": \"{}\", \"arguments\": {args}}}]",
            c.name
        ),
    }
}

fn syntaxes() -> Vec<(CallSyntax, bool)> {
    vec![
        (CallSyntax::Hermes, true),
        (CallSyntax::Glm { newlines: true }, true),
        (CallSyntax::Glm { newlines: false }, true),
        (CallSyntax::Harmony, false),
        (CallSyntax::DeepSeek { fenced: true }, true),
        (CallSyntax::Mistral, false),
        (CallSyntax::QwenXml, false),
        (CallSyntax::MiniMax, true),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn pieces_parse_as_the_whole(
        which in 0usize..8,
        sizes in proptest::collection::vec(1usize..12, 1..6),
        in_reasoning in any::<bool>(),
        tools_on in any::<bool>(),
        text in proptest::collection::vec(
            prop_oneof![
                segment(CallSyntax::Hermes),
                segment(CallSyntax::Glm { newlines: true }),
                segment(CallSyntax::Harmony),
                segment(CallSyntax::DeepSeek { fenced: true }),
                segment(CallSyntax::Mistral),
                segment(CallSyntax::MiniMax),
            ],
            0..8,
        ),
    ) {
        let (syntax, think) = syntaxes()[which];
        let dialect = Dialect { calls: Some(syntax), think };
        let text: String = text.concat();
        let tools = tools_on.then(tool_set);
        let whole = ReplyParser::parse(dialect, tools.clone(), in_reasoning, &text);
        let mut p = ReplyParser::new(dialect, tools, in_reasoning);
        let mut deltas = Vec::new();
        let mut at = 0;
        let mut i = 0;
        while at < text.len() {
            let mut end = (at + sizes[i % sizes.len()]).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            deltas.extend(p.push(&text[at..end]));
            at = end;
            i += 1;
        }
        deltas.extend(p.finish());
        prop_assert_eq!(Reply::from_deltas(deltas), whole, "{:?}", text);
    }
}

#[test]
fn text_around_calls_and_broken_calls() {
    let d = Dialect {
        calls: Some(CallSyntax::Hermes),
        think: true,
    };
    let r = ReplyParser::parse(
        d,
        Some(tool_set()),
        false,
        "<think>\nhmm\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
    );
    assert_eq!(
        (r.reasoning.as_str(), r.content.as_str(), r.calls.len()),
        ("hmm", "Sure.", 1)
    );
    // A call to a tool not offered, broken JSON, an unclosed block: content.
    for text in [
        "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
        "a <tool_call>{\"name\": \"now\", \"arguments\": {</tool_call> b",
        "<tool_call>{\"name\": \"now\"",
    ] {
        let r = ReplyParser::parse(d, Some(tool_set()), false, text);
        assert!(r.calls.is_empty(), "{text}");
        assert_eq!(r.content, text.trim(), "{text}");
    }
    // Without tools, a well-formed call is just text.
    let text = "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
    assert_eq!(ReplyParser::parse(d, None, false, text).content, text);
    // `<think>` later in the reply is text; reasoning the prompt opened ends at `</think>`.
    assert_eq!(
        ReplyParser::parse(d, None, false, "a <think>b").content,
        "a <think>b"
    );
    let r = ReplyParser::parse(d, None, true, "deep thought</think>answer");
    assert_eq!(
        (r.reasoning.as_str(), r.content.as_str()),
        ("deep thought", "answer")
    );
    // A reply cut short inside reasoning keeps it as reasoning.
    let r = ReplyParser::parse(d, None, false, "<think>still going");
    assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("still going", ""));
}

#[test]
fn streaming_holds_back_only_possible_markers() {
    let d = Dialect {
        calls: Some(CallSyntax::Hermes),
        think: true,
    };
    let mut p = ReplyParser::new(d, Some(tool_set()), false);
    assert_eq!(p.push("Hello"), vec![Delta::Content("Hello".into())]);
    assert_eq!(p.push(" there <tool"), vec![Delta::Content(" there".into())]);
    assert_eq!(
        p.push("box> done"),
        vec![Delta::Content(" <toolbox> done".into())]
    );
    assert_eq!(p.push("\n<tool_call>\n{\"name\": \"now\", "), vec![]);
    assert_eq!(
        p.push("\"arguments\": {}}\n</tool_call>"),
        vec![Delta::Call(ToolCall {
            name: "now".into(),
            arguments: json!({})
        })]
    );
    assert_eq!(p.finish(), vec![]);
}

/// Prose after a call marker is found to be no call while it streams, not
/// only at the reply's end.
#[test]
fn a_false_start_is_released_before_the_end() {
    let d = Dialect {
        calls: Some(CallSyntax::Hermes),
        think: false,
    };
    let mut p = ReplyParser::new(d, Some(tool_set()), false);
    let mut early = Reply::default();
    for piece in std::iter::once("<tool_call>{".to_string()).chain((0..100).map(|i| format!("word{i} "))) {
        for delta in p.push(&piece) {
            early.add(delta);
        }
    }
    assert!(early.content.starts_with("<tool_call>{word0 word1"), "{early:?}");
    assert!(early.calls.is_empty());
}

/// The MiniMax-M2-shaped template's case.
fn minimax_case() -> Case {
    cases()
        .into_iter()
        .find(|c| c.name == "minimax-m2-tools")
        .expect("the MiniMax-M2 case")
}

/// A MiniMax-M2 reply as its template writes it: the reasoning the prompt
/// opened, content, and the calls (`calls` renamed to `names`, all in one
/// block); where the content starts (after `</think>`) and the block's
/// byte range.
fn minimax_reply(
    content: &str,
    calls: &[ToolCall],
    names: &[String; 3],
) -> (Vec<Value>, String, usize, std::ops::Range<usize>) {
    let (list, calls) = renamed(names, calls);
    let (text, in_reasoning, _) = round_trip(&minimax_case(), &list, content, &calls);
    assert!(in_reasoning, "the prompt opens <think>");
    let body = text.find("</think>").expect("reasoning closed") + "</think>".len();
    let open = text.find("<minimax:tool_call>").expect("a block");
    let close = text.rfind("</minimax:tool_call>").expect("a closed block") + "</minimax:tool_call>".len();
    (list, text, body, open..close)
}

fn minimax() -> Dialect {
    Dialect {
        calls: Some(CallSyntax::MiniMax),
        think: true,
    }
}

/// Where the block's markup tags are (not its names or values).
fn minimax_tags(text: &str, block: &std::ops::Range<usize>) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for tag in ["<invoke name=", "</invoke>", "<parameter name="] {
        let mut from = block.start;
        while let Some(at) = text[from..block.end].find(tag) {
            out.push((from + at, tag.len()));
            from += at + tag.len();
        }
    }
    out.sort_unstable();
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Up to six parallel calls in one block, any names and values, read
    /// back whole and piece by piece, after the reasoning the prompt opened.
    #[test]
    fn minimax_parallel_calls_read_back(
        content in content(),
        calls in proptest::collection::vec(call(), 1..7),
        names in names(),
        sizes in proptest::collection::vec(1usize..12, 1..6),
    ) {
        let (list, text, _, _) = minimax_reply(&content, &calls, &names);
        let (_, calls) = renamed(&names, &calls);
        let reply = ReplyParser::parse(minimax(), Some(tool_set_of(&list)), true, &text);
        prop_assert_eq!(&reply.calls, &calls, "{:?}", text);
        prop_assert_eq!(&reply.content, &content, "{:?}", text);
        prop_assert_eq!(reply.reasoning.as_str(), THOUGHT, "{:?}", text);
        prop_assert_eq!(chunked(minimax(), tool_set_of(&list), true, &text, &sizes), reply);
    }

    /// A block the reply's end cuts inside a call, or one whose markup lost
    /// a character, is no call: all of its text stays content, streamed or not.
    #[test]
    fn a_cut_or_garbled_minimax_block_stays_text(
        content in content(),
        calls in proptest::collection::vec(call(), 1..4),
        names in names(),
        cut in any::<proptest::sample::Index>(),
        tag in any::<proptest::sample::Index>(),
        at in any::<proptest::sample::Index>(),
        sizes in proptest::collection::vec(1usize..12, 1..6),
    ) {
        let (list, text, body, block) = minimax_reply(&content, &calls, &names);
        let tools = tool_set_of(&list);
        // Cut before the last call's end.
        let last_end = text[..block.end].rfind("</invoke>").expect("a call") + "</invoke>".len();
        let mut end = block.start + 1 + cut.index(last_end - block.start - 1);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        // A cut right after a whole `</invoke>` leaves whole calls whose
        // block only lacks its closing tag, which are read as calls; step
        // back into that tag so the cut falls inside a call.
        while text[..end].trim_end().ends_with("</invoke>") {
            end = text[..end].trim_end().len() - 1;
        }
        // One character of one tag left out.
        let tags = minimax_tags(&text, &block);
        let (tag_at, tag_len) = tags[tag.index(tags.len())];
        let drop = tag_at + at.index(tag_len);
        let garbled = format!("{}{}", &text[..drop], &text[drop + 1..]);
        for bad in [&text[..end], garbled.as_str()] {
            let reply = ReplyParser::parse(minimax(), Some(tools.clone()), true, bad);
            prop_assert!(reply.calls.is_empty(), "{:?}", bad);
            prop_assert_eq!(reply.reasoning.as_str(), THOUGHT, "{:?}", bad);
            prop_assert_eq!(reply.content.as_str(), bad[body..].trim(), "{:?}", bad);
            prop_assert_eq!(chunked(minimax(), tools.clone(), true, bad, &sizes), reply);
        }
    }
}

/// Text before and after a block is content, in reply order; a block of
/// an unknown tool, or cut off, is text; without tools a block is text.
#[test]
fn minimax_text_around_calls_and_broken_calls() {
    let block = "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Oslo</parameter>\n\
                 <parameter name=\"days\">2</parameter>\n</invoke>\n<invoke name=\"now\">\n</invoke>\n</minimax:tool_call>";
    let text = format!("Let me see.\n</think>\n\nSure.\n{block}\nAnything else?");
    let mut p = ReplyParser::new(minimax(), Some(tool_set()), true);
    let mut deltas = p.push(&text);
    deltas.extend(p.finish());
    assert_eq!(
        deltas,
        vec![
            Delta::Reasoning("Let me see.".into()),
            Delta::Content("Sure.".into()),
            Delta::Call(ToolCall {
                name: "get_weather".into(),
                arguments: json!({"city": "Oslo", "days": 2})
            }),
            Delta::Call(ToolCall {
                name: "now".into(),
                arguments: json!({})
            }),
            Delta::Content("Anything else?".into()),
        ]
    );
    for text in [
        "<minimax:tool_call>\n<invoke name=\"rm_rf\">\n</invoke>\n</minimax:tool_call>",
        "a <minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Oslo",
        "<minimax:tool_call>\n<invoke name=\"now\">\n</invoke>\n<invoke name=\"now\">",
        "<minimax:tool_call> is the tag I would use </minimax:tool_call> b",
    ] {
        let r = ReplyParser::parse(minimax(), Some(tool_set()), false, text);
        assert!(r.calls.is_empty(), "{text}");
        assert_eq!(r.content, text.trim(), "{text}");
    }
    assert_eq!(ReplyParser::parse(minimax(), None, false, block).content, block);
}
