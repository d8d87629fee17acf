// CPU emulation of the CUDA device-side features kernels/*.cu use, for compiling the
// kernels as C++ (g++ -std=c++17) and running them on the CPU: the threads of a block
// are cooperative fibers (tools/cuda-emu/runtime.cpp) that switch only at barriers and
// warp collectives, so a block of 1024 threads costs no OS thread.
//
// What this header models strictly:
// - __syncthreads / __syncthreads_{or,and,count}: a block barrier of the live threads.
// - warp collectives (__shfl*_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp):
//   every lane of the mask must arrive, with the same mask and the same collective; a
//   mask naming an exited or non-existent lane, or a source lane outside the mask, is a
//   kernel fault (the hardware's behaviour is undefined there).
// - vector types (float2/float4, uint2/uint4, int2/int4, __half, __half2): every load
//   or store through a pointer checks the alignment the GPU requires (8/16/2/4 bytes);
//   a misaligned one faults with CUDA_ERROR_MISALIGNED_ADDRESS.
// - __shared__ variables are per executing OS thread (thread_local), so blocks running
//   at once on different host threads never share them.
// Not modelled: GPU float details (fast-math __expf, the GPU's expf ulps), FMA
// contraction (build with -ffp-contract=off: every fmaf is explicit), timing, races
// that the barriers do not order (fibers run one at a time, so a race never tears).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef CUDA_EMU_SCAN
// tools/cuda-driver-emu/gen_kernels.sh preprocesses each kernels/*.cu with this defined
// and reads the kernel names (and launch bounds) from the markers.
#define __global__ __emu_global__
#define __launch_bounds__(...) __emu_lb__ __VA_ARGS__ __emu_lb_end__
#else
#define __global__
#define __launch_bounds__(...)
#endif
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
// thread_local: at block scope it implies static (one array per executing thread, shared
// by the block's fibers); `extern __shared__ T name[];` (dynamic shared memory) declares a
// thread_local array that gen_kernels.sh defines next to the file, 227 KiB long.
#ifdef CUDA_EMU_SCAN
#define __shared__ __emu_shared__
#else
#define __shared__ thread_local
#endif
#define EMU_DYNAMIC_SMEM_BYTES (227 * 1024)
#define __constant__ static
#define __align__(n) __attribute__((aligned(n)))
#ifndef __CUDACC__
#define __CUDA_ARCH__ 900
#endif

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
using dim3e = dim3;  // the name tools/cuda-emu/t_*.cpp used

namespace emu {
// Each CUDA thread is a fiber whose stack lies in a 256 KiB slot aligned to 256 KiB;
// a header in the slot holds the thread's indices. So threadIdx & co. are found from
// the stack pointer: no thread-local lookup on the kernels' hot paths.
constexpr uintptr_t kSlotBytes = 256 * 1024;
struct FiberHdr {
  uint3 tid, bid;
  dim3 bdim, gdim;
  void* fiber;
};
// The header sits at the top of the slot, just above the stack (one page for both: one
// TLB entry per thread); its offset varies with the slot, so that the headers and stack
// tops of a warp do not all fall into one cache set.
__attribute__((always_inline)) inline FiberHdr* hdr_of_slot(uintptr_t base) {
  return reinterpret_cast<FiberHdr*>(base + kSlotBytes - 64 - (((base / kSlotBytes) & 31) << 6));
}
__attribute__((always_inline)) inline FiberHdr* hdr() {
  uintptr_t sp;
  asm("mov %%rsp, %0" : "=r"(sp));
  return hdr_of_slot(sp & ~(kSlotBytes - 1));
}
}  // namespace emu
#define threadIdx (::emu::hdr()->tid)
#define blockIdx (::emu::hdr()->bid)
#define blockDim (::emu::hdr()->bdim)
#define gridDim (::emu::hdr()->gdim)
static constexpr int warpSize = 32;

namespace emu {
// Codes of the device faults (CUresult values).
enum Fault : int {
  FAULT_ILLEGAL_ADDRESS = 700,
  FAULT_ASSERT = 710,
  FAULT_HARDWARE_STACK = 714,
  FAULT_ILLEGAL_INSTRUCTION = 715,
  FAULT_MISALIGNED = 716,
  FAULT_LAUNCH_FAILED = 719,
};
// Ends the current kernel launch with `code` and a message (printf-style); never returns.
[[noreturn]] void fault(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void misaligned(const void* p, unsigned align, const char* type);  // faults inside a kernel
inline void check_align(const void* p, unsigned align, const char* type) {
  if (__builtin_expect(((uintptr_t)p & (align - 1)) != 0, 0)) misaligned(p, align, type);
}
// Block barrier: kind 0 plain, 1 or, 2 and, 3 count; returns the reduction.
int block_sync(int kind, int v);
// Warp collective: kind (see runtime.cpp), mask, this lane's value and argument.
uint64_t warp_op(int kind, unsigned mask, uint64_t v, int arg, int width);
unsigned active_mask();
enum WarpKind : int { W_SYNC = 0, W_SHFL_IDX, W_SHFL_UP, W_SHFL_DOWN, W_SHFL_XOR, W_BALLOT, W_ANY, W_ALL };
template <class T>
inline T shfl(int kind, unsigned mask, T v, int arg, int width) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  b = warp_op(kind, mask, b, arg, width);
  T r;
  std::memcpy(&r, &b, sizeof(T));
  return r;
}
}  // namespace emu

inline void __syncthreads() { emu::block_sync(0, 0); }
inline int __syncthreads_or(int v) { return emu::block_sync(1, v != 0); }
inline int __syncthreads_and(int v) { return emu::block_sync(2, v != 0); }
inline int __syncthreads_count(int v) { return emu::block_sync(3, v != 0); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_op(emu::W_SYNC, mask, 0, 0, 32); }
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return emu::shfl(emu::W_SHFL_IDX, mask, v, src, width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
  return emu::shfl(emu::W_SHFL_UP, mask, v, (int)d, width);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
  return emu::shfl(emu::W_SHFL_DOWN, mask, v, (int)d, width);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
  return emu::shfl(emu::W_SHFL_XOR, mask, v, m, width);
}
inline unsigned __ballot_sync(unsigned mask, int p) { return (unsigned)emu::warp_op(emu::W_BALLOT, mask, p != 0, 0, 32); }
inline int __any_sync(unsigned mask, int p) { return (int)emu::warp_op(emu::W_ANY, mask, p != 0, 0, 32); }
inline int __all_sync(unsigned mask, int p) { return (int)emu::warp_op(emu::W_ALL, mask, p != 0, 0, 32); }
inline unsigned __activemask() { return emu::active_mask(); }
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __nanosleep(unsigned) {}

// ---- vector types: loads/stores through pointers check the GPU's alignment -------------
#define EMU_VEC4(NAME, T, ALIGN)                                                                  \
  struct alignas(ALIGN) NAME {                                                                    \
    T x, y, z, w;                                                                                 \
    NAME() = default;                                                                             \
    constexpr NAME(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}                                \
    NAME(const NAME& o) {                                                                         \
      emu::check_align(&o, ALIGN, #NAME);                                                         \
      x = o.x; y = o.y; z = o.z; w = o.w;                                                         \
    }                                                                                             \
    NAME& operator=(const NAME& o) {                                                              \
      emu::check_align(this, ALIGN, #NAME);                                                       \
      emu::check_align(&o, ALIGN, #NAME);                                                         \
      x = o.x; y = o.y; z = o.z; w = o.w;                                                         \
      return *this;                                                                               \
    }                                                                                             \
  };
#define EMU_VEC2(NAME, T, ALIGN)                                                                  \
  struct alignas(ALIGN) NAME {                                                                    \
    T x, y;                                                                                       \
    NAME() = default;                                                                             \
    constexpr NAME(T a, T b) : x(a), y(b) {}                                                      \
    NAME(const NAME& o) {                                                                         \
      emu::check_align(&o, ALIGN, #NAME);                                                         \
      x = o.x; y = o.y;                                                                           \
    }                                                                                             \
    NAME& operator=(const NAME& o) {                                                              \
      emu::check_align(this, ALIGN, #NAME);                                                       \
      emu::check_align(&o, ALIGN, #NAME);                                                         \
      x = o.x; y = o.y;                                                                           \
      return *this;                                                                               \
    }                                                                                             \
  };
EMU_VEC4(float4, float, 16)
EMU_VEC4(uint4, unsigned, 16)
EMU_VEC4(int4, int, 16)
EMU_VEC2(float2, float, 8)
EMU_VEC2(uint2, unsigned, 8)
EMU_VEC2(int2, int, 8)
EMU_VEC4(char4, signed char, 4)
EMU_VEC4(uchar4, unsigned char, 4)
inline float4 make_float4(float a, float b, float c, float d) { return float4(a, b, c, d); }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4(a, b, c, d); }
inline int4 make_int4(int a, int b, int c, int d) { return int4(a, b, c, d); }
inline float2 make_float2(float a, float b) { return float2(a, b); }
inline uint2 make_uint2(unsigned a, unsigned b) { return uint2(a, b); }
inline int2 make_int2(int a, int b) { return int2(a, b); }

// ---- integer and float intrinsics ---------------------------------------------------------
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline unsigned min(int a, unsigned b) { return min((unsigned)a, b); }
inline unsigned min(unsigned a, int b) { return min(a, (unsigned)b); }
inline unsigned max(int a, unsigned b) { return max((unsigned)a, b); }
inline unsigned max(unsigned a, int b) { return max(a, (unsigned)b); }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }
inline float __expf(float v) { return std::exp(v); }
inline float __logf(float v) { return std::log(v); }
inline float __sinf(float v) { return std::sin(v); }
inline float __cosf(float v) { return std::cos(v); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __saturatef(float v) { return v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v); }
inline int __float2int_rn(float v) { return (int)std::nearbyint(v); }
inline int __float2int_rz(float v) { return (int)v; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
  return c;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  uint64_t v = ((uint64_t)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
template <class T>
inline T __ldg(const T* p) { return *p; }
// Atomics: the fibers of a block run one at a time and never switch inside these, but
// blocks of different streams may run at once on different OS threads: use real atomics.
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline float atomicAdd(float* p, float v) {
  unsigned old = __atomic_load_n((unsigned*)p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n((unsigned*)p, &old, __float_as_uint(__uint_as_float(old) + v), false,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return __uint_as_float(old);
}
inline int atomicMax(int* p, int v) { int o = __atomic_load_n(p, __ATOMIC_RELAXED); while (o < v && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} return o; }
inline int atomicMin(int* p, int v) { int o = __atomic_load_n(p, __ATOMIC_RELAXED); while (o > v && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} return o; }
inline unsigned atomicMax(unsigned* p, unsigned v) { unsigned o = __atomic_load_n(p, __ATOMIC_RELAXED); while (o < v && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} return o; }
inline int atomicCAS(int* p, int cmp, int v) { __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); return cmp; }
inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) { __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); return cmp; }
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
// fmaf, expf, sqrtf, fabsf, fmaxf, fminf, logf, ...: the C library's (global namespace).

// ---- half and bfloat16 -------------------------------------------------------------------
struct alignas(2) __half {
  unsigned short __x;
  __half() = default;
  __half(const __half& o) { emu::check_align(&o, 2, "__half"); __x = o.__x; }
  __half& operator=(const __half& o) {
    emu::check_align(this, 2, "__half");
    emu::check_align(&o, 2, "__half");
    __x = o.__x;
    return *this;
  }
};
struct alignas(4) __half2 {
  __half x, y;
  __half2() = default;
  __half2(__half a, __half b) : x(a), y(b) {}
  __half2(const __half2& o) { emu::check_align(&o, 4, "__half2"); x.__x = o.x.__x; y.__x = o.y.__x; }
  __half2& operator=(const __half2& o) {
    emu::check_align(this, 4, "__half2");
    emu::check_align(&o, 4, "__half2");
    x.__x = o.x.__x;
    y.__x = o.y.__x;
    return *this;
  }
};
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline float __half2float(__half h) { _Float16 f; std::memcpy(&f, &h.__x, 2); return (float)f; }
inline __half __float2half_rn(float v) { _Float16 f = (_Float16)v; unsigned short u; std::memcpy(&u, &f, 2); return __ushort_as_half(u); }
inline __half __float2half(float v) { return __float2half_rn(v); }
inline float2 __half22float2(__half2 h) { return float2(__half2float(h.x), __half2float(h.y)); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2(__float2half_rn(a), __float2half_rn(b)); }
inline __half2 __float22half2_rn(float2 v) { return __floats2half2_rn(v.x, v.y); }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }
inline __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
typedef __half half;
typedef __half2 half2;

struct alignas(2) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16& o) { emu::check_align(&o, 2, "__nv_bfloat16"); __x = o.__x; }
  __nv_bfloat16& operator=(const __nv_bfloat16& o) {
    emu::check_align(this, 2, "__nv_bfloat16");
    emu::check_align(&o, 2, "__nv_bfloat16");
    __x = o.__x;
    return *this;
  }
};
inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((unsigned)b.__x << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned u = __float_as_uint(f);
  __nv_bfloat16 b;
  if ((u & 0x7fffffffu) > 0x7f800000u) b.__x = (unsigned short)((u >> 16) | 0x40u);
  else b.__x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return b;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 b; b.__x = u; return b; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }

// ---- host-side launch for standalone programs (tools/cuda-emu/t_*.cpp) --------------------
#include <functional>
namespace emu {
// Runs `body` for every thread of every block of the grid (fibers; blocks in order).
// Returns 0, or the fault code after printing the fault message.
int run_grid_fn(dim3 grid, dim3 block, const std::function<void()>& body);
}  // namespace emu
template <class F>
void launch(dim3 grid, dim3 block, F f) {
  std::function<void()> body(f);
  if (emu::run_grid_fn(grid, block, body) != 0) std::abort();
}
