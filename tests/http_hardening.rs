//! `coli serve --http` against big, slow and malformed clients, and
//! `coli serve --batch` against one that does not read its replies.
//! Hostile clients are raw `std::net::TcpStream`s; normal ones use reqwest.
//! Every wait is on an event (a reply, a closed socket, a /metrics value, a
//! stderr line) under a generous bound; the only timeouts that matter are
//! the server's own, set to 1 s where a test is about them.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{ColiChild, coli_command, tiny_chat_model, wait_bounded};

/// Longest wait for a server to start, a reply, or a socket to close.
use support::http::{HANG_GUARD, client};

/// Bytes of the oversized bodies (under the default --max-body of 8 MiB).
const BIG: usize = 8_000_000;

/// A running `coli serve --http 127.0.0.1:0`.
struct HttpServer {
    child: ColiChild,
    addr: SocketAddr,
}

impl HttpServer {
    fn start(extra: &[&str]) -> HttpServer {
        let mut child = coli_command()
            .arg("serve")
            .arg("--model")
            .arg(tiny_chat_model())
            .args(["--http", "127.0.0.1:0", "--threads", "1"])
            .args(extra)
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
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split(' ').next().unwrap_or("").to_string());
                }
            }
        });
        let addr = rx
            .recv_timeout(HANG_GUARD)
            .expect("the ready line")
            .parse()
            .expect("an address in the ready line");
        HttpServer { child, addr }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(HANG_GUARD)).expect("read timeout");
        s
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn post(c: &reqwest::Client, srv: &HttpServer, path: &str, body: Vec<u8>) -> (u16, Value) {
    let r = c
        .post(srv.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text:?}"));
    (status, v)
}

async fn metrics(c: &reqwest::Client, srv: &HttpServer) -> HashMap<String, f64> {
    let text = c
        .get(srv.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    parse_metrics(&text)
}

fn parse_metrics(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn metric(m: &HashMap<String, f64>, name: &str) -> f64 {
    m.get(name)
        .copied()
        .unwrap_or_else(|| panic!("no metric {name} in {m:?}"))
}

/// A text of about `n` bytes.
fn filler(n: usize) -> String {
    "river bank ".repeat(n / 11)
}

fn chat(content: &str, max_tokens: usize) -> Vec<u8> {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
           "temperature": 0, "seed": 1})
    .to_string()
    .into_bytes()
}

/// One response read off a raw connection: status, lower-cased headers, body.
#[derive(Debug)]
struct Raw {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Raw {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// A JSON error in OpenAI's shape with this status and code.
    fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.headers.get("content-type").map(String::as_str),
            Some("application/json"),
            "{self:?}"
        );
        let v = self.json();
        assert_eq!(v["error"]["code"], code, "{self:?}");
        assert!(
            v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{self:?}"
        );
    }
}

/// Reads one response (head, then `content-length` bytes of body).
fn read_response(s: &mut impl Read) -> Raw {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            other => panic!(
                "the connection ended inside a head ({other:?}): {:?}",
                String::from_utf8_lossy(&buf)
            ),
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head:?}"));
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no content-length: {head:?}"));
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).expect("the body");
    Raw {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// True once the server has closed `s` (reads end), within the hang guard;
/// what it sent before closing is appended to `seen`.
fn closed_by_server(s: &mut TcpStream, seen: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

// --- Oversized prompts -----------------------------------------------------

/// An 8 MB prompt on each endpoint is refused with the context error, and
/// none of them reached the tokenizer (or the decode loop); a prompt just
/// over the context is tokenized and refused with its exact count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_prompt_is_refused_without_tokenizing() {
    let srv = HttpServer::start(&[]);
    let c = client();
    let text = filler(BIG);
    let (status, v) = post(&c, &srv, "/v1/chat/completions", chat(&text, 8)).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "messages");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("resulted in at least "), "{message}");
    let body = json!({"prompt": text, "max_tokens": 8}).to_string().into_bytes();
    let (status, v) = post(&c, &srv, "/v1/completions", body).await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("prompt")),
        "{v}"
    );
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let body = json!({"messages": [{"role": "user", "content": text}], "max_tokens": 8})
        .to_string()
        .into_bytes();
    let (status, v) = post(&c, &srv, "/v1/messages", body).await;
    assert_eq!((status, v["type"].as_str()), (400, Some("error")), "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let m = metrics(&c, &srv).await;
    assert_eq!(metric(&m, "colibri_http_prompts_tokenized_total"), 0.0, "{m:?}");
    assert_eq!(metric(&m, "colibri_http_prompts_refused_by_length_total"), 3.0);
    assert_eq!(metric(&m, "colibri_requests_received_total"), 0.0);

    // Over the context, but not by enough to tell from the length: the
    // exact count, from the decode loop.
    // (The bundled tokenizer's longest token is 16 bytes and its context
    // 1024 tokens: 16 000 bytes could be 1000 tokens; they are thousands.)
    let body = json!({"prompt": filler(16_000)}).to_string().into_bytes();
    let (status, v) = post(&c, &srv, "/v1/completions", body).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(!message.contains("at least"), "{message}");
    let m = metrics(&c, &srv).await;
    assert_eq!(metric(&m, "colibri_http_prompts_tokenized_total"), 1.0, "{m:?}");
    assert_eq!(metric(&m, "colibri_http_prompts_refused_by_length_total"), 3.0);
}

/// Three 8 MB bodies in flight (all but their last bytes sent, then sent
/// in full, three times over) do not keep a short chat from its reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_is_answered_while_big_bodies_are_in_flight() {
    let srv = HttpServer::start(&[]);
    let c = client();
    let body = chat(&filler(BIG), 8);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let (most, tail) = body.split_at(body.len() - 16);
    let mut held: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = srv.connect();
            s.write_all(head.as_bytes()).expect("head");
            s.write_all(most).expect("most of the body");
            s
        })
        .collect();
    let (status, v) = post(
        &c,
        &srv,
        "/v1/chat/completions",
        chat("What does river mean?", 32),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["usage"]["completion_tokens"].as_u64().is_some_and(|n| n >= 1),
        "{v}"
    );
    for s in &mut held {
        s.write_all(tail).expect("the rest of the body");
    }
    for s in &mut held {
        read_response(s).assert_error(400, "context_length_exceeded");
    }

    // Now with the three being parsed and rendered while the chat runs.
    let body = Arc::new(body);
    let senders: Vec<_> = (0..3)
        .map(|_| {
            let (c, url, body) = (c.clone(), srv.url("/v1/chat/completions"), body.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..3 {
                    let r = c
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.to_vec())
                        .send()
                        .await
                        .expect("big request");
                    statuses.push(r.status().as_u16());
                }
                statuses
            })
        })
        .collect();
    let mut replies = 0;
    for _ in 0..3 {
        let (status, v) = post(
            &c,
            &srv,
            "/v1/chat/completions",
            chat("What does river mean?", 32),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        replies += usize::from(v["choices"][0]["message"]["content"].is_string());
    }
    assert_eq!(replies, 3);
    for s in senders {
        assert_eq!(s.await.expect("sender"), vec![400, 400, 400]);
    }
}

// --- Slow clients ------------------------------------------------------------

/// A connection that sends half a head, half a body, or nothing is closed
/// once the (1 s) timeouts pass: the first two with a 408 in the JSON
/// error shape, the idle one without a word.
#[test]
fn half_heads_and_half_bodies_are_closed_after_the_timeouts() {
    let srv = HttpServer::start(&["--header-timeout-s", "1", "--body-timeout-s", "1"]);
    let mut half_heads: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = srv.connect();
            s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-le")
                .expect("half a head");
            s
        })
        .collect();
    let mut half_bodies: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = srv.connect();
            s.write_all(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                  content-length: 1000\r\n\r\n{\"messages\": [",
            )
            .expect("half a body");
            s
        })
        .collect();
    let mut idle = srv.connect();
    for s in &mut half_heads {
        let mut seen = Vec::new();
        assert!(closed_by_server(s, &mut seen), "a half head is still open");
        let raw = read_response(&mut &seen[..]);
        raw.assert_error(408, "request_timeout");
    }
    for s in &mut half_bodies {
        let raw = read_response(s);
        raw.assert_error(408, "request_timeout");
        assert!(closed_by_server(s, &mut Vec::new()), "a half body is still open");
    }
    let mut seen = Vec::new();
    assert!(
        closed_by_server(&mut idle, &mut seen),
        "an idle connection is still open"
    );
    assert!(seen.is_empty(), "{:?}", String::from_utf8_lossy(&seen));
    let m = parse_metrics(&get(&srv, "/metrics").body);
    assert!(metric(&m, "colibri_http_header_timeouts_total") >= 5.0, "{m:?}");
    assert_eq!(metric(&m, "colibri_http_body_timeouts_total"), 4.0, "{m:?}");
}

/// A GET on a connection of its own.
fn get(srv: &HttpServer, path: &str) -> Raw {
    let mut s = srv.connect();
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").expect("request");
    read_response(&mut s)
}

/// /metrics over an open keep-alive connection.
fn metrics_on(s: &mut TcpStream) -> HashMap<String, f64> {
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .expect("metrics request");
    parse_metrics(&read_response(s).body)
}

/// With `--max-connections 2`, a third connection is served only once one
/// of the first two closes.
#[test]
fn connections_beyond_the_limit_wait_for_a_free_one() {
    let srv = HttpServer::start(&["--max-connections", "2"]);
    let idle = srv.connect();
    let mut polling = srv.connect();
    let m = metrics_on(&mut polling);
    assert_eq!(metric(&m, "colibri_http_connections_open"), 2.0, "{m:?}");
    let accepted = metric(&m, "colibri_http_connections_total");
    let mut third = srv.connect();
    third
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .expect("health request");
    // The third is not taken while both are held.
    let m = metrics_on(&mut polling);
    assert_eq!(metric(&m, "colibri_http_connections_total"), accepted, "{m:?}");
    drop(idle);
    let health = read_response(&mut third);
    assert_eq!(health.status, 200, "{health:?}");
    let m = metrics_on(&mut polling);
    assert_eq!(
        metric(&m, "colibri_http_connections_total"),
        accepted + 1.0,
        "{m:?}"
    );
}

// --- Framing errors ------------------------------------------------------------

/// Malformed HTTP and bodies the server cannot take get the JSON error
/// shape, whichever layer notices.
#[test]
fn framing_errors_get_json_bodies() {
    let srv = HttpServer::start(&["--max-body", "1000"]);
    let exchange = |bytes: &[u8]| {
        let mut s = srv.connect();
        s.write_all(bytes).expect("request");
        read_response(&mut s)
    };
    let post = |extra: &str, body: &str| {
        format!("POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{extra}\r\n{body}")
            .into_bytes()
    };
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "a request line that is not HTTP",
            b"GARBAGE\r\n\r\n".to_vec(),
            400,
            "malformed_request",
        ),
        (
            "a header without a colon",
            post("bad header\r\n", ""),
            400,
            "malformed_request",
        ),
        (
            "a content-length that is not a number",
            post("content-length: ten\r\n", ""),
            400,
            "malformed_request",
        ),
        (
            "two content-lengths",
            post("content-length: 2\r\ncontent-length: 3\r\n", "{}"),
            400,
            "malformed_request",
        ),
        (
            "a head too large",
            post(&format!("x-big: {}\r\n", "a".repeat(1 << 20)), ""),
            431,
            "request_header_fields_too_large",
        ),
        (
            "bad chunked encoding",
            post(
                "transfer-encoding: chunked\r\ncontent-type: application/json\r\n",
                "zz\r\n{}\r\n0\r\n\r\n",
            ),
            400,
            "",
        ),
        (
            "a body that is not JSON",
            post("content-type: application/json\r\ncontent-length: 5\r\n", "{nope"),
            400,
            "",
        ),
        (
            "a body that is not an object",
            post("content-type: application/json\r\ncontent-length: 3\r\n", "[1]"),
            400,
            "",
        ),
        (
            "a content type other than JSON",
            post("content-type: text/plain\r\ncontent-length: 2\r\n", "{}"),
            415,
            "unsupported_media_type",
        ),
        (
            "a body over --max-body",
            post(
                "content-type: application/json\r\ncontent-length: 5000\r\n",
                "{\"messages\":",
            ),
            413,
            "request_too_large",
        ),
        (
            "an unknown route",
            b"GET /v2/nothing HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".to_vec(),
            404,
            "not_found",
        ),
        (
            "a wrong method",
            b"GET /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".to_vec(),
            405,
            "method_not_allowed",
        ),
    ];
    for (what, bytes, status, code) in cases {
        let raw = exchange(&bytes);
        assert_eq!(raw.status, status, "{what}: {raw:?}");
        assert_eq!(
            raw.headers.get("content-type").map(String::as_str),
            Some("application/json"),
            "{what}: {raw:?}"
        );
        let v = raw.json();
        assert!(
            v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
        assert_eq!(v["error"]["type"], "invalid_request_error", "{what}: {v}");
        if !code.is_empty() {
            assert_eq!(v["error"]["code"], code, "{what}: {v}");
        }
    }
    // The Anthropic endpoint answers its body errors in its own shape.
    let raw = exchange(
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: text/plain\r\n\
          content-length: 2\r\n\r\n{}",
    );
    assert_eq!(raw.status, 415, "{raw:?}");
    let v = raw.json();
    assert_eq!(
        (v["type"].as_str(), v["error"]["type"].as_str()),
        (Some("error"), Some("invalid_request_error")),
        "{v}"
    );
}

// --- serve --batch ---------------------------------------------------------------

/// A `serve --batch` client that never reads stdout: the server stops
/// reading requests once the replies waiting for stdout reach their limit
/// (and says so on stderr), instead of queueing them without end; once
/// stdout is read, every request gets its last line exactly once.
#[test]
fn an_unread_batch_stdout_stops_the_reader_at_its_limit() {
    let mut child = coli_command()
        .arg("serve")
        .arg("--batch")
        .arg("--model")
        .arg(tiny_chat_model())
        .args(["--kv-slots", "1", "--threads", "1", "--no-kv-save"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let (line_tx, line_rx) = mpsc::channel();
    let stderr = Arc::new(Mutex::new(String::new()));
    let sink = stderr.clone();
    thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if line.contains("wait for stdout to be read") {
                let _ = line_tx.send(line.clone());
            }
            if let Ok(mut s) = sink.lock() {
                s.push_str(&line);
                s.push('\n');
            }
        }
    });
    // Far more reply bytes than the pipe, the writer's buffer and its
    // queue hold: most are refused (SLOT_BUSY) while one runs.
    const N: usize = 12_000;
    let writer = thread::spawn(move || {
        for i in 0..N {
            if stdin
                .write_all(format!("SUBMIT r{i} 0 5 16 0 1\nhello\n").as_bytes())
                .is_err()
            {
                return false;
            }
        }
        true
    });
    let line = line_rx.recv_timeout(HANG_GUARD).unwrap_or_else(|_| {
        panic!(
            "no back-pressure line; stderr: {}",
            stderr.lock().map(|s| s.clone()).unwrap_or_default()
        )
    });
    let numbers: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        matches!(numbers.as_slice(), [waiting, limit, ..] if waiting <= limit && *limit == 2),
        "{line}"
    );
    // Now read: everything comes, and the input is read to its end.
    let reader = thread::spawn(move || {
        let mut all = Vec::new();
        BufReader::new(stdout).read_to_end(&mut all).expect("stdout");
        all
    });
    let deadline = Instant::now() + HANG_GUARD;
    while !writer.is_finished() {
        assert!(Instant::now() < deadline, "the requests were never all read");
        thread::sleep(Duration::from_millis(20));
    }
    assert!(writer.join().expect("writer"), "stdin closed early");
    // The writer thread dropped stdin: EOF lets the session end.
    let status = wait_bounded(&mut child, HANG_GUARD);
    assert!(status.success(), "{status:?}");
    let out = reader.join().expect("reader");
    let last = last_lines(&out);
    assert_eq!(last.len(), N, "ids with a last line");
    assert!(
        last.values().all(|&n| n == 1),
        "an id with more than one last line"
    );
}

/// Per id, how many DONE or ERROR lines `out` holds (DATA payloads skipped).
fn last_lines(out: &[u8]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    let mut rest = out;
    while !rest.is_empty() {
        let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        let line = String::from_utf8_lossy(&rest[..end]).into_owned();
        rest = rest.get(end + 1..).unwrap_or(&[]);
        let mut f = line.split(' ');
        match (f.next(), f.next(), f.next()) {
            (Some("DATA"), Some(_), Some(n)) => {
                let n: usize = n.parse().expect("DATA length");
                rest = rest.get(n + 1..).unwrap_or(&[]);
            }
            (Some("DONE" | "ERROR"), Some(id), _) => *counts.entry(id.to_string()).or_insert(0) += 1,
            _ => {}
        }
    }
    counts
}
