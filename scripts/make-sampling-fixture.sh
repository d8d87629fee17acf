#!/usr/bin/env bash
# Regenerates tests/fixtures/sampling/llamacpp_sampler.txt: builds tools/llamacpp_sampler.cpp
# against a llama.cpp build (llama-cpp-python 0.3.36's vendor/llama.cpp, as
# scripts/bench-vs-llamacpp.sh uses) and runs it. No model, no network when both are given:
#   LLAMACPP_SRC=.../vendor/llama.cpp LLAMA_BUILD=.../build scripts/make-sampling-fixture.sh
# LLAMA_BUILD is a CMake build of LLAMACPP_SRC holding src/libllama.a and ggml/src/libggml*.a
# (configure one with: cmake -S "$LLAMACPP_SRC" -B DIR -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF;
#  cmake --build DIR --target llama).
set -euo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
: "${LLAMACPP_SRC:?set LLAMACPP_SRC to llama-cpp-python 0.3.36 vendor/llama.cpp}"
: "${LLAMA_BUILD:?set LLAMA_BUILD to a static CMake build of LLAMACPP_SRC}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
g++ -O2 -std=c++17 -I"$LLAMACPP_SRC/include" -I"$LLAMACPP_SRC/ggml/include" "$HERE/tools/llamacpp_sampler.cpp" \
  "$LLAMA_BUILD/src/libllama.a" "$LLAMA_BUILD/ggml/src/libggml.a" "$LLAMA_BUILD/ggml/src/libggml-cpu.a" \
  "$LLAMA_BUILD/ggml/src/libggml-base.a" -fopenmp -lpthread -o "$TMP/llamacpp_sampler"
OUT="$HERE/tests/fixtures/sampling/llamacpp_sampler.txt"
"$TMP/llamacpp_sampler" "$OUT"
echo "wrote $OUT ($(grep -c '^case' "$OUT") cases)"
