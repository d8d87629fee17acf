#!/usr/bin/env bash
# Runs kernels/*.cu on the CPU: the threads of a block are cooperative fibers that
# switch at __syncthreads / __syncwarp / warp shuffles (inc/cuda_emu.h, runtime.cpp),
# blocks run one after another. Checks the kernels' logic where there is no GPU (not their speed,
# not the GPU's float details such as its expf):
#   t_att   split-KV and tiled prefill attention against the one-kernel attention
#   t_gemv  fast GEMV kernels against the plain ones (F16/BF16 bit for bit), the fused
#           Q/K/V and gate/up/SwiGLU launches against the separate ones (bit for bit)
#   t_norm  add_rmsnorm against add then rmsnorm (bit for bit)
#   t_stale tiled prefill attention with stale Inf K/V past the tile's last position
# Needs g++ with C++17 and _Float16 (gcc 12 on x86-64). The emulated driver
# (tools/cuda-driver-emu) runs the same kernels behind libcuda.so.
#   usage: tools/cuda-emu/run.sh [t_att|t_gemv|t_norm|t_stale ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(t_norm t_stale t_gemv t_gq t_att)
status=0
for t in "${tests[@]}"; do
  echo "== $t"
  g++ -std=c++17 -O2 -ffp-contract=off -fno-strict-aliasing -I inc -I ../../kernels "$t.cpp" runtime.cpp -o "$OUT/$t" -pthread
  "$OUT/$t" || status=1
done
exit $status
