#!/usr/bin/env bash
# Runs kernels/*.cu on the CPU: every CUDA thread of a block is a std::thread,
# __syncthreads / __syncwarp / warp shuffles are barriers (inc/cuda_fp16.h), blocks run
# one after another. Checks the kernels' logic where there is no GPU (not their speed,
# not the GPU's float details such as its expf):
#   t_att   split-KV and tiled prefill attention against the one-kernel attention
#   t_gemv  fast GEMV kernels against the plain ones (F16/BF16 bit for bit), the fused
#           Q/K/V and gate/up/SwiGLU launches against the separate ones (bit for bit)
#   t_norm  add_rmsnorm against add then rmsnorm (bit for bit)
#   t_stale tiled prefill attention with stale Inf K/V past the tile's last position
# Needs g++ with C++20 and _Float16 (gcc 12 on x86-64). t_att takes a few minutes on 2
# cores (thread creation).
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
  g++ -std=c++20 -O1 -I inc -x c++ "$t.cpp" -o "$OUT/$t" -pthread
  "$OUT/$t" || status=1
done
exit $status
