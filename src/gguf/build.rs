//! Small GGUF images assembled in memory, for the tests and the fuzzer's
//! seeds. Fields are written exactly as given and nothing is validated, so
//! the same builder writes the well-formed files the reader must accept
//! and the malformed ones it must refuse.

use super::header::{DEFAULT_ALIGNMENT, MAGIC};
use super::types::GgmlType;
use super::value::{Array, Value};

/// One tensor info as it will be written.
#[derive(Clone, Debug)]
pub struct ImageTensor {
    pub name: Vec<u8>,
    /// ggml order (`dims[0]` innermost).
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// Relative to the data section.
    pub offset: u64,
}

/// A GGUF file, field by field.
#[derive(Clone, Debug)]
pub struct GgufImage {
    pub magic: [u8; 4],
    pub version: u32,
    /// Written instead of the real tensor count when set.
    pub tensor_count: Option<u64>,
    /// Written instead of the real metadata count when set.
    pub kv_count: Option<u64>,
    /// Key bytes, value type id, encoded value.
    pub kvs: Vec<(Vec<u8>, u32, Vec<u8>)>,
    pub tensors: Vec<ImageTensor>,
    /// The data section starts at the next multiple of this.
    pub alignment: u64,
    pub data: Vec<u8>,
}

impl Default for GgufImage {
    fn default() -> Self {
        Self {
            magic: *MAGIC,
            version: 3,
            tensor_count: None,
            kv_count: None,
            kvs: Vec::new(),
            tensors: Vec::new(),
            alignment: DEFAULT_ALIGNMENT,
            data: Vec::new(),
        }
    }
}

impl GgufImage {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        self.kvs.push((
            key.as_bytes().to_vec(),
            value.value_type().id(),
            encode_value(&value),
        ));
        self
    }

    /// Appends a tensor whose data follows the previous one's at the next
    /// aligned offset.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ggml_type: GgmlType, bytes: &[u8]) -> &mut Self {
        let offset = (self.data.len() as u64).next_multiple_of(self.alignment.max(1));
        self.data.resize(offset as usize, 0);
        self.data.extend_from_slice(bytes);
        self.tensors.push(ImageTensor {
            name: name.as_bytes().to_vec(),
            dims: dims.to_vec(),
            ggml_type: ggml_type.id(),
            offset,
        });
        self
    }

    /// Offset where the tensor infos start (after header and metadata).
    pub fn tensor_infos_start(&self) -> usize {
        4 + 4
            + 8
            + 8
            + self
                .kvs
                .iter()
                .map(|(k, _, v)| 8 + k.len() + 4 + v.len())
                .sum::<usize>()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.magic);
        out.extend_from_slice(&self.version.to_le_bytes());
        let nt = self.tensor_count.unwrap_or(self.tensors.len() as u64);
        out.extend_from_slice(&nt.to_le_bytes());
        let nk = self.kv_count.unwrap_or(self.kvs.len() as u64);
        out.extend_from_slice(&nk.to_le_bytes());
        for (k, t, v) in &self.kvs {
            put_bytes(&mut out, k);
            out.extend_from_slice(&t.to_le_bytes());
            out.extend_from_slice(v);
        }
        for t in &self.tensors {
            put_bytes(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.to_le_bytes());
            out.extend_from_slice(&t.offset.to_le_bytes());
        }
        let start = (out.len() as u64).next_multiple_of(self.alignment.max(1));
        out.resize(start as usize, 0);
        out.extend_from_slice(&self.data);
        out
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

/// A value's bytes as they follow its type id.
pub fn encode_value(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_bytes(&mut out, s.as_bytes()),
        Value::Array(a) => encode_array(&mut out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
    out
}

fn encode_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.element_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&b| b as u8)),
        Array::String(v) => {
            for s in v {
                put_bytes(out, s.as_bytes());
            }
        }
        Array::Array(v) => {
            for inner in v {
                encode_array(out, inner);
            }
        }
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
    }
}
