//! colibri: Mixture-of-Experts inference for models larger than RAM.
//!
//! The dense part of a model stays resident and quantized; routed experts
//! stay in a file and are fetched per `(layer, expert)` through the runtime
//! crate (`colibri-actors`). This crate holds what is specific to models:
//! checkpoints, quantized formats and kernels, the math of each family,
//! tokenizers, sampling and the command-line front ends.

pub mod bounds;
pub mod catalog;
pub mod chat_template;
pub mod cli;
pub mod config;
pub mod convert;
pub mod engine;
pub mod fuzz;
pub mod gguf;
pub mod grammar;
pub mod http;
pub mod kernels;
pub mod model;
pub mod progress;
pub mod quant;
pub mod routing;
pub mod runtime;
pub mod sampling;
pub mod serve;
pub mod st;
pub mod synth;
pub mod telemetry;
pub mod tokenizer;
pub mod tool_calls;
