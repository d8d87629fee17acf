#!/bin/sh
# make test-cuda-emulated: the CUDA test binaries on the emulated driver, every fast
# path on (the opt-in LLMRT_CUDA_GEMV_QUANT=1 too) and then LLMRT_CUDA_FAST=0. A test
# that prints a line starting with "skipped" (the tests' way of saying there is no
# device, no cuBLAS, no NVRTC, no optional model) counts as skipped. On the emulated
# device that must not happen: any skip fails the target, except one that says
# "(optional)", which is listed.
# A test that needs a model file the repository does not hold is left out of the list
# when the file is absent (`--skip`), and the run says so on a line of its own:
# cuda_parity::stories260k_greedy_on_cuda needs $LLMRT_SHARED_MODELS (default
# ../shared/models)/stories260K/stories260K.gguf.
# Ends with one line: `cuda emulated: N passed, M failed, K skipped`.
#   env: CUDA_EMU_LIB (the emulated libraries), CARGO, CUDA_EMU_TESTS (binaries),
#        CUDA_EMU_LOGS (log folder, default target/cuda-emu/logs)
set -u
lib=${CUDA_EMU_LIB:?CUDA_EMU_LIB must name the emulated libraries}
cargo=${CARGO:-cargo}
tests=${CUDA_EMU_TESTS:-cuda_smoke cuda_kernels cuda_parity cuda_quant_formats}
logs=${CUDA_EMU_LOGS:-$(dirname "$lib")/logs}
mkdir -p "$logs"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
targs=""
for t in $tests; do targs="$targs --test $t"; done
# Tests that need a model outside the repository: "binary test file", one a line.
root=$(cd "$(dirname "$0")/../.." && pwd)
models=${LLMRT_SHARED_MODELS:-$root/../shared/models}
optional="cuda_parity stories260k_greedy_on_cuda $models/stories260K/stories260K.gguf"
not_run=""
# skips_for BINARY: the --skip arguments of BINARY's tests whose model is absent.
skips_for() {
  echo "$optional" | while read -r bin name file; do
    [ "$bin" = "$1" ] && [ ! -f "$file" ] && printf ' --skip %s' "$name"
  done
}
for t in $tests; do
  for name in $(skips_for "$t" | sed 's/--skip//g'); do
    not_run="$not_run $t::$name"
  done
done
# shellcheck disable=SC2086
$cargo test --release --no-run $targs >"$logs/build.log" 2>&1 || {
  cat "$logs/build.log"
  echo "cuda emulated: 0 passed, 1 failed, 0 skipped (the test binaries did not build)"
  exit 1
}
passed=0; failed=0; skipped=0; bad_skips=0
start=$(date +%s)
for pass in fast plain; do
  for t in $tests; do
    log="$logs/$t.$pass.log"
    t0=$(date +%s)
    skip=$(skips_for "$t")
    # shellcheck disable=SC2086
    if [ "$pass" = plain ]; then
      LLMRT_CUDA_FAST=0 $cargo test --release --test "$t" -- --show-output $skip >"$log" 2>&1
    else
      LLMRT_CUDA_GEMV_QUANT=1 $cargo test --release --test "$t" -- --show-output $skip >"$log" 2>&1
    fi
    rc=$?
    res=$(grep -E '^test result: ' "$log" | tail -1)
    p=$(echo "$res" | sed -n 's/.* \([0-9][0-9]*\) passed.*/\1/p'); p=${p:-0}
    f=$(echo "$res" | sed -n 's/.* \([0-9][0-9]*\) failed.*/\1/p'); f=${f:-0}
    if [ -z "$res" ] || { [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; }; then
      f=$((f + 1))  # the binary crashed or failed outside a test
      echo "  $t ($pass): the test binary exited with $rc before reporting; see $log"
    fi
    # Tests whose captured stdout has a line starting with "skipped".
    s=$(awk '/^---- .* stdout ----$/ { name = $2 } /^skipped/ && name != "" { print name }' "$log" | sort -u)
    ns=$(printf '%s' "$s" | grep -c . || true)
    no=$(awk '/^---- .* stdout ----$/ { name = $2 } /^skipped/ && name != "" && !/\(optional\)/ { print name }' "$log" |
      sort -u | grep -c . || true)
    passed=$((passed + p - ns)); failed=$((failed + f)); skipped=$((skipped + ns)); bad_skips=$((bad_skips + no))
    echo "  $t ($pass): $((p - ns)) passed, $f failed, $ns skipped in $(( $(date +%s) - t0 )) s$( [ -n "$s" ] && echo " (skipped: $(echo $s))")"
    if [ "$f" -ne 0 ]; then
      grep -E -A1 "^thread '.*' .*panicked at" "$log" | grep -v '^--$' | head -12 | sed 's/^/    /'
      grep -E '^cuda-emu: ' "$log" | head -4 | sed 's/^/    /'
    fi
  done
done
echo "  logs: $logs; $(( $(date +%s) - start )) s in all"
for n in $not_run; do
  echo "  not run (its model is not in the repository): $n; needs $(echo "$optional" |
    awk -v b="${n%%::*}" -v t="${n##*::}" '$1 == b && $2 == t { print $3 }') (set LLMRT_SHARED_MODELS)"
done
echo "cuda emulated: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && [ "$bad_skips" -eq 0 ]
