#!/bin/sh
# Fetches llama.cpp's tokenizer test suite for tests/tokenizer_vocab.rs: the
# models/ggml-vocab-*.gguf files (vocab-only GGUFs) with their .inp/.out vectors, from the
# llama.cpp vendored in the llama-cpp-python 0.3.36 source package on PyPI (the same package
# scripts/bench-vs-llamacpp.sh builds llama.cpp from). They are ~60 MB, so they are cached
# outside the repository instead of committed:
#
#   ${LLMRT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmrt}/llama_cpp_python-0.3.36/vendor/llama.cpp/models
#
# (where the test looks; LLMRT_VOCAB_DIR=<models dir> points the test elsewhere and makes
# this script do nothing). LLMRT_VOCAB_SDIST=<path to llama_cpp_python-0.3.36.tar.gz> uses a
# copy already downloaded instead of `pip download`. The archive is checked against its
# sha256. Any failure exits non-zero: `make test` stops rather than skipping the suite.
#
# This script only fetches. The loadable copies the suite also runs (each vocab's tokenizer.*
# keys verbatim plus a tiny random F32 llama, so it loads through llmrt_model_load) are built
# by tests/tokenizer_vocab.rs itself (`model_copy`), at test time, in a temp dir it removes.
set -eu
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
if [ -n "${LLMRT_VOCAB_DIR:-}" ]; then
  echo "vocab suite: LLMRT_VOCAB_DIR=$LLMRT_VOCAB_DIR (nothing to fetch)"
  exit 0
fi
CACHE="${LLMRT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmrt}"
PKG="llama_cpp_python-$VERSION"
MODELS="$CACHE/$PKG/vendor/llama.cpp/models"
if [ -f "$MODELS/.complete" ]; then
  echo "vocab suite: $MODELS"
  exit 0
fi
mkdir -p "$CACHE"
TMP=$(mktemp -d "$CACHE/fetch.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM
if [ -n "${LLMRT_VOCAB_SDIST:-}" ]; then
  cp "$LLMRT_VOCAB_SDIST" "$TMP/$PKG.tar.gz"
else
  echo "vocab suite: downloading the llama-cpp-python $VERSION source package from PyPI" >&2
  (cd "$TMP" && python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" >&2) || {
    echo "vocab suite: pip download of llama-cpp-python==$VERSION failed (network?); set LLMRT_VOCAB_SDIST or LLMRT_VOCAB_DIR" >&2
    exit 1
  }
fi
echo "$SHA256  $TMP/$PKG.tar.gz" | sha256sum -c --quiet - || {
  echo "vocab suite: $PKG.tar.gz does not have sha256 $SHA256" >&2
  exit 1
}
tar -xzf "$TMP/$PKG.tar.gz" -C "$TMP" --wildcards "$PKG/vendor/llama.cpp/models/ggml-vocab-*"
n=$(ls "$TMP/$PKG/vendor/llama.cpp/models/"*.gguf.inp | wc -l)
[ "$n" -ge 15 ] || { echo "vocab suite: only $n .inp files in $PKG" >&2; exit 1; }
touch "$TMP/$PKG/vendor/llama.cpp/models/.complete"
rm -rf "$CACHE/$PKG"
mv "$TMP/$PKG" "$CACHE/$PKG"
echo "vocab suite: $MODELS ($n vocabularies with vectors)"
