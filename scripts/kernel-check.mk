# Included by the Makefile: `make kernel-check` (run by `make test`) compiles every
# kernels/*.cu for sm_90 and fails on errors, register spills or stack frames
# (scripts/kernel-check.sh; `scripts/kernel-check.sh --markdown` prints the table).
.PHONY: kernel-check
kernel-check:
	scripts/kernel-check.sh
