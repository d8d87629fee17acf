// Device helpers shared by the kernel files: every kernels/*.cu includes this header
// first (nvcc finds it next to the source; for NVRTC the runtime splices it into the
// embedded source, see src/backend/cuda/load.rs). Like the kernels, it may include only
// <cuda_fp16.h> (NVRTC has no host headers).
//
// - FULL_MASK, warp_sum, warp_max: warp-wide reductions with xor shuffles (every lane
//   gets the result; the tree is fixed, so a sum's order never depends on the caller).
// - BLOCK_POSITIONS: positions per KV block (crate::kv::BLOCK_POSITIONS).
// - GRID_STRIDE: the grid-stride loop of the element-wise kernels (64-bit index).
// - bf16_lo / bf16_hi / bf16_bits_to_f32: bf16 -> f32 (exact: the high half of an f32).
// - LoadF32 / LoadF16 / LoadBF16 / LoadQ8_0 / LoadQ4_0: element c of a weight row in its
//   stored type (ggml block layouts), as f32; rows hold whole blocks.
#ifndef LLMRT_KERNELS_COMMON_CUH
#define LLMRT_KERNELS_COMMON_CUH

#include <cuda_fp16.h>

#define FULL_MASK 0xffffffffu
#define BLOCK_POSITIONS 16

#define GRID_STRIDE(i, total) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (total); i += (long long)gridDim.x * blockDim.x)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
    return v;
}

// bf16 -> f32 is exact: the 16 bits are the high half of the f32.
__device__ __forceinline__ float bf16_bits_to_f32(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
// The low and high bf16 of a 32-bit word (element 2i and 2i+1 of a little-endian row).
__device__ __forceinline__ float bf16_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

// Element c of a row that starts at `row` (bytes), per stored type (I: int or long long,
// the caller's index type); row_bytes(n): bytes of a row of n elements.
struct LoadF32 {
    template <typename I>
    static __device__ __forceinline__ float at(const unsigned char* row, I c) {
        return reinterpret_cast<const float*>(row)[c];
    }
    static __device__ __forceinline__ size_t row_bytes(int n) { return (size_t)n * 4; }
};
struct LoadF16 {
    template <typename I>
    static __device__ __forceinline__ float at(const unsigned char* row, I c) {
        return __half2float(reinterpret_cast<const __half*>(row)[c]);
    }
    static __device__ __forceinline__ size_t row_bytes(int n) { return (size_t)n * 2; }
};
struct LoadBF16 {
    template <typename I>
    static __device__ __forceinline__ float at(const unsigned char* row, I c) {
        return bf16_bits_to_f32(reinterpret_cast<const unsigned short*>(row)[c]);
    }
    static __device__ __forceinline__ size_t row_bytes(int n) { return (size_t)n * 2; }
};
struct LoadQ8_0 {  // { f16 d; int8 qs[32]; } = 34 bytes, value d * qs[j]
    template <typename I>
    static __device__ __forceinline__ float at(const unsigned char* row, I c) {
        const unsigned char* blk = row + (size_t)(c >> 5) * 34;
        const float d = __half2float(*reinterpret_cast<const __half*>(blk));
        return d * (float)(signed char)blk[2 + (c & 31)];
    }
    static __device__ __forceinline__ size_t row_bytes(int n) { return (size_t)(n >> 5) * 34; }
};
struct LoadQ4_0 {  // { f16 d; u8 qs[16]; } = 18 bytes; j < 16: low nibble of qs[j], else high of qs[j-16]
    template <typename I>
    static __device__ __forceinline__ float at(const unsigned char* row, I c) {
        const unsigned char* blk = row + (size_t)(c >> 5) * 18;
        const float d = __half2float(*reinterpret_cast<const __half*>(blk));
        const int j = (int)(c & 31);
        const unsigned int q = blk[2 + (j & 15)];
        const int nib = (int)(j < 16 ? (q & 0xfu) : (q >> 4));
        return d * (float)(nib - 8);
    }
    static __device__ __forceinline__ size_t row_bytes(int n) { return (size_t)(n >> 5) * 18; }
};

#endif  // LLMRT_KERNELS_COMMON_CUH
