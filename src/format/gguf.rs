//! STUB (replaced by the gguf branch).
use crate::quant::DType;
use crate::Result;
use std::path::{Path, PathBuf};
pub enum Value { U8(u8), I8(i8), U16(u16), I16(i16), U32(u32), I32(i32), F32(f32), Bool(bool), Str(String), Array(Vec<Value>), U64(u64), I64(i64), F64(f64) }
pub struct TensorInfo { pub name: String, pub ne: Vec<u64>, pub ggml_type: u32, pub dtype: Option<DType>, pub offset: u64, pub size: u64 }
pub struct Gguf { pub path: PathBuf, pub version: u32, pub alignment: u64, pub metadata: Vec<(String, Value)>, pub tensors: Vec<TensorInfo>, pub data_start: u64 }
impl Gguf {
    pub fn open(_path: &Path) -> Result<Gguf> { todo!() }
    pub fn bytes(&self) -> &[u8] { todo!() }
    pub fn get(&self, _key: &str) -> Option<&Value> { todo!() }
    pub fn get_u64(&self, _key: &str) -> Result<Option<u64>> { todo!() }
    pub fn get_u32(&self, _key: &str) -> Result<Option<u32>> { todo!() }
    pub fn get_f32(&self, _key: &str) -> Result<Option<f32>> { todo!() }
    pub fn get_str(&self, _key: &str) -> Result<Option<&str>> { todo!() }
    pub fn get_bool(&self, _key: &str) -> Result<Option<bool>> { todo!() }
    pub fn tensor(&self, _name: &str) -> Option<&TensorInfo> { todo!() }
    pub fn tensor_data(&self, _t: &TensorInfo) -> &[u8] { todo!() }
}
