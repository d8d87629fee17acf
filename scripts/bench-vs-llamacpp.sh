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
# Environment (all optional):
#   SHAPE=tinyllama   synthetic model shape (tinyllama | llama3-8b)
#   TYPES="f16 q8_0 q4_0"  THREADS="1 2"  PP=128  TG=64  REPS=3  ROUNDS=2
#   MODELS_DIR=DIR    where synthetic models are written/reused (default: a temp dir)
#   LLAMA_BENCH=PATH  reuse a llama-bench binary; LLAMACPP_SRC=DIR reuse an unpacked vendor/llama.cpp
#   KEEP=1            keep the temporary folder
#   --logits          also build tools/llamacpp_logits.cpp against that llama.cpp (prints its path)
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
SHAPE="${SHAPE:-tinyllama}"
TYPES="${TYPES:-f16 q8_0 q4_0}"
THREADS="${THREADS:-1 2}"
PP="${PP:-128}"
TG="${TG:-64}"
REPS="${REPS:-3}"
ROUNDS="${ROUNDS:-2}"
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

if [ -z "${LLAMA_BENCH:-}" ] || [ "$WANT_LOGITS" = 1 ]; then
  if [ -z "${LLAMACPP_SRC:-}" ]; then
    echo "== fetching llama-cpp-python 0.3.36 (source package)" >&2
    (cd "$TMP" && python3 -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==0.3.36 >&2)
    tar -xzf "$TMP"/llama_cpp_python-0.3.36.tar.gz -C "$TMP"
    LLAMACPP_SRC="$TMP/llama_cpp_python-0.3.36/vendor/llama.cpp"
  fi
  BUILD="$TMP/llama-build"
  echo "== building llama.cpp from $LLAMACPP_SRC in $BUILD (several minutes)" >&2
  cmake -S "$LLAMACPP_SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF >&2
  cmake --build "$BUILD" -j"$(nproc)" --target llama-bench >&2
  LLAMA_BENCH="${LLAMA_BENCH:-$BUILD/bin/llama-bench}"
  if [ "$WANT_LOGITS" = 1 ]; then
    OUT="${LOGITS_TOOL_OUT:-$TMP/llamacpp_logits}"
    g++ -O2 -std=c++17 -I"$LLAMACPP_SRC/include" -I"$LLAMACPP_SRC/ggml/include" "$HERE/tools/llamacpp_logits.cpp" \
      "$BUILD/src/libllama.a" "$BUILD/ggml/src/libggml.a" "$BUILD/ggml/src/libggml-cpu.a" "$BUILD/ggml/src/libggml-base.a" \
      -fopenmp -lpthread -o "$OUT"
    echo "llamacpp_logits: $OUT"
  fi
fi

echo "== synthetic models ($SHAPE: $TYPES) in $MODELS_DIR" >&2
declare -A FILE
for ty in $TYPES; do
  f="$MODELS_DIR/$( [ "$SHAPE" = tinyllama ] && echo tinyllama-1.1b || echo "$SHAPE")-$ty.gguf"
  [ -f "$f" ] || "$LLMRT_BENCH" --synth "$SHAPE" --type "$ty" --out "$MODELS_DIR" >&2
  FILE[$ty]="$f"
done

RES="$TMP/results.jsonl"
: > "$RES"
run_one() { # tool ty threads p n round
  local tool="$1" ty="$2" t="$3" p="$4" n="$5" round="$6" out
  if [ "$tool" = llama.cpp ]; then
    out="$("$LLAMA_BENCH" -m "${FILE[$ty]}" -t "$t" -p "$p" -n "$n" -r "$REPS" -o json 2>/dev/null)"
  else
    # tg rows: the read bandwidth is probed in the same process right before and
    # after the repetitions, with the same thread count (the row's bytes bound).
    out="$("$LLMRT_BENCH" -m "${FILE[$ty]}" -t "$t" -p "$p" -n "$n" -r "$REPS" -o json $([ "$n" -gt 0 ] && echo --membw))"
  fi
  python3 -c 'import json,sys; [print(json.dumps({"tool":sys.argv[1],"type":sys.argv[2],"round":int(sys.argv[3]),"n_threads":r["n_threads"],"n_prompt":r["n_prompt"],"n_gen":r["n_gen"],"avg_ts":r["avg_ts"],"stddev_ts":r["stddev_ts"],"bound_ts":r.get("bound_ts"),"fraction":r.get("fraction_of_bound")})) for r in json.loads(sys.stdin.read())]' "$tool" "$ty" "$round" <<<"$out" >> "$RES"
}

echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for round in $(seq 1 "$ROUNDS"); do
  for ty in $TYPES; do
    for t in $THREADS; do
      for test in "pp" "tg"; do
        if [ "$test" = pp ]; then p="$PP"; n=0; else p=0; n="$TG"; fi
        if [ $((round % 2)) = 1 ]; then order="llama.cpp llmrt"; else order="llmrt llama.cpp"; fi
        for tool in $order; do
          echo "   round $round: $tool $ty -t $t ${test}$([ "$test" = pp ] && echo "$PP" || echo "$TG") (load $(cut -d' ' -f1 /proc/loadavg))" >&2
          run_one "$tool" "$ty" "$t" "$p" "$n" "$round"
        done
      done
    done
  done
done
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$RES" "$SHAPE" "$PP" "$TG" <<'EOF'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
shape, pp, tg = sys.argv[2], sys.argv[3], sys.argv[4]
def agg(tool, ty, t, test):
    v = [r["avg_ts"] for r in rows if r["tool"] == tool and r["type"] == ty and r["n_threads"] == t
         and ((r["n_prompt"] > 0) if test == "pp" else (r["n_gen"] > 0))]
    return (statistics.mean(v), statistics.pstdev(v) if len(v) > 1 else 0.0) if v else (float("nan"), 0.0)
print(f"| model | type | threads | llama.cpp pp{pp} t/s | llmrt pp{pp} t/s | pp ratio | llama.cpp tg{tg} t/s | llmrt tg{tg} t/s | tg ratio |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for ty in dict.fromkeys(r["type"] for r in rows):
    for t in sorted(set(r["n_threads"] for r in rows if r["type"] == ty)):
        lp, mp = agg("llama.cpp", ty, t, "pp"), agg("llmrt", ty, t, "pp")
        lt, mt = agg("llama.cpp", ty, t, "tg"), agg("llmrt", ty, t, "tg")
        print(f"| {shape} | {ty.upper()} | {t} | {lp[0]:.2f} ± {lp[1]:.2f} | {mp[0]:.2f} ± {mp[1]:.2f} | {mp[0]/lp[0]:.2f}x "
              f"| {lt[0]:.2f} ± {lt[1]:.2f} | {mt[0]:.2f} ± {mt[1]:.2f} | {mt[0]/lt[0]:.2f}x |")
# tg against its bytes bound: each llmrt tg run probed the read bandwidth in the same
# process around its repetitions (bound = bytes read per token / that bandwidth).
bounded = [r for r in rows if r["tool"] == "llmrt" and r["n_gen"] > 0 and r.get("bound_ts")]
if bounded:
    print()
    print(f"| type | threads | llmrt tg{tg} t/s per round | bound t/s per round | % of bound per round | mean % |")
    print("| --- | ---: | --- | --- | --- | ---: |")
    for ty in dict.fromkeys(r["type"] for r in bounded):
        for t in sorted(set(r["n_threads"] for r in bounded if r["type"] == ty)):
            rs = sorted((r for r in bounded if r["type"] == ty and r["n_threads"] == t), key=lambda r: r["round"])
            pct = [100 * r["fraction"] for r in rs]  # mean over repetitions of speed / its own bound
            speeds = " / ".join("%.2f" % r["avg_ts"] for r in rs)
            bounds = " / ".join("%.2f" % r["bound_ts"] for r in rs)
            pcts = " / ".join("%.0f%%" % p for p in pct)
            print(f"| {ty.upper()} | {t} | {speeds} | {bounds} | {pcts} | {statistics.mean(pct):.0f}% |")
EOF
