//! Tool calling over real HTTP: a model directory with a Qwen3-style
//! (hermes) template that renders tools (the bundled model's files, its
//! template swapped for fixtures/chat-templates/qwen3-tools.jinja) takes
//! requests with tools, assistant tool calls in the history and tool
//! results, on the OpenAI and Anthropic endpoints; streamed replies add up
//! to the unstreamed ones; bad tools and tool messages are refused naming
//! the parameter; the bundled model, whose template knows no tools, refuses
//! them. Every wait is on an event (a response); timeouts are hang guards.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use serde_json::{Value, json};
use support::{ColiChild, coli_command, repo, tiny_chat_model};

const HANG_GUARD: Duration = Duration::from_secs(180);

/// The bundled model with a tool-rendering template, in a temporary dir.
fn hermes_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = tiny_chat_model();
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        std::fs::copy(src.join(f), dir.path().join(f)).expect("copy the bundled model");
    }
    let cfg_text = std::fs::read_to_string(src.join("tokenizer_config.json")).expect("tokenizer_config.json");
    let mut cfg: Value = serde_json::from_str(&cfg_text).expect("tokenizer_config.json is JSON");
    let template = std::fs::read_to_string(repo().join("fixtures/chat-templates/qwen3-tools.jinja"))
        .expect("qwen3-tools.jinja");
    cfg["chat_template"] = Value::from(template);
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).expect("write config");
    dir
}

struct HttpServer {
    _child: ColiChild,
    base: String,
}

impl HttpServer {
    fn start(model: &Path) -> HttpServer {
        let mut child = coli_command()
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args([
                "--http",
                "127.0.0.1:0",
                "--threads",
                "1",
                "--kv-slots",
                "2",
                "--no-web",
            ])
            .env_remove("COLI_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let err = child.stderr.take().expect("stderr piped");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if line.contains("listening on http://") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = rx.recv_timeout(HANG_GUARD).expect("the server's ready line");
        let addr = line
            .split("listening on http://")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .expect("address in the ready line")
            .to_string();
        HttpServer {
            _child: child,
            base: format!("http://{addr}"),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = client()
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text:?}"));
        (status, v)
    }

    /// A streamed request's events as (name, data) pairs.
    async fn stream(&self, path: &str, body: &Value) -> Vec<(Option<String>, String)> {
        let r = client()
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status().as_u16(), 200);
        let text = r.text().await.expect("body");
        text.split("\n\n")
            .filter_map(|block| {
                let mut name = None;
                let mut data = Vec::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                (!data.is_empty()).then(|| (name, data.join("\n")))
            })
            .collect()
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(HANG_GUARD)
        .build()
        .expect("http client")
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

/// A conversation that called a tool and got its result back.
fn openai_body(extra: Value) -> Value {
    let mut b = json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        "tools": [weather_tool()],
        "tool_choice": "auto",
        "temperature": 0,
        "max_tokens": 24,
    });
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
    b
}

fn anthropic_body(extra: Value) -> Value {
    let mut b = json!({
        "model": "m",
        "max_tokens": 24,
        "temperature": 0,
        "system": "Use tools.",
        "tools": [{"name": "get_weather", "description": "Weather in a city",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
        ],
    });
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
    b
}

/// An OpenAI stream's chunks put back together as a message.
fn openai_message(events: &[(Option<String>, String)]) -> (Value, String) {
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"));
    let (mut content, mut reasoning) = (String::new(), String::new());
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = None;
    for (_, data) in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(data).expect("chunk JSON");
        let choice = &c["choices"][0];
        let d = &choice["delta"];
        content.push_str(d["content"].as_str().unwrap_or(""));
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().expect("index") as usize;
            if i == calls.len() {
                calls.push(json!({"id": tc["id"], "type": tc["type"],
                                  "function": {"name": tc["function"]["name"], "arguments": ""}}));
            }
            let args = format!(
                "{}{}",
                calls[i]["function"]["arguments"].as_str().unwrap_or(""),
                tc["function"]["arguments"].as_str().unwrap_or("")
            );
            calls[i]["function"]["arguments"] = json!(args);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    let mut m = json!({"role": "assistant",
                       "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { json!(content) },
                       "refusal": null});
    if !reasoning.is_empty() {
        m["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        m["tool_calls"] = json!(calls);
    }
    (m, finish.expect("a finish chunk"))
}

/// An Anthropic stream's events put back together as content blocks.
fn anthropic_content(events: &[(Option<String>, String)]) -> (Vec<Value>, String) {
    let mut blocks: Vec<Value> = Vec::new();
    let mut json_parts: Vec<String> = Vec::new();
    let mut stop = None;
    for (name, data) in events {
        let v: Value = serde_json::from_str(data).expect("event JSON");
        assert_eq!(v["type"].as_str(), name.as_deref(), "{v}");
        match name.as_deref() {
            Some("content_block_start") => {
                assert_eq!(v["index"].as_u64(), Some(blocks.len() as u64), "{v}");
                blocks.push(v["content_block"].clone());
                json_parts.push(String::new());
            }
            Some("content_block_delta") => {
                let i = v["index"].as_u64().expect("index") as usize;
                let d = &v["delta"];
                for (kind, field) in [("text_delta", "text"), ("thinking_delta", "thinking")] {
                    if d["type"] == kind {
                        let t = format!(
                            "{}{}",
                            blocks[i][field].as_str().unwrap_or(""),
                            d[field].as_str().unwrap_or("")
                        );
                        blocks[i][field] = json!(t);
                    }
                }
                if d["type"] == "input_json_delta" {
                    json_parts[i].push_str(d["partial_json"].as_str().unwrap_or(""));
                }
            }
            Some("content_block_stop") => {
                let i = v["index"].as_u64().expect("index") as usize;
                if blocks[i]["type"] == "tool_use" {
                    blocks[i]["input"] = serde_json::from_str(&json_parts[i]).expect("tool input JSON");
                }
            }
            Some("message_delta") => stop = v["delta"]["stop_reason"].as_str().map(str::to_string),
            _ => {}
        }
    }
    (blocks, stop.expect("a message_delta"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_conversations_are_answered_on_both_apis() {
    let model = hermes_model();
    let srv = HttpServer::start(model.path());

    // OpenAI: the history with a call and its result is taken, the tools
    // reach the prompt, and the stream adds up to the unstreamed reply.
    let (status, v) = srv.post("/v1/chat/completions", &openai_body(json!({}))).await;
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    let finish = choice["finish_reason"].as_str().expect("finish_reason");
    assert!(["stop", "length", "tool_calls"].contains(&finish), "{v}");
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(finish == "tool_calls", !calls.is_empty(), "{v}");
    for c in &calls {
        assert!(c["id"].as_str().is_some_and(|s| s.starts_with("call_")), "{c}");
        assert_eq!(c["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(c["function"]["arguments"].as_str().expect("arguments")).expect("JSON");
        assert!(args.is_object());
    }
    let with_tools = v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    let events = srv
        .stream("/v1/chat/completions", &openai_body(json!({"stream": true})))
        .await;
    let (streamed, sfinish) = openai_message(&events);
    assert_eq!(streamed, choice["message"], "{events:?}");
    assert_eq!(sfinish, finish);

    // Without tools the prompt is shorter; `tool_choice: none` keeps the
    // tools in it (the reply is not read for calls).
    let mut no_tools = openai_body(json!({}));
    no_tools.as_object_mut().map(|o| o.remove("tools"));
    no_tools.as_object_mut().map(|o| o.remove("tool_choice"));
    let (status, v) = srv.post("/v1/chat/completions", &no_tools).await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens") < with_tools,
        "{v}"
    );
    let (status, v) = srv
        .post(
            "/v1/chat/completions",
            &openai_body(json!({"tool_choice": "none"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(with_tools));
    assert!(v["choices"][0]["message"].get("tool_calls").is_none(), "{v}");

    // chat_template_kwargs reach the template (Qwen3's `enable_thinking:
    // false` adds an empty think block to the prompt).
    let (status, v) = srv
        .post(
            "/v1/chat/completions",
            &openai_body(json!({"chat_template_kwargs": {"enable_thinking": false}})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens") > with_tools,
        "{v}"
    );

    // A forced call is accepted (the grammar forcing it is checked in
    // src/tool_calls/grammar.rs).
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let (status, v) = srv
            .post(
                "/v1/chat/completions",
                &openai_body(json!({"tool_choice": choice})),
            )
            .await;
        assert_eq!(status, 200, "{v}");
    }

    // Anthropic: tool_use and tool_result blocks in the history.
    let (status, v) = srv.post("/v1/messages", &anthropic_body(json!({}))).await;
    assert_eq!(status, 200, "{v}");
    let content = v["content"].as_array().cloned().expect("content");
    assert!(!content.is_empty(), "{v}");
    let stop = v["stop_reason"].as_str().expect("stop_reason");
    assert!(["end_turn", "max_tokens", "tool_use"].contains(&stop), "{v}");
    for b in &content {
        if b["type"] == "tool_use" {
            assert!(b["id"].as_str().is_some_and(|s| s.starts_with("toolu_")), "{b}");
            assert!(b["input"].is_object(), "{b}");
        }
    }
    let events = srv
        .stream("/v1/messages", &anthropic_body(json!({"stream": true})))
        .await;
    let (blocks, sstop) = anthropic_content(&events);
    assert_eq!(Value::from(blocks), v["content"], "{events:?}");
    assert_eq!(sstop, stop);
    for thinking in [
        json!({"type": "enabled", "budget_tokens": 1024}),
        json!({"type": "disabled"}),
    ] {
        let (status, v) = srv
            .post("/v1/messages", &anthropic_body(json!({"thinking": thinking})))
            .await;
        assert_eq!(status, 200, "{v}");
    }
    let (status, v) = srv
        .post(
            "/v1/messages",
            &anthropic_body(json!({"tool_choice": {"type": "tool", "name": "get_weather"}})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tools_and_tool_messages_are_refused() {
    let model = hermes_model();
    let srv = HttpServer::start(model.path());
    let tool_msg = |extra: Value| {
        let mut m = json!({"role": "tool", "content": "sunny"});
        if let (Some(o), Value::Object(e)) = (m.as_object_mut(), extra) {
            o.extend(e);
        }
        m
    };
    let history = |last: Value| {
        json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"}}]},
            last,
        ])
    };
    let openai_cases = [
        (
            json!({"tools": [{"type": "function", "function": {"name": "get weather"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}),
            "tools[0].function.parameters",
        ),
        (json!({"tools": [{"type": "code_interpreter"}]}), "tools[0].type"),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (
            json!({"messages": history(tool_msg(json!({})))}),
            "messages[2].tool_call_id",
        ),
        (
            json!({"messages": history(tool_msg(json!({"tool_call_id": "call_9"})))}),
            "messages[2].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "get_weather", "arguments": "{oops"}}]}]}),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            json!({"chat_template_kwargs": {"tools": []}}),
            "chat_template_kwargs",
        ),
        (json!({"chat_template_kwargs": 3}), "chat_template_kwargs"),
        (json!({"functions": [{"name": "f"}]}), "functions"),
    ];
    for (extra, param) in openai_cases {
        let (status, v) = srv
            .post("/v1/chat/completions", &openai_body(extra.clone()))
            .await;
        assert_eq!(status, 400, "{extra}: {v}");
        assert_eq!(v["error"]["param"], param, "{extra}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
    let mut no_tools = openai_body(json!({"tool_choice": "required"}));
    no_tools.as_object_mut().map(|o| o.remove("tools"));
    let (status, v) = srv.post("/v1/chat/completions", &no_tools).await;
    assert_eq!(
        (status, v["error"]["param"].clone()),
        (400, json!("tool_choice")),
        "{v}"
    );

    let anthropic_cases = [
        (json!({"tools": [{"name": "f"}]}), "tools[0].input_schema"),
        (
            json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"tool_choice": {"type": "tool", "name": "nope"}}),
            "tool_choice",
        ),
        (json!({"thinking": {"type": "sometimes"}}), "thinking.type"),
        (json!({"thinking": {"type": "enabled"}}), "thinking.budget_tokens"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}]}),
            "messages[0].content[0].tool_use_id",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}),
            "messages[0].content[0].type",
        ),
    ];
    for (extra, param) in anthropic_cases {
        let (status, v) = srv.post("/v1/messages", &anthropic_body(extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {v}");
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(param), "{extra}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_tool_format_refuses_tools() {
    let srv = HttpServer::start(&tiny_chat_model());
    let body =
        json!({"messages": [{"role": "user", "content": "Hi"}], "tools": [weather_tool()], "max_tokens": 4});
    let (status, v) = srv.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "tools");
    assert_eq!(v["error"]["code"], "unsupported_parameter");
    // Offered but not to be called: fine.
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    let (status, v) = srv.post("/v1/chat/completions", &none).await;
    assert_eq!(status, 200, "{v}");
    let body = json!({"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}],
                      "tools": [{"name": "f", "input_schema": {"type": "object"}}]});
    let (status, v) = srv.post("/v1/messages", &body).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error");
}
