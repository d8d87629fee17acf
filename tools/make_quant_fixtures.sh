#!/usr/bin/env bash
# Regenerates tests/fixtures/quant/ (see tests/fixtures/quant/README.md) from tools nobody here
# wrote: gguf-py and llama.cpp, both from the llama.cpp vendored in the llama-cpp-python 0.3.36
# source package. Nothing of llama.cpp is put inside this repository: the sdist, the llama.cpp
# build, the venv and the built tools live in WORK.
#
#   tools/make_quant_fixtures.sh [PARTS]      PARTS: dequant,models,stories (default: all three)
#
# Environment (all optional):
#   WORK=DIR            work folder (default /tmp/llmrt-qfix); reused between runs
#   LLAMACPP_SRC=DIR    an unpacked vendor/llama.cpp (default: pip download the sdist into WORK)
#   LLAMA_BUILD=DIR     an existing llama.cpp cmake build (bin/llama-quantize, src/libllama.a, ...)
#   LLAMA_CPU_LIBDIR=DIR  take libggml-cpu.a / libggml-base.a from DIR instead of LLAMA_BUILD/ggml/src
#                       (e.g. a second build of only the ggml-cpu target with the AMX flags below)
#   VENV=DIR            a venv with numpy (default: WORK/venv, made with numpy==2.4.6)
#   OUT=DIR             output folder (default tests/fixtures/quant)
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
PARTS="${1:-dequant,models,stories}"
WORK="${WORK:-/tmp/llmrt-qfix}"
OUT="${OUT:-$HERE/tests/fixtures/quant}"
mkdir -p "$WORK"

if [ -z "${LLAMACPP_SRC:-}" ]; then
  if [ ! -d "$WORK/llama_cpp_python-0.3.36/vendor/llama.cpp" ]; then
    echo "== fetching llama-cpp-python 0.3.36 (source package)" >&2
    (cd "$WORK" && python3 -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==0.3.36 >&2)
    tar -xzf "$WORK"/llama_cpp_python-0.3.36.tar.gz -C "$WORK"
  fi
  LLAMACPP_SRC="$WORK/llama_cpp_python-0.3.36/vendor/llama.cpp"
fi

if [ -z "${LLAMA_BUILD:-}" ]; then
  LLAMA_BUILD="$WORK/llama-build"
  if [ ! -x "$LLAMA_BUILD/bin/llama-quantize" ] || [ ! -f "$LLAMA_BUILD/src/libllama.a" ]; then
    echo "== building llama.cpp from $LLAMACPP_SRC in $LLAMA_BUILD (several minutes)" >&2
    # AMX off: on this project's machines the CPU reports amx_tile/amx_int8 but ggml's AMX mul_mat
    # dies with SIGILL (tilezero) on a Q4_0 prompt batch; without AMX llama.cpp takes its AVX-512
    # paths (with its usual CPU_REPACK weight repacking), as on any machine without AMX.
    NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake -S "$LLAMACPP_SRC" -B "$LLAMA_BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DCMAKE_C_FLAGS="$NOAMX" -DCMAKE_CXX_FLAGS="$NOAMX" >&2
    cmake --build "$LLAMA_BUILD" -j"$(nproc)" --target llama-quantize llama >&2
  fi
fi

CPULIB="${LLAMA_CPU_LIBDIR:-$LLAMA_BUILD/ggml/src}"
TOOLS="$WORK/tools"
mkdir -p "$TOOLS"
for t in llamacpp_logits llamacpp_greedy; do
  if [ ! -x "$TOOLS/$t" ] || [ "$HERE/tools/$t.cpp" -nt "$TOOLS/$t" ]; then
    echo "== building $t" >&2
    g++ -O2 -std=c++17 -I"$LLAMACPP_SRC/include" -I"$LLAMACPP_SRC/ggml/include" "$HERE/tools/$t.cpp" \
      "$LLAMA_BUILD/src/libllama.a" "$LLAMA_BUILD/ggml/src/libggml.a" "$CPULIB/libggml-cpu.a" \
      "$CPULIB/libggml-base.a" -fopenmp -lpthread -o "$TOOLS/$t"
  fi
done

if [ -z "${VENV:-}" ]; then
  VENV="$WORK/venv"
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet numpy==2.4.6 tqdm pyyaml requests >&2
  fi
fi

cd "$HERE"
PYTHONPATH="$LLAMACPP_SRC/gguf-py" "$VENV/bin/python" tools/make_quant_fixtures.py --out "$OUT" --work "$WORK" \
  --llama-bin "$LLAMA_BUILD/bin" --tools "$TOOLS" --parts "$PARTS"
