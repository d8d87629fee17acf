#!/bin/sh
# make cuda-emu-coverage: which lines and functions of src/backend/cuda the CUDA tests
# run on the emulated device (both passes: fast paths on, LLMRT_CUDA_FAST=0). Builds the
# tests with -C instrument-coverage in their own target folder; needs the toolchain's
# llvm-tools (`rustup component add llvm-tools`).
#   env: CUDA_EMU_LIB, CARGO
set -eu
lib=${CUDA_EMU_LIB:?}
cargo=${CARGO:-cargo}
cov=$(dirname "$lib")/cov
bin=$(echo "$(rustc --print sysroot)"/lib/rustlib/*/bin)
[ -x "$bin/llvm-profdata" ] || { echo "no llvm-profdata in $bin: rustup component add llvm-tools"; exit 1; }
mkdir -p "$cov"
[ "${CUDA_EMU_COV_REPORT_ONLY:-0}" = 0 ] && rm -rf "$cov/prof"
export CARGO_TARGET_DIR="$cov/target" RUSTFLAGS="-C instrument-coverage"
tests="cuda_smoke cuda_kernels cuda_parity"
targs=""
for t in $tests; do targs="$targs --test $t"; done
# shellcheck disable=SC2086
# (The instrumented build scripts write profiles too: keep them out of the work tree.)
exes=$(LLVM_PROFILE_FILE="$cov/build-prof/%p-%m.profraw" $cargo test --release --no-run $targs --message-format=json 2>"$cov/build.log" |
  grep -o '"executable":"[^"]*"' | sed 's/"executable":"//; s/"$//' | grep -E '/deps/cuda_(smoke|kernels|parity)-')
[ -n "$exes" ] || { cat "$cov/build.log"; exit 1; }
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ "${CUDA_EMU_COV_REPORT_ONLY:-0}" = 0 ] && for e in $exes; do
  LLMRT_CUDA_GEMV_QUANT=1 LLVM_PROFILE_FILE="$cov/prof/fast-%p-%m.profraw" "$e" >"$cov/$(basename "$e").fast.log" 2>&1 ||
    echo "  $(basename "$e") (fast) failed: see $cov"
  LLMRT_CUDA_FAST=0 LLVM_PROFILE_FILE="$cov/prof/plain-%p-%m.profraw" "$e" >"$cov/$(basename "$e").plain.log" 2>&1 ||
    echo "  $(basename "$e") (plain) failed: see $cov"
done
if [ "${CUDA_EMU_COV_REPORT_ONLY:-0}" = 0 ] || [ ! -f "$cov/merged.profdata" ]; then
  "$bin/llvm-profdata" merge -sparse "$cov"/prof/*.profraw -o "$cov/merged.profdata"
fi
first=""
objs=""
for e in $exes; do
  if [ -z "$first" ]; then first=$e; else objs="$objs -object $e"; fi
done
root=$(cd "$(dirname "$0")/../.." && pwd)
srcs=$(ls "$root"/src/backend/cuda/*.rs "$root"/src/backend/cuda/*/*.rs 2>/dev/null || true)
# shellcheck disable=SC2086
"$bin/llvm-cov" report --instr-profile "$cov/merged.profdata" "$first" $objs $srcs | tee "$cov/report.txt"
# shellcheck disable=SC2086
"$bin/llvm-cov" show --instr-profile "$cov/merged.profdata" "$first" $objs $srcs \
  --show-line-counts-or-regions >"$cov/show.txt"
echo "line-by-line: $cov/show.txt"
