#!/bin/sh
# make cuda-emu-selftest: builds a libcuda.so with the deliberately broken kernels of
# tests/kernels/ added (next to kernels/*.cu), and runs tests/selftest.cpp against it.
#   env: CUDA_EMU_LIB (the emulated libraries, built by make cuda-emu-libs), CXX
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(dirname "$here")
root=$(cd "$src/../.." && pwd)
lib=${CUDA_EMU_LIB:?}
cxx=${CXX:-g++}
emu=$(dirname "$lib")
out="$emu/selftest"
mkdir -p "$out/lib"
inc="$root/tools/cuda-emu/inc"
flags="-std=c++17 -O2 -g -fPIC -fvisibility=hidden -ffp-contract=off -fno-strict-aliasing -pthread -Wno-unknown-pragmas"
sh "$src/gen_kernels.sh" "$here/kernels" "$inc" "$out/gen" "$cxx"
objs=""
for g in "$out"/gen/k_*.cpp; do
  o="$out/$(basename "$g" .cpp).o"
  $cxx $flags -I "$inc" -I "$src" -I "$here/kernels" -c "$g" -o "$o"  # a few seconds: always
  objs="$objs $o"
done
# The driver with both kernel sets; cuBLAS as built, linked against this driver.
$cxx -shared -pthread -Wl,-soname,libcuda.so -o "$out/lib/libcuda.so" "$emu/obj/driver.o" "$emu/obj/runtime.o" \
  "$emu"/obj/k_*.o $objs
$cxx -shared -pthread -Wl,-soname,libcublas.so -o "$out/lib/libcublas.so" "$emu/obj/cublas.o" \
  -L"$out/lib" -lcuda -Wl,-rpath,'$ORIGIN'
$cxx -shared -pthread -Wl,-soname,libnvrtc.so -o "$out/lib/libnvrtc.so" "$emu/obj/nvrtc.o" \
  -L"$out/lib" -lcuda -Wl,-rpath,'$ORIGIN'
$cxx -std=c++17 -O1 -g -o "$out/selftest" "$here/selftest.cpp" -L"$out/lib" -lcuda -ldl -pthread \
  -Wl,-rpath,"$out/lib"
EMU_SELFTEST_KERNELS="$here/kernels" LD_LIBRARY_PATH="$out/lib" "$out/selftest" "$@"
