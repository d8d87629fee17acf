//! safetensors reader over a read-only memory map, and sharded checkpoints
//! (`model.safetensors.index.json`).
//!
//! Layout (<https://github.com/huggingface/safetensors>): u64 little-endian
//! header length N, N bytes of JSON `{name: {"dtype", "shape", "data_offsets":
//! [begin, end]}, "__metadata__": {..}}`, then the data section; offsets are
//! relative to its start (byte 8 + N).
//!
//! Nothing is trusted: the header length must lie inside the file and be below
//! [`MAX_HEADER`]; every tensor's dtype must be F32, F16 or BF16 (others are
//! LLMRT_UNSUPPORTED, naming the tensor and dtype); `shape` product times the
//! dtype size must equal the `data_offsets` extent; every extent must lie inside
//! the data section, and no two may overlap. `__metadata__` is ignored.
//! Failures name the file, the tensor and the offsets.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::FileBytes;

use crate::error::{Error, Result};
use crate::format::WeightFile;
use crate::quant::DType;

/// Largest JSON header accepted (the format's own reference reader uses 100 MB).
const MAX_HEADER: u64 = 100_000_000;

/// Name of the single-file checkpoint in a model directory.
pub(crate) const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index in a sharded model directory.
pub(crate) const INDEX_FILE: &str = "model.safetensors.index.json";

/// One tensor's header entry, validated against the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StTensor {
    pub name: String,
    pub dtype: DType,
    /// As stored: row-major, the last dimension contiguous (HF `[out, in]`).
    pub shape: Vec<u64>,
    /// Absolute file offset of the data.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

enum Backing {
    File(FileBytes),
    Owned(Vec<u8>),
}

/// A parsed safetensors file; tensor data stays in the mapping.
pub struct SafeTensors {
    pub path: PathBuf,
    pub tensors: Vec<StTensor>,
    /// Absolute file offset of the data section.
    pub data_start: u64,
    by_name: HashMap<String, usize>,
    backing: Backing,
}

impl std::fmt::Debug for SafeTensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafeTensors")
            .field("path", &self.path)
            .field("n_tensors", &self.tensors.len())
            .field("data_start", &self.data_start)
            .finish()
    }
}

impl WeightFile for SafeTensors {
    fn path(&self) -> &Path {
        &self.path
    }
    fn bytes(&self) -> &[u8] {
        SafeTensors::bytes(self)
    }
    fn check_unchanged(&self) -> Result<()> {
        match &self.backing {
            Backing::File(f) => f.check_unchanged(&self.path),
            Backing::Owned(_) => Ok(()),
        }
    }
    fn release(&self, offset: usize, len: usize) {
        if let Backing::File(f) = &self.backing {
            f.release(offset, len);
        }
    }
}

fn elem_size(dtype: &str) -> Option<(DType, u64)> {
    match dtype {
        "F32" => Some((DType::F32, 4)),
        "F16" => Some((DType::F16, 2)),
        "BF16" => Some((DType::BF16, 2)),
        _ => None,
    }
}

impl SafeTensors {
    /// Open and map `path`, then parse and validate the header. LLMRT_IO for a
    /// missing/unreadable/non-regular path, LLMRT_BAD_MODEL for a malformed file,
    /// LLMRT_UNSUPPORTED for a tensor dtype other than F32/F16/BF16.
    pub fn open(path: &Path) -> Result<SafeTensors> {
        let shown = path.display();
        let meta = std::fs::metadata(path).map_err(|e| Error::io(format!("{shown}: {e}")))?;
        crate::format::gguf::check_regular(path, &meta)?;
        let file = File::open(path).map_err(|e| Error::io(format!("{shown}: cannot open: {e}")))?;
        let meta = file.metadata().map_err(|e| Error::io(format!("{shown}: cannot stat: {e}")))?;
        crate::format::gguf::check_regular(path, &meta)?;
        if meta.len() == 0 {
            return Err(Error::bad_model(format!("{shown}: empty file (0 bytes; expected an 8-byte header length)")));
        }
        // Mapped (or read, with LLMRT_LOAD_COPY=1); see FileBytes::open.
        let data = FileBytes::open(file, &meta, path)?;
        parse(Backing::File(data), path.to_path_buf())
    }

    /// Parse from owned memory (tests); `name` stands for the file in messages.
    pub fn from_bytes(bytes: Vec<u8>, name: &str) -> Result<SafeTensors> {
        parse(Backing::Owned(bytes), PathBuf::from(name))
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::File(f) => f.bytes(),
            Backing::Owned(v) => v,
        }
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&StTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor of this file (extent validated at open).
    pub fn tensor_data(&self, t: &StTensor) -> &[u8] {
        let (s, n) = (t.offset as usize, t.size as usize);
        self.bytes().get(s..s.saturating_add(n)).unwrap_or(&[])
    }
}

fn parse(backing: Backing, path: PathBuf) -> Result<SafeTensors> {
    let shown = path.display().to_string();
    let b = match &backing {
        Backing::File(f) => f.bytes(),
        Backing::Owned(v) => &v[..],
    };
    let len = b.len() as u64;
    if len < 8 {
        return Err(Error::bad_model(format!("{shown}: file is {len} bytes, shorter than the 8-byte header length")));
    }
    let n = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    if n > MAX_HEADER {
        return Err(Error::bad_model(format!(
            "{shown}: header length {n} at offset 0 exceeds the {MAX_HEADER}-byte limit (not a safetensors file?)"
        )));
    }
    if n < 2 || 8 + n > len {
        return Err(Error::bad_model(format!(
            "{shown}: header length {n} at offset 0 does not fit the file of {len} bytes"
        )));
    }
    let data_start = 8 + n;
    let data_len = len - data_start;
    let header: serde_json::Value = serde_json::from_slice(&b[8..data_start as usize])
        .map_err(|e| Error::bad_model(format!("{shown}: header (bytes 8..{data_start}) is not valid JSON: {e}")))?;
    let obj = header.as_object().ok_or_else(|| Error::bad_model(format!("{shown}: header is not a JSON object")))?;
    let mut tensors = Vec::with_capacity(obj.len());
    for (name, v) in obj {
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: &str| Error::bad_model(format!("{shown}: tensor {name}: {what}"));
        let e = v.as_object().ok_or_else(|| bad("entry is not a JSON object"))?;
        let dtype_s =
            e.get("dtype").and_then(|d| d.as_str()).ok_or_else(|| bad("\"dtype\" is missing or not a string"))?;
        let shape: Vec<u64> = e
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("\"shape\" is missing or not an array"))?
            .iter()
            .map(|d| d.as_u64())
            .collect::<Option<_>>()
            .ok_or_else(|| bad("\"shape\" holds something other than non-negative integers"))?;
        let offs: Vec<u64> = e
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .map(|a| a.iter().map(|d| d.as_u64()).collect::<Option<Vec<u64>>>())
            .and_then(|o| o.filter(|o| o.len() == 2))
            .ok_or_else(|| bad("\"data_offsets\" is not a pair of non-negative integers"))?;
        let (begin, end) = (offs[0], offs[1]);
        let (dtype, esize) = elem_size(dtype_s).ok_or_else(|| {
            Error::unsupported(format!(
                "{shown}: tensor {name} has dtype {dtype_s}, which is not supported (F32, F16, BF16 are)"
            ))
        })?;
        let bytes = shape
            .iter()
            .try_fold(esize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(&format!("shape {shape:?} overflows")))?;
        if end < begin || end - begin != bytes {
            return Err(bad(&format!(
                "data_offsets [{begin}, {end}] hold {} bytes, but shape {shape:?} of {dtype_s} needs {bytes}",
                end as i128 - begin as i128
            )));
        }
        if end > data_len {
            return Err(Error::bad_model(format!(
                "{shown}: tensor {name}: data_offsets [{begin}, {end}] lie outside the data section of {data_len} bytes \
                 (file offsets {}..{}, file size {len}; truncated file?)",
                data_start + begin,
                data_start + end
            )));
        }
        tensors.push(StTensor { name: name.clone(), dtype, shape, offset: data_start + begin, size: bytes });
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| (tensors[i].offset, tensors[i].size));
    for w in order.windows(2) {
        let (a, c) = (&tensors[w[0]], &tensors[w[1]]);
        if a.size > 0 && c.size > 0 && c.offset < a.offset + a.size {
            return Err(Error::bad_model(format!(
                "{shown}: tensors {} (data_offsets [{}, {}]) and {} (data_offsets [{}, {}]) overlap",
                a.name,
                a.offset - data_start,
                a.offset + a.size - data_start,
                c.name,
                c.offset - data_start,
                c.offset + c.size - data_start
            )));
        }
    }
    let by_name = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
    Ok(SafeTensors { path, tensors, data_start, by_name, backing })
}

/// The safetensors files of a model directory: one `model.safetensors`, or the
/// shards listed by `model.safetensors.index.json`.
pub(crate) struct Checkpoint {
    pub files: Vec<Arc<SafeTensors>>,
    /// Tensor name -> (index into `files`, index into that file's `tensors`).
    by_name: HashMap<String, (usize, usize)>,
}

impl Checkpoint {
    /// Opens the checkpoint of directory `dir`. A missing shard is LLMRT_IO naming
    /// the shard and a tensor the index says it holds; an index naming a tensor its
    /// shard does not hold is LLMRT_BAD_MODEL.
    pub fn open_dir(dir: &Path) -> Result<Checkpoint> {
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            return Self::open_index(dir, &index);
        }
        let single = dir.join(SINGLE_FILE);
        if !single.exists() {
            return Err(Error::io(format!("{}: neither {SINGLE_FILE} nor {INDEX_FILE} is present", dir.display())));
        }
        let f = SafeTensors::open(&single)?;
        let by_name = f.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), (0, i))).collect();
        Ok(Checkpoint { files: vec![Arc::new(f)], by_name })
    }

    fn open_index(dir: &Path, index: &Path) -> Result<Checkpoint> {
        let shown = index.display();
        let raw = crate::format::read_small_file(index)?
            .ok_or_else(|| Error::io(format!("{shown}: No such file or directory")))?;
        let json: serde_json::Value =
            serde_json::from_slice(&raw).map_err(|e| Error::bad_model(format!("{shown}: not valid JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::bad_model(format!("{shown}: \"weight_map\" is missing or not an object")))?;
        // shard file -> the first tensor the index puts there (for messages).
        let mut shards: BTreeMap<String, String> = BTreeMap::new();
        let mut wanted: Vec<(String, String)> = Vec::with_capacity(map.len());
        for (tensor, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| Error::bad_model(format!("{shown}: weight_map entry for {tensor} is not a string")))?;
            if file.is_empty() || file.contains('/') || file.contains('\\') || file == "." || file == ".." {
                return Err(Error::bad_model(format!(
                    "{shown}: weight_map puts {tensor} in '{file}', which is not a file name in the model directory"
                )));
            }
            shards.entry(file.to_string()).or_insert_with(|| tensor.clone());
            wanted.push((tensor.clone(), file.to_string()));
        }
        if shards.is_empty() {
            return Err(Error::bad_model(format!("{shown}: weight_map is empty")));
        }
        let mut files = Vec::with_capacity(shards.len());
        let mut file_idx: HashMap<String, usize> = HashMap::new();
        for (file, tensor) in &shards {
            let p = dir.join(file);
            if !p.exists() {
                return Err(Error::io(format!(
                    "{}: shard {file} is missing ({} lists it for tensor {tensor})",
                    p.display(),
                    INDEX_FILE
                )));
            }
            file_idx.insert(file.clone(), files.len());
            files.push(Arc::new(SafeTensors::open(&p)?));
        }
        let mut by_name = HashMap::new();
        for (fi, f) in files.iter().enumerate() {
            for (ti, t) in f.tensors.iter().enumerate() {
                if let Some((pf, _)) = by_name.insert(t.name.clone(), (fi, ti)) {
                    return Err(Error::bad_model(format!(
                        "{}: tensor {} is also in {}",
                        f.path.display(),
                        t.name,
                        files[pf].path.display()
                    )));
                }
            }
        }
        for (tensor, file) in wanted {
            let fi = file_idx[&file];
            if by_name.get(&tensor).map(|&(f, _)| f) != Some(fi) {
                return Err(Error::bad_model(format!(
                    "{shown}: weight_map puts tensor {tensor} in {file}, which does not hold it"
                )));
            }
        }
        Ok(Checkpoint { files, by_name })
    }

    /// A tensor by name: (file index, its entry).
    pub fn tensor(&self, name: &str) -> Option<(usize, &StTensor)> {
        self.by_name.get(name).map(|&(f, t)| (f, &self.files[f].tensors[t]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.resize(v.len() + data, 0);
        v
    }

    #[test]
    fn parses_and_ignores_metadata() {
        let h = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}}"#;
        let s = SafeTensors::from_bytes(file(h, 32), "t").unwrap();
        assert_eq!(s.tensors.len(), 2);
        let a = s.tensor("a").unwrap();
        assert_eq!((a.dtype, a.shape.clone(), a.offset, a.size), (DType::F32, vec![2, 3], 8 + h.len() as u64, 24));
        assert_eq!(s.tensor("b").unwrap().dtype, DType::BF16);
    }

    #[test]
    fn rejects_bad_headers() {
        let e = SafeTensors::from_bytes(vec![1, 2, 3], "t").unwrap_err();
        assert_eq!(e.status, crate::Status::LLMRT_BAD_MODEL);
        let mut v = (1u64 << 40).to_le_bytes().to_vec();
        v.extend_from_slice(b"{}");
        let e = SafeTensors::from_bytes(v, "t").unwrap_err();
        assert!(e.message.contains("exceeds"), "{}", e.message);
        let mut v = 500u64.to_le_bytes().to_vec();
        v.extend_from_slice(b"{}");
        let e = SafeTensors::from_bytes(v, "t").unwrap_err();
        assert!(e.message.contains("does not fit"), "{}", e.message);
        let e = SafeTensors::from_bytes(file("{not json", 0), "t").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
    }

    #[test]
    fn rejects_bad_tensors() {
        let e = SafeTensors::from_bytes(file(r#"{"q":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}}"#, 4), "t")
            .unwrap_err();
        assert_eq!(e.status, crate::Status::LLMRT_UNSUPPORTED);
        assert!(e.message.contains("q") && e.message.contains("I8"), "{}", e.message);
        let e = SafeTensors::from_bytes(file(r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}}"#, 16), "t")
            .unwrap_err();
        assert!(e.message.contains("w") && e.message.contains("needs 16"), "{}", e.message);
        let e = SafeTensors::from_bytes(file(r#"{"w":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}}"#, 4), "t")
            .unwrap_err();
        assert_eq!(e.status, crate::Status::LLMRT_BAD_MODEL);
        assert!(e.message.contains("[0, 8]") && e.message.contains("outside"), "{}", e.message);
        let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
        let e = SafeTensors::from_bytes(file(h, 12), "t").unwrap_err();
        assert!(e.message.contains("overlap"), "{}", e.message);
    }
}
