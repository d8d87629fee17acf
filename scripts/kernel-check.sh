#!/usr/bin/env bash
# Kernel check: compile every kernels/*.cu to PTX for sm_90 with the pinned nvcc
# (installed by scripts/install-nvcc.sh when missing), assemble each with
# `ptxas -arch=sm_90 -v`, and fail on any compile/assemble error, any register spill
# (nonzero spill stores/loads) or any nonzero stack frame. Prints registers, shared
# memory, barriers, stack and spills per kernel.
#
#   usage: scripts/kernel-check.sh [--markdown]
#   --markdown   print the table as markdown (for docs/ARCHITECTURE.md) instead of text
#   env: NVCC    an nvcc to use instead of the pinned one
#
# Exit status: 0 clean; 1 a compile error, spill or stack frame.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MARKDOWN=0
for a in "$@"; do
  case "$a" in
    --markdown) MARKDOWN=1 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "kernel-check: unknown argument $a" >&2; exit 2 ;;
  esac
done
ARCH=sm_90

if [ -z "${NVCC:-}" ]; then
  NVCC="$(scripts/install-nvcc.sh 2>/dev/null | tail -1)" || {
    echo "kernel-check: installing nvcc failed (run scripts/install-nvcc.sh to see why)" >&2; exit 1; }
fi
PTXAS="$(dirname "$NVCC")/ptxas"
[ -x "$PTXAS" ] || PTXAS="$(command -v ptxas || true)"
[ -n "$PTXAS" ] || { echo "kernel-check: no ptxas next to $NVCC" >&2; exit 1; }

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
status=0
ROWS="$TMP/rows.tsv"
: > "$ROWS"
shopt -s nullglob
sources=(kernels/*.cu)
[ ${#sources[@]} -gt 0 ] || { echo "kernel-check: no kernels/*.cu" >&2; exit 1; }
for src in "${sources[@]}"; do
  stem="$(basename "$src" .cu)"
  if ! "$NVCC" --ptx -arch="$ARCH" -O3 "$src" -o "$TMP/$stem.ptx" 2> "$TMP/$stem.nvcc.log"; then
    echo "kernel-check: nvcc failed on $src:" >&2; cat "$TMP/$stem.nvcc.log" >&2; status=1; continue
  fi
  if ! "$PTXAS" -arch="$ARCH" -v "$TMP/$stem.ptx" -o /dev/null > "$TMP/$stem.ptxas.log" 2>&1; then
    echo "kernel-check: ptxas failed on $src:" >&2; cat "$TMP/$stem.ptxas.log" >&2; status=1; continue
  fi
  grep -i 'warning' "$TMP/$stem.ptxas.log" >&2 || true
  # ptxas -v: "Compiling entry function 'K' for 'sm_90'", then
  # "N bytes stack frame, S bytes spill stores, L bytes spill loads", then
  # "Used R registers, used B barriers, M bytes smem, ..." (fields absent when zero).
  awk -v file="$stem.cu" '
    /Compiling entry function/ { if (k != "") print_row(); match($0, /function .[^ ]+. for/); k = substr($0, RSTART + 10, RLENGTH - 15); st = sp_s = sp_l = regs = bar = smem = 0 }
    /bytes stack frame/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "bytes" && $(i+2) == "stack") st = $i; if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) ~ /^stores/) sp_s = $i; if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) ~ /^loads/) sp_l = $i } }
    /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^registers/) regs = $i; if ($(i+1) ~ /^barriers/) bar = $i; if ($(i+1) == "bytes" && $(i+2) ~ /^smem/) smem = $i } }
    function print_row() { printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", file, k, regs, smem, bar, st, sp_s, sp_l }
    END { if (k != "") print_row() }
  ' "$TMP/$stem.ptxas.log" >> "$ROWS"
done

if [ "$MARKDOWN" = 1 ]; then
  echo "| file | kernel | registers | shared mem (bytes) | barriers | stack (bytes) | spill st/ld (bytes) |"
  echo "|---|---|---:|---:|---:|---:|---:|"
  sort "$ROWS" | awk -F'\t' '{ printf "| %s | `%s` | %s | %s | %s | %s | %s/%s |\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
else
  printf '%-16s %-22s %5s %8s %4s %6s %12s\n' file kernel regs smem bar stack "spill st/ld"
  sort "$ROWS" | awk -F'\t' '{ printf "%-16s %-22s %5s %8s %4s %6s %12s\n", $1, $2, $3, $4, $5, $6, $7 "/" $8 }'
fi
n="$(wc -l < "$ROWS")"
while IFS=$'\t' read -r file k regs smem bar st sp_s sp_l; do
  if [ "$sp_s" != 0 ] || [ "$sp_l" != 0 ]; then echo "kernel-check: $file $k spills ($sp_s bytes stored, $sp_l loaded)" >&2; status=1; fi
  if [ "$st" != 0 ]; then echo "kernel-check: $file $k has a $st-byte stack frame" >&2; status=1; fi
done < "$ROWS"
[ "$n" -gt 0 ] || { echo "kernel-check: ptxas reported no kernels" >&2; status=1; }
if [ "$status" = 0 ]; then
  echo "kernel-check: $n kernels in ${#sources[@]} files for $ARCH: no spills, no stack frames" >&2
fi
exit "$status"
