//! One set of limits: the same bad value through every front end (`run`,
//! `chat` and `serve` flags, a `PROMPT` frame, a `--batch` `SUBMIT` frame,
//! the OpenAI and Anthropic endpoints) is refused with the same words after
//! the name each front end spells, the words of `colibri::runtime::limits`.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use colibri::runtime::limits;
use serde_json::{Value, json};
use support::{REPLY_TIMEOUT, coli_command, tiny_chat_model, wait_bounded};

/// A bad value of each kind: (frame/JSON name, flag, value, the shared words).
fn cases() -> Vec<(&'static str, &'static str, &'static str, String)> {
    let words = |e: Result<(), limits::LimitError>| e.err().map(|e| e.to_string()).unwrap_or_default();
    vec![
        (
            "max_tokens",
            "--max-tokens",
            "0",
            words(limits::max_tokens("0").map(drop)),
        ),
        (
            "temperature",
            "--temperature",
            "3",
            words(limits::temperature("3").map(drop)),
        ),
        ("top_p", "--top-p", "0", words(limits::top_p("0").map(drop))),
        ("top_k", "--top-k", "-1", words(limits::top_k("-1").map(drop))),
    ]
}

#[test]
fn the_shared_words_say_the_range_and_the_value() {
    let c = cases();
    assert_eq!(c[0].3, "must be a whole number >= 1, got 0");
    assert_eq!(c[1].3, "must be a number in [0, 2], got 3");
    assert_eq!(c[2].3, "must be a number in (0, 1], got 0");
    assert_eq!(c[3].3, "must be a whole number >= 0, got -1");
}

#[test]
fn flags_of_run_chat_and_serve_refuse_with_the_shared_words() {
    for (_, flag, value, words) in cases() {
        for cmd in [
            &["run", "--prompt-ids", "1"][..],
            &["chat"],
            &["serve", "--no-kv-save"],
        ] {
            let o = coli_command()
                .args(cmd)
                .args([flag, value])
                .stdin(Stdio::null())
                .output();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{cmd:?} {flag} {value}: {err}");
            // clap names the flag: "invalid value '0' for '--max-tokens <N>': ...".
            assert!(err.contains(&format!("'{value}' for '{flag}")), "{err}");
            assert!(err.contains(&format!(": {words}")), "{cmd:?}: {err}");
            assert!(o.stdout.is_empty(), "{cmd:?} started anyway");
        }
    }
}

/// Runs `coli ARGS` with `input` on stdin (then EOF): status, stdout, stderr.
fn run_with_input(args: &[&str], input: &[u8]) -> (ExitStatus, Vec<u8>, String) {
    let mut child = coli_command()
        .args(args)
        .arg("--model")
        .arg(tiny_chat_model())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut stdin = child.stdin.take().expect("stdin");
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = { out }.read_to_end(&mut v);
        v
    });
    let err = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    stdin.write_all(input).expect("writing the frames");
    drop(stdin);
    let status = wait_bounded(&mut child, REPLY_TIMEOUT);
    (
        status,
        out.join().expect("stdout reader"),
        err.join().expect("stderr reader"),
    )
}

#[test]
fn prompt_frames_refuse_with_the_shared_words() {
    let mut input = Vec::new();
    for (name, _, value, _) in cases() {
        let fields = match name {
            "max_tokens" => format!("{value} 0.5 0.5"),
            "temperature" => format!("4 {value} 0.5"),
            "top_p" => format!("4 0.5 {value}"),
            _ => continue, // a PROMPT frame has no top_k field
        };
        input.extend_from_slice(format!("\x02PROMPT 2 {fields}\nhi\n").as_bytes());
    }
    let (status, out, err) = run_with_input(&["serve", "--no-kv-save"], &input);
    assert!(status.success(), "{err}");
    let ends = out
        .windows(support::END.len())
        .filter(|w| *w == support::END)
        .count();
    assert_eq!(
        ends,
        3,
        "one malformed reply each: {}",
        String::from_utf8_lossy(&out)
    );
    for (name, _, _, words) in cases().into_iter().take(3) {
        assert!(
            err.contains(&format!("malformed request: PROMPT {name} {words}")),
            "{name}: {err}"
        );
    }
}

#[test]
fn submit_frames_refuse_with_the_shared_words() {
    let mut input = Vec::new();
    for (i, (name, _, value, _)) in cases().into_iter().enumerate() {
        let fields = match name {
            "max_tokens" => format!("{value} 0.5 0.5"),
            "temperature" => format!("4 {value} 0.5"),
            "top_p" => format!("4 0.5 {value}"),
            _ => continue, // a SUBMIT frame has no top_k field
        };
        input.extend_from_slice(format!("SUBMIT r{i} 0 2 {fields}\nhi\n").as_bytes());
    }
    let (status, out, err) = run_with_input(&["serve", "--batch", "--no-kv-save"], &input);
    assert!(status.success(), "{err}");
    let out = String::from_utf8_lossy(&out);
    for (i, (name, _, _, words)) in cases().into_iter().take(3).enumerate() {
        // The frame says BAD_REQUEST as the protocol always did; stderr says why.
        assert!(out.contains(&format!("ERROR r{i} BAD_REQUEST\n")), "{out}");
        assert!(
            err.contains(&format!("request r{i} refused: {name} {words}")),
            "{name}: {err}"
        );
    }
}

/// A running `coli serve --http` on a free loopback port.
struct Http {
    child: support::ColiChild,
    addr: String,
}

impl Http {
    fn start() -> Http {
        let mut child = coli_command()
            .args(["serve", "--http", "127.0.0.1:0", "--threads", "1", "--model"])
            .arg(tiny_chat_model())
            .env_remove("COLI_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let err = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split(' ').next().unwrap_or_default().to_string());
                }
            }
        });
        let addr = rx.recv_timeout(REPLY_TIMEOUT).expect("the server listens");
        Http { child, addr }
    }

    /// POSTs `body` and returns the status and the JSON reply.
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let body = body.to_string();
        let mut s = TcpStream::connect(&self.addr).expect("connect");
        s.set_read_timeout(Some(REPLY_TIMEOUT)).expect("timeout");
        s.set_write_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .expect("request");
        let mut reply = String::new();
        s.read_to_string(&mut reply).expect("reply");
        let status = reply
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("{reply}"));
        let json = reply.split("\r\n\r\n").nth(1).unwrap_or_default();
        (
            status,
            serde_json::from_str(json).unwrap_or_else(|_| panic!("{reply}")),
        )
    }
}

impl Drop for Http {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn both_http_apis_refuse_with_the_shared_words() {
    let srv = Http::start();
    for (name, _, value, words) in cases() {
        let bad: Value = serde_json::from_str(value).expect("a JSON number");
        let mut chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        chat[name] = bad.clone();
        let (status, v) = srv.post("/v1/chat/completions", &chat);
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], name, "{v}");
        assert_eq!(v["error"]["message"], format!("'{name}' {words}"), "{v}");

        let mut msg = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        msg[name] = bad;
        let (status, v) = srv.post("/v1/messages", &msg);
        assert_eq!(status, 400, "{v}");
        let m = v["error"]["message"].as_str().unwrap_or_default();
        assert!(m.ends_with(&format!("'{name}' {words}")), "{v}");
    }
    // A value the range allows is served (temperature 2 on both APIs alike).
    for path in ["/v1/chat/completions", "/v1/messages"] {
        let body =
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 2});
        let (status, v) = srv.post(path, &body);
        assert_eq!(status, 200, "{path}: {v}");
    }
}
