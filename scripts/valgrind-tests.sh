#!/bin/sh
# Runs Rust integration test binaries under valgrind memcheck (`make valgrind-rust`).
#   scripts/valgrind-tests.sh TEST...      e.g. cache_semantics formats
# Each binary comes from `cargo test --release --no-run` (CARGO_TARGET_DIR is
# honoured) and runs with --test-threads=1; any invalid access, use of
# uninitialised memory or definite leak fails it (exit 99). Tests that run child
# processes run those natively (no --trace-children): the parent is what is checked.
set -eu
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
VALGRIND=${VALGRIND_BIN:-valgrind}
command -v "$VALGRIND" >/dev/null || { echo "valgrind not found" >&2; exit 1; }
json=$($CARGO test --release --no-run --message-format=json $(for t in "$@"; do printf -- '--test %s ' "$t"; done))
status=0
for t in "$@"; do
  exe=$(printf '%s\n' "$json" | python3 -c '
import json, sys
name = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == name and m.get("executable"):
        print(m["executable"])
' "$t")
  [ -n "$exe" ] || { echo "no test binary for $t" >&2; exit 1; }
  start=$(date +%s)
  if "$VALGRIND" --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
       --show-leak-kinds=definite --track-origins=yes --num-callers=30 -q \
       --suppressions=ctests/valgrind.supp "$exe" --test-threads=1 -q; then
    echo "valgrind $t: clean ($(( $(date +%s) - start ))s)"
  else
    echo "valgrind $t: FAILED ($(( $(date +%s) - start ))s)" >&2
    status=1
  fi
done
exit $status
