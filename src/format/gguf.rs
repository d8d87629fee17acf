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

/// A metadata value.
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
        match self {
            Value::U8(_) => GGUF_TYPE_U8,
            Value::I8(_) => GGUF_TYPE_I8,
            Value::U16(_) => GGUF_TYPE_U16,
            Value::I16(_) => GGUF_TYPE_I16,
            Value::U32(_) => GGUF_TYPE_U32,
            Value::I32(_) => GGUF_TYPE_I32,
            Value::F32(_) => GGUF_TYPE_F32,
            Value::Bool(_) => GGUF_TYPE_BOOL,
            Value::Str(_) => GGUF_TYPE_STRING,
            Value::Array(_) => GGUF_TYPE_ARRAY,
            Value::U64(_) => GGUF_TYPE_U64,
            Value::I64(_) => GGUF_TYPE_I64,
            Value::F64(_) => GGUF_TYPE_F64,
        }
    }

    /// The type's name, e.g. "U32", "ARRAY".
    pub fn type_name(&self) -> &'static str {
        value_type_name(self.type_id()).unwrap_or("?")
    }

    /// The value as a u64 if it is an integer >= 0.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    fn is_int(&self) -> bool {
        matches!(
            self,
            Value::U8(_)
                | Value::U16(_)
                | Value::U32(_)
                | Value::U64(_)
                | Value::I8(_)
                | Value::I16(_)
                | Value::I32(_)
                | Value::I64(_)
        )
    }

    /// A short description for error messages: type and (for scalars) value.
    fn describe(&self) -> String {
        match self {
            Value::Str(s) if s.len() > 40 => format!("STRING of {} bytes", s.len()),
            Value::Str(s) => format!("STRING {s:?}"),
            Value::Array(a) => format!("ARRAY of {} elements", a.len()),
            Value::U8(v) => format!("U8 {v}"),
            Value::I8(v) => format!("I8 {v}"),
            Value::U16(v) => format!("U16 {v}"),
            Value::I16(v) => format!("I16 {v}"),
            Value::U32(v) => format!("U32 {v}"),
            Value::I32(v) => format!("I32 {v}"),
            Value::U64(v) => format!("U64 {v}"),
            Value::I64(v) => format!("I64 {v}"),
            Value::F32(v) => format!("F32 {v}"),
            Value::F64(v) => format!("F64 {v}"),
            Value::Bool(v) => format!("BOOL {v}"),
        }
    }
}

/// Name of a GGUF value type id.
pub fn value_type_name(t: u32) -> Option<&'static str> {
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

/// A parsed GGUF file; tensor data stays in the mapping.
pub struct Gguf {
    pub path: PathBuf,
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, Value)>,
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
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("{shown}: cannot stat: {e}")))?;
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
    pub fn check_unchanged(&self) -> Result<()> {
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

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn wrong_type(&self, key: &str, v: &Value, want: &str) -> Error {
        Error::bad_model(format!(
            "{}: metadata key '{}' is {}, expected {}",
            self.path.display(),
            key,
            v.describe(),
            want
        ))
    }

    /// An integer value >= 0 of any integer type; `Ok(None)` when absent.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, v, "a non-negative integer")),
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
                .ok_or_else(|| self.wrong_type(key, v, "an integer in 0..=4294967295")),
        }
    }

    /// A float (F32, F64 narrowed to f32) or an integer converted to f32.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(*x)),
            Some(Value::F64(x)) => Ok(Some(*x as f32)),
            Some(v @ (Value::U64(_) | Value::U32(_) | Value::U16(_) | Value::U8(_))) => {
                Ok(v.as_u64().map(|x| x as f32))
            }
            Some(Value::I8(x)) => Ok(Some(*x as f32)),
            Some(Value::I16(x)) => Ok(Some(*x as f32)),
            Some(Value::I32(x)) => Ok(Some(*x as f32)),
            Some(Value::I64(x)) => Ok(Some(*x as f32)),
            Some(v) => Err(self.wrong_type(key, v, "a number")),
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Str(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong_type(key, v, "a STRING")),
        }
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong_type(key, v, "a BOOL")),
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
        let range = usize::try_from(t.offset).ok().and_then(|s| {
            usize::try_from(t.size)
                .ok()
                .and_then(|n| s.checked_add(n))
                .map(|e| s..e)
        });
        let out = range.and_then(|r| b.get(r));
        out.unwrap_or(&[])
    }
}

pub(crate) fn check_regular(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    if meta.is_dir() {
        return Err(Error::io(format!(
            "{}: is a directory, not a model file",
            path.display()
        )));
    }
    if !meta.is_file() {
        return Err(Error::io(format!(
            "{}: not a regular file (device, FIFO or socket)",
            path.display()
        )));
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
                format_args!(
                    "{} is not valid UTF-8 (byte {} of it)",
                    what(),
                    e.valid_up_to()
                ),
            )),
        }
    }

    fn value(
        &mut self,
        t: u32,
        depth: usize,
        budget: &mut u64,
        what: &dyn Fn() -> String,
    ) -> Result<Value> {
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
                    x => {
                        return Err(self.err(
                            at,
                            format_args!("{} is BOOL but holds {} (expected 0 or 1)", what(), x),
                        ))
                    }
                }
            }
            GGUF_TYPE_STRING => {
                let (_, b) = self.str_bytes(what)?;
                Value::Str(String::from_utf8_lossy(b).into_owned())
            }
            GGUF_TYPE_ARRAY => {
                let at = self.pos;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(
                        at,
                        format_args!(
                            "{} nests arrays deeper than {} levels",
                            what(),
                            MAX_ARRAY_DEPTH
                        ),
                    ));
                }
                let et = self.u32(&|| format!("the element type of {}", what()))?;
                let min = match min_value_size(et) {
                    Some(m) => m,
                    None => {
                        return Err(self.err(
                            at,
                            format_args!("{} has unknown element type id {}", what(), et),
                        ))
                    }
                };
                let n = self.u64(&|| format!("the element count of {}", what()))?;
                let left = self.left() as u64;
                match n.checked_mul(min) {
                    Some(need) if need <= left => {}
                    _ => {
                        return Err(self.truncated(
                            format_args!("at least {} x {}", n, min),
                            &|| {
                                format!(
                                    "{} ({} elements of type {})",
                                    what(),
                                    n,
                                    value_type_name(et).unwrap_or("?")
                                )
                            },
                        ))
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
                // n <= left / min <= file length: bounded by the input.
                let mut v = Vec::with_capacity(n as usize);
                for i in 0..n {
                    let sub = || format!("element {} of {}", i, what());
                    v.push(self.value(et, depth + 1, budget, &sub)?);
                }
                Value::Array(v)
            }
            _ => {
                return Err(self.err(
                    self.pos,
                    format_args!("{} has unknown value type id {}", what(), t),
                ))
            }
        })
    }
}

fn parse(backing: Backing, path: PathBuf) -> Result<Gguf> {
    let name_owned = path.display().to_string();
    let b = backing.bytes();
    let mut r = Reader {
        b,
        pos: 0,
        name: &name_owned,
    };
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
        return Err(r.err(
            4,
            format_args!("unsupported GGUF version {version} (versions 2 and 3 are supported)"),
        ));
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
    let need = n_kv.checked_mul(MIN_KV).and_then(|a| {
        n_tensors
            .checked_mul(MIN_TENSOR)
            .and_then(|c| a.checked_add(c))
    });
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
    let (metadata, alignment, tensors, data_start) = match (body, note) {
        (Ok(b), _) => b,
        (Err(e), None) => return Err(e),
        (Err(mut e), Some(note)) => {
            e.message.push_str(&note);
            return Err(e);
        }
    };
    Ok(Gguf {
        path,
        version,
        alignment,
        metadata,
        tensors,
        data_start,
        backing,
    })
}

type Body = (Vec<(String, Value)>, u64, Vec<TensorInfo>, u64);

fn parse_body(
    r: &mut Reader<'_>,
    n_kv: u64,
    n_tensors: u64,
    kv_cap: usize,
    tensor_cap: usize,
) -> Result<Body> {
    let name_owned = r.name;
    let b = r.b;
    // Metadata.
    let mut budget = MAX_ARRAY_ELEMS;
    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(kv_cap);
    let mut keys: HashSet<String> = HashSet::with_capacity(kv_cap);
    for i in 0..n_kv {
        let key_at = r.pos + 8;
        let key = r.strict_str(&|| format!("metadata key #{i}"))?;
        if keys.contains(&key) {
            return Err(r.err(
                key_at,
                format_args!("duplicate metadata key '{key}' (entry #{i})"),
            ));
        }
        let ty = r.u32(&|| format!("the value type of metadata key #{i} '{key}'"))?;
        let value = r.value(ty, 0, &mut budget, &|| {
            format!("the value of metadata key #{i} '{key}'")
        })?;
        keys.insert(key.clone());
        metadata.push((key, value));
    }

    // Alignment.
    let mut alignment = DEFAULT_ALIGNMENT;
    if let Some((_, v)) = metadata.iter().find(|(k, _)| k == "general.alignment") {
        match v.as_u64() {
            Some(a) if a != 0 && a.is_power_of_two() => alignment = a,
            _ => {
                let what = if v.is_int() {
                    "a nonzero power of two"
                } else {
                    "an integer (U32)"
                };
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
            return Err(r.err(
                name_at,
                format_args!("duplicate tensor name '{name}' (tensor #{i})"),
            ));
        }
        let nd_at = r.pos;
        let n_dims = r.u32(&|| format!("the dimension count of tensor #{i} '{name}'"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(r.err(
                nd_at,
                format_args!(
                    "tensor #{i} '{name}' has {n_dims} dimensions (expected 1 to {MAX_DIMS})"
                ),
            ));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        let mut n_elems: u64 = 1;
        for d in 0..n_dims {
            let at = r.pos;
            let x = r.u64(&|| format!("dimension {d} of tensor #{i} '{name}'"))?;
            if x == 0 {
                return Err(r.err(
                    at,
                    format_args!("tensor #{i} '{name}' has dimension {d} = 0"),
                ));
            }
            n_elems = n_elems.checked_mul(x).ok_or_else(|| {
                r.err(at, format_args!("tensor #{i} '{name}': element count overflows (dims so far {ne:?}, then {x})"))
            })?;
            ne.push(x);
        }
        let ty_at = r.pos;
        let ggml_type = r.u32(&|| format!("the type of tensor #{i} '{name}'"))?;
        let Some((tname, be, bb)) = ggml_type_info(ggml_type) else {
            return Err(r.err(
                ty_at,
                format_args!("tensor #{i} '{name}' has unknown ggml type id {ggml_type}"),
            ));
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
        let size = (n_elems / be as u64)
            .checked_mul(bb as u64)
            .ok_or_else(|| {
                r.err(
                    nd_at,
                    format_args!(
                        "tensor #{i} '{name}': byte size overflows ({n_elems} elements of {tname})"
                    ),
                )
            })?;
        let offset_at = r.pos;
        let rel_offset = r.u64(&|| format!("the data offset of tensor #{i} '{name}'"))?;
        names.insert(name.clone());
        tensors.push(TensorInfo {
            name,
            ne,
            ggml_type,
            dtype: DType::from_ggml(ggml_type),
            offset: 0,
            size,
        });
        raws.push(Raw {
            offset_at,
            rel_offset,
        });
    }

    // Data section.
    let header_end = r.pos as u64;
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| {
            r.err(
                r.pos,
                format_args!("header end {header_end} cannot be aligned to {alignment}"),
            )
        })?;
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

    Ok((metadata, alignment, tensors, data_start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;
    use crate::format::gguf_write::GgufWriter;
    use crate::quant::quantize_row;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn tmp_path(tag: &str) -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        std::env::temp_dir().join(format!(
            "llmrt-gguf-test-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            tag
        ))
    }

    fn quant(dt: DType, x: &[f32]) -> Vec<u8> {
        let mut q = vec![0u8; dt.row_bytes(x.len()).unwrap()];
        quantize_row(dt, x, &mut q);
        q
    }

    fn bad(r: Result<Gguf>) -> Error {
        match r {
            Ok(g) => panic!("expected an error, parsed {g:?}"),
            Err(e) => {
                assert_eq!(e.status, Status::LLMRT_BAD_MODEL, "{e}");
                e
            }
        }
    }

    fn all_values() -> Vec<(String, Value)> {
        vec![
            ("general.architecture".into(), Value::Str("llama".into())),
            ("t.u8".into(), Value::U8(200)),
            ("t.i8".into(), Value::I8(-100)),
            ("t.u16".into(), Value::U16(60000)),
            ("t.i16".into(), Value::I16(-30000)),
            ("t.u32".into(), Value::U32(4_000_000_000)),
            ("t.i32".into(), Value::I32(-2_000_000_000)),
            ("t.f32".into(), Value::F32(1.5e-5)),
            ("t.bool.t".into(), Value::Bool(true)),
            ("t.bool.f".into(), Value::Bool(false)),
            ("t.str".into(), Value::Str("héllo ▁wörld \u{1F600}".into())),
            ("t.str.empty".into(), Value::Str(String::new())),
            ("t.u64".into(), Value::U64(u64::MAX)),
            ("t.i64".into(), Value::I64(i64::MIN)),
            ("t.f64".into(), Value::F64(-1.0e300)),
            ("t.arr.empty".into(), Value::Array(vec![])),
            (
                "t.arr.u8".into(),
                Value::Array(vec![Value::U8(1), Value::U8(2), Value::U8(3)]),
            ),
            (
                "t.arr.f32".into(),
                Value::Array(vec![Value::F32(0.5), Value::F32(-0.25)]),
            ),
            (
                "t.arr.i64".into(),
                Value::Array(vec![Value::I64(-1), Value::I64(7)]),
            ),
            (
                "t.arr.bool".into(),
                Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
            ),
            (
                "t.arr.str".into(),
                Value::Array(vec![
                    Value::Str("a".into()),
                    Value::Str("".into()),
                    Value::Str("<s>".into()),
                ]),
            ),
            (
                "t.arr.nested".into(),
                Value::Array(vec![
                    Value::Array(vec![Value::U32(1), Value::U32(2)]),
                    Value::Array(vec![Value::Str("x".into())]),
                    Value::Array(vec![]),
                    Value::Array(vec![Value::Array(vec![Value::F64(2.0)])]),
                ]),
            ),
        ]
    }

    struct T {
        name: &'static str,
        ne: Vec<u64>,
        ggml_type: u32,
        data: Vec<u8>,
    }

    fn sample_tensors() -> Vec<T> {
        let x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        vec![
            T {
                name: "a.f32",
                ne: vec![5, 3],
                ggml_type: 0,
                data: quant(DType::F32, &x[..15]),
            },
            T {
                name: "b.q8_0",
                ne: vec![64, 2],
                ggml_type: 8,
                data: quant(DType::Q8_0, &x),
            },
            T {
                name: "c.q4_0",
                ne: vec![32, 1, 1, 2],
                ggml_type: 2,
                data: quant(DType::Q4_0, &x[..64]),
            },
            T {
                name: "d.f16",
                ne: vec![3],
                ggml_type: 1,
                data: quant(DType::F16, &x[..3]),
            },
            T {
                name: "e.bf16",
                ne: vec![7, 2],
                ggml_type: 30,
                data: quant(DType::BF16, &x[..14]),
            },
            T {
                name: "f.q4_k",
                ne: vec![256],
                ggml_type: 12,
                data: vec![0xAB; 144],
            },
        ]
    }

    fn build(version: u32, alignment: u64) -> GgufWriter {
        let mut w = GgufWriter::new();
        w.version(version);
        w.alignment(alignment);
        for (k, v) in all_values() {
            w.kv(&k, v);
        }
        for t in sample_tensors() {
            w.tensor_raw(t.name, &t.ne, t.ggml_type, t.data);
        }
        w
    }

    fn check_round_trip(g: &Gguf, version: u32, alignment: u64) {
        assert_eq!(g.version, version);
        assert_eq!(g.alignment, alignment);
        let mut want = all_values();
        if alignment != 32 {
            want.insert(
                0,
                ("general.alignment".into(), Value::U32(alignment as u32)),
            );
        }
        assert_eq!(g.metadata, want);
        assert_eq!(g.data_start % alignment, 0);
        let ts = sample_tensors();
        assert_eq!(g.tensors.len(), ts.len());
        for (t, info) in ts.iter().zip(&g.tensors) {
            assert_eq!(info.name, t.name);
            assert_eq!(info.ne, t.ne);
            assert_eq!(info.ggml_type, t.ggml_type);
            assert_eq!(info.dtype, DType::from_ggml(t.ggml_type));
            assert_eq!(info.size, t.data.len() as u64);
            assert_eq!((info.offset - g.data_start) % alignment, 0);
            assert_eq!(g.tensor_data(info), &t.data[..]);
            assert_eq!(g.tensor(t.name), Some(info));
        }
        assert_eq!(g.tensor("f.q4_k").unwrap().dtype, None);
        assert_eq!(g.tensor("f.q4_k").unwrap().type_name(), "Q4_K");
        assert!(g.tensor("nope").is_none());
        // The file ends exactly at the end of the last tensor.
        let last = g.tensors.last().unwrap();
        assert_eq!(last.offset + last.size, g.bytes().len() as u64);
    }

    #[test]
    fn round_trip_every_value_type() {
        for version in [2, 3] {
            for alignment in [32, 64] {
                let bytes = build(version, alignment).to_bytes();
                let g = Gguf::from_bytes(bytes, "mem.gguf").unwrap();
                check_round_trip(&g, version, alignment);
            }
        }
        // And through a real file and the mmap.
        let p = tmp_path("rt.gguf");
        build(3, 64).write(&p).unwrap();
        let g = Gguf::open(&p).unwrap();
        check_round_trip(&g, 3, 64);
        assert_eq!(g.path, p);
        drop(g);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn no_tensors_no_metadata() {
        let g = Gguf::from_bytes(GgufWriter::new().to_bytes(), "e.gguf").unwrap();
        assert!(g.metadata.is_empty() && g.tensors.is_empty());
        assert_eq!(g.bytes().len(), 24);
    }

    #[test]
    fn typed_getters() {
        let mut w = GgufWriter::new();
        w.kv("i32.pos", Value::I32(5));
        w.kv("i32.neg", Value::I32(-5));
        w.kv("u64.big", Value::U64(1 << 40));
        w.kv("u8", Value::U8(7));
        w.kv("f64", Value::F64(0.5));
        w.kv("f32", Value::F32(1e-6));
        w.kv("s", Value::Str("llama".into()));
        w.kv("b", Value::Bool(true));
        w.kv("arr", Value::Array(vec![Value::U8(1)]));
        let g = Gguf::from_bytes(w.to_bytes(), "g.gguf").unwrap();
        assert_eq!(g.get_u64("i32.pos").unwrap(), Some(5));
        assert_eq!(g.get_u64("u8").unwrap(), Some(7));
        assert_eq!(g.get_u64("u64.big").unwrap(), Some(1 << 40));
        assert_eq!(g.get_u64("missing").unwrap(), None);
        let e = g.get_u64("i32.neg").unwrap_err();
        assert_eq!(e.status, Status::LLMRT_BAD_MODEL);
        assert!(
            e.message.contains("i32.neg")
                && e.message.contains("I32")
                && e.message.contains("g.gguf"),
            "{e}"
        );
        let e = g.get_u64("s").unwrap_err();
        assert!(
            e.message.contains("'s'") && e.message.contains("STRING"),
            "{e}"
        );
        assert_eq!(g.get_u32("i32.pos").unwrap(), Some(5));
        let e = g.get_u32("u64.big").unwrap_err();
        assert!(
            e.message.contains("u64.big") && e.message.contains("U64"),
            "{e}"
        );
        assert_eq!(g.get_f32("f64").unwrap(), Some(0.5));
        assert_eq!(g.get_f32("f32").unwrap(), Some(1e-6));
        assert_eq!(g.get_f32("i32.neg").unwrap(), Some(-5.0));
        assert_eq!(g.get_f32("u8").unwrap(), Some(7.0));
        assert!(g.get_f32("s").is_err());
        assert_eq!(g.get_f32("nope").unwrap(), None);
        assert_eq!(g.get_str("s").unwrap(), Some("llama"));
        assert!(g.get_str("u8").unwrap_err().message.contains("U8"));
        assert_eq!(g.get_str("nope").unwrap(), None);
        assert_eq!(g.get_bool("b").unwrap(), Some(true));
        assert!(g.get_bool("arr").unwrap_err().message.contains("ARRAY"));
        assert_eq!(g.get_bool("nope").unwrap(), None);
    }

    /// A small valid file with a few of everything.
    fn small_file() -> Vec<u8> {
        let mut w = GgufWriter::new();
        w.kv("general.architecture", Value::Str("llama".into()));
        w.kv("llama.block_count", Value::U32(2));
        w.kv(
            "v.arr",
            Value::Array(vec![Value::Str("ab".into()), Value::Str("c".into())]),
        );
        w.kv(
            "v.nested",
            Value::Array(vec![Value::Array(vec![Value::I16(1)])]),
        );
        w.kv("v.f", Value::F32(1.0));
        w.tensor("w1", &[32, 2], DType::Q8_0, vec![1; 68]);
        w.tensor("w2", &[3], DType::F32, vec![2; 12]);
        w.to_bytes()
    }

    #[test]
    fn truncation_at_every_offset() {
        let full = small_file();
        Gguf::from_bytes(full.clone(), "t.gguf").unwrap();
        for len in 0..full.len() {
            let e = bad(Gguf::from_bytes(full[..len].to_vec(), "t.gguf"));
            assert!(e.message.starts_with("t.gguf: "), "len {len}: {e}");
            assert!(e.message.contains("offset"), "len {len}: {e}");
        }
        let e = bad(Gguf::from_bytes(full[..30].to_vec(), "t.gguf"));
        assert!(
            e.message
                .contains("truncated at offset 24 while reading the length of metadata key #0"),
            "{e}"
        );
        assert!(e.message.contains("need 8 bytes, 6 left"), "{e}");
        let e = bad(Gguf::from_bytes(vec![], "t.gguf"));
        assert!(e.message.contains("empty file"), "{e}");
    }

    #[test]
    fn random_header_flips_never_panic() {
        let full = small_file();
        let g = Gguf::from_bytes(full.clone(), "f.gguf").unwrap();
        let header = g.data_start as usize;
        let mut rng = Rng(0xDEAD_BEEF_1234_5678);
        let (mut ok, mut err) = (0, 0);
        for it in 0..4000 {
            let mut b = full.clone();
            let flips = 1 + rng.below(3);
            for _ in 0..flips {
                let at = if it % 4 == 0 {
                    rng.below(b.len())
                } else {
                    rng.below(header)
                };
                match rng.below(3) {
                    0 => b[at] ^= 1 << rng.below(8),
                    1 => b[at] = rng.next() as u8,
                    _ => b[at] = 0xFF,
                }
            }
            match Gguf::from_bytes(b, "f.gguf") {
                Ok(g) => {
                    ok += 1;
                    for t in &g.tensors {
                        assert_eq!(g.tensor_data(t).len() as u64, t.size);
                    }
                }
                Err(e) => {
                    err += 1;
                    assert_eq!(e.status, Status::LLMRT_BAD_MODEL, "{e}");
                    assert!(e.message.contains("offset"), "{e}");
                }
            }
        }
        assert!(ok > 0 && err > 0, "ok {ok} err {err}");
    }

    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b
    }

    fn push_str(b: &mut Vec<u8>, s: &[u8]) {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend_from_slice(s);
    }

    #[test]
    fn huge_counts_fail_fast() {
        let t0 = std::time::Instant::now();
        // Array of u64::MAX bytes.
        let mut b = header(3, 0, 1);
        push_str(&mut b, b"k");
        b.extend(GGUF_TYPE_ARRAY.to_le_bytes());
        b.extend(GGUF_TYPE_U8.to_le_bytes());
        b.extend(u64::MAX.to_le_bytes());
        b.extend([0u8; 64]);
        let e = bad(Gguf::from_bytes(b, "h.gguf"));
        assert!(
            e.message.contains("18446744073709551615") && e.message.contains("'k'"),
            "{e}"
        );
        // Array of 2^62 strings (n * 8 overflows).
        let mut b = header(3, 0, 1);
        push_str(&mut b, b"k");
        b.extend(GGUF_TYPE_ARRAY.to_le_bytes());
        b.extend(GGUF_TYPE_STRING.to_le_bytes());
        b.extend((1u64 << 62).to_le_bytes());
        b.extend([0u8; 64]);
        bad(Gguf::from_bytes(b, "h.gguf"));
        // String of u64::MAX bytes, as a key and as a value.
        let mut b = header(3, 0, 1);
        b.extend(u64::MAX.to_le_bytes());
        b.extend([0u8; 64]);
        bad(Gguf::from_bytes(b, "h.gguf"));
        let mut b = header(3, 0, 1);
        push_str(&mut b, b"k");
        b.extend(GGUF_TYPE_STRING.to_le_bytes());
        b.extend((u64::MAX - 3).to_le_bytes());
        b.extend([0u8; 64]);
        let e = bad(Gguf::from_bytes(b, "h.gguf"));
        assert!(e.message.contains("truncated at offset"), "{e}");
        // 2^40 tensors, u64::MAX tensors, u64::MAX keys.
        for (nt, nkv) in [
            (1u64 << 40, 0u64),
            (u64::MAX, 0),
            (0, u64::MAX),
            (u64::MAX, u64::MAX),
        ] {
            let mut b = header(3, nt, nkv);
            b.extend([0u8; 256]);
            let e = bad(Gguf::from_bytes(b, "h.gguf"));
            assert!(
                e.message.contains("offset") && e.message.contains("the header claims"),
                "{e}"
            );
            println!("{e}");
        }
        // Many-element array: fine when the bytes are there, then the per-file budget.
        let mut b = header(3, 0, 1);
        push_str(&mut b, b"k");
        b.extend(GGUF_TYPE_ARRAY.to_le_bytes());
        b.extend(GGUF_TYPE_U8.to_le_bytes());
        b.extend(100_000u64.to_le_bytes());
        b.extend(vec![7u8; 100_000]);
        let g = Gguf::from_bytes(b, "h.gguf").unwrap();
        assert!(matches!(g.get("k"), Some(Value::Array(a)) if a.len() == 100_000));
        assert!(t0.elapsed().as_secs() < 5);
    }

    /// File offset of the u64 data offset of tensor `name` in `b`.
    fn offset_field(b: &[u8], name: &str, n_dims: usize) -> usize {
        let mut needle = (name.len() as u64).to_le_bytes().to_vec();
        needle.extend(name.as_bytes());
        let at = b
            .windows(needle.len())
            .position(|w| w == &needle[..])
            .unwrap();
        at + needle.len() + 4 + 8 * n_dims + 4
    }

    #[test]
    fn bad_tensor_offsets() {
        let full = small_file();
        let at = offset_field(&full, "w2", 1);
        assert_eq!(u64::from_le_bytes(full[at..at + 8].try_into().unwrap()), 96);
        // Unaligned.
        let mut b = full.clone();
        b[at..at + 8].copy_from_slice(&8u64.to_le_bytes());
        let e = bad(Gguf::from_bytes(b, "o.gguf"));
        assert!(
            e.message.contains("'w2'") && e.message.contains("alignment 32"),
            "{e}"
        );
        assert!(e.message.contains(&format!("offset {at}")), "{e}");
        // Aligned but past the end.
        let mut b = full.clone();
        b[at..at + 8].copy_from_slice(&128u64.to_le_bytes());
        let e = bad(Gguf::from_bytes(b, "o.gguf"));
        assert!(
            e.message.contains("'w2'") && e.message.contains("past the end"),
            "{e}"
        );
        // Overflowing.
        let mut b = full.clone();
        b[at..at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
        let e = bad(Gguf::from_bytes(b, "o.gguf"));
        assert!(e.message.contains("past the end"), "{e}");
    }

    #[test]
    fn tensor_header_checks() {
        let one = |ne: &[u64], ty: u32, data: Vec<u8>| {
            let mut w = GgufWriter::new();
            w.tensor_raw("t", ne, ty, data);
            Gguf::from_bytes(w.to_bytes(), "x.gguf")
        };
        let e = bad(one(&[32], 99, vec![0; 32]));
        assert!(
            e.message.contains("'t'") && e.message.contains("unknown ggml type id 99"),
            "{e}"
        );
        let e = bad(one(&[32], 4, vec![0; 32])); // Q4_2: removed, unknown.
        assert!(e.message.contains("type id 4"), "{e}");
        let g = one(&[256, 2], 14, vec![0; 420]).unwrap(); // Q6_K: known, unsupported.
        assert_eq!(g.tensors[0].dtype, None);
        assert_eq!(g.tensors[0].size, 420);
        let e = bad(one(&[], 0, vec![]));
        assert!(e.message.contains("0 dimensions"), "{e}");
        let e = bad(one(&[1, 1, 1, 1, 1], 0, vec![0; 4]));
        assert!(e.message.contains("5 dimensions"), "{e}");
        let e = bad(one(&[4, 0], 0, vec![]));
        assert!(e.message.contains("dimension 1 = 0"), "{e}");
        let e = bad(one(&[16], 8, vec![0; 34]));
        assert!(
            e.message.contains("not a multiple") && e.message.contains("Q8_0"),
            "{e}"
        );
        let e = bad(one(&[1 << 32, 1 << 32, 1 << 32], 0, vec![]));
        assert!(e.message.contains("overflows"), "{e}");
        let e = bad(one(&[1 << 62], 0, vec![]));
        assert!(e.message.contains("overflows"), "{e}");
        let e = bad(one(&[8], 0, vec![0; 31]));
        assert!(e.message.contains("past the end"), "{e}");
        // Duplicate tensor name.
        let mut w = GgufWriter::new();
        w.tensor("t", &[1], DType::F32, vec![0; 4]);
        w.tensor("t", &[1], DType::F32, vec![0; 4]);
        let e = bad(Gguf::from_bytes(w.to_bytes(), "x.gguf"));
        assert!(e.message.contains("duplicate tensor name 't'"), "{e}");
    }

    #[test]
    fn header_and_metadata_checks() {
        let mut b = small_file();
        b[0] = b'X';
        let e = bad(Gguf::from_bytes(b, "m.gguf"));
        assert!(
            e.message.contains("magic") && e.message.contains("offset 0"),
            "{e}"
        );
        for v in [0u32, 1, 4, 0xFFFF_FFFF] {
            let mut w = GgufWriter::new();
            w.version(v);
            let e = bad(Gguf::from_bytes(w.to_bytes(), "m.gguf"));
            assert!(e.message.contains(&format!("version {v}")), "{e}");
        }
        // Duplicate key.
        let mut w = GgufWriter::new();
        w.kv("a", Value::U8(1));
        w.kv("a", Value::U8(2));
        let e = bad(Gguf::from_bytes(w.to_bytes(), "m.gguf"));
        assert!(e.message.contains("duplicate metadata key 'a'"), "{e}");
        // Bad alignments.
        for v in [
            Value::U32(0),
            Value::U32(48),
            Value::F32(32.0),
            Value::I32(-32),
        ] {
            let mut w = GgufWriter::new();
            w.kv("general.alignment", v);
            let e = bad(Gguf::from_bytes(w.to_bytes(), "m.gguf"));
            assert!(e.message.contains("general.alignment"), "{e}");
        }
        // Alignment given as another integer type is accepted.
        let mut w = GgufWriter::new();
        w.kv("general.alignment", Value::U64(16));
        w.tensor("t", &[1], DType::F32, vec![0; 4]);
        assert_eq!(
            Gguf::from_bytes(w.to_bytes(), "m.gguf").unwrap().alignment,
            16
        );
        // Unknown value type.
        let mut b = header(3, 0, 1);
        push_str(&mut b, b"k");
        b.extend(13u32.to_le_bytes());
        b.extend([0u8; 16]);
        let e = bad(Gguf::from_bytes(b, "m.gguf"));
        assert!(
            e.message.contains("unknown value type id 13") && e.message.contains("'k'"),
            "{e}"
        );
        // Bool that is not 0/1.
        let mut b = header(3, 0, 1);
        push_str(&mut b, b"k");
        b.extend(GGUF_TYPE_BOOL.to_le_bytes());
        b.push(2);
        let e = bad(Gguf::from_bytes(b, "m.gguf"));
        assert!(e.message.contains("BOOL"), "{e}");
        // Key that is not UTF-8; value that is not UTF-8 (decoded lossily).
        let mut b = header(3, 0, 1);
        push_str(&mut b, b"k\xff");
        b.extend(GGUF_TYPE_U8.to_le_bytes());
        b.push(0);
        let e = bad(Gguf::from_bytes(b, "m.gguf"));
        assert!(
            e.message.contains("UTF-8") && e.message.contains("offset 33"),
            "{e}"
        );
        let mut b = header(3, 0, 1);
        push_str(&mut b, b"k");
        b.extend(GGUF_TYPE_STRING.to_le_bytes());
        push_str(&mut b, b"a\xffb");
        let g = Gguf::from_bytes(b, "m.gguf").unwrap();
        assert_eq!(g.get_str("k").unwrap(), Some("a\u{FFFD}b"));
        // Arrays nested too deep.
        let mut v = Value::Array(vec![Value::U8(1)]);
        for _ in 0..MAX_ARRAY_DEPTH {
            v = Value::Array(vec![v]);
        }
        let mut w = GgufWriter::new();
        w.kv("deep", v);
        let e = bad(Gguf::from_bytes(w.to_bytes(), "m.gguf"));
        assert!(e.message.contains("deeper"), "{e}");
    }

    #[test]
    fn io_errors() {
        let dir = tmp_path("dir");
        std::fs::create_dir(&dir).unwrap();
        let e = Gguf::open(&dir).unwrap_err();
        assert_eq!(e.status, Status::LLMRT_IO, "{e}");
        assert!(e.message.contains("directory"), "{e}");
        std::fs::remove_dir(&dir).unwrap();

        let missing = tmp_path("missing.gguf");
        let e = Gguf::open(&missing).unwrap_err();
        assert_eq!(e.status, Status::LLMRT_IO, "{e}");
        assert!(e.message.contains(&missing.display().to_string()), "{e}");

        let empty = tmp_path("empty.gguf");
        std::fs::write(&empty, b"").unwrap();
        let e = bad(Gguf::open(&empty));
        assert!(e.message.contains("empty file"), "{e}");
        std::fs::remove_file(&empty).unwrap();

        let dev = Path::new("/dev/null");
        if dev.exists() {
            let e = Gguf::open(dev).unwrap_err();
            assert_eq!(e.status, Status::LLMRT_IO, "{e}");
            assert!(e.message.contains("not a regular file"), "{e}");
        }
    }

    #[test]
    fn stories260k() {
        let p = Path::new("/work/shared/models/stories260K/stories260K.gguf");
        if !p.exists() {
            println!("skipping: {} not present", p.display());
            return;
        }
        let g = Gguf::open(p).unwrap();
        assert_eq!(g.get_str("general.architecture").unwrap(), Some("llama"));
        assert_eq!(g.get_u32("llama.block_count").unwrap(), Some(5));
        let t = g.tensor("token_embd.weight").unwrap();
        assert_eq!(t.ne, vec![64, 512]);
        assert_eq!(t.dtype, Some(DType::F32));
        assert_eq!(g.tensor_data(t).len(), 64 * 512 * 4);
    }
}
