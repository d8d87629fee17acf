//! A small GGUF writer (version 3 by default, 2 on request): for tests (valid,
//! corrupt and truncated files) and for synthetic models.
//!
//! Metadata is written in the order given (with `general.alignment` first
//! when a non-default alignment was set and the key was not given
//! explicitly). Tensor data is placed in the order given, each tensor at the
//! next aligned offset; there is no padding after the last tensor, so the
//! file ends exactly at the end of the last tensor's data.
//!
//! The writer does not validate: it writes what it is given (data of any
//! length, any type id), which is what corruption tests need.

use std::path::Path;

use super::gguf::{Value, DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_TYPE_U8};
use crate::quant::DType;

struct TensorEntry {
    name: String,
    ne: Vec<u64>,
    ggml_type: u32,
    data: Vec<u8>,
    /// Byte length of a tensor whose data is produced at write time
    /// ([`GgufWriter::write_streamed`]); `None` when `data` holds it.
    streamed: Option<u64>,
}

/// Builds a GGUF file in memory.
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    kvs: Vec<(String, Value)>,
    tensors: Vec<TensorEntry>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file with alignment 32.
    pub fn new() -> Self {
        GgufWriter { version: 3, alignment: DEFAULT_ALIGNMENT, kvs: Vec::new(), tensors: Vec::new() }
    }

    /// The version number written into the header (2 and 3 share one layout;
    /// other numbers are for tests of the reader's rejection).
    pub fn version(&mut self, v: u32) {
        self.version = v;
    }

    /// Alignment of the data section and tensor offsets (a power of two);
    /// also writes `general.alignment` (U32) when it is not 32.
    pub fn alignment(&mut self, a: u64) {
        self.alignment = a;
    }

    /// Add a metadata entry (no check for duplicates: tests need those too).
    pub fn kv(&mut self, key: &str, v: Value) {
        self.kvs.push((key.to_string(), v));
    }

    /// Add a tensor of a supported type; `ne` in ggml order (`ne[0]` = row length).
    pub fn tensor(&mut self, name: &str, ne: &[u64], dtype: DType, data: Vec<u8>) {
        self.tensor_raw(name, ne, dtype.ggml_id(), data);
    }

    /// Add a tensor with any ggml type id (unsupported or unknown types).
    pub fn tensor_raw(&mut self, name: &str, ne: &[u64], ggml_type: u32, data: Vec<u8>) {
        self.tensors.push(TensorEntry { name: name.to_string(), ne: ne.to_vec(), ggml_type, data, streamed: None });
    }

    /// Add a tensor whose data is written later by [`Self::write_streamed`]'s
    /// callback (for files too large to hold in memory).
    pub fn tensor_streamed(&mut self, name: &str, ne: &[u64], dtype: DType) {
        let rows: u64 = ne.iter().skip(1).product();
        let row = dtype.row_bytes(ne[0] as usize).expect("row length must be a multiple of the block size") as u64;
        self.tensors.push(TensorEntry {
            name: name.to_string(),
            ne: ne.to_vec(),
            ggml_type: dtype.ggml_id(),
            data: Vec::new(),
            streamed: Some(rows * row),
        });
    }

    fn tensor_len(t: &TensorEntry) -> u64 {
        t.streamed.unwrap_or(t.data.len() as u64)
    }

    /// Writes the file to `path`; the data of tensor `i` added with
    /// [`Self::tensor_streamed`] comes from `fill(i, out)`, which must write
    /// exactly that tensor's byte length.
    pub fn write_streamed(
        &self,
        path: &Path,
        mut fill: impl FnMut(usize, &mut dyn std::io::Write) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        use std::io::Write;
        let (header, offsets) = self.header();
        let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        f.write_all(&header)?;
        let mut pos = 0u64;
        for (i, (t, off)) in self.tensors.iter().zip(&offsets).enumerate() {
            f.write_all(&vec![0u8; (off - pos) as usize])?;
            match t.streamed {
                Some(len) => {
                    let mut c = Counting { inner: &mut f, n: 0 };
                    fill(i, &mut c)?;
                    if c.n != len {
                        return Err(std::io::Error::other(format!(
                            "tensor {}: wrote {} bytes, expected {len}",
                            t.name, c.n
                        )));
                    }
                }
                None => f.write_all(&t.data)?,
            }
            pos = off + Self::tensor_len(t);
        }
        f.flush()
    }

    /// The header of a file whose tensors were all added with [`Self::tensor_streamed`],
    /// and each tensor's (absolute byte offset, length) in that file: a caller that
    /// builds the file in memory copies the header to offset 0 and fills each range
    /// (the gaps between ranges are alignment padding, zero).
    pub fn streamed_layout(&self) -> (Vec<u8>, Vec<(u64, u64)>) {
        let (header, offsets) = self.header();
        let start = header.len() as u64;
        let ranges = self.tensors.iter().zip(&offsets).map(|(t, off)| (start + off, Self::tensor_len(t))).collect();
        (header, ranges)
    }

    fn effective_alignment(&self) -> u64 {
        if self.alignment == 0 {
            1
        } else {
            self.alignment
        }
    }

    /// The file's bytes.
    ///
    /// # Panics
    /// If an array mixes element types (GGUF arrays are homogeneous).
    pub fn to_bytes(&self) -> Vec<u8> {
        let (mut out, offsets) = self.header();
        let data_start = out.len() as u64;
        for (t, off) in self.tensors.iter().zip(&offsets) {
            out.resize((data_start + off) as usize, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }

    /// Header bytes (through the padding before the data section) and each
    /// tensor's offset inside the data section.
    fn header(&self) -> (Vec<u8>, Vec<u64>) {
        let align = self.effective_alignment();
        let mut kvs: Vec<(&str, Value)> = Vec::with_capacity(self.kvs.len() + 1);
        if self.alignment != DEFAULT_ALIGNMENT && !self.kvs.iter().any(|(k, _)| k == "general.alignment") {
            kvs.push(("general.alignment", Value::U32(self.alignment as u32)));
        }
        kvs.extend(self.kvs.iter().map(|(k, v)| (k.as_str(), v.clone())));

        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
        for (k, v) in &kvs {
            put_str(&mut out, k);
            out.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut out, v);
        }

        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            offsets.push(offset);
            offset = (offset + Self::tensor_len(t)).next_multiple_of(align);
        }
        for (t, off) in self.tensors.iter().zip(&offsets) {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.to_le_bytes());
            out.extend_from_slice(&off.to_le_bytes());
        }
        if !self.tensors.is_empty() {
            pad(&mut out, align);
        }
        (out, offsets)
    }

    /// Write the file.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_bytes())
    }
}

struct Counting<'a, W: std::io::Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: std::io::Write> std::io::Write for Counting<'_, W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(b)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn pad(out: &mut Vec<u8>, align: u64) {
    let len = (out.len() as u64).next_multiple_of(align);
    out.resize(len as usize, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::Str(s) => put_str(out, s),
        Value::Array(a) => {
            // An empty array is written with element type U8.
            let et = a.first().map_or(GGUF_TYPE_U8, |e| e.type_id());
            out.extend_from_slice(&et.to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for e in a {
                assert_eq!(e.type_id(), et, "GGUF arrays are homogeneous: {:?} in an array of type {}", e, et);
                put_value(out, e);
            }
        }
    }
}
