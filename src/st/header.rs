//! Parsing and validating one safetensors header.
//!
//! Done here rather than through `SafeTensors::read_metadata` so that every
//! refusal names the offending tensor; the rules are the safetensors ones
//! (contiguous, non-overlapping data covering the file exactly).

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::Dtype;
use serde::Deserialize;

use super::{MAX_HEADER_BYTES, StError};

/// One tensor entry of a header, offsets relative to the data section.
#[derive(Clone, Debug, PartialEq)]
pub struct HeaderTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub start: u64,
    pub end: u64,
}

/// A validated header: tensors sorted by data offset.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedHeader {
    /// Absolute offset of the data section (8 + header length).
    pub data_start: u64,
    pub tensors: Vec<HeaderTensor>,
    /// The `__metadata__` map (empty when absent).
    pub metadata: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInfo {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// Bits per element of the dtypes colibri accepts in a file; sub-byte and
/// exotic types are refused (`None`).
pub(crate) fn dtype_bits(d: Dtype) -> Option<u64> {
    Some(match d {
        Dtype::BOOL | Dtype::U8 | Dtype::I8 | Dtype::F8_E4M3 | Dtype::F8_E5M2 | Dtype::F8_E8M0 => 8,
        Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 16,
        Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
        Dtype::I64 | Dtype::U64 | Dtype::F64 => 64,
        _ => return None,
    })
}

/// Byte length of a tensor of `dtype` and `shape`, `None` on overflow.
pub(crate) fn byte_len(dtype: Dtype, shape: &[usize]) -> Option<u64> {
    let elems = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))?;
    elems.checked_mul(dtype_bits(dtype)? / 8)
}

/// Parses and validates the header of a safetensors file whose complete
/// contents are `file` (normally a memory map). Nothing outside `file` is
/// ever indexed; every inconsistency is an error naming `path` and, where
/// one is involved, the tensor.
pub fn parse_header(path: &Path, file: &[u8]) -> Result<ParsedHeader, StError> {
    let file_len = file.len() as u64;
    let Some(len_bytes) = file.get(..8) else {
        return Err(StError::header(
            path,
            format!("file is {file_len} bytes, too short for the 8-byte header length"),
        ));
    };
    let mut arr = [0u8; 8];
    arr.copy_from_slice(len_bytes);
    let n = u64::from_le_bytes(arr);
    if n > MAX_HEADER_BYTES {
        return Err(StError::header(
            path,
            format!("header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes"),
        ));
    }
    // n <= 1e8, so 8 + n cannot overflow.
    let data_start = 8 + n;
    if data_start > file_len {
        return Err(StError::header(
            path,
            format!("header length {n} runs past the end of the file ({file_len} bytes; truncated?)"),
        ));
    }
    let json = &file[8..data_start as usize];
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(json).map_err(|e| StError::header(path, format!("invalid JSON: {e}")))?;
    let data_len = file_len - data_start;

    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(map.len());
    for (name, value) in map {
        if name == "__metadata__" {
            let obj = value
                .as_object()
                .ok_or_else(|| StError::header(path, "__metadata__ is not an object"))?;
            for (k, v) in obj {
                let s = v.as_str().ok_or_else(|| {
                    StError::header(path, format!("__metadata__ value of {k:?} is not a string"))
                })?;
                metadata.insert(k.clone(), s.to_string());
            }
            continue;
        }
        tensors.push(parse_entry(path, name, value, data_len)?);
    }
    tensors.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    check_coverage(path, &tensors, data_len)?;
    Ok(ParsedHeader {
        data_start,
        tensors,
        metadata,
    })
}

fn parse_entry(
    path: &Path,
    name: String,
    value: serde_json::Value,
    data_len: u64,
) -> Result<HeaderTensor, StError> {
    let raw: RawInfo = serde_json::from_value(value)
        .map_err(|e| StError::tensor(path, &name, format!("malformed header entry: {e}")))?;
    let dtype: Dtype = serde_json::from_value(serde_json::Value::String(raw.dtype.clone()))
        .map_err(|_| StError::tensor(path, &name, format!("unknown dtype {:?}", raw.dtype)))?;
    if dtype_bits(dtype).is_none() {
        return Err(StError::tensor(path, &name, format!("unsupported dtype {dtype}")));
    }
    let shape = raw
        .shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| {
            StError::tensor(
                path,
                &name,
                format!("shape {:?} does not fit in memory", raw.shape),
            )
        })?;
    let [start, end] = raw.data_offsets;
    if end < start {
        return Err(StError::tensor(
            path,
            &name,
            format!("data offsets [{start}, {end}) end before they start"),
        ));
    }
    if end > data_len {
        return Err(StError::tensor(
            path,
            &name,
            format!(
                "data offsets [{start}, {end}) lie outside the file's {data_len} data bytes (truncated?)"
            ),
        ));
    }
    let want = byte_len(dtype, &shape).ok_or_else(|| {
        StError::tensor(
            path,
            &name,
            format!("shape {shape:?} of {dtype} overflows the byte count"),
        )
    })?;
    if end - start != want {
        return Err(StError::tensor(
            path,
            &name,
            format!(
                "shape {shape:?} of {dtype} needs {want} bytes but data offsets [{start}, {end}) hold {}",
                end - start
            ),
        ));
    }
    Ok(HeaderTensor {
        name,
        dtype,
        shape,
        start,
        end,
    })
}

/// Tensors (sorted) must tile the data section exactly: no overlap, no hole,
/// nothing after the last one.
fn check_coverage(path: &Path, tensors: &[HeaderTensor], data_len: u64) -> Result<(), StError> {
    let mut at = 0u64;
    let mut prev: Option<&str> = None;
    for t in tensors {
        if t.start < at {
            return Err(StError::tensor(
                path,
                &t.name,
                format!(
                    "data [{}, {}) overlaps tensor {:?} (which ends at {at})",
                    t.start,
                    t.end,
                    prev.unwrap_or("")
                ),
            ));
        }
        if t.start > at {
            return Err(StError::tensor(
                path,
                &t.name,
                format!("{} unused bytes before its data at {}", t.start - at, t.start),
            ));
        }
        at = t.end;
        prev = Some(&t.name);
    }
    if at != data_len {
        return Err(StError::header(
            path,
            format!("tensors cover {at} data bytes but the file holds {data_len}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str, data: usize) -> Vec<u8> {
        let mut v = (json.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(json.as_bytes());
        v.resize(v.len() + data, 0);
        v
    }

    #[test]
    fn accepts_a_valid_header_and_sorts_by_offset() {
        let j = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},
                   "a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                   "__metadata__":{"format":"colibri"}}   "#;
        let h = parse_header(Path::new("x"), &file(j, 12)).unwrap();
        assert_eq!(h.tensors[0].name, "a");
        assert_eq!(h.tensors[1].name, "b");
        assert_eq!(h.metadata["format"], "colibri");
        assert_eq!(h.data_start, 8 + j.len() as u64);
    }

    #[test]
    fn refuses_holes_and_trailing_bytes() {
        let j = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[1,5]}}"#;
        let e = parse_header(Path::new("x"), &file(j, 5)).unwrap_err().to_string();
        assert!(e.contains("unused bytes"), "{e}");
        let j = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
        let e = parse_header(Path::new("x"), &file(j, 5)).unwrap_err().to_string();
        assert!(e.contains("cover 4"), "{e}");
    }
}
