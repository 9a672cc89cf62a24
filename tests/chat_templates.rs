//! Chat templates shaped like the published ones (gpt-oss's harmony
//! template with `strftime_now`, Qwen3's ChatML with thinking, and the tool
//! templates of Qwen3, GLM-4.5, gpt-oss, DeepSeek-V3, Mistral and MiniMax-M2 with
//! offered tools, calls, results and `chat_template_kwargs`, and the
//! bundled model's own template with tools) render
//! exactly as transformers renders them: fixtures/chat-templates/expected.json
//! was written by Jinja2 configured as transformers configures it
//! (tools/make_chat_template_fixtures.py), with the clock pinned to
//! 2025-08-05 17:04:09 UTC, which the tests inject.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use colibri::chat_template::{ChatFormat, ChatMessage, ChatTemplate, RenderOptions, TemplateError};

/// 2025-08-05 17:04:09 UTC.
const PINNED: u64 = 1_754_413_449;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/chat-templates")
}

fn pinned() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(PINNED)
}

/// A fixture template, or (`colibri-tiny`) the bundled model's own.
fn template(name: &str) -> ChatTemplate {
    let src = if name == "colibri-tiny" {
        let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny/tokenizer_config.json");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
        v["chat_template"].as_str().unwrap().to_string()
    } else {
        std::fs::read_to_string(dir().join(name)).unwrap()
    };
    ChatTemplate::new(&src, "<|startoftext|>", "<|return|>", name)
        .unwrap()
        .with_clock(pinned)
}

#[derive(serde::Deserialize)]
struct Case {
    template: String,
    /// As colibri's `ChatMessage` serializes (what Jinja2 was given).
    messages: Vec<serde_json::Value>,
    add_generation_prompt: bool,
    tools: Option<Vec<serde_json::Value>>,
    kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    rendered: Option<String>,
    error: Option<String>,
}

fn error_chain(e: &TemplateError) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

#[test]
fn realistic_templates_render_as_transformers_does() {
    let text = std::fs::read_to_string(dir().join("expected.json")).unwrap();
    let cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    assert!(cases.len() >= 18);
    assert!(cases.iter().filter(|c| c.tools.is_some()).count() >= 10);
    for (i, case) in cases.iter().enumerate() {
        let t = template(&case.template);
        let msgs: Vec<ChatMessage> = serde_json::from_value(case.messages.clone().into()).unwrap();
        // The template sees the same fields Jinja2 saw, no more.
        assert_eq!(
            serde_json::to_value(&msgs).unwrap(),
            serde_json::Value::from(case.messages.clone()),
            "case {i}"
        );
        let opts = RenderOptions {
            add_generation_prompt: case.add_generation_prompt,
            tools: case.tools.clone(),
            kwargs: case.kwargs.clone().unwrap_or_default(),
        };
        let got = t.render_with(&msgs, &opts);
        match (&case.rendered, &case.error) {
            (Some(want), None) => assert_eq!(got.unwrap(), *want, "case {i} ({})", case.template),
            (None, Some(want)) => {
                let err = error_chain(&got.expect_err(&format!("case {i} rendered")));
                assert!(err.contains(want.as_str()), "case {i}: {err}");
            }
            _ => panic!("case {i}: expected.json needs `rendered` or `error`"),
        }
    }
}

/// `strftime_now` reads the injected clock, in UTC; `render_turn` reads it
/// once, so a date that changes between the turn's two renders (midnight)
/// still gives a clean delta. The harmony-style template closes a final
/// assistant turn with `<|return|>` but an earlier one with `<|end|>`: the
/// delta starts at that whole special token.
#[test]
fn strftime_now_follows_the_injected_clock() {
    let src = "{{ strftime_now('%Y-%m-%d %H:%M') }}|{{ strftime_now('%d %b %Y') }}";
    let t = ChatTemplate::new(src, "", "", "t").unwrap().with_clock(pinned);
    assert_eq!(t.render(&[], true).unwrap(), "2025-08-05 17:04|05 Aug 2025");
    let t = t.with_clock(|| UNIX_EPOCH + Duration::from_secs(951_782_400 + 86_399));
    assert_eq!(t.render(&[], true).unwrap(), "2000-02-29 23:59|29 Feb 2000");

    // A clock a day later at every reading.
    let calls = Arc::new(AtomicU64::new(0));
    let c = calls.clone();
    let t = template("harmony-style.jinja")
        .with_clock(move || pinned() + Duration::from_secs(86_400 * c.fetch_add(1, Ordering::SeqCst)));
    let history = [ChatMessage::user("Hi"), ChatMessage::assistant("Hello!")];
    let delta = t.render_turn(&history, "Again").unwrap();
    assert_eq!(
        delta,
        "<|end|><|start|>user<|message|>Again<|end|><|start|>assistant"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(
        t.render(&history, false)
            .unwrap()
            .contains("Current date: 2025-08-06")
    );

    let err = ChatTemplate::new("{{ strftime_now('%Q') }}", "", "", "t")
        .unwrap()
        .render(&[], true)
        .unwrap_err();
    assert!(error_chain(&err).contains("%Q"), "{}", error_chain(&err));
}

/// Without an injected clock the date is today's (UTC).
#[test]
fn strftime_now_defaults_to_the_system_clock() {
    let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "", "t").unwrap();
    let year: i64 = t.render(&[], true).unwrap().parse().unwrap();
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    // Within a day of 1970 + secs / (365.2425 days).
    let approx = 1970 + secs / 31_556_952;
    assert!((year - approx).abs() <= 1, "{year} vs {approx}");
}

/// transformers' `tojson`: Python's `json.dumps` layout and arguments, not
/// Jinja's HTML-safe compact form.
#[test]
fn tojson_is_json_dumps() {
    let cases = [
        (
            "{{ {'a': '<b> & \\'c\\'', 'n': [1, 2.5, true, none, 1e-05], 'u': 'ñ'} | tojson }}",
            r#"{"a": "<b> & 'c'", "n": [1, 2.5, true, null, 1e-05], "u": "ñ"}"#,
        ),
        (
            "{{ {'k': [1, {}], 'e': []} | tojson(indent=2, sort_keys=True) }}",
            "{\n  \"e\": [],\n  \"k\": [\n    1,\n    {}\n  ]\n}",
        ),
        (
            "{{ 'ñ😀' | tojson(ensure_ascii=True) }}",
            r#""\u00f1\ud83d\ude00""#,
        ),
        ("{{ [1, 'x'] | tojson(separators=(',', ':')) }}", r#"[1,"x"]"#),
        (
            "{{ messages[0] | tojson }}",
            r#"{"role": "user", "content": "a\nb"}"#,
        ),
        ("{{ 'x' | tojson(indent='\\t') }}", r#""x""#),
    ];
    for (src, want) in cases {
        let t = ChatTemplate::new(src, "", "", "t").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::user("a\nb")], true).unwrap(),
            want,
            "{src}"
        );
    }
    for bad in [
        "{{ 1 | tojson(colour=1) }}",
        "{{ 1 | tojson(indent=[1]) }}",
        "{{ 1 | tojson(separators=',') }}",
        "{{ undefined_thing | tojson }}",
    ] {
        let t = ChatTemplate::new(bad, "", "", "t").unwrap();
        assert!(t.render(&[], true).is_err(), "{bad}");
    }
}

/// A model directory shipping the harmony-style template as
/// chat_template.jinja (as gpt-oss does) renders through `of_model`.
#[test]
fn a_shipped_jinja_template_uses_the_clock() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir().join("harmony-style.jinja"),
        tmp.path().join("chat_template.jinja"),
    )
    .unwrap();
    let t = ChatTemplate::of_model(tmp.path(), ChatFormat::HARMONY)
        .unwrap()
        .unwrap()
        .with_clock(pinned);
    let s = t.render(&[ChatMessage::user("Hi")], true).unwrap();
    assert!(
        s.starts_with("<|start|>system<|message|>You are a tiny random model.\n"),
        "{s}"
    );
    assert!(s.contains("Current date: 2025-08-05\n"), "{s}");
    assert!(
        s.ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant"),
        "{s}"
    );
}
