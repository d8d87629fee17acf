#!/usr/bin/env bash
# Run the prebuilt test executables of gpu-bin/ (made by scripts/gpu-prepare.sh) on a
# GPU machine that has the NVIDIA driver but no Rust, then the benchmarks. In order:
#  1. nvidia-smi; each test executable from the repository root with --test-threads=1
#     --nocapture (LLMRT_FIXTURES points at tests/fixtures) and every fast path on,
#     the opt-in fast Q8_0/Q4_0 GEMV too (LLMRT_CUDA_GEMV_QUANT=1): the kernels against
#     their CPU twins, the runner against the CPU.
#  2. cuda_parity again with every fast path off (LLMRT_CUDA_FAST=0: unfused ops, one
#     attention kernel, no CUDA graphs), so a failure in step 1 points at a fast path
#     or at the plain one.
#  3. llmrt-bench on CUDA (synthetic models built in device-free host memory, nothing
#     downloaded; the default fast paths): the copy bandwidth and the cuBLAS bf16 8192^3
#     rate measured in the same process (cuBLAS optional: the log says which libcublas
#     was loaded, or why none); Llama-3-8B shape F16: pp2048, tg128 at 512 positions of
#     context at batch 1/8/32/64, TTFT of 2048; Q8_0 and Q4_0: tg128 @ d512 batch 1;
#     TinyLlama F16/Q8_0/Q4_0: pp512, tg128; then Q8_0 and Q4_0 again with the opt-in
#     fast quantized GEMV (LLMRT_CUDA_GEMV_QUANT=1), so one run says which to default to.
#  4. scripts/torch_peer.py (PyTorch, same shapes, SDPA, CUDA graphs) when python3 has
#     torch with CUDA.
#  5. A table: executables, passed/failed/skipped, wall time, MAXERR lines, the bench
#     rows, and scripts/gpu_bench_summary.py's targets (issue 7) with the ratios.
#
# Everything goes into the script's own log folder ($GPU_CHECK_LOGDIR). When OUT is set
# (a remote run returns at most 8 files from $OUT), exactly two files are written there
# at the end, whatever happened (no device, no executables, a failure, SIGTERM):
#   $OUT/summary.txt            every figure and every pass/fail verdict
#   $OUT/gpu-check-logs.tar.gz  the whole log folder (per-executable logs, bench logs and
#                               JSON, nvidia-smi, summary.txt)
#
#   usage: scripts/gpu-check.sh [GPU_BIN_DIR]       (default: gpu-bin/ at the repo root)
#   env:   OUT              where summary.txt and gpu-check-logs.tar.gz go (optional)
#          GPU_CHECK_LOGDIR the log folder (default: a fresh /tmp/gpu-check.XXXXXX; never $OUT)
#          GPU_CHECK_TIMEOUT seconds per test executable (default 120)
#          GPU_CHECK_BUDGET  seconds for everything (default 330: with a machine's start,
#                            a rerun still fits in 15 device minutes)
#          GPU_CHECK_BENCH   0 skips steps 3 and 4 (default 1)
#          GPU_CHECK_TORCH   0 skips step 4 (default 1)
#          GPU_CHECK_BENCH_DECODE 1 also runs the old `cuda_parity --ignored bench_decode`
#
# Exit status: 0 all passed on a device; 1 a test failed or timed out; 2 the tests
# skipped because they saw no CUDA device; 3 nothing to run.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/gpu-bin}"
PER_BIN_TIMEOUT="${GPU_CHECK_TIMEOUT:-120}"
BUDGET="${GPU_CHECK_BUDGET:-330}"
BENCH_TIMEOUT="${GPU_CHECK_BENCH_TIMEOUT:-240}"
RUN_BENCH="${GPU_CHECK_BENCH:-1}"
RUN_TORCH="${GPU_CHECK_TORCH:-1}"
RUN_BENCH_DECODE="${GPU_CHECK_BENCH_DECODE:-0}"
cd "$ROOT"
export LLMRT_FIXTURES="${LLMRT_FIXTURES:-$ROOT/tests/fixtures}"
START=$(date +%s)
# The script's own log folder (not $OUT: that one receives only the two files below).
LOG="${GPU_CHECK_LOGDIR:-$(mktemp -d /tmp/gpu-check.XXXXXX)}"
mkdir -p "$LOG"
SUMMARY="$LOG/summary.txt"
: > "$SUMMARY"
say() { echo "$@" | tee -a "$SUMMARY"; }

# pack: summary.txt and the tarball of the log folder into $OUT (when set), once, on
# every way out (exit, SIGTERM from an outer timeout, ^C).
PACKED=0
pack() {
  [ "$PACKED" = 1 ] && return
  PACKED=1
  [ -n "${OUT:-}" ] || { echo "gpu-check: logs in $LOG (set OUT to get summary.txt + a tarball)"; return; }
  mkdir -p "$OUT"
  cp "$SUMMARY" "$OUT/summary.txt"
  tar -czf "$OUT/gpu-check-logs.tar.gz" -C "$(dirname "$LOG")" "$(basename "$LOG")" 2>/dev/null ||
    echo "gpu-check: could not write $OUT/gpu-check-logs.tar.gz" >&2
  echo "gpu-check: $OUT/summary.txt, $OUT/gpu-check-logs.tar.gz (logs of $LOG)"
}
trap pack EXIT
trap 'say "gpu-check: stopped by a signal after $(( $(date +%s) - START )) s (partial results above)"; exit 1' INT TERM

say "gpu-check: $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET} s, per executable ${PER_BIN_TIMEOUT} s"
if [ ! -d "$BIN" ] || [ -z "$(find "$BIN" -maxdepth 1 -type f ! -name MANIFEST -print -quit 2>/dev/null)" ]; then
  say "gpu-check: no test executables in $BIN (build them with scripts/gpu-prepare.sh where Rust is,"
  say "           and bring gpu-bin/ along: it is gitignored)"
  say "gpu-check: exit 3 (nothing to run)"
  exit 3
fi

echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 30 nvidia-smi > "$LOG/nvidia-smi.txt" 2>&1
  cat "$LOG/nvidia-smi.txt"
  timeout 30 nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total --format=csv 2>&1 | tee -a "$SUMMARY"
  if ! timeout 30 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    say "gpu-check: NO GPU: nvidia-smi lists no device (the tests will say whether the driver sees one)"
  fi
else
  say "gpu-check: NO GPU: nvidia-smi not found (the tests will say whether a CUDA driver sees a device)"
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
left_s() { echo $(( BUDGET - ($(date +%s) - START) )); }

# run_test NAME LOGNAME [ENV=VALUE ...]: one test executable, a row in the table.
run_test() {
  local name="$1" logname="$2"; shift 2
  local exe="$BIN/$name"
  local left limit
  left=$(left_s)
  limit=$(( left < PER_BIN_TIMEOUT ? left : PER_BIN_TIMEOUT ))
  if [ "$limit" -lt 5 ]; then
    rows+=("$(printf '%-22s %-16s %7s %7s %8s %8s' "$logname" "NOT-RUN(budget)" - - - -)"); status=1; return
  fi
  echo "== $logname: $* $name --test-threads=1 --nocapture (timeout ${limit}s)"
  local t0 rc wall res passed failed skipped nodev verdict
  # The log's file name keeps to [A-Za-z0-9._-] ("cuda_parity[FAST=0]" -> "cuda_parity_FAST_0_"):
  # a copier that skips names with odd characters must not lose the one log that explains a failure.
  local logf="$LOG/${logname//[^A-Za-z0-9._-]/_}.log"
  t0=$(date +%s.%N)
  env "$@" timeout "$limit" "$exe" --test-threads=1 --nocapture > >(tee "$logf") 2>&1
  rc=$?
  wait  # for tee
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  res="$(grep -E '^test result:' "$logf" | tail -1)"
  passed="$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$res")"
  failed="$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$res")"
  skipped="$(grep -c 'skipped:' "$logf")"
  nodev="$(grep -c 'skipped: no CUDA device' "$logf")"
  verdict=ok
  if [ "$rc" = 124 ]; then verdict="TIMEOUT(${limit}s)"; status=1
  elif [ "$rc" != 0 ]; then verdict="FAILED(rc=$rc)"; status=1
  elif [ "$nodev" -gt 0 ]; then verdict="NO-DEVICE"; saw_no_device=1
  fi
  rows+=("$(printf '%-22s %-16s %7s %7s %8s %8s' "$logname" "$verdict" "${passed:-?}" "${failed:-?}" "$skipped" "$wall")")
  while IFS= read -r l; do maxerrs+=("$logname: ${l#MAXERR }"); done < <(grep -E '^MAXERR ' "$logf")
}

# 1. every test executable with every fast path on (the opt-in fast quantized GEMV too).
for exe in "$BIN"/*; do
  name="$(basename "$exe")"
  [ -f "$exe" ] && [ "$name" != MANIFEST ] && [ "$name" != llmrt-bench ] || continue
  [ -x "$exe" ] || chmod +x "$exe" 2>/dev/null || true
  run_test "$name" "$name" LLMRT_CUDA_GEMV_QUANT=1
done
# 2. the runner again with every fast path off.
if [ -x "$BIN/cuda_parity" ] && [ "$saw_no_device" = 0 ]; then
  run_test cuda_parity "cuda_parity[FAST=0]" LLMRT_CUDA_FAST=0
fi

# The old CPU-vs-CUDA decode benchmark (an ignored test of cuda_parity), on request.
benches=()
if [ -x "$BIN/cuda_parity" ] && [ "$RUN_BENCH_DECODE" = 1 ]; then
  left=$(left_s)
  limit=$(( left < BENCH_TIMEOUT ? left : BENCH_TIMEOUT ))
  if [ "$limit" -ge 20 ]; then
    echo "== cuda_parity --ignored bench_decode (timeout ${limit}s)"
    timeout "$limit" "$BIN/cuda_parity" --ignored --exact bench_decode --test-threads=1 --nocapture \
      > >(tee "$LOG/bench_decode.log") 2>&1
    wait
    while IFS= read -r l; do benches+=("${l#BENCH }"); done < <(grep -E '^BENCH ' "$LOG/bench_decode.log")
  fi
fi

# 3. llmrt-bench on CUDA. bench NAME TIMEOUT [ENV=VALUE ...] ARGS...: one process, md
# rows into bench-NAME.log, JSON records into bench-NAME.json.
bench_rows=()
bench() {
  local name="$1" want="$2"; shift 2
  local envs=()
  while [ $# -gt 0 ] && [[ "$1" == *=* ]] && [[ "$1" != -* ]]; do envs+=("$1"); shift; done
  local left limit rc
  left=$(left_s)
  limit=$(( left < want ? left : want ))
  if [ "$limit" -lt 20 ]; then
    bench_rows+=("$name: NOT-RUN(budget)"); status=1; return
  fi
  echo "== llmrt-bench $name: ${envs[*]+${envs[*]} }$* (timeout ${limit}s)"
  env ${envs[@]+"${envs[@]}"} timeout "$limit" "$BIN/llmrt-bench" --backend cuda --json "$LOG/bench-$name.json" "$@" \
    > >(tee "$LOG/bench-$name.log") 2>&1
  rc=$?
  wait
  if [ "$rc" = 124 ]; then bench_rows+=("$name: TIMEOUT(${limit}s) (rows so far below)"); status=1
  elif [ "$rc" != 0 ]; then bench_rows+=("$name: FAILED(rc=$rc): $(grep -m1 'llmrt-bench:' "$LOG/bench-$name.log" | grep -v 'built in memory')"); status=1
  fi
  while IFS= read -r l; do bench_rows+=("$l"); done < <(grep -E '^\| [a-z]' "$LOG/bench-$name.log" | grep -v '^| model')
  while IFS= read -r l; do bench_rows+=("$name: $l"); done < <(grep -E '^(CEILING |cuBLAS: )' "$LOG/bench-$name.log")
}
if [ "$RUN_BENCH" = 1 ] && [ -x "$BIN/llmrt-bench" ] && [ "$saw_no_device" = 0 ]; then
  bench 8b-f16 150 -m synth:llama3-8b:f16 --d2d --gemm 8192 -p 2048 -n 128 -d 512 -b 1,8,32,64 --ttft 2048 -r 2
  bench 8b-q8_0 60 -m synth:llama3-8b:q8_0 --d2d -p 0 -n 128 -d 512 -b 1 -r 2
  bench 8b-q4_0 60 -m synth:llama3-8b:q4_0 --d2d -p 0 -n 128 -d 512 -b 1 -r 2
  bench tinyllama 60 -m synth:tinyllama:f16,synth:tinyllama:q8_0,synth:tinyllama:q4_0 --d2d -p 512 -n 128 -b 1 -r 2
  # The opt-in fast Q8_0/Q4_0 GEMV against the default (plain) kernels above. Named so
  # that its JSON sorts after bench-8b-*.json (gpu_bench_summary.py takes the first match).
  bench q-gemv-quant 80 LLMRT_CUDA_GEMV_QUANT=1 -m synth:llama3-8b:q8_0,synth:llama3-8b:q4_0 --d2d -p 0 -n 128 -d 512 -b 1 -r 2
fi

# 4. the PyTorch peer.
if [ "$RUN_BENCH" = 1 ] && [ "$RUN_TORCH" = 1 ] && [ "$saw_no_device" = 0 ]; then
  left=$(left_s)
  limit=$(( left < 150 ? left : 150 ))
  if [ "$limit" -ge 30 ] && command -v python3 >/dev/null 2>&1; then
    echo "== torch_peer (timeout ${limit}s)"
    timeout "$limit" python3 "$ROOT/scripts/torch_peer.py" --shape llama3-8b --dtype f16 --depth 512 --gen 128 \
      --batch 1,64 --prefill 2048 --reps 2 --json "$LOG/torch-peer.json" > >(tee "$LOG/torch-peer.log") 2>&1
    rc=$?
    wait
    [ "$rc" = 0 ] || bench_rows+=("torch_peer: rc=$rc (see torch-peer.log)")
  else
    bench_rows+=("torch_peer: NOT-RUN (budget ${limit}s or no python3)")
  fi
fi

say ""
say "== summary (logs in $LOG)"
say "$(printf '%-22s %-16s %7s %7s %8s %8s' binary verdict passed failed skipped wall_s)"
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
if [ ${#bench_rows[@]} -gt 0 ]; then
  say ""
  say "llmrt-bench on CUDA (t/s; bound = (weights + KV bytes per step) / copy bandwidth; pp: TFLOP/s vs cuBLAS bf16):"
  for b in "${bench_rows[@]}"; do say "  $b"; done
  if command -v python3 >/dev/null 2>&1; then
    say ""
    python3 "$ROOT/scripts/gpu_bench_summary.py" "$LOG" 2>&1 | tee -a "$SUMMARY"
  fi
fi
grep -ho 'skipped: .*' "$LOG"/*.log 2>/dev/null | sort | uniq -c | sed 's/^ */  /' | tee -a "$SUMMARY"
[ "$status" = 0 ] && [ "$saw_no_device" = 1 ] && status=2
say "gpu-check: $(( $(date +%s) - START )) s of a ${BUDGET} s budget"
case "$status" in
  0) say "gpu-check: exit 0 (all passed on the device)" ;;
  2) say "gpu-check: exit 2 (NO CUDA DEVICE: the tests skipped, nothing was measured)" ;;
  *) say "gpu-check: exit $status (a test or benchmark FAILED, timed out or did not run: see the verdicts above)" ;;
esac
exit "$status"
