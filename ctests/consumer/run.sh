#!/bin/sh
# Installs llmrt into a fresh temporary prefix with scripts/install.sh, then
# builds and runs the programs of this directory against it, as a user would:
#
#   run.sh cmake|pkgconfig ROOT LIBDIR WORKDIR MODEL
#
# cmake:     find_package(llmrt) + llmrt::llmrt / llmrt::llmrt_static (CMakeLists.txt)
# pkgconfig: cc $(pkg-config --cflags --libs llmrt), the C++ wrapper the same way,
#            and a static link with `pkg-config --static`'s Libs.private
# Exit 77 (ctest SKIP_RETURN_CODE) when pkg-config is not installed.
set -eu
mode=$1 root=$2 libdir=$3 work=$4 model=$5
here=$(cd "$(dirname "$0")" && pwd)
CC=${CC:-cc}
CXX=${CXX:-c++}
CMAKE=${CMAKE:-cmake}

if [ "$mode" = pkgconfig ] && ! command -v pkg-config >/dev/null 2>&1; then
  echo "pkg-config not installed: skipping"
  exit 77
fi

rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
sh "$root/scripts/install.sh" "$prefix" "$libdir"
# The installed tree, not the source tree, must be what the consumer sees.
test -f "$prefix/include/llmrt.hpp"
test -f "$prefix/lib/cmake/llmrt/llmrtConfigVersion.cmake"

case "$mode" in
cmake)
  "$CMAKE" -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
  "$CMAKE" --build "$work/build"
  "$work/build/consumer" "$model"
  "$work/build/consumer_cpp" "$model"
  "$work/build/consumer_static" "$model"
  # An impossible version must be refused by llmrtConfigVersion.cmake.
  mkdir -p "$work/v99"
  printf 'cmake_minimum_required(VERSION 3.16)\nproject(v99 C)\nfind_package(llmrt 99 QUIET)\nif(llmrt_FOUND)\n  message(FATAL_ERROR "llmrt 99 accepted")\nendif()\n' \
    >"$work/v99/CMakeLists.txt"
  "$CMAKE" -S "$work/v99" -B "$work/v99/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  ;;
pkgconfig)
  export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
  pkg-config --exists --print-errors llmrt
  echo "pkg-config llmrt $(pkg-config --modversion llmrt): $(pkg-config --cflags --libs llmrt)"
  # shellcheck disable=SC2046
  $CC -std=c11 -Wall -Wextra -Werror "$here/consumer.c" -o "$work/consumer" \
    $(pkg-config --cflags --libs llmrt) -Wl,-rpath,"$(pkg-config --variable=libdir llmrt)"
  # shellcheck disable=SC2046
  $CXX -std=c++17 -Wall -Wextra -Werror "$here/consumer.cpp" -o "$work/consumer_cpp" \
    $(pkg-config --cflags --libs llmrt) -Wl,-rpath,"$(pkg-config --variable=libdir llmrt)"
  # Static: the archive itself, then what Libs.private says it needs.
  # shellcheck disable=SC2046
  $CC -std=c11 -Wall -Wextra -Werror "$here/consumer.c" -o "$work/consumer_static" \
    $(pkg-config --cflags llmrt) "$(pkg-config --variable=libdir llmrt)/libllmrt.a" \
    $(pkg-config --static --libs llmrt | sed 's/-lllmrt//')
  "$work/consumer" "$model"
  "$work/consumer_cpp" "$model"
  "$work/consumer_static" "$model"
  if ldd "$work/consumer_static" | grep -q libllmrt; then
    echo "consumer_static links libllmrt.so dynamically" >&2
    exit 1
  fi
  ;;
*)
  echo "usage: $0 cmake|pkgconfig ROOT LIBDIR WORKDIR MODEL" >&2
  exit 2
  ;;
esac
echo "install_consumer_$mode: ok"
