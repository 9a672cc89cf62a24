//! The one place that knows how the same hyper-parameter is spelled by
//! different writers of `config.json`: transformers 4, transformers 5, and
//! the multimodal releases whose language model sits under `text_config`.
//!
//! Every config is rewritten into one spelling before a family parses it,
//! so the families read a single name per field. A checkpoint that spells a
//! field twice with different values is refused: guessing which one the
//! writer meant would run a different model than the one published.

use std::path::Path;

use serde_json::{Map, Value};

use super::ConfigError;

/// Keys of a multimodal config's outer object that describe other towers
/// or the wrapper itself, not the language model.
const NOT_TEXT: [&str; 5] = [
    "text_config",
    "vision_config",
    "audio_config",
    "model_type",
    "architectures",
];

/// Field names and the other names they are written under: the expert
/// count (transformers 5 writes `num_local_experts` where 4 wrote
/// `num_experts` for Qwen3-MoE; Mixtral and gpt-oss always used
/// `num_local_experts`, DeepSeek and GLM `n_routed_experts`), the dtype, and
/// GLM-5's own name for its next-token layers.
const ALIASES: [(&str, &[&str]); 3] = [
    ("num_experts", &["num_local_experts", "n_routed_experts"]),
    ("dtype", &["torch_dtype"]),
    ("num_nextn_predict_layers", &["num_mtp_layers"]),
];

/// Keys transformers 5 moved from the top level into `rope_parameters`.
const LIFTED_FROM_ROPE: [&str; 2] = ["rope_theta", "partial_rotary_factor"];

/// `config` with every known alternative spelling rewritten to the one the
/// families read:
/// - a `text_config` (multimodal release) becomes the config, with the
///   outer object's other fields (e.g. `tie_word_embeddings`) filling in
///   what it lacks; vision and audio settings are dropped;
/// - `num_local_experts` / `n_routed_experts` become `num_experts`;
/// - `rope_parameters` becomes `rope_theta`, `partial_rotary_factor` and
///   `rope_scaling` (`null` for plain RoPE, else the scaling fields);
/// - `torch_dtype` becomes `dtype`, `num_mtp_layers` (GLM-5's own
///   release) `num_nextn_predict_layers`.
///
/// A value that is not an object is returned as it is; the family's parser
/// names what is wrong with it.
pub fn canonical(path: &Path, config: Value) -> Result<Value, ConfigError> {
    let Value::Object(outer) = config else {
        return Ok(config);
    };
    let mut obj = lift_text_config(path, outer)?;
    for (name, aliases) in ALIASES {
        for alias in aliases {
            rename(path, &mut obj, alias, name)?;
        }
    }
    lift_rope_parameters(path, &mut obj)?;
    Ok(Value::Object(obj))
}

/// A serde error of a family's parser, where a missing field also names the
/// spellings it could have had, so the message speaks the file's language.
pub(crate) fn parse_error(path: &Path, source: serde_json::Error) -> ConfigError {
    let msg = source.to_string();
    for (name, aliases) in ALIASES {
        if msg.starts_with(&format!("missing field `{name}`")) {
            return invalid(
                path,
                name,
                format!("is missing (also read as {})", aliases.join(" or ")),
            );
        }
    }
    ConfigError::Json {
        path: path.to_path_buf(),
        source,
    }
}

fn invalid(path: &Path, field: &'static str, reason: String) -> ConfigError {
    ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        reason,
    }
}

fn lift_text_config(path: &Path, mut outer: Map<String, Value>) -> Result<Map<String, Value>, ConfigError> {
    let text = match outer.remove("text_config") {
        None | Some(Value::Null) => return Ok(outer),
        Some(Value::Object(text)) => text,
        Some(other) => {
            return Err(invalid(
                path,
                "text_config",
                format!("must be an object, got {}", kind(&other)),
            ));
        }
    };
    let mut obj = text;
    if !obj.contains_key("model_type")
        && let Some(t) = outer.get("model_type")
    {
        obj.insert("model_type".into(), t.clone());
    }
    for (k, v) in outer {
        if !NOT_TEXT.contains(&k.as_str()) && !obj.contains_key(&k) {
            obj.insert(k, v);
        }
    }
    Ok(obj)
}

/// Moves `from` to `to`; both present with different values is an error.
fn rename(
    path: &Path,
    obj: &mut Map<String, Value>,
    from: &'static str,
    to: &'static str,
) -> Result<(), ConfigError> {
    let Some(v) = obj.remove(from) else {
        return Ok(());
    };
    match obj.get(to) {
        Some(existing) if !same(existing, &v) => Err(invalid(
            path,
            from,
            format!("is {v} but {to} is {existing}: the config names two values for one setting"),
        )),
        Some(_) => Ok(()),
        None => {
            obj.insert(to.into(), v);
            Ok(())
        }
    }
}

/// Equal as JSON, with numbers compared by value (`1e6` and `1000000.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn lift_rope_parameters(path: &Path, obj: &mut Map<String, Value>) -> Result<(), ConfigError> {
    let mut params = match obj.remove("rope_parameters") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(p)) => p,
        Some(other) => {
            return Err(invalid(
                path,
                "rope_parameters",
                format!("must be an object, got {}", kind(&other)),
            ));
        }
    };
    // transformers 5 keys RoPE by layer type when the types differ (e.g.
    // `{"full_attention": {..}, "sliding_attention": {..}}`).
    if !params.is_empty() && params.values().all(Value::is_object) {
        return Err(invalid(
            path,
            "rope_parameters",
            format!(
                "gives RoPE per layer type ({}), which no supported family uses",
                params.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    for key in LIFTED_FROM_ROPE {
        let Some(v) = params.remove(key) else {
            continue;
        };
        match obj.get(key) {
            Some(top) if !top.is_null() && !same(top, &v) => {
                return Err(invalid(
                    path,
                    "rope_parameters",
                    format!("has {key} {v} but the top level says {top}"),
                ));
            }
            _ => {
                obj.insert(key.into(), v);
            }
        }
    }
    let rope_type = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string();
    let scaling = if rope_type == "default" {
        Value::Null
    } else {
        Value::Object(params)
    };
    match obj.get("rope_scaling") {
        None => {
            obj.insert("rope_scaling".into(), scaling);
        }
        Some(Value::Null) if scaling.is_null() => {}
        Some(existing) if existing == &scaling => {}
        Some(existing) => {
            return Err(invalid(
                path,
                "rope_parameters",
                format!("({rope_type}) disagrees with rope_scaling {existing}"),
            ));
        }
    }
    Ok(())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(v: Value) -> Result<Value, ConfigError> {
        canonical(Path::new("c.json"), v)
    }

    #[test]
    fn transformers_5_qwen3_moe_reads_as_transformers_4() {
        let v5 = json!({
            "model_type": "qwen3_moe", "num_local_experts": 4, "dtype": "bfloat16",
            "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}
        });
        let v4 = json!({
            "model_type": "qwen3_moe", "num_experts": 4, "torch_dtype": "bfloat16",
            "rope_theta": 1e6
        });
        let expect = json!({
            "model_type": "qwen3_moe", "num_experts": 4, "dtype": "bfloat16",
            "rope_theta": 1e6, "rope_scaling": null
        });
        assert_eq!(canon(v5).unwrap(), expect);
        let mut v4c = canon(v4).unwrap();
        v4c.as_object_mut()
            .map(|o| o.insert("rope_scaling".into(), Value::Null));
        assert_eq!(v4c, expect);
    }

    #[test]
    fn scaling_and_partial_rotary_leave_rope_parameters() {
        let v = canon(json!({
            "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "rope_theta": 150000.0,
                                "partial_rotary_factor": 0.5, "beta_fast": 32.0}
        }))
        .unwrap();
        assert_eq!(
            v,
            json!({"rope_theta": 150000.0, "partial_rotary_factor": 0.5,
                   "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0}})
        );
    }

    #[test]
    fn two_values_for_one_setting_are_refused_by_name() {
        let e = canon(json!({"num_experts": 4, "num_local_experts": 8})).unwrap_err();
        assert!(
            e.to_string()
                .contains("num_local_experts is 8 but num_experts is 4"),
            "{e}"
        );
        assert!(canon(json!({"num_experts": 4, "n_routed_experts": 4.0})).is_ok());
        let e = canon(json!({"rope_theta": 1e4, "rope_parameters": {"rope_theta": 1e6}})).unwrap_err();
        assert!(e.to_string().contains("rope_parameters has rope_theta"), "{e}");
        let e = canon(json!({
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
            "rope_parameters": {"rope_type": "yarn", "factor": 8.0}
        }))
        .unwrap_err();
        assert!(e.to_string().contains("disagrees with rope_scaling"), "{e}");
        let e =
            canon(json!({"rope_parameters": {"full_attention": {}, "sliding_attention": {}}})).unwrap_err();
        assert!(e.to_string().contains("per layer type"), "{e}");
        let e = canon(json!({"rope_parameters": [1]})).unwrap_err();
        assert!(e.to_string().contains("must be an object, got a list"), "{e}");
    }

    #[test]
    fn a_multimodal_release_reads_as_its_language_model() {
        let v = canon(json!({
            "model_type": "wrapper", "architectures": ["X"], "tie_word_embeddings": false,
            "image_token_id": 5, "vision_config": {"depth": 2},
            "text_config": {"model_type": "inner_text", "hidden_size": 8, "num_local_experts": 2}
        }))
        .unwrap();
        assert_eq!(
            v,
            json!({"model_type": "inner_text", "hidden_size": 8, "num_experts": 2,
                   "tie_word_embeddings": false, "image_token_id": 5})
        );
        let v = canon(json!({"model_type": "outer", "text_config": {"hidden_size": 8}})).unwrap();
        assert_eq!(v["model_type"], "outer");
        let e = canon(json!({"text_config": 3})).unwrap_err();
        assert!(e.to_string().contains("text_config must be an object"), "{e}");
    }

    #[test]
    fn a_missing_field_names_its_other_spellings() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct J {
            num_experts: usize,
        }
        let e = serde_json::from_value::<J>(json!({})).unwrap_err();
        let e = parse_error(Path::new("c.json"), e).to_string();
        assert_eq!(
            e,
            "c.json: num_experts is missing (also read as num_local_experts or n_routed_experts)"
        );
        let e = serde_json::from_value::<J>(json!({"num_experts": -1})).unwrap_err();
        assert!(
            parse_error(Path::new("c.json"), e)
                .to_string()
                .starts_with("parsing c.json")
        );
    }

    #[test]
    fn canonical_is_idempotent_and_leaves_non_objects_alone() {
        let v = json!({"num_local_experts": 4, "rope_parameters": {"rope_theta": 5.0, "rope_type": "linear", "factor": 2.0}});
        let once = canon(v).unwrap();
        assert_eq!(canon(once.clone()).unwrap(), once);
        assert_eq!(canon(json!([1, 2])).unwrap(), json!([1, 2]));
    }
}
