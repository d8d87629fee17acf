# Included by the Makefile: `make fuzz-short` (run by `make test`) runs every
# cargo-fuzz target for a few seconds (scripts/fuzz.sh --short; FUZZ_SECONDS
# changes the time per target). It installs a nightly toolchain and cargo-fuzz when
# missing, and prints "fuzz: SKIPPED (...)" without failing when it cannot.
# `make fuzz-long` is the long run of docs/RELIABILITY.md ("Fuzzing").
.PHONY: fuzz-short fuzz-long
fuzz-short:
	scripts/fuzz.sh --short

fuzz-long:
	scripts/fuzz.sh --long 10000000
