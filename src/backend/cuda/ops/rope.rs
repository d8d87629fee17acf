//! RoPE on the device, fused with the KV write: Q and K rotated in place, then K and V
//! stored as f16 into the paged pool. Twins: `backend/cpu/ops/rope.rs` (the CPU op),
//! `kernels/rope.cu` (the kernel); tests: `rope_*` in tests/cuda_kernels.rs.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::{launch_err, mul, need, to_i32, AttnShape, KvPool, Ops};
use crate::error::Error;
use crate::Result;

kernel_set!("rope", {
    rope_kv_write = "rope_kv_write_f32",
});

/// The grid's y dimension holds at most this many blocks.
const GRID_Y_MAX: usize = 65535;

/// The projected Q, K and V of `n_tokens` tokens with heads of `shape`: `q`
/// `[n_tokens][n_heads * head_dim]`, `k` and `v` `[n_tokens][n_kv_heads * head_dim]`.
pub struct Qkv<'a> {
    pub q: &'a mut CudaSlice<f32>,
    pub k: &'a mut CudaSlice<f32>,
    pub v: &'a CudaSlice<f32>,
    pub n_tokens: usize,
    pub shape: AttnShape,
}

/// The rotation: `cos`/`sin` (`[n_tokens][dim / 2]`, computed on the host) turn the
/// first `dim` dimensions of each head (`Config::rope_dim`: even, at most the head
/// size; the rest pass unchanged), pairs (i, i + dim/2) when `neox` else (2i, 2i+1).
#[derive(Clone, Copy)]
pub struct Rope<'a> {
    pub cos: &'a CudaSlice<f32>,
    pub sin: &'a CudaSlice<f32>,
    pub neox: bool,
    pub dim: usize,
}

/// Where K and V go: layer `layer` of `kv`, slot id `slots[t]` for token t.
pub struct KvWrite<'a> {
    pub kv: &'a mut KvPool,
    pub layer: usize,
    pub slots: &'a CudaSlice<u32>,
}

impl Ops {
    /// RoPE on `x.q` and `x.k` in place with `rope`; then K (rotated) and V of token t
    /// are stored as f16 into `dst.kv` at layer `dst.layer`, slot id `dst.slots[t]`.
    ///
    /// Slot ids must be distinct within a call. (A slot id whose block is >= `kv.n_blocks`
    /// is not written: a device-side guard, the host checks slots.) The rotation uses
    /// unfused f32 products, bit-for-bit the CPU backend's `ops::rope`.
    pub fn rope_kv_write(&self, x: Qkv, rope: Rope, dst: KvWrite) -> Result<()> {
        const OP: &str = "rope_kv_write";
        let Qkv { q, k, v, n_tokens, shape } = x;
        let KvWrite { kv, layer, slots } = dst;
        let AttnShape { n_heads, n_kv_heads, head_dim } = shape;
        if head_dim == 0 || head_dim % 2 != 0 || n_heads == 0 || n_kv_heads == 0 {
            return Err(Error::invalid(format!("{OP}: bad shape {shape:?} (head_dim must be even and > 0)")));
        }
        let rot = rope.dim;
        if rot == 0 || !rot.is_multiple_of(2) || rot > head_dim {
            return Err(Error::invalid(format!("{OP}: {rot} rotated dimensions (even, 2 to head_dim {head_dim})")));
        }
        let (q_dim, kv_dim) = kv.check_layer(OP, shape, layer)?;
        need(OP, "q", q.len(), mul(OP, n_tokens, q_dim)?)?;
        need(OP, "k", k.len(), mul(OP, n_tokens, kv_dim)?)?;
        need(OP, "v", v.len(), n_tokens * kv_dim)?;
        need(OP, "cos", rope.cos.len(), mul(OP, n_tokens, rot / 2)?)?;
        need(OP, "sin", rope.sin.len(), n_tokens * (rot / 2))?;
        need(OP, "slots", slots.len(), n_tokens)?;
        to_i32(OP, "n_tokens * n_heads * head_dim", n_tokens * q_dim)?;
        let n_t = to_i32(OP, "n_tokens", n_tokens)?;
        let nh = to_i32(OP, "n_heads", n_heads)?;
        let nkv = to_i32(OP, "n_kv_heads", n_kv_heads)?;
        let hd = to_i32(OP, "head_dim", head_dim)?;
        let rot_i = to_i32(OP, "rot_dim", rot)?;
        to_i32(OP, "kv_dim", kv_dim)?;
        let neox_i: i32 = rope.neox.into();
        let (n_layers, layer_i, n_blocks) = kv.kernel_ints(OP, layer)?;
        let heads = n_heads + n_kv_heads;
        if heads > GRID_Y_MAX {
            return Err(Error::invalid(format!("{OP}: {n_heads} + {n_kv_heads} heads exceed the grid ({GRID_Y_MAX})")));
        }
        if n_tokens == 0 {
            return Ok(());
        }
        // A block per (token, head): threads over the head's pairs (at most 128).
        let threads = (head_dim / 2).next_multiple_of(32).min(128) as u32;
        let cfg = LaunchConfig {
            grid_dim: (n_tokens as u32, heads as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.rope.rope_kv_write);
        b.arg(q)
            .arg(k)
            .arg(v)
            .arg(rope.cos)
            .arg(rope.sin)
            .arg(slots)
            .arg(&mut kv.data)
            .arg(&n_t)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&rot_i)
            .arg(&neox_i)
            .arg(&n_layers)
            .arg(&layer_i)
            .arg(&n_blocks);
        // SAFETY: the arguments match rope_kv_write_f32 in kernels/rope.cu (q, k, v, cos, sin,
        // slots, kv pointers, then int n_tokens, n_heads, n_kv_heads, head_dim, rot_dim, neox,
        // n_layers, layer, n_blocks); q, k, v, cos, sin, slots hold what n_tokens tokens need
        // (checked above), the pool holds n_blocks blocks of n_layers*2*16*kv_dim f16 with
        // kv_dim = n_kv_heads*head_dim and layer < n_layers (check_layer); slot ids whose
        // block is >= n_blocks are skipped by the kernel; head_dim is even; grid (n_tokens,
        // n_heads + n_kv_heads <= 65535 (checked)), a block per (token, head); rot_dim is even
        // and at most head_dim (checked), the cos/sin rows rot_dim / 2 wide.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(OP, e))?;
        Ok(())
    }
}
