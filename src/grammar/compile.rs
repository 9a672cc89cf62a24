//! A [`ConstraintSpec`] as the grammar llguidance compiles, with the JSON
//! options every schema gets unless it sets its own, and llguidance's
//! error text sorted into errors that say what is wrong.

use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};

use crate::runtime::constraint::ConstraintSpec;

/// Longest piece of llguidance's error text kept in an error.
const MAX_MESSAGE: usize = 400;

/// Why a constraint does not compile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error("the JSON schema cannot be used: {0}")]
    Schema(String),
    #[error(
        "the JSON schema refers to {reference:?}, which it does not define (only references inside \
         the schema, such as \"#/$defs/name\", are resolved)"
    )]
    UnknownRef { reference: String },
    #[error("the grammar has an error at line {line}: {message}")]
    GrammarAt { line: usize, message: String },
    #[error("the grammar cannot be used: {0}")]
    Grammar(String),
    #[error("the GBNF grammar has an error at line {line}: {message}")]
    Gbnf { line: usize, message: String },
    #[error("the constraint allows no reply at all: {0}")]
    Unsatisfiable(String),
    #[error("the constraint compiler failed: {0}")]
    Internal(String),
}

/// Whitespace a JSON reply may hold between two tokens: a few spaces, or a
/// line break and indentation. Bounded, so a model cannot fill its whole
/// budget with blank lines (the failure unbounded JSON whitespace invites).
const JSON_WHITESPACE: &str = r"[\x20\x09]{1,8}|\r?\n[\x20\x09]{0,40}";

/// llguidance's JSON options (`x-guidance`) for a schema that sets none:
/// bounded whitespace, plain separators; not `strict`, unsupported keywords
/// are ignored and `oneOf` is read as `anyOf`, approximating the schema
/// instead of refusing it.
fn json_options(strict: bool) -> Value {
    json!({
        "whitespace_pattern": JSON_WHITESPACE,
        "item_separator": ",",
        "key_separator": ":",
        "lenient": !strict,
        "coerce_one_of": !strict,
    })
}

/// The schema with the default options added, or why it is no schema.
fn prepare_schema(schema: &Value, strict: bool) -> Result<Value, CompileError> {
    let mut obj = match schema {
        Value::Object(m) => m.clone(),
        Value::Bool(true) => serde_json::Map::new(),
        Value::Bool(false) => {
            return Err(CompileError::Unsatisfiable(
                "the schema `false` accepts no value".into(),
            ));
        }
        other => {
            return Err(CompileError::Schema(format!(
                "a schema must be an object or a boolean, got {}",
                kind(other)
            )));
        }
    };
    if !obj.contains_key("x-guidance") {
        obj.insert("x-guidance".into(), json_options(strict));
    }
    Ok(Value::Object(obj))
}

/// `schema` with llguidance's JSON options added when it is an object that
/// sets none (bounded whitespace, as every JSON constraint here gets);
/// anything else as it is.
pub fn with_json_options(schema: &Value, strict: bool) -> Value {
    match schema {
        Value::Object(m) if !m.contains_key("x-guidance") => {
            let mut m = m.clone();
            m.insert("x-guidance".into(), json_options(strict));
            Value::Object(m)
        }
        other => other.clone(),
    }
}

/// A `%json{...}` piece of a Lark grammar for `schema`, with the same JSON
/// options a `response_format` schema gets (for grammars built around JSON,
/// such as forced tool calls).
pub fn lark_json(schema: &Value, strict: bool) -> Result<String, CompileError> {
    Ok(format!("%json {}", prepare_schema(schema, strict)?))
}

/// The grammar llguidance compiles for `spec`.
pub fn top_level(spec: &ConstraintSpec) -> Result<TopLevelGrammar, CompileError> {
    Ok(match spec {
        ConstraintSpec::JsonObject => {
            TopLevelGrammar::from_json_schema(prepare_schema(&json!({"type": "object"}), true)?)
        }
        ConstraintSpec::JsonSchema { schema, strict } => {
            TopLevelGrammar::from_json_schema(prepare_schema(schema, *strict)?)
        }
        ConstraintSpec::Lark(text) => {
            if text.trim().is_empty() {
                return Err(CompileError::Grammar("the grammar is empty".into()));
            }
            TopLevelGrammar::from_lark(text.clone())
        }
    })
}

/// llguidance's error for `spec`, as a [`CompileError`].
pub fn classify(spec: &ConstraintSpec, err: &anyhow::Error) -> CompileError {
    let full = format!("{err:#}");
    if full.starts_with("panic:") {
        return CompileError::Internal(clip(first_line(&full)));
    }
    if let Some(reference) = unknown_ref(&full) {
        return CompileError::UnknownRef { reference };
    }
    if full.contains("Unsatisfiable schema") {
        return CompileError::Unsatisfiable(clip(first_line(&full)));
    }
    match spec {
        ConstraintSpec::Lark(_) => match at_line(&full) {
            Some((line, message)) => CompileError::GrammarAt {
                line,
                message: clip(message),
            },
            None => CompileError::Grammar(clip(first_line(&full))),
        },
        _ => CompileError::Schema(clip(first_line(&full))),
    }
}

/// The reference named by llguidance's "not found" errors for `$ref`.
fn unknown_ref(s: &str) -> Option<String> {
    if let Some(at) = s.find("Reference segment") {
        // "Reference segment 'x' not found in '#/a/x'."
        let rest = &s[at..];
        let tail = rest.find(" in '").map(|i| &rest[i + 5..])?;
        return tail.find('\'').map(|end| tail[..end].to_string());
    }
    if let Some(at) = s.find("are supported without 'referencing' feature; ref '") {
        let tail = &s[at..];
        let tail = &tail[tail.find("ref '").map(|i| i + 5)?..];
        return tail.find('\'').map(|end| tail[..end].to_string());
    }
    None
}

/// `(line, message)` of llguidance's Lark errors: "at 3(7): message" or
/// "3(7): lexer error", followed by the lines around it.
fn at_line(s: &str) -> Option<(usize, &str)> {
    for line in s.lines() {
        let t = line.trim_start();
        let t = t.strip_prefix("at ").unwrap_or(t);
        let Some(open) = t.find('(') else { continue };
        let Ok(n) = t[..open].parse::<usize>() else {
            continue;
        };
        let Some(close) = t[open..].find("): ") else {
            continue;
        };
        if t[open + 1..open + close].parse::<usize>().is_ok() {
            return Some((n, &t[open + close + 3..]));
        }
    }
    None
}

fn first_line(s: &str) -> &str {
    s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s).trim()
}

fn clip(s: &str) -> String {
    match s.char_indices().nth(MAX_MESSAGE) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_get_the_default_options_unless_they_set_their_own() {
        let s = prepare_schema(&json!({"type": "string"}), true).expect("schema");
        assert_eq!(s["x-guidance"]["lenient"], false);
        assert_eq!(s["x-guidance"]["whitespace_pattern"], JSON_WHITESPACE);
        let own = json!({"type": "string", "x-guidance": {"whitespace_flexible": false}});
        assert_eq!(prepare_schema(&own, false).ok(), Some(own));
        assert_eq!(
            prepare_schema(&json!(true), false)
                .ok()
                .map(|s| s["x-guidance"]["lenient"].clone()),
            Some(json!(true))
        );
        assert!(matches!(
            prepare_schema(&json!(false), true),
            Err(CompileError::Unsatisfiable(_))
        ));
        assert!(
            matches!(prepare_schema(&json!([1]), true), Err(CompileError::Schema(m)) if m.contains("an array"))
        );
        assert!(lark_json(&json!({"type": "integer"}), true).is_ok_and(|s| s.starts_with("%json {")));
    }

    #[test]
    fn llguidance_messages_are_sorted() {
        assert_eq!(
            unknown_ref("Reference segment 'nope' not found in '#/$defs/nope'."),
            Some("#/$defs/nope".into())
        );
        assert_eq!(
            unknown_ref(
                "Only absolute $ref's (#/...) are supported without 'referencing' feature; ref 'other.json#/a'"
            ),
            Some("other.json#/a".into())
        );
        assert_eq!(
            at_line("at 3(7): Expected token ':'\n   3 | x"),
            Some((3, "Expected token ':'"))
        );
        assert_eq!(at_line("12(1): lexer error\n..."), Some((12, "lexer error")));
        assert_eq!(at_line("no location here"), None);
        assert!(clip(&"x".repeat(1000)).len() < 500);
    }
}
