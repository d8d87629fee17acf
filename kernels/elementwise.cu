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

// out[r] = index of the largest value of row r of logits ([rows][vocab]), the first one
// on ties, for r < rows. NaN never wins; a row with no value above -inf gives 0 (as
// the CPU backend's scan, which starts from index 0).
// Launch: grid = (rows), block = (T), T a multiple of 32, 32 <= T <= 1024 (launcher: 512).
extern "C" __global__ void argmax_f32(const float* __restrict__ logits, unsigned int* __restrict__ out, int rows,
                                      int vocab) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* x = logits + (size_t)r * vocab;
    const int NONE = 0x7fffffff;
    float bv = __int_as_float(0xff800000);  // -inf
    int bi = NONE;
    // Each thread scans ascending indices with a strict >: its own first max.
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = x[i];
        if (v > bv) {
            bv = v;
            bi = i;
        }
    }
    warp_argmax(bv, bi);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < nwarps ? sv[lane] : __int_as_float(0xff800000);
        bi = lane < nwarps ? si[lane] : NONE;
        warp_argmax(bv, bi);
        if (lane == 0) out[r] = (unsigned int)(bi == NONE ? 0 : bi);
    }
}
