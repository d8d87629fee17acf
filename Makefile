# llmrt: build the Rust library, check the committed C header, run the C tests
# (plain and under valgrind), and the demo. `make help` lists the targets.
#
# Variables: MODEL (demo model; default the committed models/pystdlib Q8_0), DEMO_ARGS
# (generate arguments; default, for that model, a Python prompt), DEMO_PROMPT,
# VALGRIND=OFF (skip the memcheck half of `make ctest` and `make valgrind-rust`),
# VALGRIND_RUST_TESTS (the Rust test binaries `make valgrind-rust` runs), CARGO_TARGET_DIR,
# PREFIX / DESTDIR (`make install`), GO (the go command).
#
# Hooks filled by later work:
# - kernel-check: `make test` runs it when scripts/kernel-check.mk exists; that
#   file must define a `kernel-check` target (it is -included here).
# - go-test: `make test` runs it when go/go.mod exists.
# - fuzz-short: `make test` runs it when scripts/fuzz.mk exists (every fuzz
#   target for a few seconds; scripts/fuzz.sh).

CARGO     ?= cargo
CMAKE     ?= cmake
CTEST     ?= ctest
CC        ?= cc
NPROC     := $(shell nproc 2>/dev/null || echo 2)
TARGET    := $(abspath $(or $(CARGO_TARGET_DIR),target))
LIBDIR    := $(TARGET)/release
LIB       := $(LIBDIR)/libllmrt.so
BUILD_CTEST ?= build-ctest
VALGRIND  ?= ON
# The demo model: a small llama trained here on CPython's standard library
# (models/pystdlib/README.md; tools/train_demo_model.py made it). `make demo` says what it
# is first, then completes DEMO_PROMPT with it (greedy, repeat penalty 1.1). Another MODEL
# runs with DEMO_ARGS alone.
DEMO_MODEL  := models/pystdlib/pystdlib.q8_0.gguf
DEMO_ABOUT  := model: pystdlib (Q8_0), a 5.2M-parameter llama (4 layers, hidden 256, 8/4 heads, vocab 4096, context 256) trained on CPU on the .py files of the CPython 3.11 standard library; it writes Python-looking code (models/pystdlib/README.md)
DEMO_PROMPT ?= def fibonacci(n):
MODEL     ?= $(DEMO_MODEL)
DEMO_ARGS ?= $(if $(filter $(DEMO_MODEL),$(MODEL)),-p '$(DEMO_PROMPT)' -n 96 --repeat-penalty 1.1)
GENERATE  := $(TARGET)/examples/generate

PREFIX    ?= /usr/local
DESTDIR   ?=
GO        ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)

.PHONY: check-aarch64 all help build check-header ctest demo test go-test install clean valgrind-rust tsan lint vocab-fetch
all: build

help:
	@echo "make build         cargo build --release (lib + include/llmrt.h)"
	@echo "make check-header  fail if include/llmrt.h differs from what build.rs generates"
	@echo "make lint          cargo fmt --check and cargo clippy --all-targets -D warnings"
	@echo "make vocab-fetch   llama.cpp's tokenizer suite into the cache tests/tokenizer_vocab.rs reads (PyPI sdist)"
	@echo "make ctest         C tests in $(BUILD_CTEST)/, then again under valgrind"
	@echo "make demo          run examples/generate.c on MODEL=$(MODEL)"
	@echo "make test          lint, cargo test, check-header, ctest, valgrind-rust[, kernel-check][, go-test][, fuzz-short]"
	@echo "make valgrind-rust Rust integration tests under valgrind memcheck ($(VALGRIND_RUST_TESTS))"
	@echo "make tsan          the stress test under ThreadSanitizer (nightly + rust-src; not in make test)"
	@echo "make go-test       go vet, go test, go test -race of the Go package in go/"
	@echo "make install       lib, headers, pkg-config and CMake files into PREFIX=$(PREFIX) (DESTDIR too)"
	@echo "make clean"

build:
	$(CARGO) build --release

# build.rs regenerates the header only when it reruns, and nothing tells cargo
# that include/llmrt.h was edited or checked out since: touch build.rs so this
# check never compares against a header from an earlier build.
check-header:
	touch build.rs
	$(CARGO) build --release
	@git ls-files --error-unmatch include/llmrt.h >/dev/null 2>&1 || \
	  { echo "include/llmrt.h is not committed"; exit 1; }
	@git diff --exit-code -- include/llmrt.h || \
	  { echo "include/llmrt.h differs from what build.rs generates: commit the regenerated header"; exit 1; }

ctest: build
	$(CMAKE) -S ctests -B $(BUILD_CTEST) \
	  -DLLMRT_LIB=$(LIB) \
	  -DLLMRT_INCLUDE_DIR=$(CURDIR)/include \
	  -DLLMRT_FIXTURES_DIR=$(CURDIR)/tests/fixtures \
	  -DLLMRT_VALGRIND=$(VALGRIND)
	$(CMAKE) --build $(BUILD_CTEST) -j $(NPROC)
	cd $(BUILD_CTEST) && $(CTEST) --output-on-failure -j $(NPROC) -LE memcheck
ifneq ($(VALGRIND),OFF)
	cd $(BUILD_CTEST) && $(CTEST) --output-on-failure -j $(NPROC) -L memcheck
endif

$(GENERATE): examples/generate.c include/llmrt.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g -Wall -Wextra -Werror -Iinclude $< -o $@ \
	  -L$(LIBDIR) -lllmrt -Wl,-rpath,$(LIBDIR) -lm

# BACKEND=cpu|cuda|auto picks the backend; BACKEND=cuda runs on the emulated driver
# (scripts/cuda-emu.mk) unless CUDA_EMU=0 (then on the machine's own driver).
demo: build
	$(MAKE) --no-print-directory $(GENERATE)
	@$(if $(filter $(DEMO_MODEL),$(MODEL)),echo '$(DEMO_ABOUT)',:)
ifeq ($(BACKEND)$(CUDA_EMU),cuda)
	$(MAKE) --no-print-directory cuda-emu-libs
	LD_LIBRARY_PATH=$(CUDA_EMU_LIB) $(GENERATE) $(MODEL) --backend cuda $(DEMO_ARGS)
else
	$(GENERATE) $(MODEL) $(if $(BACKEND),--backend $(BACKEND)) $(DEMO_ARGS)
endif

-include scripts/kernel-check.mk
-include scripts/fuzz.mk
-include scripts/cuda-emu.mk

# Rust integration tests under valgrind memcheck (docs/RELIABILITY.md): two to three
# minutes. The stress test runs a shorter sequence there (valgrind serialises threads).
VALGRIND_RUST_TESTS ?= cache_semantics formats reference_parity text_api hf_parity tokenizer reliability stress \
  moe sliding_window tokenizer_special tokenizer_unsupported tokenizer_normalizers
valgrind-rust:
	LLMRT_STRESS_OPS=60 CARGO="$(CARGO)" sh scripts/valgrind-tests.sh $(VALGRIND_RUST_TESTS)

# The stress test under ThreadSanitizer: needs a nightly toolchain with rust-src
# (`rustup component add rust-src --toolchain nightly`); std is rebuilt
# instrumented (-Zbuild-std), so the first run takes several minutes, which is why
# `make test` does not run it. TSAN_OPTIONS makes any report fail the run.
TSAN_TARGET ?= x86_64-unknown-linux-gnu
tsan:
	RUSTFLAGS="-Zsanitizer=thread" TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  LLMRT_STRESS_OPS=$${LLMRT_STRESS_OPS:-250} \
	  cargo +nightly test -Zbuild-std --target $(TSAN_TARGET) --test stress -- --nocapture

# Style is enforced, not suggested: rustfmt.toml's format and every clippy lint
# (Cargo.toml turns on clippy::undocumented_unsafe_blocks) as an error.
lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --release --all-targets -- -D warnings
	$(MAKE) --no-print-directory check-aarch64

# The NEON kernels and every portable fallback (the grouped types run the scalar
# group order there) compile for aarch64, warning-free: a check, not a run (no
# aarch64 machine here). The target's standard library comes from rustup.
AARCH64 = aarch64-unknown-linux-gnu
check-aarch64:
	@if ! [ -d "$$(rustc --print target-libdir --target $(AARCH64) 2>/dev/null)" ]; then \
	  command -v rustup >/dev/null 2>&1 && rustup target add $(AARCH64); \
	fi
	@[ -d "$$(rustc --print target-libdir --target $(AARCH64) 2>/dev/null)" ] || \
	  { echo "check-aarch64: no standard library for $(AARCH64) (rustup target add $(AARCH64))" >&2; exit 1; }
	$(CARGO) clippy --release --all-targets --target $(AARCH64) -- -D warnings

# llama.cpp's vocab GGUFs + vectors (~60 MB, not committed): cached outside the repo.
vocab-fetch:
	sh tools/make_vocab_fixtures.sh

test:
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory vocab-fetch
	$(CARGO) test --release
	$(MAKE) --no-print-directory check-header
	$(MAKE) --no-print-directory ctest
	$(if $(filter OFF,$(VALGRIND)),,$(MAKE) --no-print-directory valgrind-rust)
	$(if $(wildcard scripts/kernel-check.mk),$(MAKE) --no-print-directory kernel-check)
	$(if $(wildcard go/go.mod),$(MAKE) --no-print-directory go-test)
	$(if $(wildcard scripts/fuzz.mk),$(MAKE) --no-print-directory fuzz-short)
	$(if $(wildcard scripts/cuda-emu.mk),$(MAKE) --no-print-directory test-cuda-emulated)

# The package's own #cgo lines point at ../include and ../target/release; these
# flags come first, so a CARGO_TARGET_DIR elsewhere wins.
GO_ENV = CGO_ENABLED=1 CGO_CFLAGS="-I$(CURDIR)/include" \
  CGO_LDFLAGS="-L$(LIBDIR) -Wl,-rpath,$(LIBDIR)"

go-test: build
	cd go && $(GO_ENV) $(GO) vet ./...
	cd go && $(GO_ENV) $(GO) test -count=1 ./...
	cd go && $(GO_ENV) $(GO) test -count=1 -race ./...

install: build
	sh scripts/install.sh "$(PREFIX)" "$(LIBDIR)" "$(DESTDIR)"

clean:
	$(CARGO) clean
	rm -rf $(BUILD_CTEST)
