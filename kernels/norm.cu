// Normalisation kernels.
//
// Twins: src/backend/cpu/ops/norm.rs (CPU), src/backend/cuda/ops/norm.rs (launchers);
// tests: norm_* in tests/cuda_kernels.rs.
//
// rmsnorm_f32: y[r][i] = x[r][i] * w[i] / sqrt(mean_i(x[r][i]^2) + eps)
//   x, y: [rows][n] row-major f32; w: [n] f32.
//   Launch: grid = (rows), block = (T) with T a multiple of 32, 32 <= T <= 1024.
//   One block per row: each thread sums squares over a strided slice (float4
//   loads when n % 4 == 0), warps reduce with shuffles, warp sums meet in shared memory.
//   Each thread writes exactly the elements it read, after the block-wide sum.
//
// rmsnorm_inplace_f32: the same with y == x (per-head Q/K norm). A separate entry so
//   that no pointer pair is declared __restrict__ while aliasing; same launch shape.
//
// add_rmsnorm_f32: the residual add and the next norm in one pass:
//   x[r][i] += d[r][i]; y[r][i] = rmsnorm(x[r])[i] * w[i]
//   Bit-identical to add_f32 then rmsnorm_f32: the add is the same f32 add, and the norm
//   is the same rmsnorm_row on the updated row. Each thread adds exactly the elements it
//   later reads in rmsnorm_row (same loop shape), so no barrier is needed between the two.
//   Same launch shape as rmsnorm_f32.
#include "common.cuh"

// Sum of v over the whole block; every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float warp_sums[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = lane < nwarps ? warp_sums[lane] : 0.0f;
    v = warp_sum(v);  // every warp reduces the partial sums: no second barrier needed
    return v;
}

// xr and yr are not __restrict__: the in-place entry passes the same row for both.
template <bool InPlace>
__device__ __forceinline__ void rmsnorm_row(const float* xr, const float* __restrict__ w, float* yr, int n,
                                            float eps) {
    float ss = 0.0f;
    if ((n & 3) == 0) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (int i = threadIdx.x; i < (n >> 2); i += blockDim.x) {
            const float4 v = x4[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    }
    // block_sum ends with every thread past a __syncthreads: all reads of the row
    // (by every thread) are done before any write below.
    const float scale = rsqrtf(block_sum(ss) / (float)n + eps);

    if ((n & 3) == 0) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        const float4* w4 = reinterpret_cast<const float4*>(w);
        float4* y4 = reinterpret_cast<float4*>(yr);
        for (int i = threadIdx.x; i < (n >> 2); i += blockDim.x) {
            const float4 v = x4[i];
            const float4 g = w4[i];
            y4[i] = make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z, v.w * scale * g.w);
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
    }
}

extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                       float* __restrict__ y, int rows, int n, float eps) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    rmsnorm_row<false>(x + (size_t)row * n, w, y + (size_t)row * n, n, eps);
}

extern "C" __global__ void rmsnorm_inplace_f32(float* x /*[rows][n], in place*/, const float* __restrict__ w,
                                               int rows, int n, float eps) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    float* xr = x + (size_t)row * n;
    rmsnorm_row<true>(xr, w, xr, n, eps);
}

extern "C" __global__ void add_rmsnorm_f32(float* __restrict__ x /*[rows][n], updated*/,
                                           const float* __restrict__ d /*[rows][n]*/,
                                           const float* __restrict__ w, float* __restrict__ y, int rows, int n,
                                           float eps) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    float* xr = x + (size_t)row * n;
    const float* dr = d + (size_t)row * n;
    if ((n & 3) == 0) {
        float4* x4 = reinterpret_cast<float4*>(xr);
        const float4* d4 = reinterpret_cast<const float4*>(dr);
        for (int i = threadIdx.x; i < (n >> 2); i += blockDim.x) {
            float4 v = x4[i];
            const float4 a = d4[i];
            v.x += a.x; v.y += a.y; v.z += a.z; v.w += a.w;
            x4[i] = v;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] += dr[i];
    }
    rmsnorm_row<false>(xr, w, y + (size_t)row * n, n, eps);
}
