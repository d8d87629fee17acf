#!/usr/bin/env bash
# llmrt's CPU backend against llama.cpp, on the same synthetic GGUF files, with
# the same thread counts, in one run: each (file, threads, test) runs llama-bench
# and then llmrt-bench back to back (their order alternating between rounds),
# so both see the same machine load. Prints a markdown table with the ratios.
#
# llama.cpp is built from the llama.cpp vendored in the llama-cpp-python 0.3.36
# source package, in a temporary folder (never inside this repository), unless
# LLAMA_BENCH points at an existing llama-bench binary.
#
# Two instruction sets are measured (ISAS, default "native avx2" on a machine with
# AVX-512, "native" on one without): `native` is llama.cpp built with GGML_NATIVE=ON
# (AMX off: -mno-amx-*) against llmrt's auto-selected kernels; `avx2` is llama.cpp
# built with GGML_NATIVE=OFF, AVX/AVX2/FMA/F16C on and every AVX-512 option off,
# against llmrt with LLMRT_CPU_KERNELS=avx2. The table names the ISA of every row.
#
# TYPES: lower-case names (f16, bf16, q8_0, q4_0) are llmrt-bench's own synthetic
# files (`llmrt-bench --synth`); upper-case names are llama-quantize file types
# (Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, Q2_K, IQ4_XS, Q4_0, ...) made by llama.cpp's
# llama-quantize from the synthetic f16 file, so those rows run files that llama.cpp
# wrote, with its own mix of tensor types (Q4_K_M: Q4_K + Q6_K, ...).
#
# Environment (all optional):
#   SHAPE=tinyllama   synthetic model shape (tinyllama | llama3-8b | moe-mini | gemma2-2b | phi3-mini)
#   TYPES="f16 q8_0 q4_0"  THREADS="1 2"  PP=128  TG=64  REPS=3  ROUNDS=2  ISAS="native avx2"
#   DEPTH=0           tokens already in the cache before each test (llama-bench's -d): both tools
#                     prefill DEPTH tokens first, untimed, so pp and tg run against a deeper cache
#   MODELS_DIR=DIR    where synthetic and quantized models are written/reused (default: a temp dir)
#   LLAMA_BUILD_NATIVE=DIR, LLAMA_BUILD_AVX2=DIR  reuse (or keep) llama.cpp build folders
#   LLAMACPP_SRC=DIR  reuse an unpacked vendor/llama.cpp
#   LLAMA_BENCH=PATH  one llama-bench binary for every ISA (old behaviour; ISAS must be one entry)
#   KEEP=1            keep the temporary folder
#   --logits          also build tools/llamacpp_logits.cpp against the native llama.cpp (prints its path)
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
SHAPE="${SHAPE:-tinyllama}"
TYPES="${TYPES:-f16 q8_0 q4_0}"
THREADS="${THREADS:-1 2}"
PP="${PP:-128}"
TG="${TG:-64}"
DEPTH="${DEPTH:-0}"
REPS="${REPS:-3}"
ROUNDS="${ROUNDS:-2}"
if grep -qw avx512f /proc/cpuinfo; then ISAS="${ISAS:-native avx2}"; else ISAS="${ISAS:-native}"; fi
WANT_LOGITS=0
[ "${1:-}" = "--logits" ] && WANT_LOGITS=1

TMP="$(mktemp -d)"
cleanup() { if [ "${KEEP:-0}" != 1 ]; then rm -rf "$TMP"; else echo "kept $TMP" >&2; fi; }
trap cleanup EXIT
MODELS_DIR="${MODELS_DIR:-$TMP/models}"
mkdir -p "$MODELS_DIR"

echo "== building llmrt-bench" >&2
(cd "$HERE" && cargo build --release --bin llmrt-bench >&2)
LLMRT_BENCH="${CARGO_TARGET_DIR:-$HERE/target}/release/llmrt-bench"

need_src() {
  if [ -z "${LLAMACPP_SRC:-}" ]; then
    echo "== fetching llama-cpp-python 0.3.36 (source package)" >&2
    (cd "$TMP" && python3 -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==0.3.36 >&2)
    tar -xzf "$TMP"/llama_cpp_python-0.3.36.tar.gz -C "$TMP"
    LLAMACPP_SRC="$TMP/llama_cpp_python-0.3.36/vendor/llama.cpp"
  fi
}
# build_llama ISA DIR: configure (once) and build llama-bench and llama-quantize there.
build_llama() {
  local isa="$1" dir="$2" flags=()
  case "$isa" in
    native) flags=(-DGGML_NATIVE=ON) ;;
    avx2) flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                 -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
                 -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
    *) echo "unknown ISA $isa (native | avx2)" >&2; exit 2 ;;
  esac
  # AMX stays off in every build: this VM's kernel does not enable AMX state, and
  # ggml's AMX path dies with SIGILL on quantized prompts there.
  local amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    need_src
    echo "== configuring llama.cpp ($isa) from $LLAMACPP_SRC in $dir" >&2
    cmake -S "$LLAMACPP_SRC" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF "${flags[@]}" -DCMAKE_C_FLAGS="$amx" -DCMAKE_CXX_FLAGS="$amx" >&2
  fi
  echo "== building llama.cpp ($isa) in $dir (several minutes the first time)" >&2
  cmake --build "$dir" -j"$(nproc)" --target llama-bench llama-quantize >&2
}
declare -A LBENCH
if [ -n "${LLAMA_BENCH:-}" ]; then
  [ "$(wc -w <<<"$ISAS")" = 1 ] || { echo "LLAMA_BENCH names one binary: set ISAS to one entry" >&2; exit 2; }
  LBENCH[$ISAS]="$LLAMA_BENCH"
  QUANTIZE="$(dirname "$LLAMA_BENCH")/llama-quantize"
fi
for isa in $ISAS; do
  [ -n "${LBENCH[$isa]:-}" ] && continue
  if [ "$isa" = native ]; then dir="${LLAMA_BUILD_NATIVE:-$TMP/llama-build}"; else dir="${LLAMA_BUILD_AVX2:-$TMP/llama-build-avx2}"; fi
  build_llama "$isa" "$dir"
  LBENCH[$isa]="$dir/bin/llama-bench"
  [ "$isa" = native ] && QUANTIZE="$dir/bin/llama-quantize"
  [ -n "${QUANTIZE:-}" ] || QUANTIZE="$dir/bin/llama-quantize"
done
if [ "$WANT_LOGITS" = 1 ]; then
  need_src
  BUILD="${LLAMA_BUILD_NATIVE:-$TMP/llama-build}"
  [ -f "$BUILD/CMakeCache.txt" ] || build_llama native "$BUILD"
  cmake --build "$BUILD" -j"$(nproc)" --target llama >&2
  OUT="${LOGITS_TOOL_OUT:-$TMP/llamacpp_logits}"
  g++ -O2 -std=c++17 -I"$LLAMACPP_SRC/include" -I"$LLAMACPP_SRC/ggml/include" "$HERE/tools/llamacpp_logits.cpp" \
    "$BUILD/src/libllama.a" "$BUILD/ggml/src/libggml.a" "$BUILD/ggml/src/libggml-cpu.a" "$BUILD/ggml/src/libggml-base.a" \
    -fopenmp -lpthread -o "$OUT"
  echo "llamacpp_logits: $OUT"
fi

echo "== models ($SHAPE: $TYPES) in $MODELS_DIR" >&2
base="$MODELS_DIR/$( [ "$SHAPE" = tinyllama ] && echo tinyllama-1.1b || echo "$SHAPE")"
declare -A FILE
for ty in $TYPES; do
  if [ "$ty" = "${ty,,}" ]; then # llmrt's own synthetic file
    f="$base-$ty.gguf"
    [ -f "$f" ] || "$LLMRT_BENCH" --synth "$SHAPE" --type "$ty" --out "$MODELS_DIR" >&2
  else # a llama-quantize file type, from the synthetic f16 file
    f="$base-lq-$ty.gguf"
    if [ ! -f "$f" ]; then
      [ -f "$base-f16.gguf" ] || "$LLMRT_BENCH" --synth "$SHAPE" --type f16 --out "$MODELS_DIR" >&2
      echo "   llama-quantize $ty" >&2
      "$QUANTIZE" "$base-f16.gguf" "$f.part" "$ty" "$(nproc)" > "$f.log" 2>&1 || { tail -20 "$f.log" >&2; exit 1; }
      mv "$f.part" "$f"
    fi
  fi
  FILE[$ty]="$f"
done

RES="$TMP/results.jsonl"
: > "$RES"
run_one() { # tool isa ty threads p n round
  local tool="$1" isa="$2" ty="$3" t="$4" p="$5" n="$6" round="$7" out kernels=
  [ "$isa" = avx2 ] && kernels=avx2
  if [ "$tool" = llama.cpp ]; then
    out="$("${LBENCH[$isa]}" -m "${FILE[$ty]}" -t "$t" -p "$p" -n "$n" -d "$DEPTH" -r "$REPS" -o json 2>/dev/null)"
  else
    # tg rows: the read bandwidth is probed in the same process right before and
    # after the repetitions, with the same thread count (the row's bytes bound).
    out="$(LLMRT_CPU_KERNELS=$kernels "$LLMRT_BENCH" -m "${FILE[$ty]}" -t "$t" -p "$p" -n "$n" -d "$DEPTH" -r "$REPS" -o json $([ "$n" -gt 0 ] && echo --membw))"
  fi
  python3 -c 'import json,sys; [print(json.dumps({"tool":sys.argv[1],"isa":sys.argv[4],"type":sys.argv[2],"round":int(sys.argv[3]),"n_threads":r["n_threads"],"n_prompt":r["n_prompt"],"n_gen":r["n_gen"],"avg_ts":r["avg_ts"],"stddev_ts":r["stddev_ts"],"bound_ts":r.get("bound_ts"),"fraction":r.get("fraction_of_bound")})) for r in json.loads(sys.stdin.read())]' "$tool" "$ty" "$round" "$isa" <<<"$out" >> "$RES"
}

echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for round in $(seq 1 "$ROUNDS"); do
 for isa in $ISAS; do
  for ty in $TYPES; do
    for t in $THREADS; do
      for test in "pp" "tg"; do
        if [ "$test" = pp ]; then p="$PP"; n=0; else p=0; n="$TG"; fi
        if [ $((round % 2)) = 1 ]; then order="llama.cpp llmrt"; else order="llmrt llama.cpp"; fi
        for tool in $order; do
          echo "   round $round: $tool $isa $ty -t $t ${test}$([ "$test" = pp ] && echo "$PP" || echo "$TG") (load $(cut -d' ' -f1 /proc/loadavg))" >&2
          run_one "$tool" "$isa" "$ty" "$t" "$p" "$n" "$round"
        done
      done
    done
  done
 done
done
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$RES" "$SHAPE" "$PP" "$TG" "$DEPTH" <<'EOF'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
shape, pp, tg = sys.argv[2], sys.argv[3], sys.argv[4]
if sys.argv[5] != "0":
    pp, tg = pp + " @ d" + sys.argv[5], tg + " @ d" + sys.argv[5]
def agg(tool, isa, ty, t, test):
    v = [r["avg_ts"] for r in rows if r["tool"] == tool and r["isa"] == isa and r["type"] == ty and r["n_threads"] == t
         and ((r["n_prompt"] > 0) if test == "pp" else (r["n_gen"] > 0))]
    return (statistics.mean(v), statistics.pstdev(v) if len(v) > 1 else 0.0) if v else (float("nan"), 0.0)
print(f"| model | ISA | type | threads | llama.cpp pp{pp} t/s | llmrt pp{pp} t/s | pp ratio | llama.cpp tg{tg} t/s | llmrt tg{tg} t/s | tg ratio |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for isa in dict.fromkeys(r["isa"] for r in rows):
    for ty in dict.fromkeys(r["type"] for r in rows):
        for t in sorted(set(r["n_threads"] for r in rows if r["type"] == ty and r["isa"] == isa)):
            lp, mp = agg("llama.cpp", isa, ty, t, "pp"), agg("llmrt", isa, ty, t, "pp")
            lt, mt = agg("llama.cpp", isa, ty, t, "tg"), agg("llmrt", isa, ty, t, "tg")
            print(f"| {shape} | {isa} | {ty.upper()} | {t} | {lp[0]:.2f} ± {lp[1]:.2f} | {mp[0]:.2f} ± {mp[1]:.2f} | {mp[0]/lp[0]:.2f}x "
                  f"| {lt[0]:.2f} ± {lt[1]:.2f} | {mt[0]:.2f} ± {mt[1]:.2f} | {mt[0]/lt[0]:.2f}x |")
# tg against its bytes bound: each llmrt tg run probed the read bandwidth in the same
# process around its repetitions (bound = bytes read per token / that bandwidth).
bounded = [r for r in rows if r["tool"] == "llmrt" and r["n_gen"] > 0 and r.get("bound_ts")]
if bounded:
    print()
    print(f"| ISA | type | threads | llmrt tg{tg} t/s per round | bound t/s per round | % of bound per round | mean % |")
    print("| --- | --- | ---: | --- | --- | --- | ---: |")
    for isa in dict.fromkeys(r["isa"] for r in bounded):
        for ty in dict.fromkeys(r["type"] for r in bounded):
            for t in sorted(set(r["n_threads"] for r in bounded if r["type"] == ty and r["isa"] == isa)):
                rs = sorted((r for r in bounded if r["isa"] == isa and r["type"] == ty and r["n_threads"] == t),
                            key=lambda r: r["round"])
                pct = [100 * r["fraction"] for r in rs]  # mean over repetitions of speed / its own bound
                speeds = " / ".join("%.2f" % r["avg_ts"] for r in rs)
                bounds = " / ".join("%.2f" % r["bound_ts"] for r in rs)
                pcts = " / ".join("%.0f%%" % p for p in pct)
                print(f"| {isa} | {ty.upper()} | {t} | {speeds} | {bounds} | {pcts} | {statistics.mean(pct):.0f}% |")
EOF
