//! The tools a chat request offers and whether it must call one: OpenAI's
//! `tools` / `tool_choice` / `parallel_tool_calls` and Anthropic's `tools`
//! / `tool_choice`, validated (each error names the parameter) into one
//! shape.

use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::json::Params;
use crate::tool_calls::{ToolSet, ToolSpec};

/// Whether and what the reply must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (calls are read out of its reply).
    Auto,
    /// No call: the tools stay in the prompt (as vLLM does, so the prompt
    /// and its cached prefix do not change), and a call the model writes
    /// anyway is left as text.
    None,
    /// At least one call, to any of the tools (OpenAI `required`,
    /// Anthropic `any`).
    Required,
    /// A call to this tool.
    Named(String),
}

/// A request's tools.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    pub specs: Vec<ToolSpec>,
    /// The list as the chat template gets it (OpenAI's shape).
    pub template: Vec<Value>,
    pub choice: ToolChoice,
    /// More than one call in a reply.
    pub parallel: bool,
}

impl Tools {
    /// The tools a reply's calls may name (`None`: calls are not read).
    pub fn callable(&self) -> Option<ToolSet> {
        (self.choice != ToolChoice::None).then(|| ToolSet::new(self.specs.clone()))
    }

    /// The tools a forced call may name, when a call is forced.
    pub fn forced(&self) -> Option<Vec<ToolSpec>> {
        match &self.choice {
            ToolChoice::Auto | ToolChoice::None => None,
            ToolChoice::Required => Some(self.specs.clone()),
            ToolChoice::Named(n) => Some(self.specs.iter().filter(|t| &t.name == n).cloned().collect()),
        }
    }
}

/// Function names as both APIs allow them.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_name(name: &str, at: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::invalid(
            at,
            format!("'{at}' must be 1 to 64 letters, digits, '_' or '-', got {name:?}"),
        ))
    }
}

/// A JSON schema of arguments: an object when given.
fn check_schema<'a>(q: &Params<'a>, name: &str) -> Result<Option<&'a Value>, ApiError> {
    match q.get(name) {
        None => Ok(None),
        Some(v @ Value::Object(_)) => Ok(Some(v)),
        Some(_) => {
            let at = q.name(name);
            Err(ApiError::invalid(
                &at,
                format!("'{at}' must be a JSON schema object"),
            ))
        }
    }
}

fn no_duplicates(specs: &[ToolSpec]) -> Result<(), ApiError> {
    for (i, t) in specs.iter().enumerate() {
        if specs[..i].iter().any(|u| u.name == t.name) {
            return Err(ApiError::invalid(
                "tools",
                format!("'tools' names the function {:?} twice", t.name),
            ));
        }
    }
    Ok(())
}

/// The choice must name an offered tool; forcing needs tools.
fn check_choice(choice: &ToolChoice, specs: &[ToolSpec], param: &str) -> Result<(), ApiError> {
    match choice {
        ToolChoice::Named(n) if !specs.iter().any(|t| &t.name == n) => Err(ApiError::invalid(
            param,
            format!("'{param}' names {n:?}, which is not one of the tools"),
        )),
        ToolChoice::Required | ToolChoice::Named(_) if specs.is_empty() => Err(ApiError::invalid(
            param,
            format!("'{param}' asks for a tool call but no tools are given"),
        )),
        _ => Ok(()),
    }
}

/// The request's `tools` list, and each entry as an object with the path
/// errors name it by (`tools[2]`).
type Entries<'a> = (&'a [Value], Vec<(String, &'a Map<String, Value>)>);

fn entries<'a>(p: &Params<'a>) -> Result<Entries<'a>, ApiError> {
    let list = p.array("tools")?.map(Vec::as_slice).unwrap_or_default();
    let entries = list
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("tools[{i}]");
            match t.as_object() {
                Some(obj) => Ok((at, obj)),
                None => Err(ApiError::invalid(&at, format!("'{at}' must be an object"))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((list, entries))
}

/// OpenAI's `tools` (`[{"type": "function", "function": {"name",
/// "description", "parameters", "strict"}}]`), `tool_choice` (`"auto"`,
/// `"none"`, `"required"`, `{"type": "function", "function": {"name"}}`)
/// and `parallel_tool_calls`. `None` without tools.
pub fn openai(p: &Params) -> Result<Option<Tools>, ApiError> {
    let (list, entries) = entries(p)?;
    let mut specs = Vec::with_capacity(list.len());
    for (at, obj) in &entries {
        let q = Params::at(obj, at);
        match q.required("type", q.str("type"))? {
            "function" => {}
            other => {
                let at = q.name("type");
                return Err(ApiError::invalid(
                    &at,
                    format!("'{at}' must be \"function\", got {other:?}"),
                ));
            }
        }
        let f = q.required("function", q.object("function"))?;
        let fat = q.name("function");
        let fq = Params::at(f, &fat);
        let name = fq.required("name", fq.str("name"))?;
        check_name(name, &fq.name("name"))?;
        let description = fq.str("description")?.map(str::to_string);
        let parameters = check_schema(&fq, "parameters")?.cloned();
        fq.bool("strict")?;
        specs.push(ToolSpec {
            name: name.to_string(),
            description,
            parameters,
        });
    }
    no_duplicates(&specs)?;
    let choice = match p.get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "'tool_choice' must be \"auto\", \"none\", \"required\" or a function, got {other:?}"
                    ),
                ));
            }
        },
        Some(Value::Object(o)) => {
            let q = Params::at(o, "tool_choice");
            match q.required("type", q.str("type"))? {
                "function" => {}
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice.type",
                        format!("'tool_choice.type' must be \"function\", got {other:?}"),
                    ));
                }
            }
            let f = q.required("function", q.object("function"))?;
            let fq = Params::at(f, "tool_choice.function");
            ToolChoice::Named(fq.required("name", fq.str("name"))?.to_string())
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "'tool_choice' must be a string or an object",
            ));
        }
    };
    check_choice(&choice, &specs, "tool_choice")?;
    let parallel = p.bool("parallel_tool_calls")?.unwrap_or(true);
    if specs.is_empty() {
        return Ok(None);
    }
    Ok(Some(Tools {
        template: list.to_vec(),
        specs,
        choice,
        parallel,
    }))
}

/// Anthropic's `tools` (`[{"name", "description", "input_schema"}]`; the
/// server tools with a `type` such as `web_search_20250305` are refused)
/// and `tool_choice` (`{"type": "auto" | "any" | "none"}`, `{"type":
/// "tool", "name"}`, each with `disable_parallel_tool_use`). `None` without
/// tools.
pub fn anthropic(p: &Params) -> Result<Option<Tools>, ApiError> {
    let (list, entries) = entries(p)?;
    let mut specs = Vec::with_capacity(list.len());
    let mut template = Vec::with_capacity(list.len());
    for (at, obj) in &entries {
        let q = Params::at(obj, at);
        match q.str("type")? {
            None | Some("custom") => {}
            Some(other) => {
                let at = q.name("type");
                return Err(ApiError::invalid(
                    &at,
                    format!("'{at}': server tools ({other:?}) are not supported, only custom tools"),
                )
                .with_code("unsupported_parameter"));
            }
        }
        let name = q.required("name", q.str("name"))?;
        check_name(name, &q.name("name"))?;
        let description = q.str("description")?.map(str::to_string);
        let schema = q.required("input_schema", check_schema(&q, "input_schema"))?;
        let mut function = json!({"name": name});
        if let Some(d) = &description {
            function["description"] = json!(d);
        }
        function["parameters"] = schema.clone();
        template.push(json!({"type": "function", "function": function}));
        specs.push(ToolSpec {
            name: name.to_string(),
            description,
            parameters: Some(schema.clone()),
        });
    }
    no_duplicates(&specs)?;
    let (choice, parallel) = match p.object("tool_choice")? {
        None => (ToolChoice::Auto, true),
        Some(o) => {
            let q = Params::at(o, "tool_choice");
            let parallel = !q.bool("disable_parallel_tool_use")?.unwrap_or(false);
            let choice = match q.required("type", q.str("type"))? {
                "auto" => ToolChoice::Auto,
                "any" => ToolChoice::Required,
                "none" => ToolChoice::None,
                "tool" => ToolChoice::Named(q.required("name", q.str("name"))?.to_string()),
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice.type",
                        format!(
                            "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\", got {other:?}"
                        ),
                    ));
                }
            };
            (choice, parallel)
        }
    };
    check_choice(&choice, &specs, "tool_choice")?;
    if specs.is_empty() {
        return Ok(None);
    }
    Ok(Some(Tools {
        specs,
        template,
        choice,
        parallel,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::http::json::object_of as obj;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}})
    }

    fn param_of(r: Result<Option<Tools>, ApiError>) -> Option<String> {
        r.err().and_then(|e| e.param)
    }

    #[test]
    fn openai_tools_and_choices() {
        let m = obj(
            json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                           "parallel_tool_calls": false}),
        );
        let t = openai(&Params::new(&m)).unwrap().unwrap();
        assert_eq!(t.choice, ToolChoice::Named("get_weather".into()));
        assert!(!t.parallel);
        assert_eq!(t.template, vec![weather()]);
        assert_eq!(t.forced().map(|f| f.len()), Some(1));
        for (choice, want) in [
            ("auto", ToolChoice::Auto),
            ("none", ToolChoice::None),
            ("required", ToolChoice::Required),
        ] {
            let m = obj(json!({"tools": [weather()], "tool_choice": choice}));
            assert_eq!(openai(&Params::new(&m)).unwrap().unwrap().choice, want);
        }
        let m = obj(json!({"tools": [weather()], "tool_choice": "none"}));
        assert!(openai(&Params::new(&m)).unwrap().unwrap().callable().is_none());
        // No tools: nothing, and `none` / `auto` alone are fine.
        assert_eq!(
            openai(&Params::new(&obj(json!({"tool_choice": "auto"})))).unwrap(),
            None
        );
        assert_eq!(openai(&Params::new(&obj(json!({"tools": []})))).unwrap(), None);
    }

    #[test]
    fn openai_refusals_name_the_parameter() {
        let cases = [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": [1]}), "tools[0]"),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
            (json!({"tools": [{"type": "function"}]}), "tools[0].function"),
            (
                json!({"tools": [{"type": "function", "function": {}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
                "tools[0].function.parameters",
            ),
            (json!({"tools": [weather(), weather()]}), "tools"),
            (
                json!({"tools": [weather()], "tool_choice": "always"}),
                "tool_choice",
            ),
            (json!({"tools": [weather()], "tool_choice": 3}), "tool_choice"),
            (
                json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [weather()], "parallel_tool_calls": "yes"}),
                "parallel_tool_calls",
            ),
        ];
        for (body, param) in cases {
            let m = obj(body.clone());
            assert_eq!(
                param_of(openai(&Params::new(&m))),
                Some(param.to_string()),
                "{body}"
            );
        }
    }

    #[test]
    fn anthropic_tools_become_openai_shaped() {
        let m = obj(json!({
            "tools": [{"name": "get_weather", "description": "W", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        }));
        let t = anthropic(&Params::new(&m)).unwrap().unwrap();
        assert_eq!(t.choice, ToolChoice::Required);
        assert!(!t.parallel);
        assert_eq!(
            t.template,
            vec![
                json!({"type": "function", "function": {"name": "get_weather", "description": "W", "parameters": {"type": "object"}}})
            ]
        );
        let cases = [
            (json!({"tools": [{"name": "f"}]}), "tools[0].input_schema"),
            (
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "g"}}),
                "tool_choice",
            ),
            (
                json!({"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool"}}),
                "tool_choice.name",
            ),
            (
                json!({"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "maybe"}}),
                "tool_choice.type",
            ),
            (json!({"tool_choice": {"type": "any"}}), "tool_choice"),
        ];
        for (body, param) in cases {
            let m = obj(body.clone());
            assert_eq!(
                param_of(anthropic(&Params::new(&m))),
                Some(param.to_string()),
                "{body}"
            );
        }
    }
}
