//! The chat page of `coli serve --http`: its files and headers over plain
//! HTTP, and the page itself in a real headless Chromium driven over the
//! DevTools protocol (streaming, stop, conversations kept across a
//! reload). Where no Chromium is installed (`chromium`, `chromium-browser`,
//! `google-chrome` on PATH, or `$CHROME`) the browser test says so and
//! passes without running. Every wait is on a condition of the page or the
//! server, bounded; the element hooks used are documented in
//! src/http/web/app.js. `COLI_WEB_SCREENSHOTS=DIR` also saves PNGs of the
//! page (chat.png, rendering.png) there, to look at.

#[path = "support/cdp.rs"]
mod cdp;
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use cdp::{Browser, Page, http_get, http_request};
use serde_json::{Value, json};
use support::{coli, tiny_chat_model};

/// Longest wait for the server to start.
const START_LIMIT: Duration = Duration::from_secs(180);

/// Longest wait for any one state of the page (a reply, a stop, a load).
const PAGE_LIMIT: Duration = Duration::from_secs(60);

/// Every expert read waits on a simulated disk, so a long reply takes
/// seconds and is still streaming when the test clicks stop.
const SLOW: &[&str] = &["--disk-sim", "lat=5ms", "--cache-cap", "1", "--pilot", "off"];

/// A chat request of the bundled model that runs long at this seed and
/// temperature (≈180 tokens before the model ends its turn).
const LONG_PROMPT: &str = "Tell me a long story.";
const LONG_SEED: &str = "2";
const LONG_TEMPERATURE: &str = "2";

/// The browser test's server wants this key (the page asks for it).
const KEY: &str = "web-k3y";

/// A running `coli serve --http 127.0.0.1:0` with a throw-away HOME.
struct WebServer {
    child: Child,
    addr: String,
    stderr: Arc<Mutex<String>>,
    _home: tempfile::TempDir,
}

impl WebServer {
    fn start(extra: &[&str]) -> WebServer {
        let home = tempfile::tempdir().expect("a home directory");
        let mut child = Command::new(coli())
            .arg("serve")
            .arg("--model")
            .arg(tiny_chat_model())
            .args(["--http", "127.0.0.1:0", "--threads", "1", "--no-kv-save"])
            .args(extra)
            .env_remove("COLI_MODEL")
            .env_remove("COLI_API_KEY")
            .env("HOME", home.path())
            .env("XDG_STATE_HOME", home.path().join("state"))
            .env("XDG_DATA_HOME", home.path().join("data"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning coli serve --http");
        let err = child.stderr.take().expect("stderr piped");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = stderr.clone();
        thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split(' ').next().unwrap_or("").to_string());
                }
                if let Ok(mut s) = sink.lock() {
                    s.push_str(&line);
                    s.push('\n');
                }
            }
        });
        let mut srv = WebServer {
            child,
            addr: String::new(),
            stderr,
            _home: home,
        };
        srv.addr = rx
            .recv_timeout(START_LIMIT)
            .unwrap_or_else(|_| panic!("no ready line; stderr:\n{}", srv.stderr()));
        srv
    }

    fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    fn metric(&self, name: &str) -> f64 {
        let r = http_get(
            &self.addr,
            "/metrics",
            &[("Authorization", &format!("Bearer {KEY}"))],
        );
        assert_eq!(r.status, 200, "/metrics: {}", r.body);
        r.body
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{}", r.body))
    }
}

impl Drop for WebServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

#[test]
fn the_page_is_served_from_the_binary_without_a_key_and_off_with_no_web() {
    let srv = WebServer::start(&["--api-key", "k3y"]);
    let page = http_get(&srv.addr, "/", &[]);
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = page
        .header("content-security-policy")
        .expect("a content-security-policy");
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert!(page.body.contains("<script src=\"/app.js\""), "{}", page.body);
    for (path, kind, marker) in [
        (
            "/app.js",
            "text/javascript; charset=utf-8",
            "/v1/chat/completions",
        ),
        ("/app.css", "text/css; charset=utf-8", "#messages"),
    ] {
        let r = http_get(&srv.addr, path, &[]);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_eq!(r.header("content-type"), Some(kind), "{path}");
        assert!(r.body.contains(marker), "{path} lacks {marker:?}");
        assert!(r.header("content-security-policy").is_some(), "{path}");
    }
    // HEAD works like GET; the key still guards the API and other methods.
    assert_eq!(http_request(&srv.addr, "HEAD", "/", &[]).status, 200);
    assert_eq!(http_get(&srv.addr, "/v1/models", &[]).status, 401);
    assert_eq!(http_request(&srv.addr, "POST", "/", &[]).status, 401);
    let auth = [("Authorization", "Bearer k3y")];
    assert_eq!(http_get(&srv.addr, "/v1/models", &auth).status, 200);
    assert_eq!(http_request(&srv.addr, "POST", "/", &auth).status, 405);
    drop(srv);

    let srv = WebServer::start(&["--no-web"]);
    for path in ["/", "/app.js", "/app.css"] {
        let r = http_get(&srv.addr, path, &[]);
        assert_eq!(r.status, 404, "{path} with --no-web: {}", r.body);
        assert!(r.body.contains("No route for"), "{path}: {}", r.body);
    }
    assert_eq!(http_get(&srv.addr, "/health", &[]).status, 200);
}

/// What the test reads of the page: the model, busy flag, notice, the
/// conversations and the open one's messages.
const SNAPSHOT: &str = r#"(() => {
  const q = (s) => document.querySelector(s);
  const msgs = [...document.querySelectorAll('#messages .msg')].map((m) => {
    const meta = m.querySelector('.msg-meta');
    return {
      role: m.dataset.role,
      status: m.dataset.status || null,
      text: (m.querySelector('.msg-body') || {}).innerText || '',
      error: (m.querySelector('.msg-error') || {}).innerText || null,
      tokens: meta && meta.dataset.completionTokens ? Number(meta.dataset.completionTokens) : null,
      cached: meta && meta.dataset.cachedTokens ? Number(meta.dataset.cachedTokens) : null,
      tokPerS: meta && meta.dataset.tokPerS ? Number(meta.dataset.tokPerS) : null,
      meta: meta ? meta.innerText : null,
    };
  });
  const convs = [...document.querySelectorAll('#conversations li')].map((li) => ({
    id: li.dataset.id,
    title: li.querySelector('.conv-title').textContent,
    current: li.getAttribute('aria-current') === 'true',
  }));
  return {
    model: q('#model-name').textContent,
    modelState: q('#model-name').dataset.state,
    busy: document.body.dataset.busy,
    notice: q('#notice').textContent,
    sendShown: !q('#send').hidden,
    stopShown: !q('#stop').hidden,
    msgs,
    convs,
  };
})()"#;

/// The page under test, with the failure report every wait needs.
struct Ui {
    page: Page,
    // Dropped after the page's session: kills the browser's process group.
    browser: Browser,
}

impl Ui {
    fn snapshot(&mut self) -> Value {
        self.page.eval(SNAPSHOT)
    }

    /// Waits until `done` holds for the page's snapshot.
    fn wait(&mut self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        match self.page.poll(PAGE_LIMIT, |p| p.eval(SNAPSHOT), done) {
            Ok(v) => v,
            Err(last) => panic!(
                "waited {PAGE_LIMIT:?} for {what}; the page shows:\n{last:#}\npage errors: {:?}\nbrowser stderr:\n{}",
                self.page.errors(),
                self.browser.stderr()
            ),
        }
    }

    /// Saves the viewport as `name` under `$COLI_WEB_SCREENSHOTS`, if set.
    fn screenshot(&mut self, name: &str) {
        if let Some(dir) = std::env::var_os("COLI_WEB_SCREENSHOTS") {
            let path = std::path::Path::new(&dir).join(name);
            let png = self.page.screenshot();
            std::fs::write(&path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        }
    }

    fn js(&mut self, expr: &str) -> Value {
        self.page.eval(expr)
    }

    fn click(&mut self, selector: &str) {
        let ok = self.js(&format!(
            "(() => {{ const e = document.querySelector({s}); if (!e) return false; e.click(); return true; }})()",
            s = json!(selector)
        ));
        assert_eq!(ok, json!(true), "nothing to click at {selector}");
    }

    /// Sets a settings field as a user would (the page saves on `change`).
    fn set(&mut self, id: &str, value: &str) {
        let ok = self.js(&format!(
            "(() => {{ const e = document.getElementById({id}); if (!e) return false; e.value = {v}; \
             e.dispatchEvent(new Event('change')); return true; }})()",
            id = json!(id),
            v = json!(value)
        ));
        assert_eq!(ok, json!(true), "no setting #{id}");
    }

    /// Types `text` into the message box and sends it (Enter or the button);
    /// returns once the page shows the new reply started.
    fn send(&mut self, text: &str, with_enter: bool) -> usize {
        let before = self.snapshot()["msgs"].as_array().map_or(0, Vec::len);
        self.js("document.getElementById('input').focus()");
        self.page.type_text(text);
        if with_enter {
            self.page.press_enter();
        } else {
            self.click("#send");
        }
        self.wait("the sent message to show", |s| {
            s["msgs"].as_array().is_some_and(|m| {
                m.len() == before + 2 && m[before]["role"] == "user" && m[before]["text"] == text
            })
        });
        before + 1
    }

    /// Waits until the reply at `index` is over; returns it.
    fn finished(&mut self, index: usize) -> Value {
        let s = self.wait("the reply to end", |s| {
            s["busy"] == "false" && s["msgs"][index]["status"] != "streaming"
        });
        s["msgs"][index].clone()
    }

    fn reply(&mut self, text: &str, with_enter: bool) -> Value {
        let at = self.send(text, with_enter);
        let m = self.finished(at);
        assert_eq!(m["status"], "done", "{text:?} got {m:#}");
        assert!(
            !m["text"].as_str().unwrap_or("").trim().is_empty(),
            "{text:?} got an empty reply: {m:#}"
        );
        m
    }
}

fn conversation<'a>(s: &'a Value, title_start: &str) -> &'a Value {
    s["convs"]
        .as_array()
        .and_then(|c| {
            c.iter()
                .find(|c| c["title"].as_str().is_some_and(|t| t.starts_with(title_start)))
        })
        .unwrap_or_else(|| panic!("no conversation titled {title_start:?} in {:#}", s["convs"]))
}

#[test]
fn chat_streams_stops_and_keeps_conversations_in_a_headless_browser() {
    let Some(chromium) = cdp::find_chromium() else {
        eprintln!(
            "web_page: SKIPPED, no Chromium (chromium, chromium-browser, google-chrome on PATH, or $CHROME); \
             .ci/run installs it where apt-get can"
        );
        return;
    };
    let srv = WebServer::start(&[SLOW, &["--api-key", KEY]].concat());
    let home = tempfile::tempdir().expect("a browser home");
    let browser = Browser::launch(&chromium, home.path());
    let page = browser.page();
    let mut ui = Ui { page, browser };
    ui.page.navigate(&srv.url());

    // Without the key the page says it needs one; with it, the model's
    // name from /v1/models.
    let s = ui.wait("the page to ask for the key", |s| s["modelState"] != "loading");
    assert_eq!(s["modelState"], "error", "{s:#}");
    assert!(
        s["model"].as_str().is_some_and(|m| m.contains("API key")),
        "{s:#}"
    );
    ui.set("api-key", KEY);
    let s = ui.wait("the model's name", |s| s["modelState"] == "ready");
    // The refused /v1/models is the only error so far.
    let errors = ui.page.take_errors();
    assert!(errors.iter().all(|e| e.contains("status of 401")), "{errors:?}");
    assert_eq!(s["model"], "colibri-tiny", "{s:#}");
    assert_eq!(s["busy"], "false", "{s:#}");

    // A reply streams in, with the server's counts; the second turn of the
    // conversation reuses the first from the slot's history.
    ui.set("temperature", "0");
    ui.set("max-tokens", "24");
    let first = ui.reply("What does the word bright mean?", true);
    assert!(first["tokens"].as_u64().is_some_and(|n| n > 0), "{first:#}");
    assert!(first["cached"].is_u64(), "{first:#}");
    let second = ui.reply("And the word dark?", false);
    assert!(second["cached"].as_u64().is_some_and(|n| n > 0), "{second:#}");
    assert!(
        second["meta"].as_str().is_some_and(|m| m.contains("tokens")),
        "{second:#}"
    );

    // A second conversation; in it, a long reply stopped mid-stream.
    ui.click("#new-chat");
    let s = ui.wait("a new, empty conversation", |s| {
        s["convs"].as_array().is_some_and(|c| c.len() == 2) && s["msgs"].as_array().is_some_and(Vec::is_empty)
    });
    assert_eq!(
        s["convs"][0]["current"], true,
        "the new one is open and listed first: {s:#}"
    );
    let cancelled_before = srv.metric("colibri_requests_total{outcome=\"cancelled\"}");
    ui.set("temperature", LONG_TEMPERATURE);
    ui.set("seed", LONG_SEED);
    ui.set("max-tokens", "1000");
    let at = ui.send(LONG_PROMPT, false);
    let s = ui.wait("the long reply to start streaming", |s| {
        s["msgs"][at]["status"] == "streaming" && !s["msgs"][at]["text"].as_str().unwrap_or("").is_empty()
    });
    assert_eq!(s["busy"], "true", "{s:#}");
    assert_eq!(
        (s["stopShown"].clone(), s["sendShown"].clone()),
        (json!(true), json!(false))
    );
    ui.click("#stop");
    let stopped = ui.finished(at);
    assert_eq!(
        stopped["status"], "stopped",
        "the reply ended before stop was clicked, or failed: {stopped:#}"
    );
    assert!(
        stopped["meta"].as_str().is_some_and(|m| m.contains("stopped")),
        "{stopped:#}"
    );
    let s = ui.snapshot();
    assert_eq!(
        (s["stopShown"].clone(), s["sendShown"].clone()),
        (json!(false), json!(true))
    );
    // The server saw the stream dropped and freed the slot.
    let freed = ui.page.poll(
        PAGE_LIMIT,
        |_| {
            json!([
                srv.metric("colibri_requests_total{outcome=\"cancelled\"}"),
                srv.metric("colibri_active_sessions"),
            ])
        },
        |v| v[0].as_f64() > Some(cancelled_before) && v[1] == json!(0.0),
    );
    assert!(
        freed.is_ok(),
        "the server did not cancel the stopped request: {freed:?}"
    );
    // And the page takes a new message.
    ui.set("temperature", "0");
    ui.set("max-tokens", "12");
    ui.reply("What does the word small mean?", true);

    // The first conversation kept its messages, also across a reload.
    let s = ui.snapshot();
    let first_id = conversation(&s, "What does the word bright")["id"].clone();
    let long_id = conversation(&s, LONG_PROMPT)["id"].clone();
    let open = |id: &Value| format!("#conversations li[data-id={}] .conv-title", id);
    ui.click(&open(&first_id));
    let check_first = |s: &Value| {
        let m = &s["msgs"];
        m.as_array().is_some_and(|m| m.len() == 4)
            && m[0]["text"] == "What does the word bright mean?"
            && m[1]["text"] == first["text"]
            && m[2]["text"] == "And the word dark?"
            && m[3]["text"] == second["text"]
    };
    ui.wait("the first conversation to show again", check_first);
    ui.page.reload();
    let s = ui.wait("the reloaded page", |s| s["modelState"] == "ready");
    assert_eq!(s["convs"].as_array().map(Vec::len), Some(2), "{s:#}");
    assert!(
        check_first(&s),
        "after a reload the open conversation is not the first one: {s:#}"
    );
    ui.click(&open(&long_id));
    let s = ui.wait("the second conversation after the reload", |s| {
        s["msgs"].as_array().is_some_and(|m| m.len() == 4) && s["msgs"][0]["text"] == LONG_PROMPT
    });
    assert_eq!(s["msgs"][1]["status"], "stopped", "{s:#}");
    assert_eq!(s["msgs"][1]["text"], stopped["text"], "{s:#}");
    assert_eq!(s["msgs"][3]["status"], "done", "{s:#}");

    ui.screenshot("chat.png");

    // Deleting a conversation leaves the other.
    ui.click(&format!("#conversations li[data-id={}] .conv-delete", long_id));
    let s = ui.wait("the deleted conversation to go", |s| {
        s["convs"].as_array().is_some_and(|c| c.len() == 1)
    });
    assert_eq!(s["convs"][0]["id"], first_id, "{s:#}");
    assert!(check_first(&s), "{s:#}");

    rendering(&mut ui);

    assert!(
        ui.page.errors().is_empty(),
        "the page logged errors: {:?}",
        ui.page.errors()
    );
}

/// Markdown the renderer must turn into elements, with HTML in it that
/// must stay text.
const MARKDOWN: &str = r#"## Plan <img src=x onerror=alert(1)>

Some **bold**, *em*, ~~gone~~, `a<b>` and a [link](https://example.com) and [bad](javascript:alert(1)).
Line two <script>alert(1)</script>

1. one
2. two
   - nested

> quoted

```rust
fn main() { println!("<b>hi</b>"); }
```

| a | b |
|---|--:|
| 1 | 2 |
"#;

/// The page's own functions on input the bundled model does not produce:
/// markdown (safely), reasoning and tool-call deltas, and a stored reply
/// with reasoning and a tool call drawn after a reload.
fn rendering(ui: &mut Ui) {
    let md = json!(MARKDOWN);
    let r = ui.js(&format!(
        r#"(() => {{
  const d = document.createElement('div');
  renderMarkdown({md}, d);
  const t = (s) => (d.querySelector(s) || {{}}).textContent;
  return {{
    dangerous: d.querySelectorAll('img, script, iframe, [onerror]').length,
    h2: t('h2'), strong: t('strong'), em: t('em'), del: t('del'), inlineCode: t('p code'),
    links: [...d.querySelectorAll('a')].map((a) => a.getAttribute('href')),
    items: d.querySelectorAll('ol > li').length, nested: d.querySelectorAll('ol > li ul > li').length,
    quote: t('blockquote').trim(), code: t('pre code'), lang: d.querySelector('pre code').dataset.lang,
    th: d.querySelectorAll('th').length, right: d.querySelectorAll('td.align-right').length,
    scriptAsText: d.textContent.includes('<script>alert(1)</script>'),
  }};
}})()"#
    ));
    let want = json!({
        "dangerous": 0,
        "h2": "Plan <img src=x onerror=alert(1)>",
        "strong": "bold", "em": "em", "del": "gone", "inlineCode": "a<b>",
        "links": ["https://example.com"],
        "items": 2, "nested": 1,
        "quote": "quoted", "code": "fn main() { println!(\"<b>hi</b>\"); }", "lang": "rust",
        "th": 2, "right": 1,
        "scriptAsText": true,
    });
    assert_eq!(r, want, "markdown rendering");

    // Deltas with reasoning and a tool call, as an OpenAI-style server
    // streams them, then the usage chunk; an error chunk throws.
    let r = ui.js(
        r#"(() => {
  const m = { role: 'assistant', content: '', reasoning: '', toolCalls: [], status: 'streaming', error: '', stats: {} };
  const clock = { start: performance.now(), first: null };
  const d = (delta, finish) => ({ choices: [{ index: 0, delta, finish_reason: finish || null }] });
  for (const c of [
    d({ role: 'assistant', content: '' }),
    d({ reasoning_content: 'Think ' }), d({ reasoning_content: 'more.' }),
    d({ content: 'Hi' }),
    d({ tool_calls: [{ index: 0, id: 't1', type: 'function', function: { name: 'look', arguments: '{"q":' } }] }),
    d({ tool_calls: [{ index: 0, function: { arguments: '1}' } }] }),
    d({}, 'tool_calls'),
    { choices: [], usage: { prompt_tokens: 9, completion_tokens: 5, total_tokens: 14, prompt_tokens_details: { cached_tokens: 4 } } },
  ]) applyChunk(m, c, clock);
  const s = statsOf(m, clock);
  let thrown = null;
  try { applyChunk(m, { error: { message: 'boom' } }, clock); } catch (e) { thrown = e.message; }
  return { content: m.content, reasoning: m.reasoning, calls: m.toolCalls, timed: clock.first !== null,
           tokens: s.completionTokens, cached: s.cachedTokens, prompt: s.promptTokens, finish: s.finish, thrown };
})()"#,
    );
    let want = json!({
        "content": "Hi", "reasoning": "Think more.",
        "calls": [{"id": "t1", "name": "look", "arguments": "{\"q\":1}"}],
        "timed": true, "tokens": 5, "cached": 4, "prompt": 9, "finish": "tool_calls", "thrown": "boom",
    });
    assert_eq!(r, want, "streamed deltas");

    // A stored reply with inline reasoning and a tool call, drawn from
    // localStorage after a reload.
    let reply = json!({
        "role": "assistant",
        "content": format!("<think>First, a plan.</think>{MARKDOWN}"),
        "toolCalls": [{"id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}],
        "status": "done",
        "stats": {"completionTokens": 42, "tokPerS": 12.5, "firstTokenS": 0.2, "cachedTokens": 3, "promptTokens": 10},
    });
    let conv = json!({
        "id": "rendering", "title": "Rendering", "updated": 1,
        "messages": [{"role": "user", "content": "Show me markdown <b>now</b>"}, reply],
    });
    ui.js(&format!(
        "(() => {{ const k = 'colibri.conversations'; const l = JSON.parse(localStorage.getItem(k)); \
         l.push({conv}); localStorage.setItem(k, JSON.stringify(l)); localStorage.setItem('colibri.active', '\"rendering\"'); }})()"
    ));
    ui.page.reload();
    ui.wait("the stored conversation", |s| {
        s["modelState"] == "ready" && s["msgs"].as_array().is_some_and(|m| m.len() == 2)
    });
    let r = ui.js(
        r#"(() => {
  const a = document.querySelector('#messages .msg[data-role=assistant]');
  const r = a.querySelector('details.reasoning');
  const meta = a.querySelector('.msg-meta');
  return {
    userText: document.querySelector('#messages .msg[data-role=user] .msg-body').textContent,
    reasoningOpen: r ? r.open : null, reasoning: r ? r.querySelector('.reasoning-body').textContent.trim() : null,
    thinkShown: a.querySelector('.msg-body').textContent.includes('think>'),
    tool: (a.querySelector('.tool-call .tool-name') || {}).textContent,
    args: (a.querySelector('.tool-call pre') || {}).textContent,
    tokPerS: meta.dataset.tokPerS, cached: meta.dataset.cachedTokens,
    dangerous: document.querySelectorAll('#messages img, #messages script, #messages b').length,
  };
})()"#,
    );
    let want = json!({
        "userText": "Show me markdown <b>now</b>",
        "reasoningOpen": false, "reasoning": "First, a plan.", "thinkShown": false,
        "tool": "tool call: get_weather", "args": "{\n  \"city\": \"Paris\"\n}",
        "tokPerS": "12.5", "cached": "3", "dangerous": 0,
    });
    assert_eq!(r, want, "a stored reply with reasoning and a tool call");
    ui.screenshot("rendering.png");
}
