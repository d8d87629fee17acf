// Matrix-vector products for decode: y[b][r] = sum_c W[r][c] * x[b][c].
//
// W: [rows][cols] row-major weights (f16, or ggml Q8_0 blocks); x: [batch][cols] f32;
// y: [batch][rows] f32. One warp per weight row; a row is read once for up to
// GEMV_MAX_BATCH vectors (larger batches walk the row again per tile of vectors,
// from L2). Launch: grid = (ceil(rows / (T/32))), block = (T), T a multiple of 32
// (the launcher uses 128: four rows per block).
#include <cuda_fp16.h>

#define FULL_MASK 0xffffffffu
#define GEMV_MAX_BATCH 8

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

// Lane 0 of the warp writes the reduced accumulators of batch tile [b0, b0+nb).
__device__ __forceinline__ void store_tile(float (&acc)[GEMV_MAX_BATCH], float* y, int rows, int row,
                                           int b0, int nb, int lane) {
#pragma unroll
    for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
        const float s = warp_sum(acc[b]);
        if (lane == 0 && b < nb) y[(size_t)(b0 + b) * rows + row] = s;
    }
}

// ---- f16 weights -------------------------------------------------------------------

// 16-byte loads: 8 halves of W and 2 float4 of each x vector per step. Needs cols % 8 == 0
// (then every row of W starts 16-byte aligned and every row of x 32-byte aligned).
__device__ __forceinline__ void gemv_f16_tile_vec(const __half* __restrict__ wr, const float* __restrict__ x,
                                                  int cols, int b0, int nb, int lane,
                                                  float (&acc)[GEMV_MAX_BATCH]) {
    const uint4* w8 = reinterpret_cast<const uint4*>(wr);
    const int nchunks = cols >> 3;
    for (int k = lane; k < nchunks; k += 32) {
        const uint4 raw = w8[k];
        const __half2* h = reinterpret_cast<const __half2*>(&raw);
        const float2 w01 = __half22float2(h[0]);
        const float2 w23 = __half22float2(h[1]);
        const float2 w45 = __half22float2(h[2]);
        const float2 w67 = __half22float2(h[3]);
#pragma unroll
        for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
            if (b < nb) {
                const float4* xb = reinterpret_cast<const float4*>(x + (size_t)(b0 + b) * cols) + 2 * k;
                const float4 a = xb[0];
                const float4 c = xb[1];
                float s = acc[b];
                s = fmaf(w01.x, a.x, s); s = fmaf(w01.y, a.y, s);
                s = fmaf(w23.x, a.z, s); s = fmaf(w23.y, a.w, s);
                s = fmaf(w45.x, c.x, s); s = fmaf(w45.y, c.y, s);
                s = fmaf(w67.x, c.z, s); s = fmaf(w67.y, c.w, s);
                acc[b] = s;
            }
        }
    }
}

// Scalar path for cols % 8 != 0 (rows not 16-byte aligned): coalesced 2-byte loads.
__device__ __forceinline__ void gemv_f16_tile_scalar(const __half* __restrict__ wr, const float* __restrict__ x,
                                                     int cols, int b0, int nb, int lane,
                                                     float (&acc)[GEMV_MAX_BATCH]) {
    for (int c = lane; c < cols; c += 32) {
        const float wv = __half2float(wr[c]);
#pragma unroll
        for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
            if (b < nb) acc[b] = fmaf(wv, x[(size_t)(b0 + b) * cols + c], acc[b]);
        }
    }
}

extern "C" __global__ void gemv_f16_f32(const __half* __restrict__ W /*[rows][cols]*/,
                                        const float* __restrict__ x /*[batch][cols]*/,
                                        float* __restrict__ y /*[batch][rows]*/,
                                        int rows, int cols, int batch) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warp leaves together
    const __half* wr = W + (size_t)row * cols;
    const bool vec = (cols & 7) == 0;
    for (int b0 = 0; b0 < batch; b0 += GEMV_MAX_BATCH) {
        const int nb = min(GEMV_MAX_BATCH, batch - b0);
        float acc[GEMV_MAX_BATCH];
#pragma unroll
        for (int b = 0; b < GEMV_MAX_BATCH; ++b) acc[b] = 0.0f;
        if (vec) gemv_f16_tile_vec(wr, x, cols, b0, nb, lane, acc);
        else gemv_f16_tile_scalar(wr, x, cols, b0, nb, lane, acc);
        store_tile(acc, y, rows, row, b0, nb, lane);
    }
}

// ---- Q8_0 weights (ggml) ------------------------------------------------------------
// A block is { f16 d; int8 qs[32]; } = 34 bytes, value = d * qs[i]; a row holds cols/32
// blocks (cols % 32 == 0, checked by the launcher). Blocks are only 2-byte aligned, so
// four lanes share a block, each reading 8 quants as four 2-byte loads; a warp covers 8
// consecutive blocks (272 bytes) per step.

#define QK8_0 32
#define Q8_0_BYTES 34

extern "C" __global__ void gemv_q8_0_f32(const unsigned char* __restrict__ W /*[rows][cols/32] blocks*/,
                                         const float* __restrict__ x /*[batch][cols]*/,
                                         float* __restrict__ y /*[batch][rows]*/,
                                         int rows, int cols, int batch) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int nblocks = cols / QK8_0;
    const unsigned char* wr = W + (size_t)row * nblocks * Q8_0_BYTES;
    const int sub = lane & 3;  // which 8 quants of the block
    for (int b0 = 0; b0 < batch; b0 += GEMV_MAX_BATCH) {
        const int nb = min(GEMV_MAX_BATCH, batch - b0);
        float acc[GEMV_MAX_BATCH];
#pragma unroll
        for (int b = 0; b < GEMV_MAX_BATCH; ++b) acc[b] = 0.0f;
        for (int kb = lane >> 2; kb < nblocks; kb += 8) {
            const unsigned char* blk = wr + (size_t)kb * Q8_0_BYTES;
            const float d = __half2float(*reinterpret_cast<const __half*>(blk));
            const unsigned short* q2 = reinterpret_cast<const unsigned short*>(blk + 2) + sub * 4;
            float q[8];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const unsigned short p = q2[j];
                q[2 * j] = (float)(signed char)(p & 0xff);
                q[2 * j + 1] = (float)(signed char)(p >> 8);
            }
#pragma unroll
            for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
                if (b < nb) {
                    const float4* xb = reinterpret_cast<const float4*>(
                        x + (size_t)(b0 + b) * cols + (size_t)kb * QK8_0 + sub * 8);
                    const float4 a = xb[0];
                    const float4 c = xb[1];
                    float s = q[0] * a.x;
                    s = fmaf(q[1], a.y, s); s = fmaf(q[2], a.z, s); s = fmaf(q[3], a.w, s);
                    s = fmaf(q[4], c.x, s); s = fmaf(q[5], c.y, s); s = fmaf(q[6], c.z, s);
                    s = fmaf(q[7], c.w, s);
                    acc[b] = fmaf(d, s, acc[b]);
                }
            }
        }
        store_tile(acc, y, rows, row, b0, nb, lane);
    }
}
