//! The weight table by role, bound to a file's tensors with every shape and type
//! checked against the hyperparameters. Matrices stay in the mapped file (zero
//! copy); small vectors (norms, biases, RoPE divisors) are read into f32.

use super::Config;
use crate::format::gguf::{Gguf, TensorInfo};
use crate::quant::{self, DType};
use crate::{Error, Result};
use std::sync::Arc;

/// A 2-D weight `[rows][cols]` (ggml `ne = [cols, rows]`): row `r` is the output
/// row of a matrix-vector product, stored in the file's type.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub name: String,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// Byte range inside the mapped file.
    pub offset: usize,
    pub row_bytes: usize,
}

impl Matrix {
    /// Bytes of the whole matrix.
    pub fn bytes<'a>(&self, file: &'a Gguf) -> &'a [u8] {
        &file.bytes()[self.offset..self.offset + self.rows * self.row_bytes]
    }
}

/// One transformer block's weights.
#[derive(Clone, Debug)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
}

/// Every weight of a model, over its mapped file.
pub struct Weights {
    pub file: Arc<Gguf>,
    pub token_embd: Matrix,
    pub layers: Vec<Layer>,
    pub output_norm: Vec<f32>,
    /// The LM head; the embedding table when the model ties them.
    pub output: Matrix,
    /// Llama-3 RoPE scaling: per-frequency divisors (`rope_freqs.weight`).
    pub rope_freqs: Option<Vec<f32>>,
    /// Bytes of weights as stored.
    pub bytes: u64,
}

struct Binder<'a> {
    file: &'a Gguf,
    fname: String,
    bytes: u64,
}

impl<'a> Binder<'a> {
    fn info(&self, name: &str) -> Result<&'a TensorInfo> {
        self.file
            .tensor(name)
            .ok_or_else(|| Error::bad_model(format!("{}: tensor {name} is missing", self.fname)))
    }

    fn dtype(&self, t: &TensorInfo) -> Result<DType> {
        t.dtype.ok_or_else(|| {
            let ty = quant::ggml_type_info(t.ggml_type).map(|i| i.0).unwrap_or("unknown");
            Error::unsupported(format!(
                "{}: tensor {} has type {ty} (ggml type {}), which is not supported (F32, F16, BF16, Q8_0, Q4_0 are)",
                self.fname, t.name, t.ggml_type
            ))
        })
    }

    fn shape_err(&self, t: &TensorInfo, want: &[usize]) -> Error {
        Error::bad_model(format!(
            "{}: tensor {} has shape {:?}, expected {:?} (ggml order) from the hyperparameters",
            self.fname, t.name, t.ne, want
        ))
    }

    fn matrix(&mut self, name: &str, cols: usize, rows: usize) -> Result<Matrix> {
        let t = self.info(name)?;
        if t.ne.len() != 2 || t.ne[0] as usize != cols || t.ne[1] as usize != rows {
            return Err(self.shape_err(t, &[cols, rows]));
        }
        let dtype = self.dtype(t)?;
        let row_bytes = dtype.row_bytes(cols).ok_or_else(|| {
            Error::bad_model(format!(
                "{}: tensor {name}: row length {cols} is not a multiple of the {} block size {}",
                self.fname,
                dtype.name(),
                dtype.block_elems()
            ))
        })?;
        if row_bytes as u64 * rows as u64 != t.size {
            return Err(Error::bad_model(format!(
                "{}: tensor {name} holds {} bytes, expected {}",
                self.fname,
                t.size,
                row_bytes as u64 * rows as u64
            )));
        }
        self.bytes += t.size;
        Ok(Matrix { name: name.to_string(), dtype, rows, cols, offset: t.offset as usize, row_bytes })
    }

    fn vector(&mut self, name: &str, n: usize) -> Result<Vec<f32>> {
        let t = self.info(name)?;
        if t.ne.len() != 1 || t.ne[0] as usize != n {
            return Err(self.shape_err(t, &[n]));
        }
        let dtype = self.dtype(t)?;
        let data = self.file.tensor_data(t);
        if dtype.row_bytes(n) != Some(data.len()) {
            return Err(Error::bad_model(format!(
                "{}: tensor {name} holds {} bytes, expected {:?}",
                self.fname,
                data.len(),
                dtype.row_bytes(n)
            )));
        }
        let mut out = vec![0f32; n];
        quant::dequantize_row(dtype, data, &mut out);
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(Error::bad_model(format!("{}: tensor {name} has a non-finite value at index {i}", self.fname)));
        }
        self.bytes += t.size;
        Ok(out)
    }

    fn opt_vector(&mut self, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
        if self.file.tensor(name).is_some() {
            self.vector(name, n).map(Some)
        } else {
            Ok(None)
        }
    }
}

impl Weights {
    /// Binds every tensor the forward pass needs, checking names, shapes and types;
    /// `progress` sees the fraction of layers bound.
    pub fn bind(file: Arc<Gguf>, cfg: &Config, progress: &mut dyn FnMut(f32)) -> Result<Weights> {
        let fname = file.path.display().to_string();
        let mut b = Binder { file: &file, fname: fname.clone(), bytes: 0 };
        // Any tensor of an unsupported type is reported, even one we would not read.
        for t in &file.tensors {
            b.dtype(t)?;
        }
        let (h, q, kv, f, v) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.ffn, cfg.vocab_size);
        let token_embd = b.matrix("token_embd.weight", h, v)?;
        let output_norm = b.vector("output_norm.weight", h)?;
        let output = if file.tensor("output.weight").is_some() { b.matrix("output.weight", h, v)? } else { token_embd.clone() };
        let rope_freqs = b.opt_vector("rope_freqs.weight", cfg.head_dim / 2)?;
        if let Some(rf) = &rope_freqs {
            if let Some(i) = rf.iter().position(|&d| d <= 0.0) {
                return Err(Error::bad_model(format!("{fname}: rope_freqs.weight[{i}] = {} is not positive", rf[i])));
            }
        }
        let mut layers = Vec::with_capacity(cfg.n_layers.min(4096));
        for l in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{l}.{s}");
            let layer = Layer {
                attn_norm: b.vector(&n("attn_norm.weight"), h)?,
                wq: b.matrix(&n("attn_q.weight"), h, q)?,
                wk: b.matrix(&n("attn_k.weight"), h, kv)?,
                wv: b.matrix(&n("attn_v.weight"), h, kv)?,
                wo: b.matrix(&n("attn_output.weight"), q, h)?,
                bq: if cfg.arch.qkv_bias { Some(b.vector(&n("attn_q.bias"), q)?) } else { None },
                bk: if cfg.arch.qkv_bias { Some(b.vector(&n("attn_k.bias"), kv)?) } else { None },
                bv: if cfg.arch.qkv_bias { Some(b.vector(&n("attn_v.bias"), kv)?) } else { None },
                q_norm: if cfg.arch.qk_norm { Some(b.vector(&n("attn_q_norm.weight"), cfg.head_dim)?) } else { None },
                k_norm: if cfg.arch.qk_norm { Some(b.vector(&n("attn_k_norm.weight"), cfg.head_dim)?) } else { None },
                ffn_norm: b.vector(&n("ffn_norm.weight"), h)?,
                w_gate: b.matrix(&n("ffn_gate.weight"), h, f)?,
                w_up: b.matrix(&n("ffn_up.weight"), h, f)?,
                w_down: b.matrix(&n("ffn_down.weight"), f, h)?,
            };
            layers.push(layer);
            progress((l + 1) as f32 / cfg.n_layers as f32);
        }
        let bytes = b.bytes;
        Ok(Weights { file, token_embd, layers, output_norm, output, rope_freqs, bytes })
    }
}
