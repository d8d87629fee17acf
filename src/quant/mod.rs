//! STUB (replaced by the gguf branch): tensor types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType { F32, F16, BF16, Q8_0, Q4_0 }
impl DType {
    pub fn from_ggml(_id: u32) -> Option<DType> { todo!() }
    pub fn ggml_id(self) -> u32 { todo!() }
    pub fn name(self) -> &'static str { todo!() }
    pub fn block_elems(self) -> usize { todo!() }
    pub fn block_bytes(self) -> usize { todo!() }
    pub fn row_bytes(self, _n: usize) -> Option<usize> { todo!() }
}
pub fn ggml_type_info(_id: u32) -> Option<(&'static str, usize, usize)> { todo!() }
pub fn dequantize_row(_dt: DType, _src: &[u8], _dst: &mut [f32]) { todo!() }
pub fn dot_row(_dt: DType, _row: &[u8], _x: &[f32]) -> f32 { todo!() }
pub fn quantize_row(_dt: DType, _src: &[f32], _dst: &mut [u8]) { todo!() }
