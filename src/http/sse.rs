//! Server-sent events over a running request. Each API says what events a
//! piece of the reply (content, reasoning, a tool call), the end and a
//! failure become ([`Format`]); this module drives the [`Job`], splits its
//! text with the chat reply's parser when it has one, and owns the job:
//! when the client goes away the response body is dropped, with it the job,
//! which cancels the request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::error::ApiError;
use super::generate::{Job, Outcome, Step};
use crate::tool_calls::{Delta, ReplyParser};

/// Comment lines sent while nothing else is (a long prefill), so proxies
/// keep the connection.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// How one API writes its stream.
pub trait Format: Send + 'static {
    /// Events for a piece of the reply.
    fn delta(&mut self, delta: Delta) -> Vec<Event>;
    /// Events that close a finished reply.
    fn done(&mut self, outcome: &Outcome) -> Vec<Event>;
    /// Events that report a failure after the stream began.
    fn failed(&mut self, err: &ApiError) -> Vec<Event>;
}

/// An event whose data is `value` as one line of JSON.
pub fn data(value: &Value) -> Event {
    Event::default().data(value.to_string())
}

/// A named event (`event: NAME`) with JSON data.
pub fn named(name: &str, value: &Value) -> Event {
    Event::default().event(name).data(value.to_string())
}

struct Driver<F> {
    job: Job,
    format: F,
    parser: Option<ReplyParser>,
    queue: VecDeque<Event>,
    over: bool,
    prompt_param: &'static str,
}

/// The streaming response: `head` first, then what `format` makes of the
/// job's text (split by `parser` when given, else all content) and end.
pub fn respond<F: Format>(
    job: Job,
    head: Vec<Event>,
    format: F,
    parser: Option<ReplyParser>,
    prompt_param: &'static str,
) -> Response {
    let driver = Driver {
        job,
        format,
        parser,
        queue: head.into(),
        over: false,
        prompt_param,
    };
    let events = futures_util::stream::unfold(driver, |mut d| async move {
        loop {
            if let Some(e) = d.queue.pop_front() {
                return Some((Ok::<_, Infallible>(e), d));
            }
            if d.over {
                return None;
            }
            match d.job.next().await {
                Step::Text(t) => {
                    let deltas = match &mut d.parser {
                        Some(p) => p.push(&t),
                        None => vec![Delta::Content(t)],
                    };
                    for delta in deltas {
                        let events = d.format.delta(delta);
                        d.queue.extend(events);
                    }
                }
                Step::Done(o) => {
                    for delta in d.parser.as_mut().map(ReplyParser::finish).unwrap_or_default() {
                        let events = d.format.delta(delta);
                        d.queue.extend(events);
                    }
                    let events = d.format.done(&o);
                    d.queue.extend(events);
                    d.over = true;
                }
                Step::Failed(e) => {
                    let events = d.format.failed(&ApiError::from_request(&e, d.prompt_param));
                    d.queue.extend(events);
                    d.over = true;
                }
            }
        }
    });
    let mut r = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    // Asks reverse proxies that buffer responses (nginx) not to.
    r.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}
