//! Tool calling over real HTTP: a model directory with a Qwen3-style
//! (hermes) template that renders tools (the bundled model's files, its
//! template swapped for fixtures/chat-templates/qwen3-tools.jinja) takes
//! requests with tools, assistant tool calls in the history and tool
//! results, on the OpenAI and Anthropic endpoints; streamed replies add up
//! to the unstreamed ones; bad tools and tool messages are refused naming
//! the parameter; a template that knows no tools refuses them. The bundled
//! model's own template renders tools in the hermes form: under a forced
//! `tool_choice` even its 2M parameters make valid calls, and a whole tool
//! loop (call, result, answer) runs on both APIs with the conversation's
//! prefix reused. Every wait is on an event (a response); timeouts are hang
//! guards.

mod support;

use serde_json::{Value, json};
use support::http::HttpServer;
use support::schema::validate;
use support::{repo, tiny_chat_model};

/// The bundled model's files with `template` as its chat template, in a
/// temporary dir.
fn model_with_template(template: &str) -> tempfile::TempDir {
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
    cfg["chat_template"] = Value::from(template);
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).expect("write config");
    dir
}

/// The bundled model with a Qwen3-shaped template (tools and thinking).
fn hermes_model() -> tempfile::TempDir {
    let template = std::fs::read_to_string(repo().join("fixtures/chat-templates/qwen3-tools.jinja"))
        .expect("qwen3-tools.jinja");
    model_with_template(&template)
}

/// The bundled model with a template that renders no tools and no calls.
fn plain_model() -> tempfile::TempDir {
    model_with_template(
        "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>\n{{ m['content'] }}\n\
         {% elif m['role'] == 'assistant' %}<|assistant|>\n{{ m['content'] }}<|end|>\n{% endif %}{% endfor %}\
         {% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    )
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

/// The same tool with a schema a forced call ends inside a small budget
/// with: no other properties, a short string.
fn bounded_weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "additionalProperties": false, "required": ["city"],
            "properties": {"city": {"type": "string", "maxLength": 16}}}}})
}

/// A message with its tool-call ids (unique per response) left out.
fn without_ids(m: &Value) -> Value {
    let mut m = m.clone();
    for c in m["tool_calls"].as_array_mut().into_iter().flatten() {
        assert!(c["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{c}");
        c.as_object_mut().map(|o| o.remove("id"));
    }
    m
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
    let srv = HttpServer::start(model.path(), &["--kv-slots", "2"]);

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
    assert_eq!(
        without_ids(&streamed),
        without_ids(&choice["message"]),
        "{events:?}"
    );
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

    // A forced call is made, after the reasoning the template allows.
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let (status, v) = srv
            .post(
                "/v1/chat/completions",
                &openai_body(
                    json!({"tool_choice": choice, "max_tokens": 400, "parallel_tool_calls": false,
                                    "tools": [bounded_weather_tool()]}),
                ),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
        let calls = v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(calls.len(), 1, "{v}");
        assert_eq!(calls[0]["function"]["name"], "get_weather", "{v}");
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
    let unnamed = |blocks: &[Value]| -> Vec<Value> {
        blocks
            .iter()
            .map(|b| {
                let mut b = b.clone();
                if b["type"] == "tool_use" {
                    assert!(b["id"].as_str().is_some_and(|id| id.starts_with("toolu_")), "{b}");
                    b.as_object_mut().map(|o| o.remove("id"));
                }
                b
            })
            .collect()
    };
    assert_eq!(unnamed(&blocks), unnamed(content.as_slice()), "{events:?}");
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
    let srv = HttpServer::start(model.path(), &["--kv-slots", "2"]);
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
    let model = plain_model();
    let srv = HttpServer::start(model.path(), &["--kv-slots", "2"]);
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

/// Tools offered to the bundled model: strings are bounded so that a forced
/// call always ends well inside `max_tokens`.
fn word_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "lookup_word", "description": "What an English word means",
            "parameters": {"type": "object", "additionalProperties": false, "required": ["word"],
                "properties": {"word": {"type": "string", "minLength": 1, "maxLength": 12}}}}},
        {"type": "function", "function": {"name": "synonyms", "description": "Words that mean the same",
            "parameters": {"type": "object", "additionalProperties": false, "required": ["word", "count"],
                "properties": {"word": {"type": "string", "maxLength": 12},
                               "count": {"type": "integer", "minimum": 1, "maximum": 5}}}}}
    ])
}

/// The schema of the offered tool `name`.
fn schema_of(tools: &Value, name: &str) -> Value {
    tools
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["function"]["name"] == name)
        .map(|t| t["function"]["parameters"].clone())
        .unwrap_or_else(|| panic!("{name} is not an offered tool"))
}

/// Checks that every call names an offered tool (one of `allowed` when
/// given) and that its arguments satisfy that tool's schema.
fn check_calls(calls: &[Value], tools: &Value, allowed: Option<&str>, what: &str) {
    assert!(!calls.is_empty(), "{what}: no calls");
    for c in calls {
        let name = c["function"]["name"].as_str().expect("name");
        if let Some(a) = allowed {
            assert_eq!(name, a, "{what}: {c}");
        }
        let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().expect("arguments"))
            .unwrap_or_else(|e| panic!("{what}: arguments are not JSON ({e}): {c}"));
        let schema = schema_of(tools, name);
        if let Err(e) = validate(&args, &schema, &schema, "$") {
            panic!("{what}: {e}: {c}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bundled_model_makes_valid_forced_calls() {
    let srv = HttpServer::start(&tiny_chat_model(), &["--kv-slots", "2"]);
    let tools = word_tools();
    for seed in 1..=4 {
        for (choice, allowed, parallel) in [
            (json!("required"), None, false),
            (json!("required"), None, true),
            (
                json!({"type": "function", "function": {"name": "synonyms"}}),
                Some("synonyms"),
                false,
            ),
        ] {
            let what = format!("seed {seed}, tool_choice {choice}, parallel {parallel}");
            let body = json!({
                "messages": [{"role": "user", "content": "what does river mean?"}],
                "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel,
                "temperature": 1.0, "seed": seed, "max_tokens": 400,
            });
            let (status, v) = srv.post("/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{what}: {v}");
            let choice0 = &v["choices"][0];
            let calls = choice0["message"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !parallel {
                assert_eq!(choice0["finish_reason"], "tool_calls", "{what}: {v}");
                assert_eq!(calls.len(), 1, "{what}: {v}");
            } else if choice0["finish_reason"] != "tool_calls" {
                // Parallel calls may go on until max_tokens; those made are whole.
                assert_eq!(choice0["finish_reason"], "length", "{what}: {v}");
            }
            check_calls(&calls, &tools, allowed, &what);
            // The stream of the same request adds up to the same message.
            let mut streamed = body.clone();
            streamed["stream"] = json!(true);
            let events = srv.stream("/v1/chat/completions", &streamed).await;
            let (m, finish) = openai_message(&events);
            assert_eq!(without_ids(&m), without_ids(&choice0["message"]), "{what}");
            assert_eq!(finish, choice0["finish_reason"].as_str().unwrap_or(""), "{what}");
        }
    }
    // Anthropic: `any` and a named tool give tool_use blocks whose input
    // satisfies the schema.
    let anthropic_tools: Vec<Value> = tools
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            json!({"name": t["function"]["name"], "description": t["function"]["description"],
                         "input_schema": t["function"]["parameters"]})
        })
        .collect();
    for (choice, allowed) in [
        (json!({"type": "any", "disable_parallel_tool_use": true}), None),
        (
            json!({"type": "tool", "name": "lookup_word"}),
            Some("lookup_word"),
        ),
    ] {
        let body = json!({"max_tokens": 400, "temperature": 1.0, "tools": anthropic_tools, "tool_choice": choice,
                          "messages": [{"role": "user", "content": "what does river mean?"}]});
        let (status, v) = srv.post("/v1/messages", &body).await;
        assert_eq!(status, 200, "{choice}: {v}");
        let uses: Vec<Value> = v["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] == "tool_use")
            .map(|b| json!({"function": {"name": b["name"], "arguments": b["input"].to_string()}}))
            .collect();
        if allowed.is_some() {
            assert!(!uses.is_empty(), "{v}");
        } else {
            assert_eq!(uses.len(), 1, "{v}");
            assert_eq!(v["stop_reason"], "tool_use", "{v}");
        }
        check_calls(&uses, &tools, allowed, &choice.to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_loop_runs_to_an_answer_on_both_apis() {
    let srv = HttpServer::start(&tiny_chat_model(), &["--kv-slots", "2"]);
    let tools = word_tools();

    // OpenAI: the call, its result as a `tool` message, the answer.
    let mut messages = vec![json!({"role": "user", "content": "what does river mean?"})];
    let first = json!({"messages": messages, "tools": tools, "tool_choice": "required",
                       "parallel_tool_calls": false, "temperature": 0, "max_tokens": 400});
    let (status, v) = srv.post("/v1/chat/completions", &first).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let message = v["choices"][0]["message"].clone();
    let calls = message["tool_calls"].as_array().cloned().unwrap_or_default();
    check_calls(&calls, &tools, None, "the loop's call");
    let first_prompt = v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    messages.push(message);
    messages.push(json!({"role": "tool", "tool_call_id": calls[0]["id"],
                         "content": "a large natural stream of water"}));
    let second = json!({"messages": messages, "tools": tools, "temperature": 0, "max_tokens": 48});
    let (status, v) = srv.post("/v1/chat/completions", &second).await;
    assert_eq!(status, 200, "{v}");
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap_or("");
    assert!(["stop", "length", "tool_calls"].contains(&finish), "{v}");
    let prompt = v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(prompt > first_prompt, "{v}");
    // The first turn's prompt is a prefix of this one: it is not computed again.
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens");
    assert!(
        cached >= first_prompt - 1,
        "cached {cached} of a {first_prompt}-token prefix: {v}"
    );

    // Anthropic: tool_use, then tool_result in the next user turn.
    let anthropic_tools: Vec<Value> = tools
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| json!({"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}))
        .collect();
    let mut messages = vec![json!({"role": "user", "content": "what does stone mean?"})];
    let first = json!({"max_tokens": 400, "temperature": 0, "tools": anthropic_tools,
                       "tool_choice": {"type": "any", "disable_parallel_tool_use": true}, "messages": messages});
    let (status, v) = srv.post("/v1/messages", &first).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let content = v["content"].as_array().cloned().unwrap_or_default();
    let use_id = content
        .iter()
        .find(|b| b["type"] == "tool_use")
        .and_then(|b| b["id"].as_str())
        .expect("a tool_use block")
        .to_string();
    let first_input = v["usage"]["input_tokens"].as_u64().unwrap_or(0)
        + v["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0);
    messages.push(json!({"role": "assistant", "content": content}));
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use_id, "content": "a lump of rock"}]}));
    let second = json!({"max_tokens": 48, "temperature": 0, "tools": anthropic_tools, "messages": messages});
    let (status, v) = srv.post("/v1/messages", &second).await;
    assert_eq!(status, 200, "{v}");
    let stop = v["stop_reason"].as_str().unwrap_or("");
    assert!(["end_turn", "max_tokens", "tool_use"].contains(&stop), "{v}");
    let read = v["usage"]["cache_read_input_tokens"]
        .as_u64()
        .expect("cache_read_input_tokens");
    assert!(
        read >= first_input - 1,
        "read {read} of a {first_input}-token prefix: {v}"
    );
}

/// The bundled model with a Qwen3.5-shaped template, whose calls are XML.
fn qwen_xml_model() -> tempfile::TempDir {
    let template = std::fs::read_to_string(repo().join("fixtures/chat-templates/qwen35-xml-tools.jinja"))
        .expect("qwen35-xml-tools.jinja");
    model_with_template(&template)
}

/// A template that writes Qwen3.5's XML calls is read in that format: a
/// forced call is generated in it (the grammar) and read back (the parser)
/// into calls of offered tools whose arguments have the schema's types, on
/// both APIs, streamed or not; an assistant turn's calls render back into
/// the prompt of the next request. (The tool takes no string: a string
/// value is free text up to `</parameter>`, which the random-ish bundled
/// model need not close within a test's token budget.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen35_xml_calls_are_forced_and_read_back() {
    let model = qwen_xml_model();
    let srv = HttpServer::start(model.path(), &[]);
    let tools = json!([
        {"type": "function", "function": {"name": "synonyms", "description": "Words that mean the same",
            "parameters": {"type": "object", "required": ["count", "exact"],
                "properties": {"count": {"type": "integer", "minimum": 1, "maximum": 5},
                               "exact": {"type": "boolean"}}}}}
    ]);
    for seed in 1..=3 {
        let body = json!({
            "messages": [{"role": "user", "content": "what does river mean?"}],
            "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
            "temperature": 1.0, "seed": seed, "max_tokens": 200,
        });
        let (status, v) = srv.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "seed {seed}: {v}");
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "seed {seed}: {v}");
        let calls = choice["message"]["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(calls.len(), 1, "seed {seed}: {v}");
        assert_eq!(calls[0]["function"]["name"], "synonyms");
        let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap_or("null"))
            .expect("arguments are JSON");
        assert!(args["exact"].is_boolean(), "seed {seed}: {args}");
        let count = args["count"].as_i64().unwrap_or(0);
        assert!((1..=5).contains(&count), "seed {seed}: {args}");
        // Streamed: the same call.
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let events = srv.stream("/v1/chat/completions", &streamed).await;
        let (m, finish) = openai_message(&events);
        assert_eq!(finish, "tool_calls", "seed {seed}: {m}");
        assert_eq!(
            without_ids(&m)["tool_calls"],
            without_ids(&choice["message"])["tool_calls"],
            "seed {seed}"
        );
        // The call and its result go back in the next request.
        let next = json!({
            "messages": [
                {"role": "user", "content": "what does river mean?"},
                choice["message"].clone(),
                {"role": "tool", "tool_call_id": calls[0]["id"].clone(), "content": "stream, brook"},
            ],
            "tools": tools, "max_tokens": 8, "seed": seed,
        });
        let (status, v) = srv.post("/v1/chat/completions", &next).await;
        assert_eq!(status, 200, "seed {seed}: {v}");
    }
    // On the Anthropic API too.
    let body = json!({
        "model": "m", "max_tokens": 200, "temperature": 1.0,
        "messages": [{"role": "user", "content": "what does river mean?"}],
        "tools": [{"name": "synonyms", "description": "Words that mean the same",
            "input_schema": tools[0]["function"]["parameters"].clone()}],
        // One call, whatever the sampler draws (the API has no seed).
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    });
    let (status, v) = srv.post("/v1/messages", &body).await;
    assert_eq!(status, 200, "{v}");
    let uses: Vec<&Value> = v["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(uses.len(), 1, "{v}");
    assert_eq!(uses[0]["name"], "synonyms");
    assert!(uses[0]["input"]["exact"].is_boolean(), "{v}");
}

/// The bundled model with a MiniMax-M2-shaped template.
fn minimax_model() -> tempfile::TempDir {
    let template = std::fs::read_to_string(repo().join("fixtures/chat-templates/minimax-m2-tools.jinja"))
        .expect("minimax-m2-tools.jinja");
    model_with_template(&template)
}

/// Tools whose forced calls end well inside a test's token budget: no
/// string parameter (a string value is free text up to `</parameter>`,
/// which the random-ish bundled model need not close), bounded integers.
fn counting_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "synonyms", "description": "Words that mean the same",
            "parameters": {"type": "object", "required": ["count", "exact"],
                "properties": {"count": {"type": "integer", "minimum": 1, "maximum": 5},
                               "exact": {"type": "boolean"}}}}},
        {"type": "function", "function": {"name": "antonyms", "description": "Words that mean the opposite",
            "parameters": {"type": "object", "required": ["count"],
                "properties": {"count": {"type": "integer", "minimum": 1, "maximum": 3}}}}}
    ])
}

/// A template that writes MiniMax-M2's calls is read in that format: a
/// forced call (`required`, a named tool, parallel calls in one block) is
/// generated in it (the grammar) and read back (the parser) into calls of
/// offered tools whose arguments satisfy the schema, on both APIs,
/// streamed or not; the calls and their results render into the prompt of
/// the next request. The template's generation prompt opens `<think>`, as
/// MiniMax-M2's does; these requests close it (`enable_thinking: false`,
/// Anthropic's `thinking: disabled`), and then the call comes at once: the
/// bundled model need not end a reasoning of its own within the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimax_m2_calls_are_forced_and_read_back() {
    let model = minimax_model();
    let srv = HttpServer::start(model.path(), &[]);
    let tools = counting_tools();
    for seed in 1..=3 {
        for (choice, allowed, parallel) in [
            (json!("required"), None, false),
            (
                json!({"type": "function", "function": {"name": "antonyms"}}),
                Some("antonyms"),
                false,
            ),
            (json!("required"), None, true),
        ] {
            let what = format!("seed {seed}, tool_choice {choice}, parallel {parallel}");
            let body = json!({
                "messages": [{"role": "user", "content": "what does river mean?"}],
                "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel,
                "chat_template_kwargs": {"enable_thinking": false},
                "temperature": 1.0, "seed": seed, "max_tokens": 300,
            });
            let (status, v) = srv.post("/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{what}: {v}");
            let choice0 = &v["choices"][0];
            let calls = choice0["message"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            // Streamed: the same message.
            let mut streamed = body.clone();
            streamed["stream"] = json!(true);
            let events = srv.stream("/v1/chat/completions", &streamed).await;
            let (m, finish) = openai_message(&events);
            assert_eq!(without_ids(&m), without_ids(&choice0["message"]), "{what}");
            assert_eq!(finish, choice0["finish_reason"].as_str().unwrap_or(""), "{what}");
            if parallel && choice0["finish_reason"] == "length" {
                // Parallel calls may go on until max_tokens (the bundled
                // model seldom closes the block): a block cut off inside a
                // call is no call, all of it content (one cut just after a
                // call is the calls before the cut).
                if calls.is_empty() {
                    let content = choice0["message"]["content"].as_str().unwrap_or("");
                    assert!(
                        content.starts_with("<minimax:tool_call>\n<invoke name=\""),
                        "{what}: {v}"
                    );
                } else {
                    check_calls(&calls, &tools, allowed, &what);
                }
                continue;
            }
            assert_eq!(choice0["finish_reason"], "tool_calls", "{what}: {v}");
            if !parallel {
                assert_eq!(calls.len(), 1, "{what}: {v}");
            }
            check_calls(&calls, &tools, allowed, &what);
            // The calls and their results go back in the next request.
            let mut messages = vec![
                json!({"role": "user", "content": "what does river mean?"}),
                choice0["message"].clone(),
            ];
            for c in &calls {
                messages.push(
                    json!({"role": "tool", "tool_call_id": c["id"].clone(), "content": "stream, brook"}),
                );
            }
            let next = json!({"messages": messages, "tools": tools, "max_tokens": 8, "seed": seed});
            let (status, v) = srv.post("/v1/chat/completions", &next).await;
            assert_eq!(status, 200, "{what}: {v}");
        }
    }
    // On the Anthropic API, streamed and not; one call, whatever the
    // sampler draws (the API has no seed). Greedy, the stream adds up to the
    // unstreamed reply.
    let anthropic_tools: Vec<Value> = tools
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            json!({"name": t["function"]["name"], "description": t["function"]["description"],
                   "input_schema": t["function"]["parameters"]})
        })
        .collect();
    for (choice, allowed, temperature) in [
        (
            json!({"type": "any", "disable_parallel_tool_use": true}),
            None,
            1.0,
        ),
        (
            json!({"type": "tool", "name": "antonyms", "disable_parallel_tool_use": true}),
            Some("antonyms"),
            1.0,
        ),
        (
            json!({"type": "any", "disable_parallel_tool_use": true}),
            None,
            0.0,
        ),
    ] {
        let body = json!({
            "model": "m", "max_tokens": 300, "temperature": temperature,
            "messages": [{"role": "user", "content": "what does river mean?"}],
            "tools": anthropic_tools, "tool_choice": choice, "thinking": {"type": "disabled"},
        });
        let (status, v) = srv.post("/v1/messages", &body).await;
        assert_eq!(status, 200, "{choice}: {v}");
        assert_eq!(v["stop_reason"], "tool_use", "{choice}: {v}");
        let blocks = v["content"].as_array().cloned().unwrap_or_default();
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let events = srv.stream("/v1/messages", &streamed).await;
        let (sblocks, sstop) = anthropic_content(&events);
        assert_eq!(sstop, "tool_use", "{choice}: {events:?}");
        let unnamed = |blocks: &[Value]| -> Vec<Value> {
            blocks
                .iter()
                .map(|b| {
                    let mut b = b.clone();
                    b.as_object_mut().map(|o| o.remove("id"));
                    b
                })
                .collect()
        };
        if temperature == 0.0 {
            assert_eq!(unnamed(&sblocks), unnamed(&blocks), "{choice}: {events:?}");
        }
        for (what, blocks) in [("unstreamed", &blocks), ("streamed", &sblocks)] {
            let uses: Vec<Value> = blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| json!({"function": {"name": b["name"], "arguments": b["input"].to_string()}}))
                .collect();
            assert_eq!(uses.len(), 1, "{choice}, {what}: {blocks:?}");
            check_calls(&uses, &tools, allowed, &format!("{choice}, {what}"));
        }
    }
}
