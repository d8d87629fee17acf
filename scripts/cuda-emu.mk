# The CUDA runner on a CPU-emulated driver (docs/CUDA-EMULATOR.md), -included by the
# top Makefile:
#   make cuda-emu-libs        build target/cuda-emu/lib/{libcuda,libnvrtc,libcublas}.so
#   make cuda-emu-selftest    the emulator's own tests (each strictness rule tripped)
#   make test-cuda-emulated   the selftest, then tests/cuda_smoke, cuda_kernels, cuda_parity, cuda_quant_formats
#                             on the emulated H200, fast paths on, then LLMRT_CUDA_FAST=0; ends with
#                             `cuda emulated: N passed, M failed, K skipped`
#   make demo BACKEND=cuda    examples/generate on the emulated device (top Makefile)
CUDA_EMU_DIR ?= $(CURDIR)/target/cuda-emu
CUDA_EMU_LIB := $(CUDA_EMU_DIR)/lib
CUDA_EMU_CXX ?= g++
CUDA_EMU_SRC := $(CURDIR)/tools/cuda-driver-emu
CUDA_EMU_INC := $(CURDIR)/tools/cuda-emu/inc
# -ffp-contract=off: no FMA the source did not write (the kernels' fmaf are explicit).
# -fno-strict-aliasing: CUDA code reads vectors through reinterpret_cast (uint4 as __half2).
CUDA_EMU_CXXFLAGS ?= -std=c++17 -O2 -g -fPIC -fvisibility=hidden -ffp-contract=off -fno-strict-aliasing -pthread \
  -Wall -Wno-unused-function -Wno-unused-variable -Wno-unknown-pragmas
# fmaf and f16 conversions as instructions when the host has them (same results: both
# are exactly rounded either way; only faster than the library calls).
CUDA_EMU_ARCH ?= $(shell grep -qw fma /proc/cpuinfo 2>/dev/null && grep -qw f16c /proc/cpuinfo && echo -mfma -mf16c)
CUDA_EMU_CXXFLAGS += $(CUDA_EMU_ARCH) -mtls-dialect=gnu2
CUDA_EMU_HDRS := $(CURDIR)/scripts/cuda-emu.mk $(wildcard $(CUDA_EMU_INC)/*.h) $(wildcard $(CUDA_EMU_SRC)/*.h) $(wildcard $(CURDIR)/kernels/*.cuh)

.PHONY: cuda-emu-libs cuda-emu-selftest test-cuda-emulated cuda-emu-coverage _cuda-emu-link

cuda-emu-libs:
	@sh $(CUDA_EMU_SRC)/gen_kernels.sh $(CURDIR)/kernels $(CUDA_EMU_INC) $(CUDA_EMU_DIR)/gen $(CUDA_EMU_CXX)
	@$(MAKE) --no-print-directory -f $(CURDIR)/scripts/cuda-emu.mk _cuda-emu-link CURDIR=$(CURDIR)

CUDA_EMU_GEN := $(wildcard $(CUDA_EMU_DIR)/gen/k_*.cpp)
CUDA_EMU_KOBJ := $(patsubst $(CUDA_EMU_DIR)/gen/%.cpp,$(CUDA_EMU_DIR)/obj/%.o,$(CUDA_EMU_GEN))

$(CUDA_EMU_DIR)/obj/k_%.o: $(CUDA_EMU_DIR)/gen/k_%.cpp $(CUDA_EMU_HDRS)
	@mkdir -p $(dir $@)
	$(CUDA_EMU_CXX) $(CUDA_EMU_CXXFLAGS) -I $(CUDA_EMU_INC) -I $(CUDA_EMU_SRC) -I $(CURDIR)/kernels -c $< -o $@

$(CUDA_EMU_DIR)/obj/%.o: $(CUDA_EMU_SRC)/%.cpp $(CUDA_EMU_HDRS)
	@mkdir -p $(dir $@)
	$(CUDA_EMU_CXX) $(CUDA_EMU_CXXFLAGS) -I $(CUDA_EMU_INC) -I $(CUDA_EMU_SRC) -c $< -o $@

$(CUDA_EMU_DIR)/obj/runtime.o: $(CURDIR)/tools/cuda-emu/runtime.cpp $(CUDA_EMU_HDRS)
	@mkdir -p $(dir $@)
	$(CUDA_EMU_CXX) $(CUDA_EMU_CXXFLAGS) -I $(CUDA_EMU_INC) -c $< -o $@

# cublas.cpp's GEMM loop wants -O3 (vectorised 8-lane sums; the order stays fixed).
$(CUDA_EMU_DIR)/obj/cublas.o: $(CUDA_EMU_SRC)/cublas.cpp
	@mkdir -p $(dir $@)
	$(CUDA_EMU_CXX) $(CUDA_EMU_CXXFLAGS) -O3 -c $< -o $@

$(CUDA_EMU_LIB)/libcuda.so: $(CUDA_EMU_DIR)/obj/driver.o $(CUDA_EMU_DIR)/obj/runtime.o $(CUDA_EMU_KOBJ)
	@mkdir -p $(dir $@)
	$(CUDA_EMU_CXX) -shared -pthread -Wl,-soname,libcuda.so -o $@ $^

$(CUDA_EMU_LIB)/libnvrtc.so: $(CUDA_EMU_DIR)/obj/nvrtc.o $(CUDA_EMU_LIB)/libcuda.so
	$(CUDA_EMU_CXX) -shared -pthread -Wl,-soname,libnvrtc.so -o $@ $< -L$(CUDA_EMU_LIB) -lcuda -Wl,-rpath,'$$ORIGIN'

$(CUDA_EMU_LIB)/libcublas.so: $(CUDA_EMU_DIR)/obj/cublas.o $(CUDA_EMU_LIB)/libcuda.so
	$(CUDA_EMU_CXX) -shared -pthread -Wl,-soname,libcublas.so -o $@ $< -L$(CUDA_EMU_LIB) -lcuda -Wl,-rpath,'$$ORIGIN'

_cuda-emu-link: $(CUDA_EMU_LIB)/libcuda.so $(CUDA_EMU_LIB)/libnvrtc.so $(CUDA_EMU_LIB)/libcublas.so

cuda-emu-selftest: cuda-emu-libs
	@CUDA_EMU_LIB=$(CUDA_EMU_LIB) CXX=$(CUDA_EMU_CXX) sh $(CUDA_EMU_SRC)/tests/run.sh

test-cuda-emulated: cuda-emu-libs cuda-emu-selftest
	@CUDA_EMU_LIB=$(CUDA_EMU_LIB) CARGO="$(CARGO)" sh $(CUDA_EMU_SRC)/run-tests.sh

cuda-emu-coverage: cuda-emu-libs
	@CUDA_EMU_LIB=$(CUDA_EMU_LIB) CARGO="$(CARGO)" sh $(CUDA_EMU_SRC)/coverage.sh
