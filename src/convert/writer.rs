//! The streaming container writer.
//!
//! The safetensors crate's serializer wants every tensor in memory and
//! orders tensors itself; a container must be written one tensor at a time in
//! a chosen order with chosen alignment. So the layout (every offset) is
//! computed from the plan first, the header written, then each job's data
//! produced and appended in turn, its length checked against the layout.

use std::io::Write;

use safetensors::Dtype;

use super::plan::{Entry, Job};

/// Alignment of the data section and of every expert's first byte.
pub const ALIGN: u64 = 4096;

/// Where each job goes: padding before it, then its entries.
pub(crate) struct Layout {
    /// The 8-byte length and the header JSON, padded with spaces so the
    /// data section starts on an [`ALIGN`] boundary.
    pub header: Vec<u8>,
    /// Padding bytes written before job `i`.
    pub pad_before: Vec<u64>,
    /// Total data bytes after the header.
    pub data_len: u64,
}

fn dtype_name(d: Dtype) -> String {
    d.to_string()
}

/// Computes every offset and renders the header.
pub(crate) fn layout(jobs: &[Job], metadata: &[(&str, String)]) -> Layout {
    let mut json = String::from("{\"__metadata__\":{");
    for (i, (k, v)) in metadata.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        json.push_str(&serde_json::Value::from(*k).to_string());
        json.push(':');
        json.push_str(&serde_json::Value::from(v.as_str()).to_string());
    }
    json.push('}');
    let mut at = 0u64;
    let mut pads = 0usize;
    let mut pad_before = Vec::with_capacity(jobs.len());
    let push = |json: &mut String, e: &Entry, at: &mut u64| {
        let shape: Vec<String> = e.shape.iter().map(usize::to_string).collect();
        json.push_str(&format!(
            ",{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            serde_json::Value::from(e.name.as_str()),
            dtype_name(e.dtype),
            shape.join(","),
            *at,
            *at + e.len
        ));
        *at += e.len;
    };
    for job in jobs {
        let pad = if job.align {
            at.next_multiple_of(ALIGN) - at
        } else {
            0
        };
        if pad > 0 {
            let e = Entry {
                name: format!("{}{pads}", crate::st::PAD_PREFIX),
                dtype: Dtype::U8,
                shape: vec![pad as usize],
                len: pad,
            };
            pads += 1;
            push(&mut json, &e, &mut at);
        }
        pad_before.push(pad);
        for e in job.entries() {
            push(&mut json, &e, &mut at);
        }
    }
    json.push('}');
    let n = (8 + json.len() as u64).next_multiple_of(ALIGN) - 8;
    let mut header = n.to_le_bytes().to_vec();
    header.extend_from_slice(json.as_bytes());
    header.resize(8 + n as usize, b' ');
    Layout {
        header,
        pad_before,
        data_len: at,
    }
}

/// A writer that counts what passes through, so each job's output can be
/// checked against the layout.
pub(crate) struct Counting<W> {
    pub inner: W,
    pub written: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes f32 values little-endian through a small reusable buffer.
pub(crate) fn write_f32s<W: Write>(w: &mut W, values: &[f32]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(64 * 1024);
    for chunk in values.chunks(16 * 1024) {
        buf.clear();
        for v in chunk {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        w.write_all(&buf)?;
    }
    Ok(())
}

/// Writes `n` zero bytes.
pub(crate) fn write_zeros<W: Write>(w: &mut W, mut n: u64) -> std::io::Result<()> {
    let zeros = [0u8; 4096];
    while n > 0 {
        let k = n.min(zeros.len() as u64) as usize;
        w.write_all(&zeros[..k])?;
        n -= k as u64;
    }
    Ok(())
}
