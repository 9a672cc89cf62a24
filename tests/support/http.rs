//! What the HTTP tests share: the longest any request may take before the
//! test calls it a hang, and a client bounded by it.

use std::time::Duration;

/// Longest wait for a server or a reply (a debug build on a busy machine).
pub const HANG_GUARD: Duration = Duration::from_secs(180);

/// A client that ignores proxy settings (the server is on loopback) and
/// gives up after [`HANG_GUARD`].
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(HANG_GUARD)
        .build()
        .expect("http client")
}

/// A running `coli serve --http 127.0.0.1:0` on `model` (one thread, no chat
/// page, no API key), killed when dropped.
pub struct HttpServer {
    child: super::ColiChild,
    pub base: String,
    /// The server's last stderr lines, printed when a test fails while the
    /// server runs, so a failure on a CI machine shows the server's side.
    log: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
}

/// How many of the server's stderr lines a failing test prints.
const LOG_LINES: usize = 200;

impl HttpServer {
    pub fn start(model: &std::path::Path, extra: &[&str]) -> HttpServer {
        use std::io::{BufRead, BufReader};
        let mut child = super::coli_command()
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--http", "127.0.0.1:0", "--threads", "1", "--no-web"])
            .args(extra)
            .env_remove("COLI_API_KEY")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let err = child.stderr.take().expect("stderr piped");
        let (tx, rx) = std::sync::mpsc::channel();
        let log = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split(' ').next().unwrap_or_default().to_string());
                }
                if let Ok(mut log) = kept.lock() {
                    if log.len() == LOG_LINES {
                        log.pop_front();
                    }
                    log.push_back(line);
                }
            }
        });
        let addr = match rx.recv_timeout(HANG_GUARD) {
            Ok(a) => a,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no ready line from coli serve: {e}");
            }
        };
        HttpServer {
            child,
            base: format!("http://{addr}"),
            log,
        }
    }

    /// A POST's status and JSON body.
    pub async fn post(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
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

    /// A streamed POST's server-sent events as (event name, data) pairs.
    pub async fn stream(&self, path: &str, body: &serde_json::Value) -> Vec<(Option<String>, String)> {
        let r = client()
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status().as_u16(), 200, "{body}");
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

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking()
            && let Ok(log) = self.log.lock()
        {
            eprintln!("--- coli serve's stderr (last {} lines) ---", log.len());
            for line in log.iter() {
                eprintln!("{line}");
            }
        }
    }
}
