//! What a mask costs: a JSON reply of the kind agents ask for, driven token
//! by token through a freshly compiled constraint, timing each mask as the
//! decode loop computes it. Used by `coli bench --grammar-bench` and by the
//! criterion bench.

use std::time::Instant;

use serde_json::{Value, json};

use super::{ConstraintError, Grammars};
use crate::runtime::constraint::ConstraintSpec;

/// Which constraint the measurement runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchGrammar {
    /// `response_format: json_object`: any JSON object.
    Json,
    /// `response_format: json_schema` with the schema of [`sample_schema`].
    Schema,
}

/// The reply the measurement generates: a tool call's arguments.
pub const SAMPLE_REPLY: &str = r#"{"name":"search_flights","arguments":{"origin":"SFO","destination":"Tokyo Haneda","date":"2025-03-14","passengers":2,"cabin":"economy","flexible":true,"max_price":1250.5,"airlines":["NH","JL","UA"],"notes":"Window seat if possible, and no overnight flights please."}}"#;

/// A schema [`SAMPLE_REPLY`] satisfies: required fields, an enum, bounded
/// numbers, an array, a nested object.
pub fn sample_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "arguments": {
                "type": "object",
                "properties": {
                    "origin": {"type": "string", "minLength": 3, "maxLength": 3},
                    "destination": {"type": "string"},
                    "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                    "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
                    "cabin": {"enum": ["economy", "premium", "business", "first"]},
                    "flexible": {"type": "boolean"},
                    "max_price": {"type": "number"},
                    "airlines": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
                    "notes": {"type": "string"}
                },
                "required": ["origin", "destination", "date", "passengers", "cabin"],
                "additionalProperties": false
            }
        },
        "required": ["name", "arguments"],
        "additionalProperties": false
    })
}

impl BenchGrammar {
    pub fn spec(self) -> ConstraintSpec {
        match self {
            Self::Json => ConstraintSpec::JsonObject,
            Self::Schema => ConstraintSpec::JsonSchema {
                schema: sample_schema(),
                strict: true,
            },
        }
    }
}

/// Timings of the measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct MaskCost {
    /// Tokens of one reply.
    pub tokens: usize,
    pub passes: usize,
    /// Microseconds per mask, over every token of every pass.
    pub mean_us: f64,
    pub max_us: f64,
    /// Microseconds to compile the constraint and compute its first mask.
    pub compile_us: f64,
    /// Microseconds to build the token environment (once per model).
    pub setup_us: f64,
}

/// Generates [`SAMPLE_REPLY`] under `grammar` `passes` times, each from a
/// fresh compile (so lexer states are not carried over from an earlier
/// pass), timing every mask.
pub fn mask_cost(
    grammars: &Grammars,
    grammar: BenchGrammar,
    passes: usize,
) -> Result<MaskCost, ConstraintError> {
    let t0 = Instant::now();
    let tokens = grammars.greedy_tokens(SAMPLE_REPLY)?;
    let setup_us = t0.elapsed().as_secs_f64() * 1e6;
    let spec = grammar.spec();
    let passes = passes.max(1);
    let (mut total, mut max, mut compile) = (0.0f64, 0.0f64, 0.0f64);
    for _ in 0..passes {
        let t = Instant::now();
        let mut c = grammars.compile(&spec)?;
        compile += t.elapsed().as_secs_f64() * 1e6;
        let mut logits = vec![0.0f32; grammars.vocab];
        for (i, &tok) in tokens.iter().enumerate() {
            let t = Instant::now();
            // The first mask came with the compile; every later one is timed.
            c.prepare();
            logits.fill(0.0);
            c.mask_logits(&mut logits)
                .map_err(|e| super::CompileError::Internal(e.to_string()))?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            if i > 0 {
                total += us;
                max = max.max(us);
            }
            if !logits.get(tok as usize).is_some_and(|l| l.is_finite()) {
                return Err(super::CompileError::Internal(format!(
                    "the sample reply's token {i} (id {tok}) is not allowed by the {grammar:?} constraint"
                ))
                .into());
            }
            c.commit(tok)
                .map_err(|e| super::CompileError::Internal(e.to_string()))?;
        }
    }
    let timed = (tokens.len().saturating_sub(1) * passes).max(1) as f64;
    Ok(MaskCost {
        tokens: tokens.len(),
        passes,
        mean_us: total / timed,
        max_us: max,
        compile_us: compile / passes as f64,
        setup_us,
    })
}
