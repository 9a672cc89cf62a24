//! A small JSON Schema checker for the replies of constrained requests,
//! independent of the library that constrains them.

use serde_json::{Value, json};

/// Checks `v` against the subset of JSON Schema the tests' schemas use
/// (`$ref`, `enum`, object, array, string, integer, boolean and their bounds);
/// the error says where it fails.
pub fn validate(v: &Value, schema: &Value, root: &Value, at: &str) -> Result<(), String> {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let target = r
            .strip_prefix("#/")
            .map(|p| p.split('/').fold(root, |s, seg| &s[seg]))
            .ok_or_else(|| format!("{at}: unsupported $ref {r}"))?;
        return validate(v, target, root, at);
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(v)
    {
        return Err(format!("{at}: {v} is not one of {options:?}"));
    }
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    let len = |k: &str| schema.get(k).and_then(Value::as_u64).map(|n| n as usize);
    match schema.get("type").and_then(Value::as_str) {
        None => {}
        Some("object") => {
            let obj = v
                .as_object()
                .ok_or_else(|| format!("{at}: {v} is not an object"))?;
            let props = schema.get("properties").and_then(Value::as_object);
            for req in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let k = req.as_str().unwrap_or_default();
                if !obj.contains_key(k) {
                    return Err(format!("{at}: required {k:?} is missing from {v}"));
                }
            }
            for (k, x) in obj {
                match props.and_then(|p| p.get(k)) {
                    Some(s) => validate(x, s, root, &format!("{at}.{k}"))?,
                    None if schema.get("additionalProperties") == Some(&json!(false)) => {
                        return Err(format!("{at}: {k:?} is not allowed"));
                    }
                    None => {}
                }
            }
        }
        Some("array") => {
            let items = v.as_array().ok_or_else(|| format!("{at}: {v} is not an array"))?;
            if len("minItems").is_some_and(|n| items.len() < n)
                || len("maxItems").is_some_and(|n| items.len() > n)
            {
                return Err(format!("{at}: {} items", items.len()));
            }
            if let Some(s) = schema.get("items") {
                for (i, x) in items.iter().enumerate() {
                    validate(x, s, root, &format!("{at}[{i}]"))?;
                }
            }
        }
        Some("string") => {
            let s = v.as_str().ok_or_else(|| format!("{at}: {v} is not a string"))?;
            let n = s.chars().count();
            if len("minLength").is_some_and(|m| n < m) || len("maxLength").is_some_and(|m| n > m) {
                return Err(format!("{at}: {s:?} has {n} characters"));
            }
        }
        Some("integer") => {
            let x = v.as_i64().ok_or_else(|| format!("{at}: {v} is not an integer"))? as f64;
            if num("minimum").is_some_and(|m| x < m) || num("maximum").is_some_and(|m| x > m) {
                return Err(format!("{at}: {x} is out of range"));
            }
        }
        Some("boolean") if !v.is_boolean() => return Err(format!("{at}: {v} is not a boolean")),
        Some("boolean") => {}
        Some(other) => return Err(format!("{at}: the test validator has no type {other}")),
    }
    Ok(())
}
