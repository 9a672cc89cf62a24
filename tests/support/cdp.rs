//! A headless Chromium driven over the DevTools protocol (CDP), and a plain
//! HTTP/1.1 GET. Only tests/web_page.rs includes this file (by path, so the
//! other test binaries do not build it).
//!
//! The browser runs in its own process group with a throw-away profile and
//! HOME; dropping [`Browser`] kills the group, on failure too.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tungstenite::{Message, WebSocket};

/// Longest wait for one DevTools answer, the browser's start, or a plain GET.
const CALL_LIMIT: Duration = Duration::from_secs(60);

/// How often a condition is polled (the condition decides, not this).
const POLL_EVERY: Duration = Duration::from_millis(50);

/// The Chromium to use: `$CHROME` when set, else the first of the usual
/// names found on `PATH`.
pub fn find_chromium() -> Option<PathBuf> {
    if let Some(c) = std::env::var_os("CHROME").filter(|c| !c.is_empty()) {
        return Some(PathBuf::from(c));
    }
    let path = std::env::var_os("PATH")?;
    [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ]
    .iter()
    .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
    .find(|p| p.is_file())
}

/// A running headless Chromium.
pub struct Browser {
    child: Child,
    port: u16,
    stderr: Arc<Mutex<String>>,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts `bin` headless with `home` as its HOME and waits for its
    /// DevTools port.
    pub fn launch(bin: &Path, home: &Path) -> Browser {
        let profile = tempfile::tempdir().expect("a profile directory");
        let mut child = Command::new(bin)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-port=0",
                "--window-size=1200,800",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .env("HOME", home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_CACHE_HOME", home.join(".cache"))
            .env("XDG_DATA_HOME", home.join(".local/share"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(err) = child.stderr.take() {
            let sink = stderr.clone();
            thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(mut s) = sink.lock() {
                        s.push_str(&line);
                        s.push('\n');
                    }
                }
            });
        }
        let mut b = Browser {
            child,
            port: 0,
            stderr,
            _profile: profile,
        };
        // Chromium writes the port it bound, then the browser target's path.
        let file = b._profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + CALL_LIMIT;
        b.port = loop {
            if let Some(port) = std::fs::read_to_string(&file)
                .ok()
                .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<u16>().ok()))
            {
                break port;
            }
            if let Ok(Some(status)) = b.child.try_wait() {
                panic!(
                    "{} exited ({status}) before it listened; stderr:\n{}",
                    bin.display(),
                    b.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} wrote no {} in {CALL_LIMIT:?}; stderr:\n{}",
                bin.display(),
                file.display(),
                b.stderr()
            );
            thread::sleep(POLL_EVERY);
        };
        b
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The first page target (the window opened on about:blank).
    pub fn page(&self) -> Page {
        let addr = format!("127.0.0.1:{}", self.port);
        let deadline = Instant::now() + CALL_LIMIT;
        let url = loop {
            let r = http_get(&addr, "/json/list", &[]);
            let targets: Value = serde_json::from_str(&r.body)
                .unwrap_or_else(|e| panic!("/json/list is not JSON ({e}): {}", r.body));
            let page = targets.as_array().and_then(|list| {
                list.iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str())
                    .map(str::to_string)
            });
            if let Some(u) = page {
                break u;
            }
            assert!(Instant::now() < deadline, "no page target in {targets}");
            thread::sleep(POLL_EVERY);
        };
        Page::connect(&addr, &url)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // The whole group: the browser and the renderers it started.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.child.id())])
                .status();
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A DevTools session with one page. Events are not waited on; the ones
/// that report a script error or a console error are kept in [`Page::errors`].
pub struct Page {
    ws: WebSocket<TcpStream>,
    next_id: u64,
    errors: Vec<String>,
}

impl Page {
    fn connect(addr: &str, url: &str) -> Page {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
        stream.set_read_timeout(Some(CALL_LIMIT)).expect("read timeout");
        stream.set_write_timeout(Some(CALL_LIMIT)).expect("write timeout");
        let (ws, _) = tungstenite::client(url, stream)
            .unwrap_or_else(|e| panic!("websocket handshake with {url}: {e}"));
        let mut p = Page {
            ws,
            next_id: 0,
            errors: Vec::new(),
        };
        for domain in ["Page", "Runtime", "Log"] {
            p.call(&format!("{domain}.enable"), json!({}));
        }
        p
    }

    /// Sends one command and returns its result (panics on a protocol error).
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.try_call(method, params)
            .unwrap_or_else(|err| panic!("{method} failed: {err}"))
    }

    /// Sends one command: its result, or the protocol error (a page that
    /// is navigating has no context to evaluate in, for one).
    pub fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({ "id": id, "method": method, "params": params }).to_string();
        self.ws
            .send(Message::Text(msg.into()))
            .unwrap_or_else(|e| panic!("sending {method}: {e}"));
        loop {
            let m = self
                .ws
                .read()
                .unwrap_or_else(|e| panic!("no answer to {method} ({e})"));
            let Message::Text(t) = m else { continue };
            let v: Value = serde_json::from_str(t.as_str())
                .unwrap_or_else(|e| panic!("DevTools sent non-JSON ({e}): {}", t.as_str()));
            if v["id"].as_u64() == Some(id) {
                return match v.get("error") {
                    Some(err) => Err(err.clone()),
                    None => Ok(v["result"].clone()),
                };
            }
            self.note_event(&v);
        }
    }

    fn note_event(&mut self, v: &Value) {
        let p = &v["params"];
        match v["method"].as_str() {
            Some("Runtime.exceptionThrown") => {
                let d = &p["exceptionDetails"];
                let text = d["exception"]["description"].as_str().or(d["text"].as_str());
                self.errors.push(format!("exception: {}", text.unwrap_or("?")));
            }
            Some("Runtime.consoleAPICalled") if p["type"] == "error" => {
                self.errors.push(format!("console.error: {}", p["args"]));
            }
            Some("Log.entryAdded") if p["entry"]["level"] == "error" => {
                self.errors.push(format!("log: {}", p["entry"]["text"]));
            }
            _ => {}
        }
    }

    /// Script errors, console errors and browser log errors seen so far
    /// (a refused load under the content security policy is one).
    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    /// The errors so far, forgotten here.
    pub fn take_errors(&mut self) -> Vec<String> {
        std::mem::take(&mut self.errors)
    }

    /// The value of a JavaScript expression (promises awaited); panics
    /// with the exception when it throws.
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expr, "awaitPromise": true, "returnByValue": true }),
        );
        if let Some(ex) = r.get("exceptionDetails") {
            panic!(
                "{expr} threw: {}",
                ex["exception"]["description"].as_str().unwrap_or("?")
            );
        }
        r["result"]["value"].clone()
    }

    /// Polls `probe` until `done` holds for its value; the last value
    /// when `limit` passes first.
    pub fn poll(
        &mut self,
        limit: Duration,
        mut probe: impl FnMut(&mut Page) -> Value,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value, Value> {
        let deadline = Instant::now() + limit;
        loop {
            let v = probe(self);
            if done(&v) {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(v);
            }
            thread::sleep(POLL_EVERY);
        }
    }

    /// Opens `url` and waits until its document has loaded.
    pub fn navigate(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({ "url": url }));
        if let Some(e) = r.get("errorText") {
            panic!("navigating to {url}: {e}");
        }
        self.wait_loaded(url);
    }

    /// Reloads the page and waits until it has loaded again.
    pub fn reload(&mut self) {
        // A marker the old document has and the new one will not.
        self.eval("window.__beforeReload = true");
        self.call("Page.reload", json!({}));
        self.wait_loaded("the reloaded page");
    }

    fn wait_loaded(&mut self, what: &str) {
        let expr = json!({
            "expression": "document.readyState === 'complete' && !window.__beforeReload",
            "returnByValue": true,
        });
        // Between documents there may be no context: an error, not an answer.
        let r = self.poll(
            CALL_LIMIT,
            |p| {
                p.try_call("Runtime.evaluate", expr.clone())
                    .map_or(Value::Null, |r| r["result"]["value"].clone())
            },
            |v| v == &Value::Bool(true),
        );
        assert!(r.is_ok(), "{what} did not load in {CALL_LIMIT:?}");
    }

    /// Types `text` into the focused element, as a keyboard would.
    pub fn type_text(&mut self, text: &str) {
        self.call("Input.insertText", json!({ "text": text }));
    }

    /// Presses and releases Enter.
    pub fn press_enter(&mut self) {
        for kind in ["keyDown", "keyUp"] {
            self.call(
                "Input.dispatchKeyEvent",
                json!({ "type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13 }),
            );
        }
    }

    /// A PNG of the viewport.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        base64_decode(r["data"].as_str().expect("screenshot data"))
    }
}

/// Standard base64 (DevTools' encoding of binary results).
fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("{:?} is not base64", c as char),
    };
    let digits: Vec<u8> = s
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut n = 0u32;
        for (k, &c) in chunk.iter().enumerate() {
            n |= u32::from(value(c)) << (18 - 6 * k);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// An HTTP response: status, headers (names lower-cased), body.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `METHOD PATH` on `addr` with `Connection: close`; the body is read to
/// its `Content-Length` (DevTools keeps the connection open regardless).
pub fn http_request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(CALL_LIMIT)).expect("read timeout");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Content-Length: 0\r\n\r\n");
    s.write_all(req.as_bytes()).expect("sending the request");
    let mut raw = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut read_more = |raw: &mut Vec<u8>| -> bool {
        let n = s
            .read(&mut chunk)
            .unwrap_or_else(|e| panic!("reading {method} {path} from {addr}: {e}"));
        raw.extend_from_slice(&chunk[..n]);
        n > 0
    };
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        assert!(
            read_more(&mut raw),
            "{method} {path}: the connection closed inside the headers"
        );
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let find = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert!(
        !find("transfer-encoding").is_some_and(|v| v.contains("chunked")),
        "{method} {path}: a chunked body, which this reader does not decode"
    );
    let body_start = head_end + 4;
    if method != "HEAD" {
        match find("content-length").and_then(|v| v.parse::<usize>().ok()) {
            Some(len) => {
                while raw.len() < body_start + len {
                    assert!(read_more(&mut raw), "{method} {path}: the body ended early");
                }
                raw.truncate(body_start + len);
            }
            None => while read_more(&mut raw) {},
        }
    }
    let body = String::from_utf8_lossy(raw.get(body_start..).unwrap_or_default()).into_owned();
    Reply {
        status,
        headers,
        body,
    }
}

/// `GET PATH` on `addr`.
pub fn http_get(addr: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    http_request(addr, "GET", path, headers)
}

#[test]
fn base64_round_trip() {
    assert_eq!(base64_decode("aGVsbG8="), b"hello");
    assert_eq!(base64_decode("aGk="), b"hi");
    assert_eq!(base64_decode("YWJj"), b"abc");
    assert_eq!(base64_decode(""), b"");
}
