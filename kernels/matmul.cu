// Matrix-vector products for decode: y[b][r] = sum_c W[r][c] * x[b][c].
//
// Twins: src/backend/cpu/ops/matmul.rs (CPU), src/backend/cuda/ops/matmul.rs (launchers);
// tests: matmul_* in tests/cuda_kernels.rs.
//
// W: [rows][cols] row-major weights (f32, f16, bf16, or ggml blocks: Q8_0 / Q4_0 and the
// group-quantized types of common.cuh, GQ_TYPES);
// x: [batch][cols] f32;
// y: [batch][rows] f32. One warp per weight row; a row is read once for up to
// GEMV_MAX_BATCH vectors (larger batches walk the row again per tile of vectors,
// from L2). Launch: grid = (ceil(rows / (T/32))), block = (T), T a multiple of 32
// (the launcher uses 128: four rows per block).
//
// Batch invariance: lane l of a warp always accumulates the same elements of the row
// in the same order (explicit fmaf chains), and the 32 lane sums are reduced with the
// same shuffle tree, whatever the batch size and whichever tile slot a vector takes.
// So y[b][r] is bit-for-bit the same for a vector alone or in any batch (decode relies
// on this). Keep every accumulation an explicit fmaf (no a*b+c left to contraction).
#include "common.cuh"

#define GEMV_MAX_BATCH 8

// Lane 0 of the warp writes the reduced accumulators of batch tile [b0, b0+nb).
__device__ __forceinline__ void store_tile(float (&acc)[GEMV_MAX_BATCH], float* y, int rows, int row,
                                           int b0, int nb, int lane) {
#pragma unroll
    for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
        const float s = warp_sum(acc[b]);
        if (lane == 0 && b < nb) y[(size_t)(b0 + b) * rows + row] = s;
    }
}

// One 16-byte step of a half-precision row: s += w[j] * x[j] for the 8 weights w and the
// 8 activations in the float4 pair (a, c), as one explicit fmaf chain in element order.
__device__ __forceinline__ float dot8(const float (&w)[8], const float4 a, const float4 c, float s) {
    s = fmaf(w[0], a.x, s); s = fmaf(w[1], a.y, s);
    s = fmaf(w[2], a.z, s); s = fmaf(w[3], a.w, s);
    s = fmaf(w[4], c.x, s); s = fmaf(w[5], c.y, s);
    s = fmaf(w[6], c.z, s); s = fmaf(w[7], c.w, s);
    return s;
}

// 8 halves (16 bytes) of an f16 row as f32.
__device__ __forceinline__ void f16x8_to_f32(const uint4 raw, float (&w)[8]) {
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(h[i]);
        w[2 * i] = f.x;
        w[2 * i + 1] = f.y;
    }
}

// 8 bf16 (16 bytes) of a bf16 row as f32 (exact).
__device__ __forceinline__ void bf16x8_to_f32(const uint4 raw, float (&w)[8]) {
    w[0] = bf16_lo(raw.x); w[1] = bf16_hi(raw.x);
    w[2] = bf16_lo(raw.y); w[3] = bf16_hi(raw.y);
    w[4] = bf16_lo(raw.z); w[5] = bf16_hi(raw.z);
    w[6] = bf16_lo(raw.w); w[7] = bf16_hi(raw.w);
}

template <bool Bf16>
__device__ __forceinline__ void half8_to_f32(const uint4 raw, float (&w)[8]) {
    if (Bf16) bf16x8_to_f32(raw, w);
    else f16x8_to_f32(raw, w);
}

// ---- plain GEMV kernels ------------------------------------------------------------------
//
// Every plain kernel is gemv_rows<Row>: warp `row` walks its weight row once per tile of
// up to GEMV_MAX_BATCH vectors; Row::acc adds lane `lane`'s products of the row with
// vectors b0 .. b0+nb into acc; store_tile reduces and writes them. Row::row_bytes(cols):
// bytes of one row.
template <typename Row>
__device__ __forceinline__ void gemv_rows(const unsigned char* __restrict__ W, const float* __restrict__ x,
                                          float* __restrict__ y, int rows, int cols, int batch) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warp leaves together
    const unsigned char* wr = W + (size_t)row * Row::row_bytes(cols);
    for (int b0 = 0; b0 < batch; b0 += GEMV_MAX_BATCH) {
        const int nb = min(GEMV_MAX_BATCH, batch - b0);
        float acc[GEMV_MAX_BATCH];
#pragma unroll
        for (int b = 0; b < GEMV_MAX_BATCH; ++b) acc[b] = 0.0f;
        Row::acc(wr, x, cols, b0, nb, lane, acc);
        store_tile(acc, y, rows, row, b0, nb, lane);
    }
}

// Scalar path (rows not 16-byte aligned): coalesced loads of element c = lane, lane + 32, ...
template <typename L>
__device__ __forceinline__ void tile_scalar(const unsigned char* __restrict__ wr, const float* __restrict__ x,
                                            int cols, int b0, int nb, int lane, float (&acc)[GEMV_MAX_BATCH]) {
    for (int c = lane; c < cols; c += 32) {
        const float wv = L::at(wr, c);
#pragma unroll
        for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
            if (b < nb) acc[b] = fmaf(wv, x[(size_t)(b0 + b) * cols + c], acc[b]);
        }
    }
}

// ---- f16 and bf16 weights ---------------------------------------------------------------
// 16-byte loads: 8 halves of W and 2 float4 of each x vector per step. Needs cols % 8 == 0
// (then every row of W starts 16-byte aligned and every row of x 32-byte aligned); other
// widths take the scalar path.
template <bool Bf16>
struct RowHalf {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)cols * 2; }
    static __device__ __forceinline__ void acc(const unsigned char* __restrict__ wr, const float* __restrict__ x,
                                               int cols, int b0, int nb, int lane, float (&acc)[GEMV_MAX_BATCH]) {
        if ((cols & 7) != 0) {
            if (Bf16) tile_scalar<LoadBF16>(wr, x, cols, b0, nb, lane, acc);
            else tile_scalar<LoadF16>(wr, x, cols, b0, nb, lane, acc);
            return;
        }
        const uint4* w8 = reinterpret_cast<const uint4*>(wr);
        const int nchunks = cols >> 3;
        for (int k = lane; k < nchunks; k += 32) {
            float w[8];
            half8_to_f32<Bf16>(w8[k], w);
#pragma unroll
            for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
                if (b < nb) {
                    const float4* xb = reinterpret_cast<const float4*>(x + (size_t)(b0 + b) * cols) + 2 * k;
                    acc[b] = dot8(w, xb[0], xb[1], acc[b]);
                }
            }
        }
    }
};

// ---- f32 weights -------------------------------------------------------------------------
// float4 loads when cols % 4 == 0, else the scalar path.
struct RowF32 {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)cols * 4; }
    static __device__ __forceinline__ void acc(const unsigned char* __restrict__ wr, const float* __restrict__ x,
                                               int cols, int b0, int nb, int lane, float (&acc)[GEMV_MAX_BATCH]) {
        if ((cols & 3) != 0) {
            tile_scalar<LoadF32>(wr, x, cols, b0, nb, lane, acc);
            return;
        }
        const float4* w4 = reinterpret_cast<const float4*>(wr);
        const int nchunks = cols >> 2;
        for (int k = lane; k < nchunks; k += 32) {
            const float4 wv = w4[k];
#pragma unroll
            for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
                if (b < nb) {
                    const float4 a = reinterpret_cast<const float4*>(x + (size_t)(b0 + b) * cols)[k];
                    float s = acc[b];
                    s = fmaf(wv.x, a.x, s); s = fmaf(wv.y, a.y, s);
                    s = fmaf(wv.z, a.z, s); s = fmaf(wv.w, a.w, s);
                    acc[b] = s;
                }
            }
        }
    }
};

// ---- Q8_0 weights (ggml) -----------------------------------------------------------------
// A block is { f16 d; int8 qs[32]; } = 34 bytes, value = d * qs[i]; a row holds cols/32
// blocks (cols % 32 == 0, checked by the launcher). Blocks are only 2-byte aligned, so
// four lanes share a block, each reading 8 quants as four 2-byte loads; a warp covers 8
// consecutive blocks (272 bytes) per step.
struct RowQ8_0 {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 32) * 34; }
    static __device__ __forceinline__ void acc(const unsigned char* __restrict__ wr, const float* __restrict__ x,
                                               int cols, int b0, int nb, int lane, float (&acc)[GEMV_MAX_BATCH]) {
        const int nblocks = cols / 32;
        const int sub = lane & 3;  // which 8 quants of the block
        for (int kb = lane >> 2; kb < nblocks; kb += 8) {
            const unsigned char* blk = wr + (size_t)kb * 34;
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
                    const float4* xb =
                        reinterpret_cast<const float4*>(x + (size_t)(b0 + b) * cols + (size_t)kb * 32 + sub * 8);
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
    }
};

// ---- Q4_0 weights (ggml) -----------------------------------------------------------------
// A block is { f16 d; unsigned char qs[16]; } = 18 bytes: element j (< 16) is the low
// nibble of qs[j], element j + 16 the high nibble; value = d * (nibble - 8). A row holds
// cols/32 blocks (cols % 32 == 0, checked by the launcher). Blocks are 2-byte aligned:
// four lanes share a block, lane `sub` reading qs[4*sub .. 4*sub+4) as two 2-byte loads
// (elements 4*sub..+4 and 16+4*sub..+4); a warp covers 8 consecutive blocks per step.
struct RowQ4_0 {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / 32) * 18; }
    static __device__ __forceinline__ void acc(const unsigned char* __restrict__ wr, const float* __restrict__ x,
                                               int cols, int b0, int nb, int lane, float (&acc)[GEMV_MAX_BATCH]) {
        const int nblocks = cols / 32;
        const int sub = lane & 3;
        for (int kb = lane >> 2; kb < nblocks; kb += 8) {
            const unsigned char* blk = wr + (size_t)kb * 18;
            const float d = __half2float(*reinterpret_cast<const __half*>(blk));
            const unsigned short* q2 = reinterpret_cast<const unsigned short*>(blk + 2) + sub * 2;
            const unsigned int p = (unsigned int)q2[0] | ((unsigned int)q2[1] << 16);  // qs[4sub..4sub+4)
            float lo[4], hi[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const unsigned int byte = (p >> (8 * j)) & 0xffu;
                lo[j] = (float)((int)(byte & 0xfu) - 8);
                hi[j] = (float)((int)(byte >> 4) - 8);
            }
#pragma unroll
            for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
                if (b < nb) {
                    const float* xb = x + (size_t)(b0 + b) * cols + (size_t)kb * 32 + sub * 4;
                    const float4 a = *reinterpret_cast<const float4*>(xb);       // elements 4sub..+4
                    const float4 c = *reinterpret_cast<const float4*>(xb + 16);  // elements 16+4sub..+4
                    float s = lo[0] * a.x;
                    s = fmaf(lo[1], a.y, s); s = fmaf(lo[2], a.z, s); s = fmaf(lo[3], a.w, s);
                    s = fmaf(hi[0], c.x, s); s = fmaf(hi[1], c.y, s); s = fmaf(hi[2], c.z, s);
                    s = fmaf(hi[3], c.w, s);
                    acc[b] = fmaf(d, s, acc[b]);
                }
            }
        }
    }
};

// ---- group-quantized weights (Q4_1 ... IQ4_XS, common.cuh) -------------------------------
// A row is cols/32 groups of 32 values (cols a multiple of T::QK, checked by the launcher);
// value l of a group is s*q + o per half of 16 (T::q, T::so). Four lanes share a group,
// lane `sub` taking its values 8*sub .. 8*sub+8 (all in half sub/2): the dot product is
// s * sum(q*x) (+ o * sum(x) for offset types), each sum an fmaf chain in element order,
// so the order per output depends only on cols (batch-invariant); a warp covers 8
// consecutive groups (one K-quant super-block) per step.
template <typename T>
struct RowGQ {
    static __device__ __forceinline__ size_t row_bytes(int cols) { return (size_t)(cols / T::QK) * T::BB; }
    static __device__ __forceinline__ void acc(const unsigned char* __restrict__ wr, const float* __restrict__ x,
                                               int cols, int b0, int nb, int lane, float (&acc)[GEMV_MAX_BATCH]) {
        const int ngroups = cols / 32;
        const int sub = lane & 3;
        for (int gi = lane >> 2; gi < ngroups; gi += 8) {
            const unsigned char* blk = wr + (size_t)(gi / (T::QK / 32)) * T::BB;
            const int g = gi % (T::QK / 32);
            float q[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) q[i] = (float)T::q(blk, g, sub * 8 + i);
            float s, o;
            T::so(blk, g, sub >> 1, s, o);
#pragma unroll
            for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
                if (b < nb) {
                    const float4* xb =
                        reinterpret_cast<const float4*>(x + (size_t)(b0 + b) * cols + (size_t)gi * 32 + sub * 8);
                    const float4 a = xb[0];
                    const float4 c = xb[1];
                    float t = q[0] * a.x;
                    t = fmaf(q[1], a.y, t); t = fmaf(q[2], a.z, t); t = fmaf(q[3], a.w, t);
                    t = fmaf(q[4], c.x, t); t = fmaf(q[5], c.y, t); t = fmaf(q[6], c.z, t);
                    t = fmaf(q[7], c.w, t);
                    float r = fmaf(s, t, acc[b]);
                    if (T::OFF) {
                        float u = __fadd_rn(a.x, a.y);
                        u = __fadd_rn(u, a.z); u = __fadd_rn(u, a.w); u = __fadd_rn(u, c.x);
                        u = __fadd_rn(u, c.y); u = __fadd_rn(u, c.z); u = __fadd_rn(u, c.w);
                        r = fmaf(o, u, r);
                    }
                    acc[b] = r;
                }
            }
        }
    }
};

#define GEMV_ENTRY(name, T, Row)                                                                         \
    extern "C" __global__ void name(const T* __restrict__ W /*[rows] rows of Row::row_bytes(cols)*/,    \
                                    const float* __restrict__ x /*[batch][cols]*/,                       \
                                    float* __restrict__ y /*[batch][rows]*/, int rows, int cols, int batch) { \
        gemv_rows<Row>(reinterpret_cast<const unsigned char*>(W), x, y, rows, cols, batch);              \
    }

GEMV_ENTRY(gemv_f32_f32, float, RowF32)
GEMV_ENTRY(gemv_f16_f32, __half, RowHalf<false>)
GEMV_ENTRY(gemv_bf16_f32, unsigned short, RowHalf<true>)
GEMV_ENTRY(gemv_q8_0_f32, unsigned char, RowQ8_0)
GEMV_ENTRY(gemv_q4_0_f32, unsigned char, RowQ4_0)
#define GQ_GEMV(tag, T) GEMV_ENTRY(gemv_##tag##_f32, unsigned char, RowGQ<T>)
GQ_TYPES(GQ_GEMV)

// ---- fast GEMV kernels (LLMRT_CUDA_GEMV=0 or LLMRT_CUDA_FAST=0 turn them off) ----------
// The quantized ones (and their fused launches) are opt-in, LLMRT_CUDA_GEMV_QUANT=1, until a
// GPU has measured them: lane l reads x[(c0 + l) * 32 ..] of the block it dequantises, so
// each 16-byte activation load of the warp touches 32 cache lines (the plain kernels' 8).
//
// Same contract and launch as the kernels above (grid = ceil(rows / 4), block = 128: a warp
// per row), more bytes in flight per warp:
// - gemv_fast_f16_f32 / gemv_fast_bf16_f32 (cols % 8 == 0): each lane issues GEMV_UNROLL
//   16-byte weight loads before using the first. Lane l still accumulates chunks l, l+32,
//   ... in increasing order with the same fmaf chain, so the result is bit-identical to
//   gemv_f16_f32 / gemv_bf16_f32 (and batch-invariant the same way).
// - gemv_fast_q8_0_f32 / gemv_fast_q4_0_f32 (cols % 256 == 0, so that every row starts
//   16-byte aligned): the warp copies FAST_QBLOCKS consecutive blocks of its row with
//   16-byte loads into its own shared-memory stage (about 4 loads per lane in flight),
//   then lane l dequantises blocks l and l + 32 of the stage in registers. Per output,
//   the order of the sum depends only on cols: batch-invariant. (A different order from
//   gemv_q8_0_f32: equal within rounding, not bit for bit.)
//
// KIND: 0 f16, 1 bf16, 2 q8_0, 3 q4_0. fast_acc<KIND> adds lane `lane`'s products of the
// weight row at `wrow` (fast_row<KIND>) with vectors b0 .. b0+nb into acc; every fast and
// fused kernel is built on it,
// so their sums are the same instructions (the fused kernels are bit-identical to the
// fast ones). `stage` is the warp's shared stage (quantized kinds only).

#define GEMV_UNROLL 4
#define FAST_QBLOCKS 64

// Row `row` of W for kind KIND.
template <int KIND>
__device__ __forceinline__ const unsigned char* fast_row(const unsigned char* W, int row, int cols) {
    if (KIND <= 1) return W + (size_t)row * cols * 2;
    return W + (size_t)row * (cols / 32) * (KIND == 2 ? 34 : 18);
}

template <int KIND>
__device__ __forceinline__ void fast_acc(const unsigned char* __restrict__ wrow, const float* __restrict__ x, int cols,
                                         int b0, int nb, int lane, uint4* stage, float (&acc)[GEMV_MAX_BATCH]) {
    if (KIND <= 1) {
        const uint4* w8 = reinterpret_cast<const uint4*>(wrow);
        const int nchunks = cols >> 3;
        for (int k0 = lane; k0 < nchunks; k0 += 32 * GEMV_UNROLL) {
            uint4 raw[GEMV_UNROLL];
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                const int k = k0 + 32 * u;
                if (k < nchunks) raw[u] = w8[k];
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                const int k = k0 + 32 * u;
                if (k < nchunks) {
                    float w[8];
                    half8_to_f32<KIND == 1>(raw[u], w);
#pragma unroll
                    for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
                        if (b < nb) {
                            const float4* xb = reinterpret_cast<const float4*>(x + (size_t)(b0 + b) * cols) + 2 * k;
                            acc[b] = dot8(w, xb[0], xb[1], acc[b]);
                        }
                    }
                }
            }
        }
    } else {
        const int BB = KIND == 2 ? 34 : 18;
        const int nblocks = cols / 32;
        const uint4* wr = reinterpret_cast<const uint4*>(wrow);
        const unsigned char* st = reinterpret_cast<const unsigned char*>(stage);
        for (int c0 = 0; c0 < nblocks; c0 += FAST_QBLOCKS) {
            const int nblk = min(FAST_QBLOCKS, nblocks - c0);  // a multiple of 8
            const int nvec = nblk * BB / 16;
            const uint4* src = wr + (size_t)c0 * BB / 16;
            __syncwarp();  // the previous chunk's stage reads are done
            for (int i = lane; i < nvec; i += 32) stage[i] = src[i];
            __syncwarp();
#pragma unroll
            for (int half_ = 0; half_ < 2; ++half_) {
                const int j = lane + 32 * half_;
                if (j < nblk) {
                    const unsigned char* blk = st + j * BB;
                    const float d = __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(blk)));
                    const unsigned short* qs = reinterpret_cast<const unsigned short*>(blk + 2);
                    float q[32];
                    if (KIND == 2) {
#pragma unroll
                        for (int i = 0; i < 16; ++i) {
                            const unsigned short p = qs[i];
                            q[2 * i] = (float)(signed char)(p & 0xff);
                            q[2 * i + 1] = (float)(signed char)(p >> 8);
                        }
                    } else {
#pragma unroll
                        for (int i = 0; i < 8; ++i) {
                            const unsigned short p = qs[i];
                            q[2 * i] = (float)((int)(p & 0xf) - 8);
                            q[2 * i + 16] = (float)((int)((p >> 4) & 0xf) - 8);
                            q[2 * i + 1] = (float)((int)((p >> 8) & 0xf) - 8);
                            q[2 * i + 17] = (float)((int)(p >> 12) - 8);
                        }
                    }
#pragma unroll
                    for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
                        if (b < nb) {
                            const float4* xb =
                                reinterpret_cast<const float4*>(x + (size_t)(b0 + b) * cols + (size_t)(c0 + j) * 32);
                            float s = 0.0f;
#pragma unroll
                            for (int v = 0; v < 8; ++v) {
                                const float4 a = xb[v];
                                s = fmaf(q[4 * v], a.x, s);
                                s = fmaf(q[4 * v + 1], a.y, s);
                                s = fmaf(q[4 * v + 2], a.z, s);
                                s = fmaf(q[4 * v + 3], a.w, s);
                            }
                            acc[b] = fmaf(d, s, acc[b]);
                        }
                    }
                }
            }
        }
    }
}

// The fast quantized kernels: row `row` of W (one warp), every tile of vectors.
template <int KIND>
__device__ __forceinline__ void gemv_fast_rows(const unsigned char* __restrict__ W, const float* __restrict__ x,
                                               float* __restrict__ y, int rows, int row, int cols, int batch,
                                               int lane, uint4* stage) {
    const unsigned char* wrow = fast_row<KIND>(W, row, cols);
    for (int b0 = 0; b0 < batch; b0 += GEMV_MAX_BATCH) {
        const int nb = min(GEMV_MAX_BATCH, batch - b0);
        float acc[GEMV_MAX_BATCH];
#pragma unroll
        for (int b = 0; b < GEMV_MAX_BATCH; ++b) acc[b] = 0.0f;
        fast_acc<KIND>(wrow, x, cols, b0, nb, lane, stage, acc);
        store_tile(acc, y, rows, row, b0, nb, lane);
    }
}

// F16 / BF16: the row loop of gemv_fast_rows written out for a row pointer the kernel
// computes once, and its chunk loop (the same as fast_acc's) written out in place: nvcc
// gives this form 80 registers, while calling fast_acc, or a shared chunk-step function,
// from here takes 96 (fewer blocks per SM on the decode path). The sums are the same
// instructions either way; keep the two loops equal.
template <bool Bf16>
__device__ __forceinline__ void gemv_fast_half(const uint4* __restrict__ w8, const float* __restrict__ x,
                                               float* __restrict__ y, int rows, int row, int cols, int batch,
                                               int lane) {
    const int nchunks = cols >> 3;
    for (int b0 = 0; b0 < batch; b0 += GEMV_MAX_BATCH) {
        const int nb = min(GEMV_MAX_BATCH, batch - b0);
        float acc[GEMV_MAX_BATCH];
#pragma unroll
        for (int b = 0; b < GEMV_MAX_BATCH; ++b) acc[b] = 0.0f;
        for (int k0 = lane; k0 < nchunks; k0 += 32 * GEMV_UNROLL) {
            uint4 raw[GEMV_UNROLL];
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                const int k = k0 + 32 * u;
                if (k < nchunks) raw[u] = w8[k];
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                const int k = k0 + 32 * u;
                if (k < nchunks) {
                    float w[8];
                    half8_to_f32<Bf16>(raw[u], w);
#pragma unroll
                    for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
                        if (b < nb) {
                            const float4* xb = reinterpret_cast<const float4*>(x + (size_t)(b0 + b) * cols) + 2 * k;
                            acc[b] = dot8(w, xb[0], xb[1], acc[b]);
                        }
                    }
                }
            }
        }
        store_tile(acc, y, rows, row, b0, nb, lane);
    }
}

#define FAST_HALF_ENTRY(name, T, BF16)                                                                      \
    extern "C" __global__ void name(const T* __restrict__ W, const float* __restrict__ x,                   \
                                    float* __restrict__ y, int rows, int cols, int batch) {                 \
        const int lane = threadIdx.x & 31;                                                                  \
        const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                                \
        if (row >= rows) return;                                                                            \
        gemv_fast_half<BF16>(reinterpret_cast<const uint4*>(W + (size_t)row * cols), x, y, rows, row, cols, \
                             batch, lane);                                                                  \
    }

FAST_HALF_ENTRY(gemv_fast_f16_f32, __half, false)
FAST_HALF_ENTRY(gemv_fast_bf16_f32, unsigned short, true)

// Q8_0 / Q4_0 through a per-warp shared-memory stage of FAST_QBLOCKS blocks (BB bytes each).
#define FAST_QUANT_ENTRY(name, KIND, BB)                                                                   \
    extern "C" __global__ void __launch_bounds__(128)                                                      \
        name(const unsigned char* __restrict__ W, const float* __restrict__ x, float* __restrict__ y,      \
             int rows, int cols, int batch) {                                                              \
        __shared__ uint4 stage[4][FAST_QBLOCKS * BB / 16];                                                  \
        const int lane = threadIdx.x & 31;                                                                 \
        const int warp = threadIdx.x >> 5;                                                                 \
        const int row = blockIdx.x * 4 + warp;                                                             \
        if (row >= rows) return; /* warp-uniform; only __syncwarp below */                                 \
        gemv_fast_rows<KIND>(W, x, y, rows, row, cols, batch, lane, stage[warp]);                           \
    }

FAST_QUANT_ENTRY(gemv_fast_q8_0_f32, 2, 34)
FAST_QUANT_ENTRY(gemv_fast_q4_0_f32, 3, 18)

// ---- fused launches for decode (the `fused` fast path) --------------------------------
//
// gemv3_fast_<type>_f32: three products with the same x in one launch (Q, K and V):
//   y_s[b][r] = dot(W_s[r], x[b]) for s < 3, r < rows_s. Warp R of the grid takes row R of
//   the rows of W0, then W1, then W2 stacked. Per output the same instructions as
//   gemv_fast_<type>_f32 (bit-identical). Launch: grid = ceil((rows0+rows1+rows2) / 4),
//   block = 128.
// gemv_swiglu_fast_<type>_f32: the gate and up products and SwiGLU in one launch:
//   y[b][r] = silu(dot(Wg[r], x[b])) * dot(Wu[r], x[b]), bit-identical to
//   gemv_fast_<type>_f32 twice then swiglu_f32. Launch: grid = ceil(rows / 4), block = 128.
// Shape conditions as the fast kernels (F16/BF16: cols % 8 == 0; Q8_0/Q4_0: cols % 256 == 0).

// The warp-reduced sums of row `row` of W for vectors b0 .. b0+nb (every lane gets
// them), as the fast kernels compute them.
template <int KIND>
__device__ __forceinline__ void row_tile(const unsigned char* __restrict__ W, const float* __restrict__ x, int row,
                                         int cols, int b0, int nb, int lane, uint4* stage,
                                         float (&sums)[GEMV_MAX_BATCH]) {
    float acc[GEMV_MAX_BATCH];
#pragma unroll
    for (int b = 0; b < GEMV_MAX_BATCH; ++b) acc[b] = 0.0f;
    fast_acc<KIND>(fast_row<KIND>(W, row, cols), x, cols, b0, nb, lane, stage, acc);
#pragma unroll
    for (int b = 0; b < GEMV_MAX_BATCH; ++b) sums[b] = warp_sum(acc[b]);
}

#define FUSED_STAGE (FAST_QBLOCKS * 34 / 16)

template <int KIND>
__device__ __forceinline__ void gemv3_body(const unsigned char* W0, const unsigned char* W1, const unsigned char* W2,
                                           const float* __restrict__ x, float* y0, float* y1, float* y2, int r0, int r1,
                                           int r2, int cols, int batch, uint4 (*stage)[FUSED_STAGE]) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    int row = blockIdx.x * 4 + warp;
    const unsigned char* W;
    float* y;
    int rows;
    if (row < r0) { W = W0; y = y0; rows = r0; }
    else if (row < r0 + r1) { row -= r0; W = W1; y = y1; rows = r1; }
    else if (row < r0 + r1 + r2) { row -= r0 + r1; W = W2; y = y2; rows = r2; }
    else return;  // warp-uniform; only __syncwarp in row_tile
    for (int b0 = 0; b0 < batch; b0 += GEMV_MAX_BATCH) {
        const int nb = min(GEMV_MAX_BATCH, batch - b0);
        float sums[GEMV_MAX_BATCH];
        row_tile<KIND>(W, x, row, cols, b0, nb, lane, stage[warp], sums);
#pragma unroll
        for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
            if (lane == 0 && b < nb) y[(size_t)(b0 + b) * rows + row] = sums[b];
        }
    }
}

template <int KIND>
__device__ __forceinline__ void swiglu_body(const unsigned char* Wg, const unsigned char* Wu, const float* __restrict__ x,
                                            float* __restrict__ y, int rows, int cols, int batch,
                                            uint4 (*stage)[FUSED_STAGE], float (*gsum)[GEMV_MAX_BATCH]) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int row = blockIdx.x * 4 + warp;
    if (row >= rows) return;
    for (int b0 = 0; b0 < batch; b0 += GEMV_MAX_BATCH) {
        const int nb = min(GEMV_MAX_BATCH, batch - b0);
        // The gate sums wait in shared memory (not registers) while the up row is read.
        float t[GEMV_MAX_BATCH];
        row_tile<KIND>(Wg, x, row, cols, b0, nb, lane, stage[warp], t);
        if (lane < GEMV_MAX_BATCH) {
#pragma unroll
            for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
                if (b == lane) gsum[warp][b] = t[b];
            }
        }
        __syncwarp();
        row_tile<KIND>(Wu, x, row, cols, b0, nb, lane, stage[warp], t);
#pragma unroll
        for (int b = 0; b < GEMV_MAX_BATCH; ++b) {
            // As swiglu_f32: a / (1 + exp(-a)) * u.
            if (lane == b && b < nb) {
                const float g = gsum[warp][b];
                y[(size_t)(b0 + b) * rows + row] = g / (1.0f + expf(-g)) * t[b];
            }
        }
        __syncwarp();  // gsum is rewritten by the next tile
    }
}

#define FUSED_KERNELS(NAME, KIND)                                                                                   \
    extern "C" __global__ void __launch_bounds__(128) gemv3_fast_##NAME##_f32(                                    \
        const unsigned char* __restrict__ W0, const unsigned char* __restrict__ W1,                                \
        const unsigned char* __restrict__ W2, const float* __restrict__ x, float* __restrict__ y0,                 \
        float* __restrict__ y1, float* __restrict__ y2, int r0, int r1, int r2, int cols, int batch) {              \
        __shared__ uint4 stage[KIND >= 2 ? 4 : 1][KIND >= 2 ? FUSED_STAGE : 1];                                     \
        gemv3_body<KIND>(W0, W1, W2, x, y0, y1, y2, r0, r1, r2, cols, batch,                                       \
                         reinterpret_cast<uint4(*)[FUSED_STAGE]>(&stage[0][0]));                                   \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) gemv_swiglu_fast_##NAME##_f32(                              \
        const unsigned char* __restrict__ Wg, const unsigned char* __restrict__ Wu, const float* __restrict__ x,   \
        float* __restrict__ y, int rows, int cols, int batch) {                                                    \
        __shared__ uint4 stage[KIND >= 2 ? 4 : 1][KIND >= 2 ? FUSED_STAGE : 1];                                     \
        __shared__ float gsum[4][GEMV_MAX_BATCH];                                                                  \
        swiglu_body<KIND>(Wg, Wu, x, y, rows, cols, batch, reinterpret_cast<uint4(*)[FUSED_STAGE]>(&stage[0][0]),  \
                          gsum);                                                                                   \
    }

FUSED_KERNELS(f16, 0)
FUSED_KERNELS(bf16, 1)
FUSED_KERNELS(q8_0, 2)
FUSED_KERNELS(q4_0, 3)

// ---- conversions for the cuBLAS path (activations and weights) -------------------------
//
// Launch: grid = (G), block = (T), T a multiple of 32; grid-stride loops (64-bit
// indices), so any G >= 1 covers every element (the launcher uses T = 256 and
// G = min(ceil(total/T), 65535)).

// f32 -> bf16 bits, round to nearest even (NaN stays NaN), as half::bf16::from_f32.
__device__ __forceinline__ unsigned short f32_to_bf16_bits(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// y[i] = (f16) x[i], round to nearest even, for i < n.
extern "C" __global__ void convert_f32_f16(const float* __restrict__ x, __half* __restrict__ y, int n) {
    GRID_STRIDE(i, (long long)n) { y[i] = __float2half_rn(x[i]); }
}

// y[i] = (bf16) x[i] (bits), round to nearest even, for i < n.
extern "C" __global__ void convert_f32_bf16(const float* __restrict__ x, unsigned short* __restrict__ y, int n) {
    GRID_STRIDE(i, (long long)n) { y[i] = f32_to_bf16_bits(x[i]); }
}

// dequant_<type>_f16: a weight matrix W ([rows][cols], stored type) to f16 [rows][cols],
// rounded to nearest: out[i] = f16(L::at(W, i)). Rows hold whole blocks, so the flat
// element index addresses the matrix as one long row (quantized types: cols a multiple of
// the block, checked by the launcher). The group-quantized types' values are those of
// quant::dequantize_row bit for bit (LoadGQ) before the rounding to f16.
#define DEQUANT_ENTRY(name, T, L)                                                                       \
    extern "C" __global__ void name(const T* __restrict__ W /*[rows][cols]*/,                          \
                                    __half* __restrict__ out /*[rows][cols]*/, int rows, int cols) {   \
        const unsigned char* w = reinterpret_cast<const unsigned char*>(W);                            \
        const long long total = (long long)rows * cols;                                                \
        GRID_STRIDE(i, total) { out[i] = __float2half_rn(L::at(w, i)); }                               \
    }

DEQUANT_ENTRY(dequant_f32_f16, float, LoadF32)
DEQUANT_ENTRY(dequant_bf16_f16, unsigned short, LoadBF16)
DEQUANT_ENTRY(dequant_q8_0_f16, unsigned char, LoadQ8_0)
DEQUANT_ENTRY(dequant_q4_0_f16, unsigned char, LoadQ4_0)
#define GQ_DEQUANT(tag, T) DEQUANT_ENTRY(dequant_##tag##_f16, unsigned char, LoadGQ<T>)
GQ_TYPES(GQ_DEQUANT)
