//! ggml blocks inside a safetensors container: a GGUF converted by `coli
//! convert` keeps every quantized tensor's blocks as they were (no
//! requantization), stored as `U8 [rows, bytes_per_row]` (or `[bytes]` for
//! a vector), and the container's `__metadata__` says, under
//! [`GGML_TYPES_KEY`], each such tensor's ggml type and logical shape. On
//! open the tensor is then presented exactly as the GGUF view presents it
//! ([`TensorMeta::block`]), so the loaders and kernels cannot tell the two
//! apart.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::Dtype;

use super::StError;
use super::checkpoint::TensorMeta;
use crate::gguf::GgmlType;

/// The `__metadata__` key: a JSON object, tensor name → `[ggml type id,
/// [logical shape, outermost first]]`.
pub const GGML_TYPES_KEY: &str = "ggml_types";

/// The stored shape of a tensor of `ty` blocks with logical `shape`:
/// `[rows, bytes_per_row]` (rows = every dimension but the innermost), or
/// `[bytes]` for a vector. `None` when the innermost dimension is not whole
/// blocks or the size overflows.
pub fn stored_shape(ty: GgmlType, shape: &[usize]) -> Option<Vec<usize>> {
    let (&cols, outer) = shape.split_last()?;
    let cols = u64::try_from(cols).ok()?;
    if ty.block_size() == 0 || !cols.is_multiple_of(ty.block_size()) {
        return None;
    }
    let row = usize::try_from(ty.bytes_for(cols)?).ok()?;
    if outer.is_empty() {
        return Some(vec![row]);
    }
    let rows = outer.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    rows.checked_mul(row)?;
    Some(vec![rows, row])
}

/// The [`GGML_TYPES_KEY`] value for `tensors` (name, type, logical shape).
pub fn encode<'a>(tensors: impl IntoIterator<Item = (&'a str, GgmlType, &'a [usize])>) -> String {
    let map: serde_json::Map<String, serde_json::Value> = tensors
        .into_iter()
        .map(|(name, ty, shape)| (name.to_string(), serde_json::json!([ty.id(), shape])))
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// Applies the container's [`GGML_TYPES_KEY`] entry (if any) to `tensors`:
/// each listed tensor must exist, be `U8` and have exactly the stored shape
/// and byte length its type and logical shape give; it then reads as that
/// type's blocks with its logical shape.
pub(crate) fn apply(
    path: &Path,
    tensors: &mut BTreeMap<String, TensorMeta>,
    metadata: &BTreeMap<String, String>,
) -> Result<(), StError> {
    let Some(text) = metadata.get(GGML_TYPES_KEY) else {
        return Ok(());
    };
    let bad_key =
        |reason: String| StError::header(path, format!("__metadata__ {GGML_TYPES_KEY:?}: {reason}"));
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad_key(format!("invalid JSON: {e}")))?;
    let map = value
        .as_object()
        .ok_or_else(|| bad_key("not a JSON object".into()))?;
    for (name, entry) in map {
        let bad = |reason: String| StError::tensor(path, name, reason);
        let (ty, shape) = parse_entry(entry).ok_or_else(|| {
            bad(format!(
                "{GGML_TYPES_KEY} entry {entry} is not [ggml type id, [dims]]"
            ))
        })?;
        let meta = tensors
            .get_mut(name)
            .ok_or_else(|| bad(format!("listed in {GGML_TYPES_KEY} but not in the file")))?;
        let stored = stored_shape(ty, &shape)
            .ok_or_else(|| bad(format!("shape {shape:?} is not whole {ty} blocks")))?;
        if meta.dtype != Dtype::U8 || meta.shape != stored {
            return Err(bad(format!(
                "{ty} blocks of shape {shape:?} are stored as U8 {stored:?}, found {} {:?}",
                meta.dtype, meta.shape
            )));
        }
        meta.block = Some(ty);
        meta.shape = shape;
    }
    Ok(())
}

fn parse_entry(v: &serde_json::Value) -> Option<(GgmlType, Vec<usize>)> {
    let [id, dims] = v.as_array()?.as_slice() else {
        return None;
    };
    let ty = GgmlType::from_id(u32::try_from(id.as_u64()?).ok()?)?;
    let shape = dims
        .as_array()?
        .iter()
        .map(|d| usize::try_from(d.as_u64()?).ok())
        .collect::<Option<Vec<_>>>()?;
    Some((ty, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(dtype: Dtype, shape: Vec<usize>) -> TensorMeta {
        let len = shape.iter().product::<usize>() as u64;
        TensorMeta {
            dtype,
            block: None,
            shape,
            file: 0,
            offset: 0,
            len,
        }
    }

    #[test]
    fn listed_tensors_read_as_their_blocks_and_bad_entries_name_the_tensor() {
        let q = GgmlType::Q8_0;
        assert_eq!(stored_shape(q, &[4, 64]), Some(vec![4, 68]));
        assert_eq!(stored_shape(q, &[64]), Some(vec![68]));
        assert_eq!(stored_shape(q, &[2, 3, 32]), Some(vec![6, 34]));
        assert_eq!(stored_shape(q, &[4, 40]), None);
        let path = Path::new("c/model.safetensors");
        let mut tensors = BTreeMap::from([
            ("w".to_string(), meta(Dtype::U8, vec![4, 68])),
            ("f".to_string(), meta(Dtype::F32, vec![4, 64])),
        ]);
        let mut md = BTreeMap::new();
        md.insert(GGML_TYPES_KEY.to_string(), encode([("w", q, &[4usize, 64][..])]));
        apply(path, &mut tensors, &md).unwrap();
        assert_eq!(tensors["w"].block, Some(q));
        assert_eq!(tensors["w"].shape, vec![4, 64]);
        assert_eq!(tensors["f"].block, None);

        let fails = |entry: &str| {
            let mut t = BTreeMap::from([
                ("w".to_string(), meta(Dtype::U8, vec![4, 68])),
                ("f".to_string(), meta(Dtype::F32, vec![4, 64])),
            ]);
            let md = BTreeMap::from([(GGML_TYPES_KEY.to_string(), entry.to_string())]);
            apply(path, &mut t, &md).unwrap_err().to_string()
        };
        let e = fails(r#"{"w": [8, [4, 65]]}"#);
        assert!(e.contains("\"w\"") && e.contains("65"), "{e}");
        let e = fails(r#"{"w": [8, [4, 96]]}"#);
        assert!(e.contains("\"w\"") && e.contains("[4, 68]"), "{e}");
        let e = fails(r#"{"f": [8, [4, 64]]}"#);
        assert!(e.contains("\"f\"") && e.contains("F32"), "{e}");
        let e = fails(r#"{"x": [8, [4, 64]]}"#);
        assert!(e.contains("\"x\"") && e.contains("not in the file"), "{e}");
        let e = fails(r#"{"w": [4, [4, 64]]}"#);
        assert!(e.contains("\"w\"") && e.contains("ggml type id"), "{e}");
        let e = fails(r#"[1]"#);
        assert!(e.contains("ggml_types") && e.contains("object"), "{e}");
        let e = fails("{");
        assert!(e.contains("ggml_types") && e.contains("JSON"), "{e}");
    }
}
