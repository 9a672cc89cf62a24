//! `coli serve --http`: the OpenAI and Anthropic APIs over real HTTP, on the
//! bundled model. Every wait is on an event (a response, a chunk, a
//! /metrics value); timeouts are hang guards only.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{ColiChild, coli_command, tiny_chat_model, wait_bounded};

/// Longest wait for a server to start or a response to arrive.
use support::http::{HANG_GUARD, client};

/// Arguments that make generation slow (every expert read waits on a
/// simulated disk), so a request is still running when a test acts on it.
const SLOW: &[&str] = &["--disk-sim", "lat=5ms", "--cache-cap", "1", "--pilot", "off"];

/// A completion request that runs long at this seed (≈180 tokens before
/// the model ends its turn), streamed.
fn long_stream() -> Value {
    json!({"prompt": "The cat", "temperature": 2, "seed": 22, "max_tokens": 1000, "stream": true})
}

/// A running `coli serve --http 127.0.0.1:0`.
struct HttpServer {
    child: ColiChild,
    base: String,
    ready_line: String,
    stderr: Arc<Mutex<String>>,
}

impl HttpServer {
    fn start(extra: &[&str]) -> HttpServer {
        Self::start_with(extra, &[])
    }

    fn start_with(extra: &[&str], env: &[(&str, &str)]) -> HttpServer {
        let model = tiny_chat_model();
        let mut cmd = coli_command();
        cmd.arg("serve")
            .arg("--model")
            .arg(&model)
            .args(["--http", "127.0.0.1:0", "--threads", "1"])
            .args(extra)
            .env_remove("COLI_API_KEY");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let err = child.stderr.take().expect("stderr piped");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = stderr.clone();
        thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if line.contains("listening on http://") {
                    let _ = tx.send(line.clone());
                }
                if let Ok(mut s) = sink.lock() {
                    s.push_str(&line);
                    s.push('\n');
                }
            }
        });
        let ready_line = match rx.recv_timeout(HANG_GUARD) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "no ready line; stderr: {}",
                    stderr.lock().map(|s| s.clone()).unwrap_or_default()
                );
            }
        };
        let addr = ready_line
            .split("listening on http://")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .expect("address in the ready line")
            .to_string();
        HttpServer {
            child,
            base: format!("http://{addr}"),
            ready_line,
            stderr,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Resident memory of the server process, in kB.
    fn rss_kb(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("/proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    /// SIGTERM, then the exit status (bounded wait).
    fn terminate(mut self) -> ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
        wait_bounded(&mut self.child, HANG_GUARD)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

async fn post(c: &reqwest::Client, srv: &HttpServer, path: &str, body: &Value) -> (u16, Value) {
    let r = c.post(srv.url(path)).json(body).send().await.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text:?}"));
    (status, v)
}

/// Posts a streaming request; returns the status and the whole event stream.
async fn post_stream(
    c: &reqwest::Client,
    srv: &HttpServer,
    path: &str,
    body: &Value,
) -> (u16, Vec<SseEvent>) {
    let r = c.post(srv.url(path)).json(body).send().await.expect("request");
    let status = r.status().as_u16();
    if status == 200 {
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
    }
    let text = r.text().await.expect("body");
    (status, parse_sse(&text))
}

#[derive(Debug, Clone, PartialEq)]
struct SseEvent {
    name: Option<String>,
    data: String,
}

impl SseEvent {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {:?}", self.data))
    }
}

/// Events of a text/event-stream body (comments skipped).
fn parse_sse(body: &str) -> Vec<SseEvent> {
    body.split("\n\n")
        .filter_map(|block| {
            let mut name = None;
            let mut data: Vec<&str> = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            (!data.is_empty()).then(|| SseEvent {
                name,
                data: data.join("\n"),
            })
        })
        .collect()
}

/// /metrics as name (with labels) -> value.
async fn metrics(c: &reqwest::Client, srv: &HttpServer) -> HashMap<String, f64> {
    let r = c.get(srv.url("/metrics")).send().await.expect("metrics");
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.expect("metrics body");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Polls /metrics until `pred` holds (hang guard: HANG_GUARD).
async fn wait_metrics(
    c: &reqwest::Client,
    srv: &HttpServer,
    what: &str,
    pred: impl Fn(&HashMap<String, f64>) -> bool,
) -> HashMap<String, f64> {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let m = metrics(c, srv).await;
        if pred(&m) {
            return m;
        }
        assert!(Instant::now() < deadline, "waited too long for {what}: {m:?}");
        // A poll interval, not a synchronisation: the condition decides.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn metric(m: &HashMap<String, f64>, name: &str) -> f64 {
    m.get(name)
        .copied()
        .unwrap_or_else(|| panic!("no metric {name} in {m:?}"))
}

fn chat_body(content: Value, extra: Value) -> Value {
    let mut b = json!({
        "model": "colibri-tiny",
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 48,
    });
    merge(&mut b, extra);
    b
}

fn merge(b: &mut Value, extra: Value) {
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
}

/// Chat chunks' content deltas joined, with the finish chunk and the
/// usage chunk checked for shape.
fn chat_stream_text(events: &[SseEvent]) -> (String, String, Option<Value>) {
    assert_eq!(
        events.last().map(|e| e.data.as_str()),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(SseEvent::json).collect();
    let first = &chunks[0];
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant", "{first}");
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert!(
            c["id"].as_str().is_some_and(|s| s.starts_with("chatcmpl-")),
            "{c}"
        );
        assert_eq!(c["id"], first["id"]);
        let choices = c["choices"].as_array().expect("choices");
        if choices.is_empty() {
            usage = Some(c["usage"].clone());
            continue;
        }
        assert!(finish.is_none(), "content after the finish chunk: {c}");
        if let Some(t) = choices[0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if let Some(f) = choices[0]["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    (text, finish.expect("a finish chunk"), usage)
}

fn completion_stream_text(events: &[SseEvent]) -> (String, String, Option<Value>) {
    assert_eq!(
        events.last().map(|e| e.data.as_str()),
        Some("[DONE]"),
        "{events:?}"
    );
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    for e in &events[..events.len() - 1] {
        let c = e.json();
        assert_eq!(c["object"], "text_completion", "{c}");
        assert!(c["id"].as_str().is_some_and(|s| s.starts_with("cmpl-")), "{c}");
        let choices = c["choices"].as_array().expect("choices");
        if choices.is_empty() {
            usage = Some(c["usage"].clone());
            continue;
        }
        text.push_str(choices[0]["text"].as_str().expect("text"));
        if let Some(f) = choices[0]["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    (text, finish.expect("a finish chunk"), usage)
}

fn check_usage(u: &Value) -> (u64, u64) {
    let p = u["prompt_tokens"].as_u64().expect("prompt_tokens");
    let c = u["completion_tokens"].as_u64().expect("completion_tokens");
    assert_eq!(u["total_tokens"].as_u64(), Some(p + c), "{u}");
    assert!(p > 0 && c > 0, "{u}");
    let cached = u["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert!(cached.is_some_and(|n| n <= p), "{u}");
    (p, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_equals_non_stream_at_temperature_zero() {
    let srv = HttpServer::start(&["--no-kv-save"]);
    assert!(srv.ready_line.contains("4 slot(s)"), "{}", srv.ready_line);
    assert!(srv.ready_line.contains("saving off"), "{}", srv.ready_line);
    let c = client();
    let body = chat_body(json!("What does the word bright mean?"), json!({}));
    let (status, v) = post(&c, &srv, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["id"].as_str().is_some_and(|s| s.starts_with("chatcmpl-")),
        "{v}"
    );
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].as_u64().is_some_and(|t| t > 1_600_000_000), "{v}");
    assert_eq!(v["model"], "colibri-tiny");
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    let text = choice["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    assert!(!text.is_empty());
    let finish = choice["finish_reason"]
        .as_str()
        .expect("finish_reason")
        .to_string();
    assert!(finish == "stop" || finish == "length", "{finish}");
    let usage = check_usage(&v["usage"]);

    let mut sbody = body.clone();
    merge(
        &mut sbody,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let (status, events) = post_stream(&c, &srv, "/v1/chat/completions", &sbody).await;
    assert_eq!(status, 200);
    let (stext, sfinish, susage) = chat_stream_text(&events);
    assert_eq!(stext, text);
    assert_eq!(sfinish, finish);
    let susage = susage.expect("a usage chunk");
    assert_eq!(check_usage(&susage), usage);
    // The same prompt again runs in the slot that holds it and reuses it.
    let cached = susage["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert!(cached.is_some_and(|n| n > 0), "{susage}");

    // Content as text parts renders like the same string.
    let parts = chat_body(
        json!([{"type": "text", "text": "What does the word bright mean?"}]),
        json!({}),
    );
    let (status, v2) = post(&c, &srv, "/v1/chat/completions", &parts).await;
    assert_eq!(status, 200, "{v2}");
    assert_eq!(v2["choices"][0]["message"]["content"], text.as_str());

    // Without include_usage there is no usage chunk.
    let mut plain = body.clone();
    merge(&mut plain, json!({"stream": true}));
    let (_, events) = post_stream(&c, &srv, "/v1/chat/completions", &plain).await;
    let (t3, _, u3) = chat_stream_text(&events);
    assert_eq!(t3, text);
    assert!(u3.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_stream_equals_non_stream_and_stop_strings_cut() {
    let srv = HttpServer::start(&[]);
    let c = client();
    let body = json!({"prompt": "The cat", "temperature": 0, "max_tokens": 40});
    let (status, v) = post(&c, &srv, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["id"].as_str().is_some_and(|s| s.starts_with("cmpl-")), "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "colibri-tiny");
    let text = v["choices"][0]["text"].as_str().expect("text").to_string();
    let finish = v["choices"][0]["finish_reason"]
        .as_str()
        .expect("finish")
        .to_string();
    let usage = check_usage(&v["usage"]);

    let mut sbody = body.clone();
    merge(
        &mut sbody,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let (status, events) = post_stream(&c, &srv, "/v1/completions", &sbody).await;
    assert_eq!(status, 200);
    let (stext, sfinish, susage) = completion_stream_text(&events);
    assert_eq!(stext, text);
    assert_eq!(sfinish, finish);
    assert_eq!(check_usage(&susage.expect("usage chunk")), usage);

    // A stop string from the middle of that text ends the reply before it.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 12, "{text:?}");
    let stop: String = chars[8..11].iter().collect();
    let cut = &text[..text.find(&stop).expect("stop in text")];
    let mut stopped = body.clone();
    merge(&mut stopped, json!({"stop": [stop, "never-generated-zzz"]}));
    let (status, v) = post(&c, &srv, "/v1/completions", &stopped).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], cut);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    merge(&mut stopped, json!({"stream": true}));
    let (_, events) = post_stream(&c, &srv, "/v1/completions", &stopped).await;
    let (st, sf, _) = completion_stream_text(&events);
    assert_eq!(st, cut);
    assert_eq!(sf, "stop");

    // Token ids are a prompt too.
    let ids = json!({"prompt": [87, 313], "temperature": 0, "max_tokens": 4});
    let (status, v) = post(&c, &srv, "/v1/completions", &ids).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_stream_equals_non_stream() {
    let srv = HttpServer::start(&[]);
    let c = client();
    let body = json!({
        "model": "colibri-tiny",
        "system": "You answer briefly.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What does the word bright mean?"}]}],
        "max_tokens": 48,
        "temperature": 0,
    });
    let (status, v) = post(&c, &srv, "/v1/messages", &body).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["id"].as_str().is_some_and(|s| s.starts_with("msg_")), "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["content"][0]["type"], "text");
    let text = v["content"][0]["text"].as_str().expect("text").to_string();
    let reason = v["stop_reason"].as_str().expect("stop_reason").to_string();
    assert!(reason == "end_turn" || reason == "max_tokens", "{reason}");
    assert!(v["stop_sequence"].is_null());
    let input = v["usage"]["input_tokens"].as_u64().expect("input_tokens");
    let output = v["usage"]["output_tokens"].as_u64().expect("output_tokens");
    assert!(input > 0 && output > 0);

    let mut sbody = body.clone();
    merge(&mut sbody, json!({"stream": true}));
    let (status, events) = post_stream(&c, &srv, "/v1/messages", &sbody).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = events.iter().map(|e| e.name.as_deref().unwrap_or("")).collect();
    assert_eq!(
        &names[..3],
        ["message_start", "content_block_start", "ping"],
        "{names:?}"
    );
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"],
        "{names:?}"
    );
    assert!(
        names[3..names.len() - 3]
            .iter()
            .all(|n| *n == "content_block_delta"),
        "{names:?}"
    );
    for e in &events {
        assert_eq!(e.json()["type"], e.name.as_deref().unwrap_or(""), "{e:?}");
    }
    let start = events[0].json();
    // The same prompt again: Anthropic's input_tokens counts only what was
    // not read from the cache, so the total is what stays equal.
    let u = &start["message"]["usage"];
    assert_eq!(
        u["input_tokens"]
            .as_u64()
            .zip(u["cache_read_input_tokens"].as_u64())
            .map(|(a, b)| a + b),
        Some(
            input
                + v["usage"]["cache_read_input_tokens"]
                    .as_u64()
                    .expect("cache_read_input_tokens")
        )
    );
    assert_eq!(
        start["message"]["id"].as_str().map(|s| s.starts_with("msg_")),
        Some(true)
    );
    let stext: String = events[3..events.len() - 3]
        .iter()
        .map(|e| {
            let d = e.json();
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().expect("text").to_string()
        })
        .collect();
    assert_eq!(stext, text);
    let delta = events[events.len() - 2].json();
    assert_eq!(delta["delta"]["stop_reason"], reason.as_str());
    assert_eq!(delta["usage"]["output_tokens"].as_u64(), Some(output));

    // A stop sequence from the text: stop_reason and stop_sequence say so.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 10, "{text:?}");
    let stop: String = chars[5..8].iter().collect();
    let mut stopped = body.clone();
    merge(&mut stopped, json!({"stop_sequences": [stop.clone()]}));
    let (status, v) = post(&c, &srv, "/v1/messages", &stopped).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], stop.as_str());
    assert_eq!(
        v["content"][0]["text"],
        &text[..text.find(&stop).expect("stop in text")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_concurrent_streams_each_equal_their_solo_text() {
    let srv = HttpServer::start(&["--kv-slots", "4"]);
    let c = client();
    let prompts = [
        "What does the word bright mean?",
        "What does the word river mean?",
        "Tell me about cats.",
        "What is a house?",
    ];
    let mut solo = Vec::new();
    for p in prompts {
        let (status, v) = post(&c, &srv, "/v1/chat/completions", &chat_body(json!(p), json!({}))).await;
        assert_eq!(status, 200, "{v}");
        solo.push(
            v["choices"][0]["message"]["content"]
                .as_str()
                .expect("content")
                .to_string(),
        );
    }
    let mut tasks = Vec::new();
    for p in prompts {
        let c = c.clone();
        let url = srv.url("/v1/chat/completions");
        let body = chat_body(json!(p), json!({"stream": true}));
        tasks.push(tokio::spawn(async move {
            let r = c.post(url).json(&body).send().await.expect("request");
            assert_eq!(r.status().as_u16(), 200);
            parse_sse(&r.text().await.expect("body"))
        }));
    }
    for (t, want) in tasks.into_iter().zip(&solo) {
        let events = t.await.expect("task");
        let (text, _, _) = chat_stream_text(&events);
        assert_eq!(&text, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_frees_its_slot_and_the_server_keeps_serving() {
    let mut args = vec!["--kv-slots", "1"];
    args.extend_from_slice(SLOW);
    let srv = HttpServer::start(&args);
    let c = client();
    // A round whose request ended on its own before the drop reached the
    // server proves nothing about cancelling and is redone.
    for round in 0..10 {
        let before = wait_metrics(&c, &srv, "an idle server", |m| {
            metric(m, "colibri_active_sessions") == 0.0
        })
        .await;
        let mut r = c
            .post(srv.url("/v1/completions"))
            .json(&long_stream())
            .send()
            .await
            .expect("request");
        assert_eq!(r.status().as_u16(), 200);
        // Generated text arrived: the request holds the only slot.
        let first = r.chunk().await.expect("chunk");
        assert!(first.is_some_and(|b| b.starts_with(b"data: ")));
        drop(r);
        let after = wait_metrics(&c, &srv, "the request to end", |m| {
            metric(m, "colibri_active_sessions") == 0.0
        })
        .await;
        let outcome = |m: &HashMap<String, f64>, o: &str| {
            metric(m, &format!("colibri_requests_total{{outcome=\"{o}\"}}"))
        };
        if outcome(&after, "cancelled") == outcome(&before, "cancelled") {
            assert_eq!(outcome(&after, "completed"), outcome(&before, "completed") + 1.0);
            eprintln!("round {round}: the request ended before the drop; again");
            continue;
        }
        assert_eq!(outcome(&after, "cancelled"), outcome(&before, "cancelled") + 1.0);
        // The only slot is free again.
        let (status, v) = post(
            &c,
            &srv,
            "/v1/completions",
            &json!({"prompt": "The cat", "temperature": 0, "max_tokens": 3}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        return;
    }
    panic!("no request outlived its first chunk; stderr: {}", srv.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_gets_429_with_retry_after() {
    let mut args = vec!["--kv-slots", "1", "--queue", "1"];
    args.extend_from_slice(SLOW);
    let srv = HttpServer::start(&args);
    let c = client();
    // One request runs, one waits, the next is refused. A round whose long
    // request ended before the third arrived proves nothing and is redone.
    for round in 0..10 {
        let mut running = c
            .post(srv.url("/v1/completions"))
            .json(&long_stream())
            .send()
            .await
            .expect("request");
        assert_eq!(running.status().as_u16(), 200);
        let _first = running.chunk().await.expect("chunk");
        let url = srv.url("/v1/completions");
        let c2 = c.clone();
        let waiting = tokio::spawn(async move { c2.post(url).json(&long_stream()).send().await });
        let m = wait_metrics(&c, &srv, "a queued request", |m| {
            metric(m, "colibri_queue_depth") == 1.0 || metric(m, "colibri_active_sessions") == 0.0
        })
        .await;
        if metric(&m, "colibri_queue_depth") != 1.0 {
            continue;
        }
        let r = c
            .post(srv.url("/v1/chat/completions"))
            .json(&chat_body(json!("hi"), json!({})))
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        let retry = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let v: Value = serde_json::from_str(&r.text().await.expect("body")).expect("JSON");
        drop(running);
        waiting.abort();
        let _ = waiting.await;
        if status == 200 {
            eprintln!("round {round}: the long request ended first; again");
            wait_metrics(&c, &srv, "an idle server", |m| {
                metric(m, "colibri_active_sessions") == 0.0 && metric(m, "colibri_queue_depth") == 0.0
            })
            .await;
            continue;
        }
        assert_eq!(status, 429, "{v}");
        let secs: u64 = retry.expect("Retry-After").parse().expect("seconds");
        assert!(secs >= 1);
        assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
        let m = wait_metrics(&c, &srv, "an idle server", |m| {
            metric(m, "colibri_active_sessions") == 0.0 && metric(m, "colibri_queue_depth") == 0.0
        })
        .await;
        assert!(metric(&m, "colibri_requests_total{outcome=\"rejected\"}") >= 1.0);
        return;
    }
    panic!("never saw a full queue; stderr: {}", srv.stderr());
}

/// (endpoint, body, the parameter the error must name).
fn bad_requests() -> Vec<(&'static str, Value, Option<&'static str>)> {
    let msg = |extra: Value| chat_body(json!("hi"), extra);
    vec![
        (
            "/v1/chat/completions",
            msg(json!({"temperature": 3})),
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            msg(json!({"temperature": "warm"})),
            Some("temperature"),
        ),
        ("/v1/chat/completions", msg(json!({"top_p": 0})), Some("top_p")),
        ("/v1/chat/completions", msg(json!({"n": 2})), Some("n")),
        (
            "/v1/chat/completions",
            msg(json!({"max_tokens": -1})),
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            msg(json!({"max_completion_tokens": 0})),
            Some("max_completion_tokens"),
        ),
        (
            "/v1/chat/completions",
            msg(json!({"stop": ["a", "b", "c", "d", "e"]})),
            Some("stop"),
        ),
        ("/v1/chat/completions", msg(json!({"seed": "x"})), Some("seed")),
        (
            "/v1/chat/completions",
            msg(json!({"stream": "yes"})),
            Some("stream"),
        ),
        (
            "/v1/chat/completions",
            msg(json!({"logprobs": true})),
            Some("logprobs"),
        ),
        ("/v1/chat/completions", json!({"model": "m"}), Some("messages")),
        ("/v1/chat/completions", json!({"messages": []}), Some("messages")),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            Some("messages[0].content[0].type"),
        ),
        ("/v1/completions", json!({"max_tokens": 3}), Some("prompt")),
        ("/v1/completions", json!({"prompt": {"a": 1}}), Some("prompt")),
        ("/v1/completions", json!({"prompt": ["a", "b"]}), Some("prompt")),
        (
            "/v1/completions",
            json!({"prompt": "", "max_tokens": 3}),
            Some("prompt"),
        ),
        ("/v1/completions", json!({"prompt": [5000000]}), Some("prompt")),
        (
            "/v1/completions",
            json!({"prompt": "x", "echo": true}),
            Some("echo"),
        ),
        ("/v1/chat/completions", json!([1, 2]), None),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_openai_and_anthropic_shapes_and_statuses() {
    let srv = HttpServer::start(&["--ctx", "64", "--max-body", "4096"]);
    let c = client();
    for (path, body, param) in bad_requests() {
        let (status, v) = post(&c, &srv, path, &body).await;
        assert_eq!(status, 400, "{path} {body}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        match param {
            Some(p) => assert_eq!(v["error"]["param"], p, "{path} {body}: {v}"),
            None => assert!(v["error"]["param"].is_null(), "{v}"),
        }
        assert!(
            v["error"].as_object().is_some_and(|o| o.contains_key("code")),
            "{v}"
        );
    }
    // Malformed JSON: 400, and the server is still there.
    for raw in ["{", "not json", "{\"messages\": [}", "\u{0}"] {
        let r = c
            .post(srv.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status().as_u16(), 400, "{raw:?}");
        let v: Value = serde_json::from_str(&r.text().await.expect("body")).expect("JSON error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    // The prompt does not fit the context (64 tokens here).
    let long = "the bright river runs past the house and the cat ".repeat(20);
    let (status, v) = post(
        &c,
        &srv,
        "/v1/chat/completions",
        &chat_body(json!(long), json!({})),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert_eq!(v["error"]["param"], "messages");
    let (status, v) = post(
        &c,
        &srv,
        "/v1/completions",
        &json!({"prompt": long, "stream": true}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert_eq!(v["error"]["param"], "prompt");
    let anth = json!({"max_tokens": 5, "messages": [{"role": "user", "content": long}]});
    let (status, v) = post(&c, &srv, "/v1/messages", &anth).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");

    // Anthropic's shape for its own endpoint.
    let (status, v) = post(
        &c,
        &srv,
        "/v1/messages",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_tokens")),
        "{v}"
    );
    let (status, v) = post(
        &c,
        &srv,
        "/v1/messages",
        &json!({"max_tokens": 5, "temperature": 2.5, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("temperature")),
        "{v}"
    );

    // Too large a body: 413.
    let big = json!({"prompt": "x".repeat(8192), "max_tokens": 1});
    let (status, v) = post(&c, &srv, "/v1/completions", &big).await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["error"]["code"], "request_too_large", "{v}");
    let (status, v) = post(&c, &srv, "/v1/messages", &big).await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["error"]["type"], "request_too_large", "{v}");

    // Unknown route, wrong method.
    let r = c.get(srv.url("/v1/nothing")).send().await.expect("request");
    assert_eq!(r.status().as_u16(), 404);
    let v: Value = serde_json::from_str(&r.text().await.expect("body")).expect("JSON");
    assert!(v["error"]["message"].as_str().is_some(), "{v}");
    let r = c
        .get(srv.url("/v1/chat/completions"))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 405);
    let v: Value = serde_json::from_str(&r.text().await.expect("body")).expect("JSON");
    assert!(v["error"]["message"].as_str().is_some(), "{v}");

    // Still serving after all that.
    let (status, _) = post(
        &c,
        &srv,
        "/v1/completions",
        &json!({"prompt": "The cat", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_guards_everything_but_health() {
    let srv = HttpServer::start(&["--api-key", "sekret-1"]);
    let c = client();
    let r = c.get(srv.url("/health")).send().await.expect("health");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.json::<Value>().await.expect("JSON"), json!({"status": "ok"}));
    for path in ["/v1/models", "/metrics", "/v1/nothing"] {
        let r = c.get(srv.url(path)).send().await.expect("request");
        assert_eq!(r.status().as_u16(), 401, "{path}");
        let v: Value = r.json().await.expect("JSON");
        assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
        let r = c
            .get(srv.url(path))
            .bearer_auth("wrong")
            .send()
            .await
            .expect("request");
        assert_eq!(r.status().as_u16(), 401, "{path}");
    }
    let r = c
        .get(srv.url("/v1/models"))
        .bearer_auth("sekret-1")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
    let body = chat_body(json!("hi"), json!({"max_tokens": 2}));
    let r = c
        .post(srv.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .post(srv.url("/v1/chat/completions"))
        .bearer_auth("sekret-1")
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
    // Anthropic clients send x-api-key; errors come in Anthropic's shape.
    let anth = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    let r = c
        .post(srv.url("/v1/messages"))
        .json(&anth)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 401);
    let v: Value = r.json().await.expect("JSON");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");
    let r = c
        .post(srv.url("/v1/messages"))
        .header("x-api-key", "sekret-1")
        .json(&anth)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
    // x-api-key is for /v1/messages only.
    let r = c
        .get(srv.url("/v1/models"))
        .header("x-api-key", "sekret-1")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 401);
    drop(srv);

    // The key from the environment.
    let srv = HttpServer::start_with(&[], &[("COLI_API_KEY", "from-env")]);
    let r = c.get(srv.url("/v1/models")).send().await.expect("request");
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .get(srv.url("/v1/models"))
        .bearer_auth("from-env")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_metrics() {
    let srv = HttpServer::start(&[]);
    let c = client();
    let v: Value = c
        .get(srv.url("/v1/models"))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("JSON");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "colibri-tiny");
    assert_eq!(v["data"][0]["object"], "model");
    let r = c
        .get(srv.url("/v1/models/colibri-tiny"))
        .send()
        .await
        .expect("model");
    assert_eq!(r.status().as_u16(), 200);
    let r = c.get(srv.url("/v1/models/other")).send().await.expect("model");
    assert_eq!(r.status().as_u16(), 404);
    let v: Value = c
        .get(srv.url("/health"))
        .send()
        .await
        .expect("health")
        .json()
        .await
        .expect("JSON");
    assert_eq!(v, json!({"status": "ok"}));

    let (status, _) = post(
        &c,
        &srv,
        "/v1/completions",
        &json!({"prompt": "The cat", "max_tokens": 5}),
    )
    .await;
    assert_eq!(status, 200);
    let r = c.get(srv.url("/metrics")).send().await.expect("metrics");
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let text = r.text().await.expect("body");
    for name in [
        "colibri_generated_tokens_total",
        "colibri_prompt_tokens_total",
        "colibri_requests_total",
        "colibri_recent_tokens_per_second",
        "colibri_queue_depth",
        "colibri_active_sessions",
        "colibri_expert_cache_hit_ratio",
        "colibri_expert_bytes_read_total",
    ] {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}\n{text}");
        assert!(text.contains(&format!("# TYPE {name} ")), "{name}\n{text}");
    }
    let m = metrics(&c, &srv).await;
    assert!(metric(&m, "colibri_generated_tokens_total") >= 1.0);
    assert_eq!(metric(&m, "colibri_requests_total{outcome=\"completed\"}"), 1.0);
    let ratio = metric(&m, "colibri_expert_cache_hit_ratio");
    assert!((0.0..=1.0).contains(&ratio), "{ratio}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_streams_and_exits_cleanly() {
    let mut args = vec!["--kv-slots", "1"];
    args.extend_from_slice(SLOW);
    let srv = HttpServer::start(&args);
    let c = client();
    let mut r = c
        .post(srv.url("/v1/completions"))
        .json(&long_stream())
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200);
    let _first = r.chunk().await.expect("chunk");
    let stderr = srv.stderr.clone();
    let status = tokio::task::spawn_blocking(move || srv.terminate())
        .await
        .expect("join");
    assert!(
        status.success(),
        "{status:?}; stderr: {}",
        stderr.lock().map(|s| s.clone()).unwrap_or_default()
    );
    // The stream was ended, not cut: it closes with an error event and [DONE].
    let mut rest = String::new();
    while let Ok(Some(b)) = r.chunk().await {
        rest.push_str(&String::from_utf8_lossy(&b));
    }
    let events = parse_sse(&rest);
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"), "{rest}");
}

/// One client's share of a load round: chat and streamed completions in
/// turn. Returns (ok, refused) counts; anything else fails the test.
async fn client_round(c: reqwest::Client, base: String, client: usize, per_client: usize) -> (usize, usize) {
    let mut ok = 0;
    let mut refused = 0;
    for i in 0..per_client {
        let seed = (client * 1000 + i) as u64;
        let (path, body, stream) = if i % 2 == 0 {
            (
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": format!("Tell me about {client} cats.")}],
                       "max_tokens": 24, "temperature": 0.8, "seed": seed}),
                false,
            )
        } else {
            (
                "/v1/completions",
                json!({"prompt": format!("The {i} cat"), "max_tokens": 24, "temperature": 0.8,
                       "seed": seed, "stream": true}),
                true,
            )
        };
        let r = c
            .post(format!("{base}{path}"))
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        let retry = r.headers().contains_key("retry-after");
        let text = r.text().await.expect("body");
        match status {
            200 if stream => {
                let events = parse_sse(&text);
                let (_, finish, _) = completion_stream_text(&events);
                assert!(finish == "stop" || finish == "length", "{finish}");
                ok += 1;
            }
            200 => {
                let v: Value = serde_json::from_str(&text).expect("JSON");
                assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
                ok += 1;
            }
            429 => {
                assert!(retry, "429 without Retry-After");
                refused += 1;
            }
            other => panic!("status {other}: {text}"),
        }
    }
    (ok, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_16_clients_loses_nothing_and_memory_stays_flat() {
    const CLIENTS: usize = 16;
    const PER_CLIENT: usize = 2;
    const ROUNDS: usize = 4;
    let srv = HttpServer::start(&[]);
    let c = client();
    let mut rss = Vec::new();
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..ROUNDS {
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|k| tokio::spawn(client_round(c.clone(), srv.base.clone(), k, PER_CLIENT)))
            .collect();
        for t in tasks {
            let (o, r) = t.await.expect("client task");
            ok += o;
            refused += r;
        }
        rss.push(srv.rss_kb());
    }
    let sent = CLIENTS * PER_CLIENT * ROUNDS;
    assert_eq!(ok + refused, sent);
    assert!(ok > 0);
    let m = wait_metrics(&c, &srv, "an idle server", |m| {
        metric(m, "colibri_active_sessions") == 0.0
    })
    .await;
    assert_eq!(
        metric(&m, "colibri_requests_received_total") as usize,
        sent,
        "{m:?}"
    );
    assert_eq!(
        metric(&m, "colibri_requests_total{outcome=\"completed\"}") as usize,
        ok,
        "{m:?}"
    );
    assert_eq!(
        metric(&m, "colibri_requests_total{outcome=\"rejected\"}") as usize,
        refused,
        "{m:?}"
    );
    let (first, last) = (rss[0], rss[rss.len() - 1]);
    assert!(
        last <= first + 64 * 1024,
        "resident memory grew from {first} kB to {last} kB over the rounds: {rss:?}"
    );
}

#[test]
fn http_flags_are_checked_before_anything_runs() {
    let out = coli_command().args(["serve", "--queue", "3"]).output();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = coli_command()
        .args(["serve", "--http", "not-an-address"])
        .output();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The OpenAI usage's cached tokens and the llama-server timings agree:
/// cached + computed = prompt, generated = completion.
fn cached_tokens(usage: &Value, timings: &Value) -> u64 {
    let prompt = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("prompt_tokens_details.cached_tokens");
    let computed = timings["prompt_n"].as_u64().expect("timings.prompt_n");
    assert_eq!(cached + computed, prompt, "{usage} {timings}");
    assert_eq!(timings["cache_n"].as_u64(), Some(cached), "{timings}");
    assert_eq!(timings["predicted_n"], usage["completion_tokens"], "{timings}");
    for k in [
        "prompt_ms",
        "prompt_per_second",
        "predicted_ms",
        "predicted_per_second",
    ] {
        assert!(timings[k].as_f64().is_some_and(|x| x >= 0.0), "{k}: {timings}");
    }
    cached
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_reports_the_prompt_tokens_read_from_the_cache() {
    let srv = HttpServer::start(&["--prompt-cache-mb", "16"]);
    assert!(
        srv.ready_line.contains("prompt cache 16 MiB"),
        "{}",
        srv.ready_line
    );
    let c = client();
    let first = chat_body(json!("What does the word river mean?"), json!({"max_tokens": 8}));
    let (status, v) = post(&c, &srv, "/v1/chat/completions", &first).await;
    assert_eq!(status, 200, "{v}");
    // A fresh server has nothing to reuse.
    assert_eq!(cached_tokens(&v["usage"], &v["timings"]), 0);
    let first_prompt = v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");

    // The conversation's next turn reuses the first (up to where the
    // re-rendered reply may tokenize differently).
    let reply = v["choices"][0]["message"]["content"].clone();
    let second = json!({
        "messages": [
            {"role": "user", "content": "What does the word river mean?"},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "And stone?"},
        ],
        "temperature": 0,
        "max_tokens": 8,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let (status, events) = post_stream(&c, &srv, "/v1/chat/completions", &second).await;
    assert_eq!(status, 200);
    let (_, _, usage) = chat_stream_text(&events);
    let usage = usage.expect("a usage chunk");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(SseEvent::json).collect();
    let usage_chunk = chunks.last().expect("the usage chunk");
    let cached = cached_tokens(&usage, &usage_chunk["timings"]);
    assert!(
        cached + 2 >= first_prompt,
        "cached {cached} of the first turn's {first_prompt}"
    );
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(cached_tokens(&usage, &finish["timings"]), cached);

    // The same completion prompt twice: all but its last token is reused.
    let body = json!({"prompt": "The cat sat on the warm stone", "temperature": 0, "max_tokens": 4});
    let (_, a) = post(&c, &srv, "/v1/completions", &body).await;
    cached_tokens(&a["usage"], &a["timings"]);
    let (_, b) = post(&c, &srv, "/v1/completions", &body).await;
    let prompt = b["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert_eq!(cached_tokens(&b["usage"], &b["timings"]), prompt - 1);

    // Anthropic: input_tokens is what was not read from the cache.
    let msg = json!({
        "messages": [{"role": "user", "content": "What does the word forest mean?"}],
        "max_tokens": 4,
        "temperature": 0,
    });
    let (_, m1) = post(&c, &srv, "/v1/messages", &msg).await;
    let (_, m2) = post(&c, &srv, "/v1/messages", &msg).await;
    let total = |m: &Value| {
        let u = &m["usage"];
        assert_eq!(u["cache_creation_input_tokens"], 0, "{u}");
        u["input_tokens"].as_u64().expect("input_tokens")
            + u["cache_read_input_tokens"]
                .as_u64()
                .expect("cache_read_input_tokens")
    };
    assert_eq!(total(&m1), total(&m2));
    assert_eq!(m2["usage"]["input_tokens"], 1, "{m2}");
    assert_eq!(
        m2["usage"]["cache_read_input_tokens"].as_u64(),
        Some(total(&m2) - 1)
    );
    let mut streamed = msg.clone();
    merge(&mut streamed, json!({"stream": true}));
    let (_, events) = post_stream(&c, &srv, "/v1/messages", &streamed).await;
    let start = events[0].json();
    assert_eq!(start["message"]["usage"]["input_tokens"], 1, "{start}");
    assert_eq!(
        start["message"]["usage"]["cache_read_input_tokens"].as_u64(),
        Some(total(&m2) - 1)
    );
}
