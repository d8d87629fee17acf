// Embedding gather: out[t][c] = table[ids[t]][c] dequantized to f32.
//
// Twins: src/backend/cpu/ops/embed.rs (CPU), src/backend/cuda/ops/embed.rs (launchers);
// tests: embed_* in tests/cuda_kernels.rs.
//
// table: [vocab][hidden] rows of `row_bytes(hidden)` bytes in its stored type (f32,
// f16, bf16, or ggml blocks: Q8_0 / Q4_0 and the group-quantized types of common.cuh,
// hidden a multiple of the block); ids: [n] u32;
// out: [n][hidden] f32. An id >= vocab yields a row of NaN (never an out-of-bounds
// read): the host checks ids, this is only a guard.
// Launch: grid = (n), block = (T), T a multiple of 32 (the launcher uses 256); each
// block walks its row with a stride of T.
#include "common.cuh"

template <typename L>
__device__ __forceinline__ void embed_rows(const unsigned char* __restrict__ table, const unsigned int* __restrict__ ids,
                                           float* __restrict__ out, int n, int hidden, int vocab) {
    const int t = blockIdx.x;
    if (t >= n) return;
    const unsigned int id = ids[t];
    float* o = out + (size_t)t * hidden;
    if (id >= (unsigned int)vocab) {
        for (int c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = __int_as_float(0x7fc00000);
        return;
    }
    const unsigned char* row = table + (size_t)id * L::row_bytes(hidden);
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = L::at(row, c);
}

#define EMBED_ENTRY(name, L)                                                                              \
    extern "C" __global__ void name(const unsigned char* __restrict__ table /*[vocab] rows*/,             \
                                    const unsigned int* __restrict__ ids /*[n]*/,                         \
                                    float* __restrict__ out /*[n][hidden]*/, int n, int hidden, int vocab) { \
        embed_rows<L>(table, ids, out, n, hidden, vocab);                                                 \
    }

EMBED_ENTRY(embed_f32_f32, LoadF32)
EMBED_ENTRY(embed_f16_f32, LoadF16)
EMBED_ENTRY(embed_bf16_f32, LoadBF16)
EMBED_ENTRY(embed_q8_0_f32, LoadQ8_0)
EMBED_ENTRY(embed_q4_0_f32, LoadQ4_0)
#define GQ_EMBED(tag, T) EMBED_ENTRY(embed_##tag##_f32, LoadGQ<T>)
GQ_TYPES(GQ_EMBED)
