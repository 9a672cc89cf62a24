//! Constrained decoding on the bundled 2M-parameter model: whatever it would
//! say, every `json_schema` reply parses and satisfies its schema, every
//! `json_object` reply is an object, a Lark grammar holds at the decode
//! loop, and constraints that cannot compile are refused with a 400 naming
//! the field. Every wait is on an event; timeouts are hang guards only.

mod support;

use std::path::Path;

use colibri::engine::{Engine, EngineOptions};
use colibri::runtime::constraint::ConstraintSpec;
use colibri::runtime::{
    DecodeLoop, Event, Finish, FinishReason, GenRequest, LoopConfig, PromptMode, RequestError, RequestStream,
    SlotChoice,
};
use colibri::sampling::SamplingParams;
use serde_json::{Value, json};
use support::tiny_chat_model;

use support::http::{HttpServer, client};
use support::schema::validate;

/// Most tokens a constrained reply may take: the schemas below bound every
/// string, number and array, so each reply ends well inside it.
const BUDGET: u64 = 600;

// ---------------------------------------------------------------- schemas

fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "person",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "role": {"enum": ["admin", "user", "guest"]}
                },
                "required": ["name", "age", "role"],
                "additionalProperties": false
            }),
        ),
        (
            "tags",
            json!({
                "type": "object",
                "properties": {
                    "tags": {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1, "maxLength": 10},
                        "minItems": 1,
                        "maxItems": 3
                    },
                    "count": {"type": "integer", "minimum": -5, "maximum": 5},
                    "done": {"type": "boolean"}
                },
                "required": ["tags", "count", "done"],
                "additionalProperties": false
            }),
        ),
        (
            "nested",
            json!({
                "type": "object",
                "properties": {
                    "user": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                            "email": {"type": "string", "maxLength": 24},
                            "level": {"$ref": "#/$defs/level"}
                        },
                        "required": ["id", "email", "level"],
                        "additionalProperties": false
                    },
                    "active": {"type": "boolean"}
                },
                "required": ["user", "active"],
                "additionalProperties": false,
                "$defs": {"level": {"enum": ["low", "mid", "high"]}}
            }),
        ),
    ]
}

fn check_schema(text: &str, schema: &Value, what: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text:?}"));
    if let Err(e) = validate(&v, schema, schema, "$") {
        panic!("{what}: {e}\n{text}");
    }
}

#[test]
fn the_test_validator_rejects_what_it_must() {
    let (_, person) = &schemas()[0];
    let (_, nested) = &schemas()[2];
    for bad in [
        json!({"name": "x", "age": 3}),
        json!({"name": "x", "age": 3.5, "role": "user"}),
        json!({"name": "x", "age": 300, "role": "user"}),
        json!({"name": "x", "age": 3, "role": "boss"}),
        json!({"name": "a very long name indeed", "age": 3, "role": "user"}),
        json!({"name": "x", "age": 3, "role": "user", "extra": 1}),
        json!([1]),
    ] {
        assert!(validate(&bad, person, person, "$").is_err(), "{bad}");
    }
    let ok = json!({"user": {"id": 4, "email": "a@b", "level": "mid"}, "active": true});
    assert_eq!(validate(&ok, nested, nested, "$"), Ok(()));
    let bad = json!({"user": {"id": 4, "email": "a@b", "level": "max"}, "active": true});
    assert!(validate(&bad, nested, nested, "$").is_err());
}

// ------------------------------------------------------------ over HTTP

/// A streamed request's text and finish reason (chat deltas or completion text).
async fn post_stream(c: &reqwest::Client, srv: &HttpServer, path: &str, body: &Value) -> (String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = c
        .post(format!("{}{path}", srv.base))
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200, "{body}");
    let text = r.text().await.expect("body");
    let (mut out, mut finish) = (String::new(), String::new());
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).expect("chunk JSON");
        assert!(v.get("error").is_none(), "{v}");
        let choice = &v["choices"][0];
        if let Some(t) = choice["delta"]["content"].as_str().or(choice["text"].as_str()) {
            out.push_str(t);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (out, finish)
}

fn chat(content: &str, extra: Value) -> Value {
    let mut b = json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": BUDGET,
        "temperature": 0,
    });
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
    b
}

fn reply_text(v: &Value) -> String {
    let choice = &v["choices"][0];
    choice["message"]["content"]
        .as_str()
        .or(choice["text"].as_str())
        .unwrap_or_else(|| panic!("no text in {v}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_json_schema_reply_satisfies_its_schema() {
    let srv = HttpServer::start(&tiny_chat_model(), &["--kv-slots", "2"]);
    let c = client();
    for (name, schema) in schemas() {
        let rf = json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": true}}});
        // Greedy, then sampled at temperature 1 with several seeds; each
        // non-streamed and streamed, which must agree.
        let mut runs = vec![json!({"temperature": 0})];
        runs.extend((1..=3).map(|seed| json!({"temperature": 1, "seed": seed})));
        for run in runs {
            let mut extra = rf.clone();
            if let (Some(o), Value::Object(r)) = (extra.as_object_mut(), run.clone()) {
                o.extend(r);
            }
            let body = chat("Describe someone as JSON.", extra);
            let (status, v) = srv.post("/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{name} {run}: {v}");
            let text = reply_text(&v);
            let what = format!("{name} {run}");
            check_schema(&text, &schema, &what);
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{what}: {v}");
            let (streamed, finish) = post_stream(&c, &srv, "/v1/chat/completions", &body).await;
            assert_eq!(streamed, text, "{what}: streamed and not differ");
            assert_eq!(finish, "stop", "{what}");
        }
    }
    // llama-server's fields on /v1/completions: a top-level `json_schema`.
    let (_, schema) = &schemas()[0];
    for seed in [7, 8] {
        let body = json!({"prompt": "A person:", "json_schema": schema, "max_tokens": BUDGET,
            "temperature": 1, "seed": seed});
        let (status, v) = srv.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        check_schema(&reply_text(&v), schema, "completions json_schema");
        let (streamed, _) = post_stream(&c, &srv, "/v1/completions", &body).await;
        assert_eq!(streamed, reply_text(&v));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_object_replies_are_objects_and_grammars_hold() {
    let srv = HttpServer::start(&tiny_chat_model(), &["--kv-slots", "2"]);
    let c = client();
    for run in [
        json!({"temperature": 0}),
        json!({"temperature": 1, "seed": 1}),
        json!({"temperature": 1, "seed": 2}),
    ] {
        let mut extra = json!({"response_format": {"type": "json_object"}});
        if let (Some(o), Value::Object(r)) = (extra.as_object_mut(), run.clone()) {
            o.extend(r);
        }
        let body = chat("Give me a JSON object.", extra);
        let (status, v) = srv.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let text = reply_text(&v);
        if v["choices"][0]["finish_reason"] == "stop" {
            let parsed: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{run}: {e}: {text:?}"));
            assert!(parsed.is_object(), "{run}: {text}");
        } else {
            // Cut by the token budget (the tiny model rambles inside
            // strings): still an object's beginning, which JSON could
            // complete (serde_json runs out of input, it finds no error).
            assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
            assert!(text.trim_start().starts_with('{'), "{run}: {text}");
            let e = serde_json::from_str::<Value>(&text).err();
            assert!(
                e.as_ref().is_some_and(serde_json::Error::is_eof),
                "{run}: {e:?} in {text:?}"
            );
        }
        let (streamed, _) = post_stream(&c, &srv, "/v1/chat/completions", &body).await;
        assert_eq!(streamed, text, "{run}");
    }
    // `grammar` as llguidance Lark and as llama-server's GBNF.
    for (grammar, allowed) in [
        (r#"start: "yes" | "no" | "maybe""#, &["yes", "no", "maybe"][..]),
        (
            "root ::= answer \"!\"\nanswer ::= [Yy] \"es\" | \"No\"",
            &["Yes!", "yes!", "No!"][..],
        ),
    ] {
        for seed in 1..=4 {
            let body = json!({"prompt": "Answer:", "grammar": grammar, "max_tokens": 20,
                "temperature": 1, "seed": seed});
            let (status, v) = srv.post("/v1/completions", &body).await;
            assert_eq!(status, 200, "{v}");
            let text = reply_text(&v);
            assert!(
                allowed.contains(&text.as_str()),
                "{grammar} seed {seed}: {text:?}"
            );
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_that_cannot_compile_are_refused_naming_the_field() {
    let srv = HttpServer::start(&tiny_chat_model(), &["--kv-slots", "2"]);
    let c = client();
    let rf = |schema: Value, strict: bool| {
        json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": strict}}})
    };
    let schema_param = "response_format.json_schema.schema";
    // (extra fields, the param, words the message must hold)
    let cases: Vec<(Value, &str, Vec<&str>)> = vec![
        (
            rf(json!({"type": "strin"}), true),
            schema_param,
            vec!["JSON schema", "strin"],
        ),
        (
            rf(
                json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}),
                true,
            ),
            schema_param,
            vec!["#/$defs/nope"],
        ),
        (
            rf(json!({"$ref": "https://example.com/s.json"}), true),
            schema_param,
            vec!["https://example.com/s.json"],
        ),
        (
            rf(json!({"type": "string", "minLength": 5, "maxLength": 2}), true),
            schema_param,
            vec!["no reply"],
        ),
        (
            rf(json!({"type": "array", "uniqueItems": true}), true),
            schema_param,
            vec!["uniqueItems"],
        ),
        (rf(json!(false), false), schema_param, vec!["false"]),
        (
            json!({"grammar": "start: \"a\"\nfoo: : bar"}),
            "grammar",
            vec!["line 2"],
        ),
        (
            json!({"grammar": "start: undefined_rule"}),
            "grammar",
            vec!["undefined_rule"],
        ),
        (
            json!({"grammar": "root ::= \"a\" [b-"}),
            "grammar",
            vec!["GBNF", "line 1"],
        ),
        (json!({"grammar": "root ::= x"}), "grammar", vec!["x"]),
        (
            json!({"json_schema": {"type": "object", "required": 3}}),
            "json_schema",
            vec!["required"],
        ),
        (
            json!({"response_format": {"type": "json_object", "schema": {"type": 7}}}),
            "response_format.schema",
            vec![],
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
            vec!["xml"],
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format.json_schema",
            vec![],
        ),
        (
            json!({"response_format": {"type": "json_object"}, "grammar": "start: \"a\""}),
            "grammar",
            vec!["one of"],
        ),
    ];
    for (extra, param, words) in cases {
        let body = chat("hi", extra.clone());
        let (status, v) = srv.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{extra}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["param"], param, "{extra}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        for w in words {
            assert!(msg.contains(w), "{extra}: {w:?} not in {msg:?}");
        }
    }
    // A non-strict schema may use keywords llguidance only approximates.
    let lenient = json!({"type": "array", "uniqueItems": true, "maxItems": 2,
        "items": {"type": "integer", "minimum": 0, "maximum": 9}});
    let body = chat("hi", rf(lenient, false));
    let (status, v) = srv.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let text = reply_text(&v);
    assert!(
        serde_json::from_str::<Value>(&text).is_ok_and(|s| s.is_array()),
        "{text:?}"
    );

    // Hostile inputs: deep nesting, self reference, huge alternations,
    // pathological patterns, left recursion. Each gets an answer (200 or
    // 400), never a crash or a hang, and the server keeps serving.
    let mut deep = json!({"type": "integer"});
    for _ in 0..100 {
        deep = json!({"type": "array", "items": deep, "maxItems": 1});
    }
    let many: Vec<String> = (0..5000).map(|i| format!("v{i}")).collect();
    let hostile = vec![
        rf(deep, true),
        rf(json!({"$ref": "#"}), true),
        rf(
            json!({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}),
            true,
        ),
        rf(json!({"enum": many}), true),
        rf(
            json!({"type": "string", "pattern": "(a*)*b(x|y|z){40}[^\\u0000-\\uffff]"}),
            true,
        ),
        rf(json!({"type": "string", "pattern": "(("}), true),
        rf(json!({"allOf": [{"type": "string"}, {"type": "integer"}]}), true),
        json!({"grammar": "start: start \"a\" | \"a\""}),
        json!({"grammar": "start: x\nx: x"}),
        json!({"grammar": format!("start: {}", "(".repeat(300))}),
        json!({"grammar": "start: /(?<=a)b/"}),
        json!({"grammar": "%llguidance {\"bogus\": 1}\nstart: \"a\""}),
        json!({"grammar": "root ::= (((((\"a\")))))*{99999}"}),
    ];
    for extra in hostile {
        let mut body = chat("hi", extra.clone());
        body["max_tokens"] = json!(8);
        let (status, v) = srv.post("/v1/chat/completions", &body).await;
        assert!(status == 200 || status == 400, "{extra}: {status} {v}");
        if status == 400 {
            assert!(v["error"]["param"].is_string(), "{v}");
        }
    }
    let r = c
        .get(format!("{}/health", srv.base))
        .send()
        .await
        .expect("health");
    assert_eq!(r.status().as_u16(), 200);
}

// ------------------------------------------------------ at the decode loop

fn start_loop(slots: usize, threads: usize) -> DecodeLoop {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny");
    let engine = Engine::load(&dir, &EngineOptions::default()).expect("the tiny model");
    let cfg = LoopConfig {
        slots,
        max_ctx: 1024,
        threads: Some(threads),
        ..LoopConfig::default()
    };
    DecodeLoop::spawn(engine, &cfg, Box::new(std::io::sink())).expect("loop")
}

fn req(prompt: Vec<u32>, constraint: Option<ConstraintSpec>, seed: u64) -> GenRequest {
    GenRequest {
        slot: SlotChoice::Any,
        mode: PromptMode::Replace,
        prompt,
        max_tokens: BUDGET as usize,
        sampling: SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed,
        },
        stop: Vec::new(),
        constraint,
        special_tokens: false,
    }
}

fn drain(s: &mut RequestStream) -> (Vec<u32>, String, Result<Finish, RequestError>) {
    let (mut toks, mut text) = (Vec::new(), String::new());
    loop {
        match s.recv() {
            Some(Event::Started { .. }) => {}
            Some(Event::Text { text: t, tokens }) => {
                toks.extend(tokens);
                text.push_str(&t);
            }
            Some(Event::Done(f)) => return (toks, text, Ok(f)),
            Some(Event::Failed(e)) => return (toks, text, Err(e)),
            None => return (toks, text, Err(RequestError::Shutdown)),
        }
    }
}

fn tool_call_grammar() -> (ConstraintSpec, Value) {
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}
        },
        "required": ["city", "days"],
        "additionalProperties": false
    });
    let json = colibri::grammar::compile::lark_json(&schema, true).expect("schema");
    (
        ConstraintSpec::Lark(format!("start: \"<tool_call>\" {json} \"</tool_call>\"")),
        schema,
    )
}

#[test]
fn a_lark_tool_call_grammar_holds_in_the_decode_loop_whatever_the_batch() {
    let (spec, schema) = tool_call_grammar();
    let prompt: Vec<u32> = vec![2, 40, 41, 42, 43, 3];
    let check = |text: &str, f: &Result<Finish, RequestError>, what: &str| {
        let inner = text
            .strip_prefix("<tool_call>")
            .and_then(|t| t.strip_suffix("</tool_call>"))
            .unwrap_or_else(|| panic!("{what}: {text:?}"));
        check_schema(inner, &schema, what);
        let f = f.as_ref().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(f.reason, FinishReason::Stop, "{what}");
        // The grammar ended the reply: its end token was appended, as if sampled.
        assert_eq!(f.usage.completion_tokens, f.emitted + 1, "{what}");
    };
    // Alone, on one compute thread.
    let solo: Vec<_> = {
        let lp = start_loop(1, 1);
        let h = lp.handle();
        (1..=4u64)
            .map(|seed| {
                let mut s = h
                    .submit(req(prompt.clone(), Some(spec.clone()), seed))
                    .expect("submit");
                let r = drain(&mut s);
                check(&r.1, &r.2, &format!("solo seed {seed}"));
                r.0
            })
            .collect()
    };
    // Four at once (one batched step computes four masks), on two threads,
    // next to an unconstrained stream: the same tokens.
    let lp = start_loop(4, 2);
    let h = lp.handle();
    let free = h.submit(req(prompt.clone(), None, 9)).expect("submit");
    let mut streams: Vec<RequestStream> = (1..=4u64)
        .map(|seed| {
            h.submit(req(prompt.clone(), Some(spec.clone()), seed))
                .expect("submit")
        })
        .collect();
    for (i, s) in streams.iter_mut().enumerate() {
        let (toks, text, f) = drain(s);
        check(&text, &f, &format!("batched seed {}", i + 1));
        assert_eq!(toks, solo[i], "seed {}: batched tokens differ from solo", i + 1);
    }
    drop(free);
}

#[test]
fn the_loop_refuses_a_constraint_that_does_not_compile() {
    let lp = start_loop(1, 1);
    let h = lp.handle();
    for (spec, words) in [
        (ConstraintSpec::Lark("start: \"a\" )".into()), "grammar"),
        (ConstraintSpec::Lark("   ".into()), "empty"),
        (
            ConstraintSpec::JsonSchema {
                schema: json!({"type": "array", "items": {"$ref": "#/nowhere"}}),
                strict: true,
            },
            "#/nowhere",
        ),
    ] {
        match h.submit(req(vec![2, 40, 3], Some(spec.clone()), 1)) {
            Err(RequestError::Constraint(e)) => assert!(e.to_string().contains(words), "{spec:?}: {e}"),
            Err(e) => panic!("{spec:?}: {e}"),
            Ok(_) => panic!("{spec:?} was admitted"),
        }
    }
    // And the loop still serves.
    let mut s = h
        .submit(req(vec![2, 40, 3], Some(ConstraintSpec::JsonObject), 1))
        .expect("submit");
    let (_, text, f) = drain(&mut s);
    assert!(f.is_ok(), "{f:?}");
    assert!(text.starts_with('{'), "{text:?}");
}
