// Element-wise kernels, row gathers, argmax.
//
// Twins: src/backend/cpu/ops/elementwise.rs (CPU), src/backend/cuda/ops/elementwise.rs (launchers);
// tests: elementwise_* in tests/cuda_kernels.rs.
//
// Unless a kernel says otherwise: launch grid = (G), block = (T) with T a multiple of
// 32; the kernel walks its elements with a grid-stride loop (64-bit indices), so any
// G >= 1 covers every element (the launcher uses T = 256 and G = min(ceil(total/T), 65535)).
#include "common.cuh"

// x[r][i] += b[i] for r < rows, i < n. x: [rows][n]; b: [n].
extern "C" __global__ void add_bias_f32(float* __restrict__ x, const float* __restrict__ b, int rows, int n) {
    const long long total = (long long)rows * n;
    GRID_STRIDE(i, total) { x[i] += b[i % n]; }
}

// x[i] += y[i] for i < n.
extern "C" __global__ void add_f32(float* __restrict__ x, const float* __restrict__ y, int n) {
    GRID_STRIDE(i, (long long)n) { x[i] += y[i]; }
}

// g[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u, for i < n (expf, IEEE division).
extern "C" __global__ void swiglu_f32(float* __restrict__ g, const float* __restrict__ u, int n) {
    GRID_STRIDE(i, (long long)n) {
        const float a = g[i];
        g[i] = a / (1.0f + expf(-a)) * u[i];
    }
}

// g[i] = gelu_tanh(g[i]) * u[i] for i < n: GELU's tanh approximation (transformers'
// gelu_pytorch_tanh), 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))), tanhf. GeGLU (gemma).
extern "C" __global__ void geglu_f32(float* __restrict__ g, const float* __restrict__ u, int n) {
    GRID_STRIDE(i, (long long)n) {
        const float a = g[i];
        g[i] = 0.5f * a * (1.0f + tanhf(0.7978846f * (a + 0.044715f * a * a * a))) * u[i];
    }
}

// x[i] *= s for i < n (gemma's embedding scale).
extern "C" __global__ void scale_f32(float* __restrict__ x, float s, int n) {
    GRID_STRIDE(i, (long long)n) { x[i] *= s; }
}

// x[i] = c * tanh(x[i] / c) for i < n (gemma's final logit soft cap; tanhf, IEEE division).
extern "C" __global__ void softcap_f32(float* __restrict__ x, float c, int n) {
    GRID_STRIDE(i, (long long)n) { x[i] = c * tanhf(x[i] / c); }
}

// out[i][:] = x[idx[i]][:] for i < n_idx; rows of `width`. x: [x_rows][width].
// An index >= x_rows gives a NaN row (guard; the host checks indices).
// Launch: grid = (n_idx), block = (T).
extern "C" __global__ void gather_rows_f32(const float* __restrict__ x, const unsigned int* __restrict__ idx,
                                           float* __restrict__ out, int n_idx, int width, int x_rows) {
    const int i = blockIdx.x;
    if (i >= n_idx) return;
    const unsigned int r = idx[i];
    float* o = out + (size_t)i * width;
    if (r >= (unsigned int)x_rows) {
        for (int c = threadIdx.x; c < width; c += blockDim.x) o[c] = __int_as_float(0x7fc00000);
        return;
    }
    const float* src = x + (size_t)r * width;
    for (int c = threadIdx.x; c < width; c += blockDim.x) o[c] = src[c];
}

// out[idx[i]][c] += w[i] * y[i][c] for i < n_idx, c < width: row i of y, scaled by its
// weight, added into output row idx[i] (the experts' outputs into their tokens' rows). The
// product and the sum are rounded separately (__fmul_rn, __fadd_rn: no FMA), exactly the
// CPU's axpy. The indices of one launch must be distinct (one block owns each output row);
// an index >= out_rows is skipped (guard; the host checks indices).
// Launch: grid = (n_idx), block = (T).
extern "C" __global__ void scatter_axpy_f32(float* __restrict__ out, const float* __restrict__ y,
                                            const unsigned int* __restrict__ idx, const float* __restrict__ w,
                                            int n_idx, int width, int out_rows) {
    const int i = blockIdx.x;
    if (i >= n_idx) return;
    const unsigned int r = idx[i];
    if (r >= (unsigned int)out_rows) return;
    const float a = w[i];
    float* o = out + (size_t)r * width;
    const float* src = y + (size_t)i * width;
    for (int c = threadIdx.x; c < width; c += blockDim.x) o[c] = __fadd_rn(o[c], __fmul_rn(a, src[c]));
}

// ---- argmax -----------------------------------------------------------------------------

// (v, i) beats (bv, bi) when larger, or equal with a smaller index (first max wins).
__device__ __forceinline__ void arg_better(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

// The best (value, index) of the warp, by arg_better over an xor-shuffle tree; every lane gets it.
__device__ __forceinline__ void warp_argmax(float& bv, int& bi) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, bv, off);
        const int oi = __shfl_xor_sync(FULL_MASK, bi, off);
        arg_better(bv, bi, ov, oi);
    }
}

// argmax in two stages, so that a row of a 128k vocabulary is scanned by many blocks:
//   argmax_part_f32:  block (c, r) takes chunk c of row r (ARGMAX_CHUNK logits) and writes
//                     its own first max: part[(r * n_chunks + c) * 2] = value bits,
//                     [.. + 1] = index (ARGMAX_NONE when nothing in the chunk is above -inf).
//   argmax_final_f32: a warp per row reduces the row's n_chunks partials.
// out[r] = index of the largest value of row r of logits ([rows][vocab]), the first one
// on ties, for r < rows: exactly crate::util::argmax, the CPU's scan from index 0 with a
// strict >. So NaN never wins, except that a NaN at index 0 is never beaten (the scan
// compares against it and every comparison is false): such a row gives 0; a row with
// nothing above -inf gives 0.
// Launch: argmax_part_f32 grid = (n_chunks, min(rows, 65535)), block = (T), T a multiple of
// 32, 32 <= T <= ARGMAX_THREADS (launcher: ARGMAX_THREADS), n_chunks = ceil(vocab /
// ARGMAX_CHUNK); rows past gridDim.y are walked by a block-uniform loop. argmax_final_f32
// grid = (rows), block = (32).
#define ARGMAX_THREADS 256
#define ARGMAX_CHUNK 4096
#define ARGMAX_NONE 0x7fffffff

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_part_f32(const float* __restrict__ logits, unsigned int* __restrict__ part, int rows, int vocab,
                    int n_chunks) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const int c = blockIdx.x;
    if (c >= n_chunks) return;  // uniform over the block
    const long long begin = (long long)c * ARGMAX_CHUNK;
    const long long end = min((long long)vocab, begin + ARGMAX_CHUNK);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {  // uniform over the block
        const float* x = logits + (size_t)r * vocab;
        float bv = __int_as_float(0xff800000);  // -inf
        int bi = ARGMAX_NONE;
        // Each thread scans ascending indices with a strict >: its own first max.
        for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
            const float v = x[i];
            if (v > bv) {
                bv = v;
                bi = (int)i;
            }
        }
        warp_argmax(bv, bi);
        if (lane == 0) {
            sv[warp] = bv;
            si[warp] = bi;
        }
        __syncthreads();
        if (warp == 0) {
            bv = lane < nwarps ? sv[lane] : __int_as_float(0xff800000);
            bi = lane < nwarps ? si[lane] : ARGMAX_NONE;
            warp_argmax(bv, bi);
            if (lane == 0) {
                const size_t p = ((size_t)r * n_chunks + c) * 2;
                part[p] = __float_as_uint(bv);
                part[p + 1] = (unsigned int)bi;
            }
        }
        __syncthreads();  // sv/si are rewritten by the next row
    }
}

extern "C" __global__ void argmax_final_f32(const float* __restrict__ logits, const unsigned int* __restrict__ part,
                                            unsigned int* __restrict__ out, int rows, int vocab, int n_chunks) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    const int lane = threadIdx.x & 31;
    const unsigned int* p = part + (size_t)r * n_chunks * 2;
    float bv = __int_as_float(0xff800000);
    int bi = ARGMAX_NONE;
    // Chunks ascend with the lane's loop, so a strict > keeps the lane's first max; the
    // tree below breaks ties by index.
    for (int c = lane; c < n_chunks; c += 32) {
        const float v = __uint_as_float(p[(size_t)c * 2]);
        if (v > bv) {
            bv = v;
            bi = (int)p[(size_t)c * 2 + 1];
        }
    }
    warp_argmax(bv, bi);
    if (lane == 0) {
        const float x0 = logits[(size_t)r * vocab];
        out[r] = (x0 != x0 || bi == ARGMAX_NONE) ? 0u : (unsigned int)bi;
    }
}
