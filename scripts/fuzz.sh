#!/usr/bin/env bash
# Fuzz llmrt's parsers of untrusted bytes with cargo-fuzz (libFuzzer). Targets live
# in fuzz/fuzz_targets/, their bodies in fuzz/src/harness.rs; docs/RELIABILITY.md
# ("Fuzzing") says what each covers.
#
#   scripts/fuzz.sh [--short] [target...]   each target for FUZZ_SECONDS (5) seconds (make fuzz-short)
#   scripts/fuzz.sh --long N [target...]    each target for N executions, one after another
#                                           (FUZZ_PARALLEL=2: two at a time)
#   scripts/fuzz.sh --for S [target...]     each target for S seconds (slow targets)
#   scripts/fuzz.sh --list
#
# Needs a nightly toolchain and cargo-fuzz: both are installed when missing
# (`rustup toolchain install nightly --profile minimal`, `cargo install cargo-fuzz --locked`).
# When that is impossible (no rustup, no network), prints a SKIPPED line and exits 0
# so `make test` does not fail for want of a fuzzer; a crash, timeout or OOM found
# by a run always fails.
#
# New corpus entries go to fuzz/corpus-run/<target>/ (ignored by git; the committed
# seeds in fuzz/corpus/<target>/ are only read); crash inputs to
# fuzz/artifacts/<target>/, logs to fuzz/logs/<target>.log.
# FUZZ_SANITIZER (default none: the crate is safe Rust but for two bounds-checked
# unaligned loads; "address" works too, about 2x slower). Builds carry debug
# assertions and overflow checks (-a). FUZZ_NO_TRACE_COMPARES=1 builds without
# comparison tracing, into fuzz/target-ntc/ (about 2x the executions per second on
# gguf_structured, whose `arbitrary` decoding needs no help to find magic values).
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_TARGETS=(gguf gguf_structured safetensors hf_config tokenizer_json sentencepiece_model tokenizer_gguf cache_state chat_template)
max_len() {
  case "$1" in
    gguf) echo 262144 ;;
    gguf_structured) echo 4096 ;;
    safetensors) echo 131072 ;;
    hf_config) echo 8192 ;;
    tokenizer_json) echo 32768 ;;
    sentencepiece_model) echo 8192 ;;
    tokenizer_gguf) echo 32768 ;;
    cache_state) echo 8192 ;;
    chat_template) echo 16384 ;;
    *) echo "unknown target $1" >&2; exit 2 ;;
  esac
}

mode=short
runs=0
secs=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --short) mode=short ;;
    --long) mode=long; runs="${2:?--long needs an execution count}"; shift ;;
    --for) mode=long; secs="${2:?--for needs seconds}"; shift ;;
    --list) printf '%s\n' "${ALL_TARGETS[@]}"; exit 0 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) max_len "$1" >/dev/null; targets+=("$1") ;;
  esac
  shift
done
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")

skip() { echo "fuzz: SKIPPED ($*)"; exit 0; }

[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
command -v cargo >/dev/null 2>&1 || skip "no cargo"
if ! cargo +nightly --version >/dev/null 2>&1; then
  command -v rustup >/dev/null 2>&1 || skip "no nightly toolchain and no rustup to install one"
  echo "fuzz: installing the nightly toolchain (rustup toolchain install nightly --profile minimal)"
  rustup toolchain install nightly --profile minimal >/dev/null 2>&1 || skip "could not install a nightly toolchain"
  cargo +nightly --version >/dev/null 2>&1 || skip "nightly toolchain unusable"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz (cargo install cargo-fuzz --locked)"
  cargo install cargo-fuzz --locked >/dev/null 2>&1 || skip "could not install cargo-fuzz"
fi

SAN="${FUZZ_SANITIZER:-none}"
FLAGS=(-s "$SAN" -a)
if [ "${FUZZ_NO_TRACE_COMPARES:-0}" = 1 ]; then FLAGS+=(--no-trace-compares --target-dir target-ntc); fi
# The fuzz crate has its own workspace and target directory.
unset CARGO_TARGET_DIR
cd fuzz
echo "fuzz: building ${targets[*]} (sanitizer $SAN, debug assertions${FUZZ_NO_TRACE_COMPARES:+, no comparison tracing})"
for t in "${targets[@]}"; do
  cargo +nightly fuzz build "${FLAGS[@]}" "$t" 2>&1 | grep -Ev '^\s*(Compiling|Finished|Running|warning: llmrt@)' || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "fuzz: build of $t failed"; exit 1; }
done

run_one() {
  local t="$1" limit="$2"
  mkdir -p "corpus-run/$t" "artifacts/$t" logs
  local start=$SECONDS rc=0
  cargo +nightly fuzz run "${FLAGS[@]}" "$t" "corpus-run/$t" "corpus/$t" -- \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 -max_len="$(max_len "$t")" \
    -artifact_prefix="artifacts/$t/" -print_final_stats=1 $limit >"logs/$t.log" 2>&1 || rc=$?
  local secs=$((SECONDS - start))
  local n; n=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "logs/$t.log" | grep -o '[0-9]*$' | tail -n1)
  local rate; rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "logs/$t.log" | grep -o '[0-9]*$' | tail -n1)
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $t FAILED (exit $rc) after ${n:-?} executions; see fuzz/logs/$t.log and fuzz/artifacts/$t/"
    grep -E 'panicked at|ERROR: libFuzzer|SUMMARY|Test unit written' "logs/$t.log" | head -n 8 | sed 's/^/  /'
    return 1
  fi
  echo "fuzz: $t ok: ${n:-?} executions in ${secs}s (${rate:-?} exec/s), corpus $(ls "corpus-run/$t" | wc -l) new + $(ls "corpus/$t" | wc -l) seeds"
}

if [ "$mode" = short ]; then
  limit="-max_total_time=${FUZZ_SECONDS:-5}"
elif [ "$secs" -gt 0 ]; then
  limit="-max_total_time=$secs"
else
  limit="-runs=$runs"
fi
fail=0
if [ "$mode" = long ] && [ "${FUZZ_PARALLEL:-1}" -gt 1 ]; then
  pids=()
  for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_PARALLEL" ]; do wait -n || fail=1; done
    run_one "$t" "$limit" &
  done
  while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || fail=1; done
else
  for t in "${targets[@]}"; do run_one "$t" "$limit" || fail=1; done
fi
exit $fail
