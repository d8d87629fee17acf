// Deliberately broken (and a few correct) kernels for the emulator's own tests
// (tools/cuda-driver-emu/tests/selftest.cpp): each strictness rule has one kernel or
// launch that must trip it. Not part of the runtime's kernels.
#include <cuda_fp16.h>

// y[i] = x[i + off] for i < n (off = n reads one past the end; off = -1 one before).
extern "C" __global__ void emu_copy_off(const float* x, float* y, int n, int off) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i + off];
}

// y[0] = sum of a float4 loaded from x + off floats (off = 1: misaligned by 4 bytes).
extern "C" __global__ void emu_load_float4(const float* x, float* y, int off) {
    if (threadIdx.x != 0) return;
    const float4 v = *reinterpret_cast<const float4*>(x + off);
    y[0] = v.x + v.y + v.z + v.w;
}

// Lanes 16..31 exit, then the rest shuffle with the full mask.
extern "C" __global__ void emu_shfl_after_exit(float* y) {
    const int lane = threadIdx.x & 31;
    if (lane >= 16) return;
    float v = (float)lane;
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    y[lane] = v;
}

// Lane 0 waits at __syncthreads while the other lanes of its warp wait at __syncwarp.
extern "C" __global__ void emu_deadlock(float* y) {
    if (threadIdx.x == 0) __syncthreads();
    else __syncwarp();
    y[threadIdx.x] = 1.0f;
}

// Block-wide sum with shuffles and shared memory; y[blockIdx.x] = sum of x over the block.
extern "C" __global__ void __launch_bounds__(128) emu_block_sum(const float* x, float* y) {
    __shared__ float part[4];
    float v = x[blockIdx.x * blockDim.x + threadIdx.x];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) y[blockIdx.x] = part[0] + part[1] + part[2] + part[3];
}

// y[i] += 1 for i < n (graph replay test).
extern "C" __global__ void emu_increment(float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += 1.0f;
}

// Dynamic shared memory: y[i] = x[i] reversed within the block, through `extern __shared__`.
extern "C" __global__ void emu_reverse_dyn(const float* x, float* y) {
    extern __shared__ float buf[];
    buf[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
    __syncthreads();
    y[blockIdx.x * blockDim.x + threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}
