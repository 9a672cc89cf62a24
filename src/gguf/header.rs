//! Parsing and validating one GGUF file: header, metadata, tensor infos,
//! alignment and the data section's layout.
//!
//! The whole file is in memory (normally a map), so every offset and size
//! is checked against its real length before it is used, and every count
//! against the bytes left before anything is allocated for it. What is
//! refused beyond plain structure: duplicate keys and tensor names, an
//! alignment that is not a power of two, more than four dimensions, element
//! counts above 2^63 - 1, rows that are not whole blocks of their type,
//! tensor data that is misaligned, outside the file or overlapping another
//! tensor's.

use std::collections::HashMap;
use std::ops::Range;

use super::GgufError;
use super::cursor::Cursor;
use super::metadata::Metadata;
use super::types::GgmlType;
use super::value::{Array, Value, ValueType};

/// The four bytes every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The key that overrides the alignment (a u32, a power of two).
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Longest key accepted (the GGUF specification's bound).
pub const MAX_KEY_BYTES: u64 = 65_535;
/// Longest tensor name accepted: ggml keeps names in 64-byte buffers with
/// a terminating NUL, so llama.cpp refuses anything longer too.
pub const MAX_TENSOR_NAME_BYTES: u64 = 63;
/// Most dimensions a tensor may have (ggml's limit).
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays accepted (real files use 1; the bound keeps a
/// hostile file from recursing the parser off its stack).
pub const MAX_ARRAY_DEPTH: usize = 4;

/// The smallest a metadata entry can be: key length, a one-byte key, the
/// type, a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// The smallest a tensor info can be: name length, a one-byte name, the
/// dimension count, one dimension, the type, the offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 1 + 4 + 8 + 4 + 8;

/// One tensor, validated: its data lies inside the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the innermost (row length), the reverse of
    /// the safetensors / PyTorch shape.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section, as stored.
    pub offset: u64,
    /// Elements (the product of `dims`).
    pub n_elements: u64,
    /// Absolute byte range of the data in the file.
    pub data: Range<u64>,
}

impl TensorInfo {
    pub fn n_bytes(&self) -> u64 {
        self.data.end - self.data.start
    }

    /// The shape outermost first, as safetensors and PyTorch write it.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A parsed, validated GGUF file (its bytes are held elsewhere).
#[derive(Clone, Debug, PartialEq)]
pub struct Gguf {
    pub version: u32,
    pub metadata: Metadata,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
    index: HashMap<String, usize>,
}

impl Gguf {
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).and_then(|&i| self.tensors.get(i))
    }
}

/// Parses and validates the GGUF file whose complete contents are `file`.
/// Nothing outside `file` is indexed, nothing is allocated for a count the
/// file cannot hold, and no input panics.
pub fn parse(file: &[u8]) -> Result<Gguf, GgufError> {
    let mut c = Cursor::new(file);
    let magic: [u8; 4] = c.array(|| "the magic".into())?;
    if &magic != MAGIC {
        return Err(GgufError::Magic {
            found: String::from_utf8_lossy(&magic).into_owned(),
        });
    }
    let version = c.u32(|| "the version".into())?;
    if version != 2 && version != 3 {
        let hint = match version {
            1 => " (version 1 was replaced in 2023; convert the model again)",
            v if matches!(v.swap_bytes(), 1..=3) => " (the file looks big-endian, which is not supported)",
            _ => "",
        };
        return Err(GgufError::Version { found: version, hint });
    }
    let n_tensors = c.u64(|| "the tensor count".into())?;
    let n_kv = c.u64(|| "the metadata count".into())?;
    c.check_count(|| "metadata entry".into(), n_kv, MIN_KV_BYTES)?;
    c.check_count(|| "tensor".into(), n_tensors, MIN_TENSOR_INFO_BYTES)?;

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let (key, value) = read_kv(&mut c, i)?;
        metadata.insert(key, value)?;
    }
    let alignment = alignment(&metadata)?;

    c.check_count(|| "tensor".into(), n_tensors, MIN_TENSOR_INFO_BYTES)?;
    let mut raw = Vec::new();
    let mut index = HashMap::new();
    for i in 0..n_tensors {
        let t = read_tensor_info(&mut c, i)?;
        if let Some(&first) = index.get(&t.name) {
            return Err(GgufError::DuplicateTensor {
                tensor: t.name,
                first: first as u64,
                second: i,
            });
        }
        index.insert(t.name.clone(), raw.len());
        raw.push(t);
    }

    let file_len = file.len() as u64;
    let data_start = c
        .pos()
        .checked_next_multiple_of(alignment)
        .ok_or(GgufError::DataStart {
            start: u64::MAX,
            len: file_len,
        })?;
    if !raw.is_empty() && data_start > file_len {
        return Err(GgufError::DataStart {
            start: data_start,
            len: file_len,
        });
    }
    let tensors = raw
        .into_iter()
        .map(|t| place(t, data_start, alignment, file_len))
        .collect::<Result<Vec<_>, _>>()?;
    check_overlaps(&tensors)?;
    Ok(Gguf {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
        index,
    })
}

/// A string's raw bytes: the u64 length, then the bytes.
fn read_string<'a>(c: &mut Cursor<'a>, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
    let len = c.u64(|| format!("the length of {}", what()))?;
    c.bytes(len, what)
}

fn read_kv(c: &mut Cursor<'_>, index: u64) -> Result<(String, Value), GgufError> {
    let offset = c.pos();
    let bad = |reason: String| GgufError::KeyName {
        index,
        offset,
        reason,
    };
    let len = c.u64(|| format!("the key length of metadata entry #{index}"))?;
    if len == 0 {
        return Err(bad("the key is empty".into()));
    }
    if len > MAX_KEY_BYTES {
        return Err(bad(format!("the key is {len} bytes, more than {MAX_KEY_BYTES}")));
    }
    let raw = c.bytes(len, || format!("the key of metadata entry #{index}"))?;
    let key = std::str::from_utf8(raw)
        .map_err(|e| {
            bad(format!(
                "the key is not UTF-8 (invalid byte at {})",
                e.valid_up_to()
            ))
        })?
        .to_string();
    let type_id = c.u32(|| format!("the type of key {key:?}"))?;
    let value = read_value(c, &key, type_id, 0)?;
    Ok((key, value))
}

fn value_type(key: &str, id: u32, what: &str) -> Result<ValueType, GgufError> {
    ValueType::from_id(id).ok_or_else(|| GgufError::key(key, format!("unknown {what} type id {id}")))
}

fn read_value(c: &mut Cursor<'_>, key: &str, type_id: u32, depth: usize) -> Result<Value, GgufError> {
    let ty = value_type(key, type_id, "value")?;
    let what = || format!("the {} value of key {key:?}", ty.name());
    Ok(match ty {
        ValueType::U8 => Value::U8(u8::from_le_bytes(c.array(what)?)),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array(what)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(what)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(what)?)),
        ValueType::Bool => {
            let at = c.pos();
            let [b] = c.array(what)?;
            Value::Bool(read_bool(key, b, at)?)
        }
        ValueType::String => Value::String(utf8(key, read_string(c, &what)?, None)?),
        ValueType::Array => Value::Array(read_array(c, key, depth + 1)?),
    })
}

fn read_bool(key: &str, b: u8, at: u64) -> Result<bool, GgufError> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(GgufError::key(
            key,
            format!("bool byte {b} at offset {at} is neither 0 nor 1"),
        )),
    }
}

fn utf8(key: &str, raw: &[u8], element: Option<u64>) -> Result<String, GgufError> {
    match std::str::from_utf8(raw) {
        Ok(s) => Ok(s.to_string()),
        Err(e) => {
            let at = element.map(|i| format!(" (element {i})")).unwrap_or_default();
            Err(GgufError::key(
                key,
                format!("string{at} is not UTF-8 (invalid byte at {})", e.valid_up_to()),
            ))
        }
    }
}

/// Little-endian elements of `N` bytes, converted by `f`.
fn fixed<const N: usize, T>(raw: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    raw.chunks_exact(N)
        .map(|ch| {
            let mut a = [0u8; N];
            a.copy_from_slice(ch);
            f(a)
        })
        .collect()
}

fn read_array<'a>(c: &mut Cursor<'a>, key: &str, depth: usize) -> Result<Array, GgufError> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::key(
            key,
            format!(
                "arrays nested deeper than {MAX_ARRAY_DEPTH} at offset {}",
                c.pos()
            ),
        ));
    }
    let elem_id = c.u32(|| format!("the element type of array {key:?}"))?;
    let elem = value_type(key, elem_id, "array element")?;
    let count = c.u64(|| format!("the length of array {key:?}"))?;
    c.check_count(|| format!("array {key:?} element"), count, elem.min_bytes())?;
    let what = || format!("the {count} {} elements of array {key:?}", elem.name());
    // Fixed-size elements: one bounds check, then a typed copy.
    let fixed_bytes = |c: &mut Cursor<'a>| c.bytes(count * elem.min_bytes(), what);
    Ok(match elem {
        ValueType::U8 => Array::U8(fixed_bytes(c)?.to_vec()),
        ValueType::I8 => Array::I8(fixed(fixed_bytes(c)?, i8::from_le_bytes)),
        ValueType::U16 => Array::U16(fixed(fixed_bytes(c)?, u16::from_le_bytes)),
        ValueType::I16 => Array::I16(fixed(fixed_bytes(c)?, i16::from_le_bytes)),
        ValueType::U32 => Array::U32(fixed(fixed_bytes(c)?, u32::from_le_bytes)),
        ValueType::I32 => Array::I32(fixed(fixed_bytes(c)?, i32::from_le_bytes)),
        ValueType::F32 => Array::F32(fixed(fixed_bytes(c)?, f32::from_le_bytes)),
        ValueType::U64 => Array::U64(fixed(fixed_bytes(c)?, u64::from_le_bytes)),
        ValueType::I64 => Array::I64(fixed(fixed_bytes(c)?, i64::from_le_bytes)),
        ValueType::F64 => Array::F64(fixed(fixed_bytes(c)?, f64::from_le_bytes)),
        ValueType::Bool => {
            let at = c.pos();
            let raw = fixed_bytes(c)?;
            let mut v = Vec::with_capacity(raw.len());
            for (i, &b) in raw.iter().enumerate() {
                v.push(read_bool(key, b, at + i as u64)?);
            }
            Array::Bool(v)
        }
        ValueType::String => {
            let mut v = Vec::new();
            for i in 0..count {
                let raw = read_string(c, &|| format!("string {i} of array {key:?}"))?;
                v.push(utf8(key, raw, Some(i))?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::new();
            for _ in 0..count {
                v.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

fn alignment(meta: &Metadata) -> Result<u64, GgufError> {
    match meta.get(ALIGNMENT_KEY) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(*a as u64),
        Some(Value::U32(a)) => Err(GgufError::key(
            ALIGNMENT_KEY,
            format!("alignment {a} is not a power of two"),
        )),
        Some(other) => Err(GgufError::KeyType {
            key: ALIGNMENT_KEY.into(),
            expected: "u32",
            found: other.type_name(),
        }),
    }
}

/// A tensor info before its data range is known.
struct RawTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    offset: u64,
    n_elements: u64,
    n_bytes: u64,
}

fn read_tensor_info(c: &mut Cursor<'_>, index: u64) -> Result<RawTensor, GgufError> {
    let offset = c.pos();
    let bad_name = |reason: String| GgufError::TensorName {
        index,
        offset,
        reason,
    };
    let len = c.u64(|| format!("the name length of tensor #{index}"))?;
    if len == 0 {
        return Err(bad_name("the name is empty".into()));
    }
    if len > MAX_TENSOR_NAME_BYTES {
        return Err(bad_name(format!(
            "the name is {len} bytes, more than {MAX_TENSOR_NAME_BYTES}"
        )));
    }
    let raw = c.bytes(len, || format!("the name of tensor #{index}"))?;
    let name = std::str::from_utf8(raw)
        .map_err(|e| {
            bad_name(format!(
                "the name is not UTF-8 (invalid byte at {})",
                e.valid_up_to()
            ))
        })?
        .to_string();
    let bad = |reason: String| GgufError::tensor(&name, reason);
    let n_dims = c.u32(|| format!("the dimension count of tensor {name:?}"))?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(bad(format!(
            "{n_dims} dimensions (1 to {MAX_DIMS} are supported)"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        let v = c.u64(|| format!("dimension {d} of tensor {name:?}"))?;
        if v > i64::MAX as u64 {
            return Err(bad(format!("dimension {d} is {v}, more than 2^63 - 1")));
        }
        dims.push(v);
    }
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| {
            acc.checked_mul(d).filter(|&n| n <= i64::MAX as u64)
        })
        .ok_or_else(|| bad(format!("dims {dims:?} hold more than 2^63 - 1 elements")))?;
    let type_id = c.u32(|| format!("the type of tensor {name:?}"))?;
    let ggml_type =
        GgmlType::from_id(type_id).ok_or_else(|| bad(format!("unknown ggml type id {type_id}")))?;
    let row = dims[0];
    if !row.is_multiple_of(ggml_type.block_size()) {
        return Err(bad(format!(
            "row length {row} (dims[0]) is not a multiple of {ggml_type}'s block size {}",
            ggml_type.block_size()
        )));
    }
    let n_bytes = ggml_type.bytes_for(n_elements).ok_or_else(|| {
        bad(format!(
            "dims {dims:?} of {ggml_type} overflow a 64-bit byte count"
        ))
    })?;
    let data_offset = c.u64(|| format!("the data offset of tensor {name:?}"))?;
    Ok(RawTensor {
        name,
        dims,
        ggml_type,
        offset: data_offset,
        n_elements,
        n_bytes,
    })
}

/// The tensor's absolute data range, checked against the alignment and the
/// file's length.
fn place(t: RawTensor, data_start: u64, alignment: u64, file_len: u64) -> Result<TensorInfo, GgufError> {
    if !t.offset.is_multiple_of(alignment) {
        return Err(GgufError::tensor(
            &t.name,
            format!(
                "data offset {} is not a multiple of the alignment {alignment}",
                t.offset
            ),
        ));
    }
    let range = data_start
        .checked_add(t.offset)
        .and_then(|s| Some(s..s.checked_add(t.n_bytes)?))
        .filter(|r| r.end <= file_len);
    let Some(data) = range else {
        return Err(GgufError::tensor(
            &t.name,
            format!(
                "{} bytes of data at offset {} (+ data section {data_start}) lie outside the file ({file_len} bytes)",
                t.n_bytes, t.offset
            ),
        ));
    };
    Ok(TensorInfo {
        name: t.name,
        dims: t.dims,
        ggml_type: t.ggml_type,
        offset: t.offset,
        n_elements: t.n_elements,
        data,
    })
}

fn check_overlaps(tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes() > 0).collect();
    order.sort_by_key(|t| (t.data.start, t.data.end));
    for w in order.windows(2) {
        if let [a, b] = w
            && b.data.start < a.data.end
        {
            return Err(GgufError::Overlap {
                first: a.name.clone(),
                first_start: a.data.start,
                first_end: a.data.end,
                second: b.name.clone(),
                second_start: b.data.start,
                second_end: b.data.end,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::build::GgufImage;
    use proptest::prelude::*;

    fn small() -> Vec<u8> {
        let mut g = GgufImage::new();
        g.kv("a.b", Value::U32(1));
        g.tensor("t", &[32, 2], GgmlType::Q8_0, &[0; 68]);
        g.to_bytes()
    }

    #[test]
    fn a_small_file_parses_with_its_layout() {
        let g = parse(&small()).unwrap();
        let t = g.tensor("t").unwrap();
        assert_eq!(t.shape(), [2, 32]);
        assert_eq!((t.n_elements, t.n_bytes()), (64, 68));
        assert_eq!(t.data.start, g.data_start);
        assert!(g.data_start.is_multiple_of(DEFAULT_ALIGNMENT));
        assert_eq!(g.metadata.get_u32("a.b").unwrap(), 1);
    }

    #[test]
    fn the_cursor_names_what_it_was_reading() {
        let mut c = Cursor::new(&[1, 2]);
        let e = c.u32(|| "the version".into()).unwrap_err().to_string();
        assert_eq!(e, "truncated at offset 0: the version needs 4 bytes, 2 left");
        let e = c
            .check_count(|| "tensor".into(), u64::MAX, 33)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("tensor count 18446744073709551615 at offset 0"),
            "{e}"
        );
    }

    proptest! {
        #[test]
        fn a_cut_or_edited_file_is_refused_or_laid_out_inside_itself(
            cut in 0usize..400, at in 0usize..400, v in any::<u8>()
        ) {
            let mut b = small();
            let n = b.len();
            b[at % n] = v;
            b.truncate(cut.min(n));
            if let Ok(g) = parse(&b) {
                for t in &g.tensors {
                    prop_assert!(t.data.end <= b.len() as u64);
                }
            }
        }
    }
}
