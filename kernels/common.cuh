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
// - GqQ4_1 ... GqIQ4_XS: the layouts of the group-quantized types (src/quant/groups.rs),
//   LoadGQ<T>: element c of a row of such a type, bit-identical to quant::dequantize_row.
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

// The score soft cap of gemma2 attention: c * tanh(s / c) for c > 0, s itself for c <= 0.
// tanh(x) = 1 - 2 / (exp(2x) + 1) with the reciprocal __frcp_rn: tanhf and IEEE
// divisions spilled registers in the attention kernels. exp overflowing to inf gives 1,
// underflowing to 0 gives -1. CPU twin: Scores::score in src/backend/cpu/ops/attention.rs.
__device__ __forceinline__ float softcap_score(float s, float c) {
    if (c <= 0.0f) return s;
    const float x = s * __frcp_rn(c);
    return c * (1.0f - 2.0f * __frcp_rn(expf(2.0f * x) + 1.0f));
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

// ---- group-quantized types (the twin of src/quant/groups.rs `unpack`) -------------------
//
// A row of these types is a sequence of groups of 32 values (a 32-value block is one
// group, a 256-value K-quant super-block eight). Value l of group g of a block is
// s * q + o, with q = T::q(blk, g, l) a small integer and (s, o) = T::so(blk, g, l / 16)
// the scale and offset of its half (o only for T::OFF types). The scales and offsets are
// formed in f32 as groups.rs forms them (d * sc, -(dmin * m)), and gq_value rounds the
// product and the sum separately (__fmul_rn / __fadd_rn: never contracted to an FMA), so
// every value is bit-identical to quant::dequantize_row (and gguf-py). Each T gives
// BB (block bytes), QK (values per block) and OFF. f16 fields are read byte by byte
// (blocks of 110 or 210 bytes leave them only 2-byte aligned; bytes need no alignment).

__device__ __forceinline__ float gq_f16(const unsigned char* b, int off) {
    return __half2float(__ushort_as_half((unsigned short)(b[off] | (b[off + 1] << 8))));
}
// Low nibble of qs[l] for l < 16, high nibble of qs[l - 16] otherwise.
__device__ __forceinline__ int gq_nib32(const unsigned char* qs, int l) {
    const unsigned int v = qs[l & 15];
    return (int)(l < 16 ? (v & 0xfu) : (v >> 4));
}
// IQ4_NL / IQ4_XS: the 16 non-linear levels (quant::groups::IQ4_LEVELS) packed as bytes,
// so the table lives in registers (no constant memory).
__device__ __forceinline__ int iq4_level(int i) {
    const unsigned long long t = i < 8 ? 0xF6EADDCFBFAD9881ull : 0x7159453526190D01ull;
    return (int)(signed char)(unsigned char)(t >> (8 * (i & 7)));
}
template <bool OFF>
__device__ __forceinline__ float gq_value(float s, int q, float o) {
    const float v = __fmul_rn(s, (float)q);
    return OFF ? __fadd_rn(v, o) : v;  // no + 0.0 without an offset (it would turn -0 into +0)
}

struct GqQ4_1 {  // d, m, qs[16]: d*q + m
    enum { BB = 20, QK = 32, OFF = 1 };
    static __device__ __forceinline__ int q(const unsigned char* b, int, int l) { return gq_nib32(b + 4, l); }
    static __device__ __forceinline__ void so(const unsigned char* b, int, int, float& s, float& o) {
        s = gq_f16(b, 0);
        o = gq_f16(b, 2);
    }
};
struct GqQ5_0 {  // d, qh (bit l of a u32), qs[16]: d*(q - 16)
    enum { BB = 22, QK = 32, OFF = 0 };
    static __device__ __forceinline__ int q(const unsigned char* b, int, int l) {
        return (gq_nib32(b + 6, l) | (((b[2 + (l >> 3)] >> (l & 7)) & 1) << 4)) - 16;
    }
    static __device__ __forceinline__ void so(const unsigned char* b, int, int, float& s, float& o) {
        s = gq_f16(b, 0);
        o = 0.0f;
    }
};
struct GqQ5_1 {  // d, m, qh, qs[16]: d*q + m
    enum { BB = 24, QK = 32, OFF = 1 };
    static __device__ __forceinline__ int q(const unsigned char* b, int, int l) {
        return gq_nib32(b + 8, l) | (((b[4 + (l >> 3)] >> (l & 7)) & 1) << 4);
    }
    static __device__ __forceinline__ void so(const unsigned char* b, int, int, float& s, float& o) {
        s = gq_f16(b, 0);
        o = gq_f16(b, 2);
    }
};
struct GqIQ4_NL {  // d, qs[16] indexing the levels: d*level
    enum { BB = 18, QK = 32, OFF = 0 };
    static __device__ __forceinline__ int q(const unsigned char* b, int, int l) { return iq4_level(gq_nib32(b + 2, l)); }
    static __device__ __forceinline__ void so(const unsigned char* b, int, int, float& s, float& o) {
        s = gq_f16(b, 0);
        o = 0.0f;
    }
};
struct GqQ2_K {  // scales[16] (lo scale, hi min per 16), qs[64] 2-bit, d, dmin: d*sc*q - dmin*m
    enum { BB = 84, QK = 256, OFF = 1 };
    static __device__ __forceinline__ int q(const unsigned char* b, int g, int l) {
        return (b[16 + (g >> 2) * 32 + l] >> (2 * (g & 3))) & 3;
    }
    static __device__ __forceinline__ void so(const unsigned char* b, int g, int h, float& s, float& o) {
        const unsigned int a = b[2 * g + h];
        s = __fmul_rn(gq_f16(b, 80), (float)(a & 0xfu));
        o = -__fmul_rn(gq_f16(b, 82), (float)(a >> 4));
    }
};
struct GqQ3_K {  // hmask[32], qs[64] 2-bit, scales[12] 6-bit signed per 16, d: d*(sc-32)*(q - 4*(1-hbit))
    enum { BB = 110, QK = 256, OFF = 0 };
    static __device__ __forceinline__ int q(const unsigned char* b, int g, int l) {
        const int lo = (b[32 + (g >> 2) * 32 + l] >> (2 * (g & 3))) & 3;
        const int hbit = (b[l] >> g) & 1;
        return lo - ((hbit ^ 1) << 2);
    }
    static __device__ __forceinline__ void so(const unsigned char* b, int g, int h, float& s, float& o) {
        const int i = 2 * g + h;
        const unsigned char* sc = b + 96;
        const int lo = i < 8 ? (sc[i] & 0xf) : (sc[i - 8] >> 4);
        const int hi = (sc[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
        s = __fmul_rn(gq_f16(b, 108), (float)((lo | (hi << 4)) - 32));
        o = 0.0f;
    }
};
// Q4_K / Q5_K: the 6-bit (scale, min) of group g from the 12 scale bytes at `s`.
__device__ __forceinline__ void k_scale_min(const unsigned char* s, int g, int& sc, int& m) {
    if (g < 4) {
        sc = s[g] & 0x3f;
        m = s[4 + g] & 0x3f;
    } else {
        sc = (s[4 + g] & 0x0f) | ((s[g - 4] >> 2) & 0x30);
        m = (s[4 + g] >> 4) | ((s[g] >> 2) & 0x30);
    }
}
template <bool Q5>
struct GqQK45 {  // d, dmin, scales[12], (Q5_K: qh[32]), qs[128]: d*sc*q - dmin*m
    enum { BB = Q5 ? 176 : 144, QK = 256, OFF = 1 };
    static __device__ __forceinline__ int q(const unsigned char* b, int g, int l) {
        const unsigned int v = b[(Q5 ? 48 : 16) + (g >> 1) * 32 + l];
        const int nib = (int)((g & 1) ? (v >> 4) : (v & 0xfu));
        return Q5 ? (nib | (((b[16 + l] >> g) & 1) << 4)) : nib;
    }
    static __device__ __forceinline__ void so(const unsigned char* b, int g, int, float& s, float& o) {
        int sc, m;
        k_scale_min(b + 4, g, sc, m);
        s = __fmul_rn(gq_f16(b, 0), (float)sc);
        o = -__fmul_rn(gq_f16(b, 2), (float)m);
    }
};
typedef GqQK45<false> GqQ4_K;
typedef GqQK45<true> GqQ5_K;
struct GqQ6_K {  // ql[128], qh[64], scales[16] (int8 per 16), d: d*sc*(q - 32)
    enum { BB = 210, QK = 256, OFF = 0 };
    static __device__ __forceinline__ int q(const unsigned char* b, int g, int l) {
        const int h = g >> 2, r = (g & 3) * 32 + l;
        const int lo = (b[h * 64 + (r & 63)] >> (4 * (r >> 6))) & 0xf;
        const int hi = (b[128 + h * 32 + (r & 31)] >> (2 * (r >> 5))) & 3;
        return (lo | (hi << 4)) - 32;
    }
    static __device__ __forceinline__ void so(const unsigned char* b, int g, int h, float& s, float& o) {
        s = __fmul_rn(gq_f16(b, 208), (float)(signed char)b[192 + 2 * g + h]);
        o = 0.0f;
    }
};
struct GqIQ4_XS {  // d, scales_h (u16), scales_l[4], qs[128] indexing the levels: d*(ls-32)*level
    enum { BB = 136, QK = 256, OFF = 0 };
    static __device__ __forceinline__ int q(const unsigned char* b, int g, int l) {
        return iq4_level(gq_nib32(b + 8 + 16 * g, l));
    }
    static __device__ __forceinline__ void so(const unsigned char* b, int g, int, float& s, float& o) {
        const int lo = (b[4 + (g >> 1)] >> (4 * (g & 1))) & 0xf;
        const int sh = b[2] | (b[3] << 8);
        const int hi = (sh >> (2 * g)) & 3;
        s = __fmul_rn(gq_f16(b, 0), (float)((lo | (hi << 4)) - 32));
        o = 0.0f;
    }
};

// Element c of a row of group-quantized type T (rows hold whole blocks).
template <typename T>
struct LoadGQ {
    template <typename I>
    static __device__ __forceinline__ float at(const unsigned char* row, I c) {
        const unsigned char* blk = row + (size_t)(c / T::QK) * T::BB;
        const int j = (int)(c % T::QK);
        const int g = j >> 5, l = j & 31;
        float s, o;
        T::so(blk, g, l >> 4, s, o);
        return gq_value<T::OFF != 0>(s, T::q(blk, g, l), o);
    }
    static __device__ __forceinline__ size_t row_bytes(int n) { return (size_t)(n / T::QK) * T::BB; }
};

// Every group-quantized type, as X(tag, T) (kernel names use the tag).
#define GQ_TYPES(X)          \
    X(q4_1, GqQ4_1)         \
    X(q5_0, GqQ5_0)         \
    X(q5_1, GqQ5_1)         \
    X(iq4_nl, GqIQ4_NL)     \
    X(q2_k, GqQ2_K)         \
    X(q3_k, GqQ3_K)         \
    X(q4_k, GqQ4_K)         \
    X(q5_k, GqQ5_K)         \
    X(q6_k, GqQ6_K)         \
    X(iq4_xs, GqIQ4_XS)

#endif  // LLMRT_KERNELS_COMMON_CUH
