#!/usr/bin/env bash
# Build the test executables a GPU machine without Rust runs (scripts/gpu-check.sh)
# and put them into gpu-bin/ at the repository root, with a MANIFEST.
#
#   usage: scripts/gpu-prepare.sh [TEST_TARGET ...]
#   TEST_TARGET: names of test targets to ship (tests/<name>.rs, or "llmrt" for the
#                library's unit tests); default: cuda_smoke cuda_parity, and
#                cuda_kernels / cuda_quant_formats when their tests/<name>.rs exists
#                (the CUDA binaries of `make test-cuda-emulated`).
#   The benchmark binary llmrt-bench (src/bin/llmrt-bench/) is always shipped too.
#   Only these targets are built (not every test of the crate).
#
# scripts/gpu-check.sh runs every executable of gpu-bin/ (with LLMRT_CUDA_GEMV_QUANT=1:
# every fast path on), cuda_parity again with LLMRT_CUDA_FAST=0, then llmrt-bench.
# Stripped, each executable is about 2 MB: gpu-bin/ travels with `carry: ["gpu-bin"]`.
#
# Installs the pinned nvcc first (scripts/install-nvcc.sh, idempotent) unless NVCC is
# set, so the executables embed PTX for sm_80/sm_90; refuses to ship without it.
# gpu-bin/ is gitignored: hand it to the GPU machine explicitly.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(cuda_smoke cuda_parity)
  for t in cuda_kernels cuda_quant_formats; do
    [ -f "tests/$t.rs" ] && TARGETS+=("$t")
  done
fi
CARGO_SEL=()
for t in "${TARGETS[@]}"; do
  if [ "$t" = llmrt ]; then CARGO_SEL+=(--lib); else CARGO_SEL+=(--test "$t"); fi
done

if [ -z "${NVCC:-}" ]; then
  scripts/install-nvcc.sh >/dev/null
fi

echo "gpu-prepare: cargo test --release --no-run (targets: ${TARGETS[*]})" >&2
JSON="$(mktemp)"
trap 'rm -f "$JSON"' EXIT
cargo test --release --no-run --message-format=json "${CARGO_SEL[@]}" > "$JSON"
cargo build --release --bin llmrt-bench --message-format=json >> "$JSON"

OUTDIR="$ROOT/gpu-bin"
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR"

# Executables of the test targets asked for: name<TAB>path, one per line.
python3 - "$JSON" "${TARGETS[@]}" > "$OUTDIR/.list" <<'PY'
import json, sys
path, wanted = sys.argv[1], set(sys.argv[2:])
found = {}
for line in open(path):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    name = m["target"]["name"]
    if name == "llmrt-bench" and "bin" in m["target"].get("kind", []):
        found[name] = m["executable"]
        continue
    if not m.get("profile", {}).get("test"):
        continue
    if name in wanted:
        found[name] = m["executable"]
wanted.add("llmrt-bench")
missing = wanted - set(found)
if missing:
    sys.exit("gpu-prepare: no test executable for: " + ", ".join(sorted(missing)))
for name in sorted(found):
    print(f"{name}\t{found[name]}")
PY

{
  echo "llmrt gpu-bin, made by scripts/gpu-prepare.sh"
  echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit:  $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "rustc:   $(rustc --version)"
  echo "nvcc:    $("${NVCC:-$ROOT/.cuda/nvidia/cu13/bin/nvcc}" --version 2>/dev/null | tail -1 || echo none)"
  echo "host:    $(ldd --version 2>/dev/null | head -1)"
} > "$OUTDIR/MANIFEST"

while IFS=$'\t' read -r name exe; do
  dst="$OUTDIR/$name"
  # Debug info is not needed to run the tests; stripping it keeps gpu-bin small.
  objcopy --strip-debug "$exe" "$dst" 2>/dev/null || cp "$exe" "$dst"
  chmod +x "$dst"
  # An executable that carries the kernel sources must carry their PTX too (else the
  # GPU machine would depend on NVRTC). Executables that use no kernel carry neither.
  if grep -aq '__global__ void rmsnorm_f32' "$dst" &&
     { ! grep -aq '.target sm_90' "$dst" || ! grep -aq '.target sm_80' "$dst"; }; then
    echo "gpu-prepare: $name has no embedded sm_80/sm_90 PTX (was nvcc found? see scripts/install-nvcc.sh)" >&2
    exit 1
  fi
  glibc="$(objdump -T "$dst" | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -1)"
  printf '%-14s %s  %s  needs %s  (from %s)\n' "$name" "$(sha256sum "$dst" | cut -c1-16)" \
    "$(du -h "$dst" | cut -f1)" "$glibc" "${exe#"$ROOT"/}" >> "$OUTDIR/MANIFEST"
done < "$OUTDIR/.list"
rm -f "$OUTDIR/.list"

cat "$OUTDIR/MANIFEST" >&2
echo "gpu-prepare: $(du -sh "$OUTDIR" | cut -f1) in $OUTDIR; on the GPU machine run: scripts/gpu-check.sh" >&2
