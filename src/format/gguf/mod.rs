//! GGUF reader (versions 2 and 3) over a read-only memory map.
//!
//! Layout (little-endian; <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>):
//! magic "GGUF", u32 version, u64 tensor count, u64 metadata count, the
//! metadata key/value pairs, the tensor infos, padding to `general.alignment`
//! (default 32), then the data section; tensor offsets are relative to it.
//!
//! Nothing in the file is trusted: every count and length is checked against
//! the bytes that remain before anything is allocated, all arithmetic is
//! checked, and every failure is an [`Error`] (never a panic) that names the
//! file, the byte offset and what was expected there.
//!
//! Strings: metadata keys and tensor names must be valid UTF-8 (BAD_MODEL
//! otherwise); string *values* are decoded lossily (invalid sequences become
//! U+FFFD), because some converters have written raw bytes into vocabularies
//! and refusing the whole file over one token would be unhelpful.
//!
//! Limits beyond the spec, to bound memory on hostile input: nested arrays at
//! most [`MAX_ARRAY_DEPTH`] deep, at most [`MAX_ARRAY_ELEMS`] array elements
//! in the whole file.
//!
//! Memory: metadata arrays are not copied. A parsed array is a view of the file's
//! bytes ([`ArrayRef`]): elements of fixed size are decoded from the mapping when
//! read; for arrays of strings and of arrays the parser keeps one file offset per
//! element (8 bytes, no more than the element's own encoding) in one index
//! shared by the file (nested arrays: the offset of the sub-array and where its own
//! entries start). So what a parsed file holds beyond its bytes is at most about
//! the size of its metadata, whatever the element count (the generic value per
//! element this replaced cost 32 bytes each: a 16 MiB U8 array held 512 MiB).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use super::FileBytes;

use crate::error::{Error, Result};
use crate::quant::{ggml_type_info, DType};

/// "GGUF" read as a little-endian u32.
pub(crate) const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and tensor offsets when `general.alignment` is absent.
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of arrays accepted (an array of arrays is depth 2).
pub(crate) const MAX_ARRAY_DEPTH: usize = 8;
/// Most array elements (all arrays, all depths) accepted in one file.
pub(crate) const MAX_ARRAY_ELEMS: u64 = 1 << 26;
/// Most dimensions of a tensor.
pub(crate) const MAX_DIMS: u32 = 4;

// GGUF metadata value type ids.
pub(crate) const GGUF_TYPE_U8: u32 = 0;
pub(crate) const GGUF_TYPE_I8: u32 = 1;
pub(crate) const GGUF_TYPE_U16: u32 = 2;
pub(crate) const GGUF_TYPE_I16: u32 = 3;
pub(crate) const GGUF_TYPE_U32: u32 = 4;
pub(crate) const GGUF_TYPE_I32: u32 = 5;
pub(crate) const GGUF_TYPE_F32: u32 = 6;
pub(crate) const GGUF_TYPE_BOOL: u32 = 7;
pub(crate) const GGUF_TYPE_STRING: u32 = 8;
pub(crate) const GGUF_TYPE_ARRAY: u32 = 9;
pub(crate) const GGUF_TYPE_U64: u32 = 10;
pub(crate) const GGUF_TYPE_I64: u32 = 11;
pub(crate) const GGUF_TYPE_F64: u32 = 12;

/// An owned metadata value: what the writer ([`crate::format::gguf_write`]) takes,
/// and what [`ValueRef::to_value`] / [`Gguf::metadata`] copy a parsed value into.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The GGUF value type id.
    pub fn type_id(&self) -> u32 {
        ValueRef::scalar(self).type_id()
    }

    /// The type's name, e.g. "U32", "ARRAY".
    pub fn type_name(&self) -> &'static str {
        value_type_name(self.type_id()).unwrap_or("?")
    }

    /// The value as a u64 if it is an integer >= 0.
    pub fn as_u64(&self) -> Option<u64> {
        ValueRef::scalar(self).as_u64()
    }
}

/// Name of a GGUF value type id.
pub(crate) fn value_type_name(t: u32) -> Option<&'static str> {
    Some(match t {
        GGUF_TYPE_U8 => "U8",
        GGUF_TYPE_I8 => "I8",
        GGUF_TYPE_U16 => "U16",
        GGUF_TYPE_I16 => "I16",
        GGUF_TYPE_U32 => "U32",
        GGUF_TYPE_I32 => "I32",
        GGUF_TYPE_F32 => "F32",
        GGUF_TYPE_BOOL => "BOOL",
        GGUF_TYPE_STRING => "STRING",
        GGUF_TYPE_ARRAY => "ARRAY",
        GGUF_TYPE_U64 => "U64",
        GGUF_TYPE_I64 => "I64",
        GGUF_TYPE_F64 => "F64",
        _ => return None,
    })
}

/// Smallest encoding of a value of type `t` (None for unknown types).
fn min_value_size(t: u32) -> Option<u64> {
    Some(match t {
        GGUF_TYPE_U8 | GGUF_TYPE_I8 | GGUF_TYPE_BOOL => 1,
        GGUF_TYPE_U16 | GGUF_TYPE_I16 => 2,
        GGUF_TYPE_U32 | GGUF_TYPE_I32 | GGUF_TYPE_F32 => 4,
        GGUF_TYPE_U64 | GGUF_TYPE_I64 | GGUF_TYPE_F64 => 8,
        GGUF_TYPE_STRING => 8,    // u64 length
        GGUF_TYPE_ARRAY => 4 + 8, // element type + u64 count
        _ => return None,
    })
}

/// One tensor's header entry, validated against the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `ne[0]` is the row length (contiguous).
    pub ne: Vec<u64>,
    /// The ggml type id as stored.
    pub ggml_type: u32,
    /// The type, when this runtime supports it.
    pub dtype: Option<DType>,
    /// Absolute file offset of the data.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements (validated not to overflow at open).
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// The ggml type's name ("Q4_K", ...), or "?" (cannot happen for a parsed file).
    pub fn type_name(&self) -> &'static str {
        ggml_type_info(self.ggml_type).map(|t| t.0).unwrap_or("?")
    }
}

enum Backing {
    File(FileBytes),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::File(f) => f.bytes(),
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed metadata value, borrowed from its file: scalars by value, strings as
/// text (borrowed when the bytes are valid UTF-8, else decoded lossily), arrays as
/// views of the file's bytes.
#[derive(Clone, Debug)]
pub enum ValueRef<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(Cow<'a, str>),
    Array(ArrayRef<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> ValueRef<'a> {
    fn scalar(v: &'a Value) -> ValueRef<'a> {
        match v {
            Value::U8(x) => ValueRef::U8(*x),
            Value::I8(x) => ValueRef::I8(*x),
            Value::U16(x) => ValueRef::U16(*x),
            Value::I16(x) => ValueRef::I16(*x),
            Value::U32(x) => ValueRef::U32(*x),
            Value::I32(x) => ValueRef::I32(*x),
            Value::F32(x) => ValueRef::F32(*x),
            Value::Bool(x) => ValueRef::Bool(*x),
            Value::Str(x) => ValueRef::Str(Cow::Borrowed(x)),
            Value::U64(x) => ValueRef::U64(*x),
            Value::I64(x) => ValueRef::I64(*x),
            Value::F64(x) => ValueRef::F64(*x),
            // Never stored: parsed arrays are views (an owned array only ever asks
            // this for its type, which the empty view shares).
            Value::Array(_) => ValueRef::Array(ArrayRef::EMPTY),
        }
    }

    /// The GGUF value type id.
    pub fn type_id(&self) -> u32 {
        match self {
            ValueRef::U8(_) => GGUF_TYPE_U8,
            ValueRef::I8(_) => GGUF_TYPE_I8,
            ValueRef::U16(_) => GGUF_TYPE_U16,
            ValueRef::I16(_) => GGUF_TYPE_I16,
            ValueRef::U32(_) => GGUF_TYPE_U32,
            ValueRef::I32(_) => GGUF_TYPE_I32,
            ValueRef::F32(_) => GGUF_TYPE_F32,
            ValueRef::Bool(_) => GGUF_TYPE_BOOL,
            ValueRef::Str(_) => GGUF_TYPE_STRING,
            ValueRef::Array(_) => GGUF_TYPE_ARRAY,
            ValueRef::U64(_) => GGUF_TYPE_U64,
            ValueRef::I64(_) => GGUF_TYPE_I64,
            ValueRef::F64(_) => GGUF_TYPE_F64,
        }
    }

    /// The type's name, e.g. "U32", "ARRAY".
    pub fn type_name(&self) -> &'static str {
        value_type_name(self.type_id()).unwrap_or("?")
    }

    /// The value as a u64 if it is an integer >= 0.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            ValueRef::U8(v) => Some(v as u64),
            ValueRef::U16(v) => Some(v as u64),
            ValueRef::U32(v) => Some(v as u64),
            ValueRef::U64(v) => Some(v),
            ValueRef::I8(v) => u64::try_from(v).ok(),
            ValueRef::I16(v) => u64::try_from(v).ok(),
            ValueRef::I32(v) => u64::try_from(v).ok(),
            ValueRef::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as an i64 if it is an integer in i64's range.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            ValueRef::U8(v) => Some(v as i64),
            ValueRef::U16(v) => Some(v as i64),
            ValueRef::U32(v) => Some(v as i64),
            ValueRef::U64(v) => i64::try_from(v).ok(),
            ValueRef::I8(v) => Some(v as i64),
            ValueRef::I16(v) => Some(v as i64),
            ValueRef::I32(v) => Some(v as i64),
            ValueRef::I64(v) => Some(v),
            _ => None,
        }
    }

    fn is_int(&self) -> bool {
        self.as_i64().is_some() || matches!(self, ValueRef::U64(_))
    }

    /// A short description for error messages: type and (for scalars) value.
    pub fn describe(&self) -> String {
        match self {
            ValueRef::Str(s) if s.len() > 40 => format!("STRING of {} bytes", s.len()),
            ValueRef::Str(s) => format!("STRING {s:?}"),
            ValueRef::Array(a) => format!("ARRAY of {} elements", a.len()),
            ValueRef::U8(v) => format!("U8 {v}"),
            ValueRef::I8(v) => format!("I8 {v}"),
            ValueRef::U16(v) => format!("U16 {v}"),
            ValueRef::I16(v) => format!("I16 {v}"),
            ValueRef::U32(v) => format!("U32 {v}"),
            ValueRef::I32(v) => format!("I32 {v}"),
            ValueRef::U64(v) => format!("U64 {v}"),
            ValueRef::I64(v) => format!("I64 {v}"),
            ValueRef::F32(v) => format!("F32 {v}"),
            ValueRef::F64(v) => format!("F64 {v}"),
            ValueRef::Bool(v) => format!("BOOL {v}"),
        }
    }

    /// An owned copy (arrays copied element by element: 32 bytes each, so only for
    /// values known to be small, e.g. in tests or when rewriting a file).
    pub fn to_value(&self) -> Value {
        match self {
            ValueRef::U8(x) => Value::U8(*x),
            ValueRef::I8(x) => Value::I8(*x),
            ValueRef::U16(x) => Value::U16(*x),
            ValueRef::I16(x) => Value::I16(*x),
            ValueRef::U32(x) => Value::U32(*x),
            ValueRef::I32(x) => Value::I32(*x),
            ValueRef::F32(x) => Value::F32(*x),
            ValueRef::Bool(x) => Value::Bool(*x),
            ValueRef::Str(x) => Value::Str(x.to_string()),
            ValueRef::Array(a) => Value::Array(a.iter().map(|v| v.to_value()).collect()),
            ValueRef::U64(x) => Value::U64(*x),
            ValueRef::I64(x) => Value::I64(*x),
            ValueRef::F64(x) => Value::F64(*x),
        }
    }
}

/// A metadata array as a view of the file: element type, count and where its
/// elements are; elements are decoded when read (validated at parse, so reading
/// never fails; a view that does not come from a parse reads as empty).
#[derive(Clone, Copy, Debug)]
pub struct ArrayRef<'a> {
    et: u32,
    n: usize,
    /// The whole file.
    file: &'a [u8],
    /// Offset of the first element (fixed-size element types).
    at: usize,
    /// The file's element index (string and array element types).
    index: &'a [u64],
    /// Where this array's entries start in `index`.
    start: usize,
}

impl<'a> ArrayRef<'a> {
    const EMPTY: ArrayRef<'static> = ArrayRef { et: GGUF_TYPE_U8, n: 0, file: &[], at: 0, index: &[], start: 0 };

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The GGUF type id of the elements.
    pub fn elem_type(&self) -> u32 {
        self.et
    }

    /// The elements' type name, e.g. "STRING".
    pub fn elem_type_name(&self) -> &'static str {
        value_type_name(self.et).unwrap_or("?")
    }

    fn bytes<const N: usize>(&self, off: usize) -> [u8; N] {
        let mut a = [0u8; N];
        if let Some(s) = off.checked_add(N).and_then(|e| self.file.get(off..e)) {
            a.copy_from_slice(s);
        }
        a
    }

    /// Element `i` (None past the end).
    pub fn get(&self, i: usize) -> Option<ValueRef<'a>> {
        if i >= self.n {
            return None;
        }
        let size = fixed_size(self.et);
        let off = self.at.wrapping_add(i.wrapping_mul(size));
        Some(match self.et {
            GGUF_TYPE_U8 => ValueRef::U8(u8::from_le_bytes(self.bytes(off))),
            GGUF_TYPE_I8 => ValueRef::I8(i8::from_le_bytes(self.bytes(off))),
            GGUF_TYPE_U16 => ValueRef::U16(u16::from_le_bytes(self.bytes(off))),
            GGUF_TYPE_I16 => ValueRef::I16(i16::from_le_bytes(self.bytes(off))),
            GGUF_TYPE_U32 => ValueRef::U32(u32::from_le_bytes(self.bytes(off))),
            GGUF_TYPE_I32 => ValueRef::I32(i32::from_le_bytes(self.bytes(off))),
            GGUF_TYPE_F32 => ValueRef::F32(f32::from_le_bytes(self.bytes(off))),
            GGUF_TYPE_U64 => ValueRef::U64(u64::from_le_bytes(self.bytes(off))),
            GGUF_TYPE_I64 => ValueRef::I64(i64::from_le_bytes(self.bytes(off))),
            GGUF_TYPE_F64 => ValueRef::F64(f64::from_le_bytes(self.bytes(off))),
            GGUF_TYPE_BOOL => ValueRef::Bool(self.bytes::<1>(off)[0] != 0),
            GGUF_TYPE_STRING => {
                let o = self.index.get(self.start.wrapping_add(i)).copied().unwrap_or(u64::MAX) as usize;
                ValueRef::Str(String::from_utf8_lossy(str_at(self.file, o)))
            }
            GGUF_TYPE_ARRAY => {
                let k = self.start.wrapping_add(2 * i);
                let o = self.index.get(k).copied().unwrap_or(u64::MAX) as usize;
                let start = self.index.get(k + 1).copied().unwrap_or(0) as usize;
                let et = u32::from_le_bytes(self.bytes(o));
                let n = u64::from_le_bytes(self.bytes(o.wrapping_add(4))) as usize;
                ValueRef::Array(ArrayRef { et, n, file: self.file, at: o.wrapping_add(12), index: self.index, start })
            }
            _ => return None,
        })
    }

    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = ValueRef<'a>> + '_ {
        (0..self.n).map_while(|i| self.get(i))
    }
}

/// The bytes of the length-prefixed string at `off` of `file` (validated at parse;
/// empty if not).
fn str_at(file: &[u8], off: usize) -> &[u8] {
    let len = off.checked_add(8).and_then(|e| file.get(off..e)).map(|b| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_le_bytes(a)
    });
    let body = off.checked_add(8);
    match (len, body) {
        (Some(len), Some(b)) => usize::try_from(len).ok().and_then(|n| b.checked_add(n)).and_then(|e| file.get(b..e)),
        _ => None,
    }
    .unwrap_or(&[])
}

/// Encoded size of a fixed-size element type (0 for strings and arrays).
fn fixed_size(t: u32) -> usize {
    match t {
        GGUF_TYPE_U8 | GGUF_TYPE_I8 | GGUF_TYPE_BOOL => 1,
        GGUF_TYPE_U16 | GGUF_TYPE_I16 => 2,
        GGUF_TYPE_U32 | GGUF_TYPE_I32 | GGUF_TYPE_F32 => 4,
        GGUF_TYPE_U64 | GGUF_TYPE_I64 | GGUF_TYPE_F64 => 8,
        _ => 0,
    }
}

/// A parsed array: where it is (see [`ArrayRef`]).
#[derive(Clone, Copy, Debug)]
struct ArrayAt {
    et: u32,
    n: usize,
    at: usize,
    start: usize,
}

/// A parsed metadata value as stored: a scalar (never `Value::Array`) or an array view.
#[derive(Clone, Debug)]
enum Stored {
    Scalar(Value),
    Array(ArrayAt),
}

/// A parsed GGUF file; tensor data stays in the mapping, metadata arrays too.
pub struct Gguf {
    pub path: PathBuf,
    pub version: u32,
    pub alignment: u64,
    metadata: Vec<(String, Stored)>,
    /// Element offsets of string and array arrays (see [`ArrayRef`]).
    index: Vec<u64>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset of the data section.
    pub data_start: u64,
    backing: Backing,
}

impl fmt::Debug for Gguf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("data_start", &self.data_start)
            .field("len", &self.bytes().len())
            .finish()
    }
}

impl Gguf {
    /// Open and map `path`, then parse and validate the header.
    ///
    /// Errors: LLMRT_IO for a missing/unreadable path, a directory or a
    /// non-regular file; LLMRT_BAD_MODEL for an empty, malformed, truncated or
    /// inconsistent file (the message names the file and the byte offset).
    pub fn open(path: &Path) -> Result<Gguf> {
        let shown = path.display();
        // Check the kind before opening: opening a FIFO would block.
        let meta = std::fs::metadata(path).map_err(|e| Error::io(format!("{shown}: {e}")))?;
        check_regular(path, &meta)?;
        let file = File::open(path).map_err(|e| Error::io(format!("{shown}: cannot open: {e}")))?;
        // Again on the handle, in case the path changed in between.
        let meta = file.metadata().map_err(|e| Error::io(format!("{shown}: cannot stat: {e}")))?;
        check_regular(path, &meta)?;
        if meta.len() == 0 {
            return Err(Error::bad_model(format!(
                "{shown}: empty file (0 bytes; expected the GGUF magic at offset 0)"
            )));
        }
        // Mapped (or read, with LLMRT_LOAD_COPY=1); see FileBytes::open.
        let data = FileBytes::open(file, &meta, path)?;
        parse(Backing::File(data), path.to_path_buf())
    }

    /// Parse GGUF from owned memory (tests, fuzzing, generated models).
    /// `name` stands for the file name in error messages.
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<Gguf> {
        parse(Backing::Owned(bytes), PathBuf::from(name))
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// `LLMRT_IO` when the mapped file changed since open (see
    /// [`crate::format::WeightFile::check_unchanged`]).
    pub(crate) fn check_unchanged(&self) -> Result<()> {
        match &self.backing {
            Backing::File(f) => f.check_unchanged(&self.path),
            Backing::Owned(_) => Ok(()),
        }
    }

    /// See [`FileBytes::release`] (bytes relative to the start of the file).
    pub fn release(&self, offset: usize, len: usize) {
        if let Backing::File(f) = &self.backing {
            f.release(offset, len);
        }
    }

    fn view<'a>(&'a self, v: &'a Stored) -> ValueRef<'a> {
        match v {
            Stored::Scalar(v) => ValueRef::scalar(v),
            Stored::Array(a) => ValueRef::Array(ArrayRef {
                et: a.et,
                n: a.n,
                file: self.bytes(),
                at: a.at,
                index: &self.index,
                start: a.start,
            }),
        }
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<ValueRef<'_>> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| self.view(v))
    }

    /// Number of metadata entries.
    pub fn n_metadata(&self) -> usize {
        self.metadata.len()
    }

    /// The metadata keys in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.metadata.iter().map(|(k, _)| k.as_str())
    }

    /// The metadata entries in file order, as views.
    pub fn entries(&self) -> impl Iterator<Item = (&str, ValueRef<'_>)> + '_ {
        self.metadata.iter().map(|(k, v)| (k.as_str(), self.view(v)))
    }

    /// An owned copy of all metadata (32 bytes per array element: for tests and for
    /// rewriting small files, not for untrusted input of any size).
    pub fn metadata(&self) -> Vec<(String, Value)> {
        self.entries().map(|(k, v)| (k.to_string(), v.to_value())).collect()
    }

    fn wrong_type(&self, key: &str, v: &ValueRef<'_>, want: &str) -> Error {
        Error::bad_model(format!(
            "{}: metadata key '{}' is {}, expected {}",
            self.path.display(),
            key,
            v.describe(),
            want
        ))
    }

    fn scalar(&self, key: &str) -> Option<(&Value, ValueRef<'_>)> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| match v {
            Stored::Scalar(s) => (s, self.view(v)),
            Stored::Array(_) => (&NOT_SCALAR, self.view(v)),
        })
    }

    /// An integer value >= 0 of any integer type; `Ok(None)` when absent.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.wrong_type(key, &v, "a non-negative integer")),
        }
    }

    /// As [`Gguf::get_u64`], and the value must fit in u32.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, &v, "an integer in 0..=4294967295")),
        }
    }

    /// A float (F32, F64 narrowed to f32) or an integer converted to f32.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(ValueRef::F32(x)) => Ok(Some(x)),
            Some(ValueRef::F64(x)) => Ok(Some(x as f32)),
            Some(v @ (ValueRef::U64(_) | ValueRef::U32(_) | ValueRef::U16(_) | ValueRef::U8(_))) => {
                Ok(v.as_u64().map(|x| x as f32))
            }
            Some(ValueRef::I8(x)) => Ok(Some(x as f32)),
            Some(ValueRef::I16(x)) => Ok(Some(x as f32)),
            Some(ValueRef::I32(x)) => Ok(Some(x as f32)),
            Some(ValueRef::I64(x)) => Ok(Some(x as f32)),
            Some(v) => Err(self.wrong_type(key, &v, "a number")),
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.scalar(key) {
            None => Ok(None),
            Some((Value::Str(s), _)) => Ok(Some(s)),
            Some((_, v)) => Err(self.wrong_type(key, &v, "a STRING")),
        }
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(ValueRef::Bool(b)) => Ok(Some(b)),
            Some(v) => Err(self.wrong_type(key, &v, "a BOOL")),
        }
    }

    /// A tensor's info by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of a tensor of this file (its extent was validated at open).
    /// A `TensorInfo` that does not come from this file and lies outside it
    /// gives an empty slice rather than a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let b = self.bytes();
        let range = usize::try_from(t.offset)
            .ok()
            .and_then(|s| usize::try_from(t.size).ok().and_then(|n| s.checked_add(n)).map(|e| s..e));
        let out = range.and_then(|r| b.get(r));
        out.unwrap_or(&[])
    }
}

/// What [`Gguf::scalar`] answers for an array (never a string).
static NOT_SCALAR: Value = Value::Bool(false);

pub(crate) fn check_regular(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    if meta.is_dir() {
        return Err(Error::io(format!("{}: is a directory, not a model file", path.display())));
    }
    if !meta.is_file() {
        return Err(Error::io(format!("{}: not a regular file (device, FIFO or socket)", path.display())));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Parsing.

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    name: &'a str,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.b.len().saturating_sub(self.pos)
    }

    fn err(&self, at: usize, msg: impl fmt::Display) -> Error {
        Error::bad_model(format!("{}: {} (at offset {})", self.name, msg, at))
    }

    fn truncated(&self, need: impl fmt::Display, what: &dyn Fn() -> String) -> Error {
        Error::bad_model(format!(
            "{}: truncated at offset {} while reading {} (need {} bytes, {} left)",
            self.name,
            self.pos,
            what(),
            need,
            self.left()
        ))
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(self.truncated(n, what));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    /// Length-prefixed bytes; the length is checked against what is left.
    fn str_bytes(&mut self, what: &dyn Fn() -> String) -> Result<(usize, &'a [u8])> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        let at = self.pos;
        let n = match usize::try_from(len) {
            Ok(n) if n <= self.left() => n,
            _ => return Err(self.truncated(len, &|| format!("the {} bytes of {}", len, what()))),
        };
        Ok((at, self.take(n, what)?))
    }

    /// A string that must be UTF-8 (keys, tensor names).
    fn strict_str(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let (at, b) = self.str_bytes(what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.err(
                at + e.valid_up_to(),
                format_args!("{} is not valid UTF-8 (byte {} of it)", what(), e.valid_up_to()),
            )),
        }
    }

    /// A scalar value of type `t` (not an array).
    fn scalar(&mut self, t: u32, what: &dyn Fn() -> String) -> Result<Value> {
        Ok(match t {
            GGUF_TYPE_U8 => Value::U8(u8::from_le_bytes(self.arr(what)?)),
            GGUF_TYPE_I8 => Value::I8(i8::from_le_bytes(self.arr(what)?)),
            GGUF_TYPE_U16 => Value::U16(u16::from_le_bytes(self.arr(what)?)),
            GGUF_TYPE_I16 => Value::I16(i16::from_le_bytes(self.arr(what)?)),
            GGUF_TYPE_U32 => Value::U32(u32::from_le_bytes(self.arr(what)?)),
            GGUF_TYPE_I32 => Value::I32(i32::from_le_bytes(self.arr(what)?)),
            GGUF_TYPE_F32 => Value::F32(f32::from_le_bytes(self.arr(what)?)),
            GGUF_TYPE_U64 => Value::U64(u64::from_le_bytes(self.arr(what)?)),
            GGUF_TYPE_I64 => Value::I64(i64::from_le_bytes(self.arr(what)?)),
            GGUF_TYPE_F64 => Value::F64(f64::from_le_bytes(self.arr(what)?)),
            GGUF_TYPE_BOOL => {
                let at = self.pos;
                match self.arr::<1>(what)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    x => return Err(self.err(at, format_args!("{} is BOOL but holds {} (expected 0 or 1)", what(), x))),
                }
            }
            GGUF_TYPE_STRING => {
                let (_, b) = self.str_bytes(what)?;
                Value::Str(String::from_utf8_lossy(b).into_owned())
            }
            _ => return Err(self.err(self.pos, format_args!("{} has unknown value type id {}", what(), t))),
        })
    }

    /// Room for `n` more entries in the element index, or LLMRT_OUT_OF_MEMORY.
    fn index_room(&self, index: &mut Vec<u64>, n: usize, what: &dyn Fn() -> String) -> Result<()> {
        index.try_reserve(n).map_err(|_| {
            Error::out_of_memory(format!(
                "{}: cannot allocate the element index of {} ({} bytes)",
                self.name,
                what(),
                index.len().saturating_add(n).saturating_mul(8)
            ))
        })
    }

    /// An array (the reader is past its value type): validates every element and
    /// records where they are, copying nothing but one index entry per string or
    /// array element (two for an array: its offset and where its entries start).
    fn array(
        &mut self,
        depth: usize,
        budget: &mut u64,
        index: &mut Vec<u64>,
        what: &dyn Fn() -> String,
    ) -> Result<ArrayAt> {
        let at = self.pos;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(at, format_args!("{} nests arrays deeper than {} levels", what(), MAX_ARRAY_DEPTH)));
        }
        let et = self.u32(&|| format!("the element type of {}", what()))?;
        let min = match min_value_size(et) {
            Some(m) => m,
            None => return Err(self.err(at, format_args!("{} has unknown element type id {}", what(), et))),
        };
        let n = self.u64(&|| format!("the element count of {}", what()))?;
        let left = self.left() as u64;
        match n.checked_mul(min) {
            Some(need) if need <= left => {}
            _ => {
                return Err(self.truncated(format_args!("at least {} x {}", n, min), &|| {
                    format!("{} ({} elements of type {})", what(), n, value_type_name(et).unwrap_or("?"))
                }))
            }
        }
        if n > *budget {
            return Err(self.err(
                self.pos,
                format_args!(
                    "{} has {} elements; more than {} array elements in one file are not accepted",
                    what(),
                    n,
                    MAX_ARRAY_ELEMS
                ),
            ));
        }
        *budget -= n;
        // n <= left / min <= file length: fits in usize.
        let n = n as usize;
        let first = self.pos;
        let start = index.len();
        match et {
            GGUF_TYPE_STRING => {
                self.index_room(index, n, what)?;
                for i in 0..n {
                    index.push(self.pos as u64);
                    self.str_bytes(&|| format!("element {} of {}", i, what()))?;
                }
            }
            GGUF_TYPE_ARRAY => {
                self.index_room(index, 2 * n, what)?;
                index.resize(start + 2 * n, 0);
                for i in 0..n {
                    index[start + 2 * i] = self.pos as u64;
                    let sub = self.array(depth + 1, budget, index, &|| format!("element {} of {}", i, what()))?;
                    index[start + 2 * i + 1] = sub.start as u64;
                }
            }
            GGUF_TYPE_BOOL => {
                let b = self.take(n, what)?;
                if let Some(i) = b.iter().position(|&x| x > 1) {
                    return Err(self.err(
                        first + i,
                        format_args!("element {} of {} is BOOL but holds {} (expected 0 or 1)", i, what(), b[i]),
                    ));
                }
            }
            _ => {
                // Fixed size: n * min <= left was checked above.
                self.take(n * min as usize, what)?;
            }
        }
        Ok(ArrayAt { et, n, at: first, start })
    }
}

fn parse(backing: Backing, path: PathBuf) -> Result<Gguf> {
    let name_owned = path.display().to_string();
    let b = backing.bytes();
    let mut r = Reader { b, pos: 0, name: &name_owned };
    if b.is_empty() {
        return Err(Error::bad_model(format!(
            "{name_owned}: empty file (0 bytes; expected the GGUF magic at offset 0)"
        )));
    }

    // Header.
    let magic = r.arr::<4>(&|| "the GGUF magic".to_string())?;
    if magic != GGUF_MAGIC {
        return Err(r.err(
            0,
            format_args!(
                "not a GGUF file: expected magic \"GGUF\" (47 47 55 46), found {:02x} {:02x} {:02x} {:02x}",
                magic[0], magic[1], magic[2], magic[3]
            ),
        ));
    }
    let version = r.u32(&|| "the GGUF version".to_string())?;
    if version != 2 && version != 3 {
        return Err(r.err(4, format_args!("unsupported GGUF version {version} (versions 2 and 3 are supported)")));
    }
    let n_tensors = r.u64(&|| "the tensor count".to_string())?;
    let n_kv = r.u64(&|| "the metadata key/value count".to_string())?;

    // Each kv needs >= 8 + 4 + 1 bytes, each tensor info >= 8 + 4 + 8 + 4 + 8.
    // Counts that cannot fit in the file are not rejected here: parsing stops
    // at the first read past the end (each entry consumes bytes, so that is
    // quick), which names the exact spot; the error then also says what the
    // counts would have needed. Capacities are capped by what can fit.
    const MIN_KV: u64 = 13;
    const MIN_TENSOR: u64 = 32;
    let left = r.left() as u64;
    let need = n_kv.checked_mul(MIN_KV).and_then(|a| n_tensors.checked_mul(MIN_TENSOR).and_then(|c| a.checked_add(c)));
    let note = match need {
        Some(need) if need <= left => None,
        _ => Some(format!(
            "; the header claims {n_kv} metadata entries and {n_tensors} tensors, which need at least \
             {n_kv} x {MIN_KV} + {n_tensors} x {MIN_TENSOR} bytes, but only {left} follow the header"
        )),
    };
    let kv_cap = n_kv.min(left / MIN_KV) as usize;
    let tensor_cap = n_tensors.min(left / MIN_TENSOR) as usize;
    let body = parse_body(&mut r, n_kv, n_tensors, kv_cap, tensor_cap);
    let (metadata, index, alignment, tensors, data_start) = match (body, note) {
        (Ok(b), _) => b,
        (Err(e), None) => return Err(e),
        (Err(mut e), Some(note)) => {
            e.message.push_str(&note);
            return Err(e);
        }
    };
    Ok(Gguf { path, version, alignment, metadata, index, tensors, data_start, backing })
}

type Body = (Vec<(String, Stored)>, Vec<u64>, u64, Vec<TensorInfo>, u64);

fn parse_body(r: &mut Reader<'_>, n_kv: u64, n_tensors: u64, kv_cap: usize, tensor_cap: usize) -> Result<Body> {
    let name_owned = r.name;
    let b = r.b;
    // Metadata.
    let mut budget = MAX_ARRAY_ELEMS;
    let mut metadata: Vec<(String, Stored)> = Vec::with_capacity(kv_cap);
    let mut index: Vec<u64> = Vec::new();
    let mut keys: HashSet<String> = HashSet::with_capacity(kv_cap);
    for i in 0..n_kv {
        let key_at = r.pos + 8;
        let key = r.strict_str(&|| format!("metadata key #{i}"))?;
        if keys.contains(&key) {
            return Err(r.err(key_at, format_args!("duplicate metadata key '{key}' (entry #{i})")));
        }
        let ty = r.u32(&|| format!("the value type of metadata key #{i} '{key}'"))?;
        let what = || format!("the value of metadata key #{i} '{key}'");
        let value = if ty == GGUF_TYPE_ARRAY {
            Stored::Array(r.array(0, &mut budget, &mut index, &what)?)
        } else {
            Stored::Scalar(r.scalar(ty, &what)?)
        };
        keys.insert(key.clone());
        metadata.push((key, value));
    }

    // Alignment.
    let mut alignment = DEFAULT_ALIGNMENT;
    if let Some((_, v)) = metadata.iter().find(|(k, _)| k == "general.alignment") {
        let v = match v {
            Stored::Scalar(v) => ValueRef::scalar(v),
            Stored::Array(a) => ValueRef::Array(ArrayRef { n: a.n, ..ArrayRef::EMPTY }),
        };
        match v.as_u64() {
            Some(a) if a != 0 && a.is_power_of_two() => alignment = a,
            _ => {
                let what = if v.is_int() { "a nonzero power of two" } else { "an integer (U32)" };
                return Err(Error::bad_model(format!(
                    "{name_owned}: metadata key 'general.alignment' is {}, expected {what}",
                    v.describe()
                )));
            }
        }
    }

    // Tensor infos.
    struct Raw {
        offset_at: usize,
        rel_offset: u64,
    }
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(tensor_cap);
    let mut raws: Vec<Raw> = Vec::with_capacity(tensor_cap);
    let mut names: HashSet<String> = HashSet::with_capacity(tensor_cap);
    for i in 0..n_tensors {
        let name_at = r.pos + 8;
        let name = r.strict_str(&|| format!("the name of tensor info #{i}"))?;
        if names.contains(&name) {
            return Err(r.err(name_at, format_args!("duplicate tensor name '{name}' (tensor #{i})")));
        }
        let nd_at = r.pos;
        let n_dims = r.u32(&|| format!("the dimension count of tensor #{i} '{name}'"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(
                r.err(nd_at, format_args!("tensor #{i} '{name}' has {n_dims} dimensions (expected 1 to {MAX_DIMS})"))
            );
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        let mut n_elems: u64 = 1;
        for d in 0..n_dims {
            let at = r.pos;
            let x = r.u64(&|| format!("dimension {d} of tensor #{i} '{name}'"))?;
            if x == 0 {
                return Err(r.err(at, format_args!("tensor #{i} '{name}' has dimension {d} = 0")));
            }
            n_elems = n_elems.checked_mul(x).ok_or_else(|| {
                r.err(at, format_args!("tensor #{i} '{name}': element count overflows (dims so far {ne:?}, then {x})"))
            })?;
            ne.push(x);
        }
        let ty_at = r.pos;
        let ggml_type = r.u32(&|| format!("the type of tensor #{i} '{name}'"))?;
        let Some((tname, be, bb)) = ggml_type_info(ggml_type) else {
            return Err(r.err(ty_at, format_args!("tensor #{i} '{name}' has unknown ggml type id {ggml_type}")));
        };
        if ne[0] % be as u64 != 0 {
            return Err(r.err(
                nd_at + 4,
                format_args!(
                    "tensor #{i} '{name}': row length {} is not a multiple of the {tname} block size {be}",
                    ne[0]
                ),
            ));
        }
        let size = (n_elems / be as u64).checked_mul(bb as u64).ok_or_else(|| {
            r.err(nd_at, format_args!("tensor #{i} '{name}': byte size overflows ({n_elems} elements of {tname})"))
        })?;
        let offset_at = r.pos;
        let rel_offset = r.u64(&|| format!("the data offset of tensor #{i} '{name}'"))?;
        names.insert(name.clone());
        tensors.push(TensorInfo { name, ne, ggml_type, dtype: DType::from_ggml(ggml_type), offset: 0, size });
        raws.push(Raw { offset_at, rel_offset });
    }

    // Data section.
    let header_end = r.pos as u64;
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| r.err(r.pos, format_args!("header end {header_end} cannot be aligned to {alignment}")))?;
    let file_len = b.len() as u64;
    for (i, (t, raw)) in tensors.iter_mut().zip(&raws).enumerate() {
        if raw.rel_offset % alignment != 0 {
            return Err(r.err(
                raw.offset_at,
                format_args!(
                    "tensor #{i} '{}' has data offset {} which is not a multiple of the alignment {alignment}",
                    t.name, raw.rel_offset
                ),
            ));
        }
        let start = data_start.checked_add(raw.rel_offset);
        let end = start.and_then(|s| s.checked_add(t.size));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len => t.offset = s,
            _ => {
                return Err(r.err(
                    raw.offset_at,
                    format_args!(
                        "tensor #{i} '{}' ({} {:?}, {} bytes) at data offset {} (file offset {}) extends past the end of the file ({} bytes)",
                        t.name,
                        t.type_name(),
                        t.ne,
                        t.size,
                        raw.rel_offset,
                        start.map_or_else(|| "overflow".to_string(), |s| s.to_string()),
                        file_len
                    ),
                ))
            }
        }
    }

    Ok((metadata, index, alignment, tensors, data_start))
}

#[cfg(test)]
mod tests;
