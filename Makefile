# llmrt: build the Rust library, check the committed C header, run the C tests
# (plain and under valgrind), and the demo. `make help` lists the targets.
#
# Variables: MODEL (demo model), DEMO_ARGS (extra generate arguments),
# VALGRIND=OFF (skip the memcheck half of `make ctest`), CARGO_TARGET_DIR,
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
MODEL     ?= tests/fixtures/llama_gqa/llama_gqa.f32.gguf
DEMO_ARGS ?=
GENERATE  := $(TARGET)/examples/generate

PREFIX    ?= /usr/local
DESTDIR   ?=
GO        ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
# Text/sampling functions the header declares (the text issue adds them): the
# examples and the Go package compile those parts only when they are there.
LP        := (
HAVE_TEXT := $(shell grep -q ' llmrt_tokenize$(LP)' include/llmrt.h && grep -q ' llmrt_detokenize$(LP)' include/llmrt.h && echo 1)
HAVE_SAMPLING := $(shell grep -q ' llmrt_decode_sample$(LP)' include/llmrt.h && grep -q ' llmrt_sampler_params_default$(LP)' include/llmrt.h && echo 1)
API_DEFS  := $(if $(HAVE_TEXT),-DLLMRT_HAVE_TEXT=1) $(if $(HAVE_SAMPLING),-DLLMRT_HAVE_SAMPLING=1)
GO_TAGS   := $(if $(and $(HAVE_TEXT),$(HAVE_SAMPLING)),-tags llmrt_text)

.PHONY: all help build check-header ctest demo test go-test install clean
all: build

help:
	@echo "make build         cargo build --release (lib + include/llmrt.h)"
	@echo "make check-header  fail if include/llmrt.h differs from what build.rs generates"
	@echo "make ctest         C tests in $(BUILD_CTEST)/, then again under valgrind"
	@echo "make demo          run examples/generate.c on MODEL=$(MODEL)"
	@echo "make test          cargo test, check-header, ctest[, kernel-check][, go-test][, fuzz-short]"
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
	$(CC) -std=c11 -O2 -g -Wall -Wextra -Werror $(API_DEFS) -Iinclude $< -o $@ \
	  -L$(LIBDIR) -lllmrt -Wl,-rpath,$(LIBDIR) -lm

demo: build
	$(MAKE) --no-print-directory $(GENERATE)
	$(GENERATE) $(MODEL) $(DEMO_ARGS)

-include scripts/kernel-check.mk
-include scripts/fuzz.mk

test:
	$(CARGO) test --release
	$(MAKE) --no-print-directory check-header
	$(MAKE) --no-print-directory ctest
	$(if $(wildcard scripts/kernel-check.mk),$(MAKE) --no-print-directory kernel-check)
	$(if $(wildcard go/go.mod),$(MAKE) --no-print-directory go-test)
	$(if $(wildcard scripts/fuzz.mk),$(MAKE) --no-print-directory fuzz-short)

# The package's own #cgo lines point at ../include and ../target/release; these
# flags come first, so a CARGO_TARGET_DIR elsewhere wins.
GO_ENV = CGO_ENABLED=1 CGO_CFLAGS="-I$(CURDIR)/include" \
  CGO_LDFLAGS="-L$(LIBDIR) -Wl,-rpath,$(LIBDIR)"

go-test: build
	cd go && $(GO_ENV) $(GO) vet $(GO_TAGS) ./...
	cd go && $(GO_ENV) $(GO) test $(GO_TAGS) -count=1 ./...
	cd go && $(GO_ENV) $(GO) test $(GO_TAGS) -count=1 -race ./...

install: build
	sh scripts/install.sh "$(PREFIX)" "$(LIBDIR)" "$(DESTDIR)"

clean:
	$(CARGO) clean
	rm -rf $(BUILD_CTEST)
