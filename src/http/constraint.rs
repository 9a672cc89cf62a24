//! The request fields that constrain a reply: OpenAI's `response_format`
//! and llama-server's `grammar` and `json_schema`, checked for shape here
//! (each error names the field); compiling the result happens on
//! submission ([`crate::runtime::LoopHandle::submit_async`]), whose refusal
//! names the field it came from (docs/http-api.md, "Structured output").

use serde_json::{Map, Value};

use super::error::ApiError;
use super::json::Params;
use crate::grammar::gbnf;
use crate::runtime::constraint::ConstraintSpec;

/// Fields that each ask for a constraint; a request may give one.
const FIELDS: [&str; 3] = ["response_format", "grammar", "json_schema"];

/// A constraint and the field a compile error is reported against.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    pub spec: ConstraintSpec,
    pub param: String,
}

/// The request's constraint, if it asks for one.
pub fn parse(p: &Params) -> Result<Option<Parsed>, ApiError> {
    let mut found: Option<(&str, Parsed)> = None;
    for field in FIELDS {
        let parsed = match field {
            "response_format" => response_format(p)?,
            "grammar" => grammar(p)?,
            _ => json_schema(p)?,
        };
        if let Some(c) = parsed {
            if let Some((first, _)) = &found {
                let name = p.name(field);
                return Err(ApiError::invalid(
                    &name,
                    format!(
                        "'{name}' and '{}' both constrain the reply: give one of them",
                        p.name(first)
                    ),
                ));
            }
            found = Some((field, c));
        }
    }
    Ok(found.map(|(_, c)| c))
}

/// A schema field: a JSON object or a boolean (JSON Schema's `true`/`false`).
fn schema_value(p: &Params, name: &str) -> Result<Option<Value>, ApiError> {
    match p.get(name) {
        None => Ok(None),
        Some(v @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(v.clone())),
        Some(_) => {
            let full = p.name(name);
            Err(ApiError::invalid(
                &full,
                format!("'{full}' must be a JSON schema (an object, or true/false)"),
            ))
        }
    }
}

/// OpenAI's `response_format`: `text`, `json_object` (with llama-server's
/// optional `schema`), or `json_schema` (`{name, description, schema, strict}`).
fn response_format(p: &Params) -> Result<Option<Parsed>, ApiError> {
    let Some(obj) = p.object("response_format")? else {
        return Ok(None);
    };
    let path = p.name("response_format");
    let rf = Params::at(obj, &path);
    let kind = rf.required("type", rf.str("type"))?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(match schema_value(&rf, "schema")? {
            Some(schema) => Parsed {
                spec: ConstraintSpec::JsonSchema {
                    schema,
                    strict: false,
                },
                param: rf.name("schema"),
            },
            None => Parsed {
                spec: ConstraintSpec::JsonObject,
                param: path.clone(),
            },
        })),
        "json_schema" => {
            let inner: &Map<String, Value> = rf.required("json_schema", rf.object("json_schema"))?;
            let jpath = rf.name("json_schema");
            let js = Params::at(inner, &jpath);
            if let Some(name) = js.str("name")? {
                let ok = !name.is_empty()
                    && name.len() <= 64
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !ok {
                    let full = js.name("name");
                    return Err(ApiError::invalid(
                        &full,
                        format!("'{full}' must be 1 to 64 letters, digits, '_' or '-', got {name:?}"),
                    ));
                }
            }
            js.str("description")?;
            let strict = js.bool("strict")?.unwrap_or(false);
            // No schema: any JSON value, as an empty schema says.
            let schema = schema_value(&js, "schema")?.unwrap_or_else(|| Value::Object(Map::new()));
            Ok(Some(Parsed {
                spec: ConstraintSpec::JsonSchema { schema, strict },
                param: js.name("schema"),
            }))
        }
        other => {
            let full = rf.name("type");
            Err(ApiError::invalid(
                &full,
                format!("'{full}' must be \"text\", \"json_object\" or \"json_schema\", got {other:?}"),
            ))
        }
    }
}

/// llama-server's `grammar`: GBNF (read as Lark) or llguidance's Lark.
fn grammar(p: &Params) -> Result<Option<Parsed>, ApiError> {
    let Some(text) = p.str("grammar")? else {
        return Ok(None);
    };
    let param = p.name("grammar");
    if text.trim().is_empty() {
        // llama-server reads an empty grammar as none.
        return Ok(None);
    }
    let lark = if gbnf::is_gbnf(text) {
        gbnf::to_lark(text).map_err(|e| ApiError::invalid(&param, format!("'{param}': {e}")))?
    } else {
        text.to_string()
    };
    Ok(Some(Parsed {
        spec: ConstraintSpec::Lark(lark),
        param,
    }))
}

/// llama-server's `json_schema`: a schema, not strict.
fn json_schema(p: &Params) -> Result<Option<Parsed>, ApiError> {
    Ok(schema_value(p, "json_schema")?.map(|schema| Parsed {
        spec: ConstraintSpec::JsonSchema {
            schema,
            strict: false,
        },
        param: p.name("json_schema"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_json(v: Value) -> Result<Option<Parsed>, ApiError> {
        let Value::Object(m) = v else {
            return Ok(None);
        };
        parse(&Params::new(&m))
    }

    fn param_of(v: Value) -> Option<String> {
        parse_json(v).err().and_then(|e| e.param)
    }

    #[test]
    fn response_format_shapes() {
        assert_eq!(
            parse_json(json!({"response_format": {"type": "text"}})).ok(),
            Some(None)
        );
        let p = parse_json(json!({"response_format": {"type": "json_object"}}))
            .ok()
            .flatten();
        assert_eq!(
            p.map(|p| (p.spec, p.param)),
            Some((ConstraintSpec::JsonObject, "response_format".into()))
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let p = parse_json(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "thing", "schema": schema, "strict": true}}}))
        .ok()
        .flatten();
        assert_eq!(
            p,
            Some(Parsed {
                spec: ConstraintSpec::JsonSchema {
                    schema: schema.clone(),
                    strict: true
                },
                param: "response_format.json_schema.schema".into()
            })
        );
        let p = parse_json(json!({"response_format": {"type": "json_object", "schema": schema}}))
            .ok()
            .flatten();
        assert_eq!(p.map(|p| p.param), Some("response_format.schema".into()));
    }

    #[test]
    fn malformed_shapes_name_the_field() {
        for (body, param) in [
            (json!({"response_format": "json"}), "response_format"),
            (json!({"response_format": {}}), "response_format.type"),
            (
                json!({"response_format": {"type": "yaml"}}),
                "response_format.type",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format.json_schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": []}}),
                "response_format.json_schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": "{}"}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}}),
                "response_format.json_schema.strict",
            ),
            (json!({"grammar": 3}), "grammar"),
            (json!({"grammar": "root ::= \"a"}), "grammar"),
            (json!({"json_schema": [1]}), "json_schema"),
            (
                json!({"response_format": {"type": "json_object"}, "grammar": "start: \"a\""}),
                "grammar",
            ),
            (
                json!({"grammar": "start: \"a\"", "json_schema": {}}),
                "json_schema",
            ),
        ] {
            assert_eq!(param_of(body.clone()).as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn grammars_are_lark_or_gbnf() {
        let p = parse_json(json!({"grammar": "start: \"yes\" | \"no\""}))
            .ok()
            .flatten();
        assert_eq!(
            p.map(|p| p.spec),
            Some(ConstraintSpec::Lark("start: \"yes\" | \"no\"".into()))
        );
        let p = parse_json(json!({"grammar": "root ::= \"yes\" | \"no\""}))
            .ok()
            .flatten();
        assert_eq!(
            p.map(|p| p.spec),
            Some(ConstraintSpec::Lark("start: \"yes\" | \"no\"".into()))
        );
        assert_eq!(parse_json(json!({"grammar": "  "})).ok(), Some(None));
        let p = parse_json(json!({"json_schema": {"type": "string"}}))
            .ok()
            .flatten();
        assert_eq!(p.map(|p| p.param), Some("json_schema".into()));
    }
}
