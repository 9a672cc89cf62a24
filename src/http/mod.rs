//! `coli serve --http ADDR`: an OpenAI-compatible HTTP API (chat
//! completions, completions, models) plus Anthropic's Messages API and a
//! chat page, as a front end of the decode-loop actor (docs/http-api.md).
//!
//! Each file has one job:
//! - [`server`] holds binding, the router, graceful shutdown on SIGINT/SIGTERM;
//! - [`conn`] holds accepting and serving connections (limits, head
//!   timeouts, JSON answers to malformed HTTP);
//! - [`state`] holds what every handler shares (the loop handle, defaults, ids);
//! - [`body`] holds reading a request body (size, time, content type);
//! - [`pool`] holds the threads that parse, render and tokenize requests,
//!   and [`prepare`] what runs there (refusing too-long prompts early);
//! - [`memory`] holds handing freed memory back after a large request;
//! - [`counters`] holds what the HTTP layer counts for `/metrics`;
//! - [`auth`] holds the API key check;
//! - [`json`] holds reading request bodies (typed getters that name the
//!   parameter in their errors) and writing JSON replies;
//! - [`error`] holds errors in OpenAI's and Anthropic's shapes, with statuses;
//! - [`constraint`] holds the fields that constrain a reply (`response_format`,
//!   `grammar`, `json_schema`);
//! - [`request`] holds server defaults and the [`GenRequest`](crate::runtime::GenRequest) a call becomes;
//! - [`generate`] holds one admitted request's events, and why it stopped;
//! - [`sse`] holds server-sent events over a running request;
//! - [`openai`] holds `/v1/chat/completions` and `/v1/completions`;
//! - [`anthropic`] holds `/v1/messages`;
//! - [`info`] holds `/v1/models` and `/health`;
//! - [`metrics`] holds `/metrics` in Prometheus' text format;
//! - [`web`] holds the chat page at `/` (its files are in `web/`).
//!
//! Dropping a response (the client went away) drops its request stream,
//! which cancels the request in the loop and frees its slot.

pub mod anthropic;
pub mod auth;
pub mod body;
pub mod chat;
pub mod conn;
pub mod constraint;
pub mod counters;
pub mod error;
pub mod generate;
pub mod history;
pub mod info;
pub mod json;
pub mod memory;
pub mod metrics;
pub mod openai;
pub mod pool;
pub mod prepare;
pub mod request;
pub mod server;
pub mod sse;
pub mod state;
pub mod tools;
pub mod web;

pub use request::Defaults;
pub use server::{
    DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_BODY, DEFAULT_MAX_CONNECTIONS, HttpConfig,
    HttpError, parse_addr, router, serve,
};
