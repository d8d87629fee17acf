#!/usr/bin/env bash
# Run the prebuilt test executables of gpu-bin/ (made by scripts/gpu-prepare.sh) on a
# GPU machine that has the NVIDIA driver but no Rust. Prints nvidia-smi, runs each
# executable from the repository root with --test-threads=1 --nocapture (logs into $OUT
# when OUT is set; LLMRT_FIXTURES points at tests/fixtures), then, when cuda_parity is
# there, its ignored benchmark (`cuda_parity --ignored bench_decode`: CPU vs CUDA
# tokens/s); then a table: executable, passed/failed/skipped counts, wall time, the
# MAXERR lines (worst error per kernel / per model file) and the BENCH lines.
#
#   usage: scripts/gpu-check.sh [GPU_BIN_DIR]       (default: gpu-bin/ at the repo root)
#   env:   OUT              folder for logs and summary.txt (default: a temp folder)
#          GPU_CHECK_TIMEOUT seconds per executable (default 150)
#          GPU_CHECK_BUDGET  seconds for everything, benchmark included (default 450)
#          GPU_CHECK_BENCH_TIMEOUT seconds for the benchmark (default 240; 0 skips it)
#
# Exit status: 0 all passed on a device; 1 a test failed or timed out; 2 the tests
# skipped because they saw no CUDA device; 3 nothing to run.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/gpu-bin}"
PER_BIN_TIMEOUT="${GPU_CHECK_TIMEOUT:-150}"
BUDGET="${GPU_CHECK_BUDGET:-450}"
BENCH_TIMEOUT="${GPU_CHECK_BENCH_TIMEOUT:-240}"
cd "$ROOT"
export LLMRT_FIXTURES="${LLMRT_FIXTURES:-$ROOT/tests/fixtures}"
START=$(date +%s)
LOG="${OUT:-$(mktemp -d /tmp/gpu-check.XXXXXX)}"
mkdir -p "$LOG"
SUMMARY="$LOG/summary.txt"
: > "$SUMMARY"
say() { echo "$@" | tee -a "$SUMMARY"; }

if [ ! -d "$BIN" ] || [ -z "$(find "$BIN" -maxdepth 1 -type f ! -name MANIFEST -print -quit 2>/dev/null)" ]; then
  say "gpu-check: no test executables in $BIN (build them with scripts/gpu-prepare.sh where Rust is,"
  say "           and bring gpu-bin/ along: it is gitignored)"
  exit 3
fi

echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 30 nvidia-smi 2>&1 | tee "$LOG/nvidia-smi.txt"
  timeout 30 nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total --format=csv 2>&1 | tee -a "$SUMMARY"
else
  say "nvidia-smi: not found"
fi
echo "== host"
say "$(uname -srm); $(ldd --version 2>/dev/null | head -1)"
[ -f "$BIN/MANIFEST" ] && { echo "== MANIFEST"; cat "$BIN/MANIFEST" | tee -a "$SUMMARY"; }

# NVRTC for the run-time compilation test: the kernels themselves need only libcuda
# (they are embedded as PTX). Take NVRTC and a matching cuda_fp16.h from a CUDA
# install, else from Python's nvidia wheels (torch brings them); leave it absent otherwise
# (that test then skips).
nvrtc_lib="" nvrtc_inc=""
if ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
  nvrtc_lib="(system)"
fi
for c in "${CUDA_HOME:-}" /usr/local/cuda; do
  [ -n "$c" ] && [ -z "$nvrtc_inc" ] || continue
  for l in "$c/lib64" "$c/targets/x86_64-linux/lib"; do
    if [ -z "$nvrtc_lib" ] && compgen -G "$l/libnvrtc.so*" >/dev/null; then nvrtc_lib="$l"; fi
  done
  [ -f "$c/include/cuda_fp16.h" ] && nvrtc_inc="$c/include"
done
if [ -z "$nvrtc_lib" ] && command -v python3 >/dev/null 2>&1; then
  # namespace package 'nvidia' of the pip wheels; no import of torch (fast)
  read -r nvrtc_lib nvrtc_inc < <(timeout 30 python3 - <<'PY' 2>/dev/null
import glob, importlib.util, os
spec = importlib.util.find_spec("nvidia")
for base in (spec.submodule_search_locations if spec else []):
    for lib, inc in (("cu13/lib", "cu13/include"), ("cuda_nvrtc/lib", "cuda_runtime/include")):
        l, i = os.path.join(base, lib), os.path.join(base, inc)
        if glob.glob(os.path.join(l, "libnvrtc.so*")) and os.path.isfile(os.path.join(i, "cuda_fp16.h")):
            incs = [i] + [d for d in [os.path.join(base, "cuda_cccl/include")] if os.path.isdir(d)]  # <nv/target> (CUDA 12)
            print(l, ":".join(incs))
            raise SystemExit
PY
  ) || true
fi
if [ -n "$nvrtc_lib" ] && [ "$nvrtc_lib" != "(system)" ]; then
  export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -n "$nvrtc_inc" ]; then export LLMRT_CUDA_INCLUDE="$nvrtc_inc${LLMRT_CUDA_INCLUDE:+:$LLMRT_CUDA_INCLUDE}"; fi
say "NVRTC: lib ${nvrtc_lib:-not found}; cuda_fp16.h in ${nvrtc_inc:-not found}"
say "fixtures: $LLMRT_FIXTURES ($(ls "$LLMRT_FIXTURES" 2>/dev/null | wc -l) entries)"

# cuBLAS for the matmul tests' cuBLAS path (without it Ops falls back to GEMV and the
# tests say "skipped: cuBLAS unavailable"): a system/CUDA install, else the pip wheels.
cublas_lib=""
if ldconfig -p 2>/dev/null | grep -q 'libcublas\.so'; then cublas_lib="(system)"; fi
for l in "${CUDA_HOME:-/nonexistent}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if [ -z "$cublas_lib" ] && compgen -G "$l/libcublas.so*" >/dev/null; then cublas_lib="$l"; fi
done
if [ -z "$cublas_lib" ] && command -v python3 >/dev/null 2>&1; then
  cublas_lib="$(timeout 30 python3 - <<'PY' 2>/dev/null
import glob, importlib.util, os
spec = importlib.util.find_spec("nvidia")
for base in (spec.submodule_search_locations if spec else []):
    for lib in ("cu13/lib", "cublas/lib"):
        l = os.path.join(base, lib)
        if glob.glob(os.path.join(l, "libcublas.so*")):
            print(l)
            raise SystemExit
PY
  )" || true
fi
if [ -n "$cublas_lib" ] && [ "$cublas_lib" != "(system)" ]; then
  export LD_LIBRARY_PATH="$cublas_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
say "cuBLAS: lib ${cublas_lib:-not found}"

rows=() maxerrs=() status=0 saw_no_device=0
for exe in "$BIN"/*; do
  name="$(basename "$exe")"
  [ -f "$exe" ] && [ "$name" != MANIFEST ] || continue
  [ -x "$exe" ] || chmod +x "$exe" 2>/dev/null || true
  left=$(( BUDGET - ($(date +%s) - START) ))
  limit=$(( left < PER_BIN_TIMEOUT ? left : PER_BIN_TIMEOUT ))
  if [ "$limit" -lt 5 ]; then
    rows+=("$(printf '%-16s %-16s %7s %7s %8s %8s' "$name" "NOT-RUN(budget)" - - - -)"); status=1; continue
  fi
  echo "== $name --test-threads=1 --nocapture (timeout ${limit}s)"
  t0=$(date +%s.%N)
  timeout "$limit" "$exe" --test-threads=1 --nocapture > >(tee "$LOG/$name.log") 2>&1
  rc=$?
  wait  # for tee
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  res="$(grep -E '^test result:' "$LOG/$name.log" | tail -1)"
  passed="$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$res")"
  failed="$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$res")"
  skipped="$(grep -c 'skipped:' "$LOG/$name.log")"
  nodev="$(grep -c 'skipped: no CUDA device' "$LOG/$name.log")"
  verdict=ok
  if [ "$rc" = 124 ]; then verdict="TIMEOUT(${limit}s)"; status=1
  elif [ "$rc" != 0 ]; then verdict="FAILED(rc=$rc)"; status=1
  elif [ "$nodev" -gt 0 ]; then verdict="NO-DEVICE"; saw_no_device=1
  fi
  rows+=("$(printf '%-16s %-16s %7s %7s %8s %8s' "$name" "$verdict" "${passed:-?}" "${failed:-?}" "$skipped" "$wall")")
  while IFS= read -r l; do maxerrs+=("$name: ${l#MAXERR }"); done < <(grep -E '^MAXERR ' "$LOG/$name.log")
done

# The benchmark: an ignored test of cuda_parity, run on its own.
benches=()
if [ -x "$BIN/cuda_parity" ] && [ "$BENCH_TIMEOUT" -gt 0 ]; then
  left=$(( BUDGET - ($(date +%s) - START) ))
  limit=$(( left < BENCH_TIMEOUT ? left : BENCH_TIMEOUT ))
  if [ "$limit" -lt 20 ]; then
    rows+=("$(printf '%-16s %-16s %7s %7s %8s %8s' bench_decode "NOT-RUN(budget)" - - - -)")
  else
    echo "== cuda_parity --ignored bench_decode (timeout ${limit}s)"
    t0=$(date +%s.%N)
    timeout "$limit" "$BIN/cuda_parity" --ignored --exact bench_decode --test-threads=1 --nocapture \
      > >(tee "$LOG/bench_decode.log") 2>&1
    rc=$?
    wait
    wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    verdict=ok
    if [ "$rc" = 124 ]; then verdict="TIMEOUT(${limit}s)"; status=1
    elif [ "$rc" != 0 ]; then verdict="FAILED(rc=$rc)"; status=1
    elif grep -q 'skipped: no CUDA device' "$LOG/bench_decode.log"; then verdict="NO-DEVICE"
    fi
    rows+=("$(printf '%-16s %-16s %7s %7s %8s %8s' bench_decode "$verdict" - - - "$wall")")
    while IFS= read -r l; do benches+=("${l#BENCH }"); done < <(grep -E '^BENCH ' "$LOG/bench_decode.log")
  fi
fi

say ""
say "== summary (logs in $LOG)"
say "$(printf '%-16s %-16s %7s %7s %8s %8s' binary verdict passed failed skipped wall_s)"
for r in "${rows[@]}"; do say "$r"; done
say ""
say "max errors (relative L2 vs the CPU twin; worst case in brackets):"
if [ ${#maxerrs[@]} -eq 0 ]; then say "  (none printed)"; fi
for m in "${maxerrs[@]}"; do say "  $m"; done
if [ ${#benches[@]} -gt 0 ]; then
  say ""
  say "benchmark (tokens/s; CPU and CUDA in the same run):"
  for b in "${benches[@]}"; do say "  $b"; done
fi
grep -ho 'skipped: .*' "$LOG"/*.log 2>/dev/null | sort | uniq -c | sed 's/^ */  /' | tee -a "$SUMMARY"
[ "$status" = 0 ] && [ "$saw_no_device" = 1 ] && status=2
say "gpu-check: exit $status"
exit "$status"
