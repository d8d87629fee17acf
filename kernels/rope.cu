// RoPE on Q and K, then K (rotated) and V stored as f16 into the paged KV pool.
//
// Twins: src/backend/cpu/ops/rope.rs (CPU), src/backend/cuda/ops/rope.rs (launchers);
// tests: rope_* in tests/cuda_kernels.rs.
//
// q: [n_tokens][n_heads * head_dim] f32, rotated in place.
// k: [n_tokens][n_kv_heads * head_dim] f32, rotated in place.
// v: [n_tokens][n_kv_heads * head_dim] f32.
// cos, sin: [n_tokens][rot_dim / 2] f32 (angles computed on the host).
// rot_dim: the leading dimensions of each head that turn (even, <= head_dim; head_dim
// unless the model has partial rotary); the others pass unchanged (K's still stored).
// slots: [n_tokens] u32 slot ids: block = id / 16, slot = id % 16.
// kv: the pool, f16, [n_blocks][n_layers][K=0|V=1][16 slots][kv_dim], kv_dim = n_kv_heads * head_dim.
// Pairs (i, i + rot_dim/2) when neox != 0, else (2i, 2i+1), i < rot_dim/2:
//   x0' = x0*cos[i] - x1*sin[i],  x1' = x0*sin[i] + x1*cos[i]
// computed with unfused f32 products (__fmul_rn), so the result is bit-for-bit the
// CPU backend's. A slot whose block is >= n_blocks is not written (guard; the host
// checks slots). Tokens must have distinct slots.
// Launch: grid = (n_tokens, n_heads + n_kv_heads), block = (T), T >= 1 (launcher: head_dim / 2
// rounded up to a multiple of 32, at most 128). Block (t, y) takes query head y of token t
// when y < n_heads, else KV head y - n_heads (K rotated and stored, V stored); its threads
// own whole pairs, so the in-place update is race-free and every element is computed
// exactly as one block per token computed it.
#include "common.cuh"

__device__ __forceinline__ void rot(float x0, float x1, float c, float s, float& y0, float& y1) {
    y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

extern "C" __global__ void rope_kv_write_f32(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                                             const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                             const unsigned int* __restrict__ slots, __half* __restrict__ kv,
                                             int n_tokens, int n_heads, int n_kv_heads, int head_dim, int rot_dim,
                                             int neox,
                                             int n_layers, int layer, int n_blocks) {
    const int t = blockIdx.x;
    const int y = blockIdx.y;
    if (t >= n_tokens || y >= n_heads + n_kv_heads) return;
    const int half_d = rot_dim >> 1;
    const int q_dim = n_heads * head_dim;
    const int kv_dim = n_kv_heads * head_dim;
    const float* c_row = cos_t + (size_t)t * half_d;
    const float* s_row = sin_t + (size_t)t * half_d;

    if (y < n_heads) {
        float* qh = q + (size_t)t * q_dim + (size_t)y * head_dim;
        for (int j = threadIdx.x; j < half_d; j += blockDim.x) {
            const int a = neox ? j : 2 * j;
            const int b = neox ? a + half_d : a + 1;
            float y0, y1;
            rot(qh[a], qh[b], c_row[j], s_row[j], y0, y1);
            qh[a] = y0;
            qh[b] = y1;
        }
        return;
    }

    const int h = y - n_heads;
    const unsigned int slot_id = slots[t];
    const unsigned int blk = slot_id / BLOCK_POSITIONS;
    const bool store = blk < (unsigned int)n_blocks;
    const size_t block_elems = (size_t)n_layers * 2 * BLOCK_POSITIONS * kv_dim;
    const size_t k_base = (size_t)blk * block_elems +
                          ((size_t)layer * 2 * BLOCK_POSITIONS + slot_id % BLOCK_POSITIONS) * kv_dim +
                          (size_t)h * head_dim;
    const size_t v_base = k_base + (size_t)BLOCK_POSITIONS * kv_dim;

    float* kh = k + (size_t)t * kv_dim + (size_t)h * head_dim;
    for (int j = threadIdx.x; j < half_d; j += blockDim.x) {
        const int a = neox ? j : 2 * j;
        const int b = neox ? a + half_d : a + 1;
        float y0, y1;
        rot(kh[a], kh[b], c_row[j], s_row[j], y0, y1);
        kh[a] = y0;
        kh[b] = y1;
        if (store) {
            kv[k_base + a] = __float2half_rn(y0);
            kv[k_base + b] = __float2half_rn(y1);
        }
    }
    if (store) {
        for (int i = rot_dim + threadIdx.x; i < head_dim; i += blockDim.x) kv[k_base + i] = __float2half_rn(kh[i]);
    }
    if (store) {
        const float* vh = v + (size_t)t * kv_dim + (size_t)h * head_dim;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) kv[v_base + i] = __float2half_rn(vh[i]);
    }
}
