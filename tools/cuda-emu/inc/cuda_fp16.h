// CPU emulation shim of the CUDA features kernels/*.cu use: each CUDA thread of a block
// is a std::thread; __syncthreads and warp shuffles are barriers. Blocks run one by one.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>
#include <algorithm>
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
struct dim3e { unsigned x = 0, y = 0, z = 0; };
inline thread_local dim3e threadIdx, blockIdx;
inline dim3e blockDim, gridDim;
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct __half { uint16_t b; };
struct __half2 { __half x, y; };
inline float __half2float(__half h) { _Float16 f; std::memcpy(&f, &h.b, 2); return (float)f; }
inline __half __float2half_rn(float v) { _Float16 f = (_Float16)v; __half h; std::memcpy(&h.b, &f, 2); return h; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
using std::min; using std::max;

struct BlockSync {
  std::barrier<> *block;
  std::vector<std::barrier<>*> warps;
  std::vector<float> slots;    // shuffle exchange, per thread
  std::vector<int> ors;
};
inline BlockSync *g_sync;
inline void __syncthreads() { g_sync->block->arrive_and_wait(); }
inline int __syncthreads_or(int v) {
  g_sync->ors[threadIdx.x] = v; g_sync->block->arrive_and_wait();
  int r = 0; for (unsigned i = 0; i < blockDim.x; ++i) r |= g_sync->ors[i];
  g_sync->block->arrive_and_wait(); return r;
}
inline void __syncwarp(unsigned = 0xffffffffu) { g_sync->warps[threadIdx.x / 32]->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int off) {
  unsigned t = threadIdx.x, w = t / 32, lane = t % 32;
  g_sync->slots[t] = v; g_sync->warps[w]->arrive_and_wait();
  float r = g_sync->slots[w * 32 + (lane ^ off)]; g_sync->warps[w]->arrive_and_wait(); return r;
}
template <class F>
void launch(dim3e grid, dim3e block, F f) {
  gridDim = grid; blockDim = block;
  unsigned nt = block.x;
  for (unsigned bz = 0; bz < std::max(1u, grid.z); ++bz)
  for (unsigned by = 0; by < std::max(1u, grid.y); ++by)
  for (unsigned bx = 0; bx < grid.x; ++bx) {
    BlockSync s; std::barrier<> b(nt); s.block = &b;
    std::vector<std::unique_ptr<std::barrier<>>> ws;
    for (unsigned w = 0; w < (nt + 31) / 32; ++w) { ws.emplace_back(new std::barrier<>(std::min(32u, nt - 32 * w))); s.warps.push_back(ws.back().get()); }
    s.slots.assign(nt, 0); s.ors.assign(nt, 0); g_sync = &s;
    std::vector<std::thread> th;
    for (unsigned t = 0; t < nt; ++t) th.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {bx, by, bz};
      // a thread that returns early must not block the others: drop from barriers
      struct Exit { ~Exit() { g_sync->block->arrive_and_drop(); g_sync->warps[threadIdx.x / 32]->arrive_and_drop(); } } e;
      f(); });
    for (auto &x : th) x.join();
  }
}
