#!/usr/bin/env bash
# Install the CUDA 13.0 kernel compiler (nvcc, cicc, ptxas, cuda_fp16.h, CCCL) from
# NVIDIA's PyPI wheels into PREFIX, so kernels build on machines with no GPU and no
# CUDA install. Idempotent. Progress goes to stderr; the last line on stdout is the
# absolute nvcc path (build.rs finds it at .cuda/nvidia/cu13/bin/nvcc by itself).
#
#   usage: scripts/install-nvcc.sh [PREFIX] [--with-nvrtc]
#   PREFIX defaults to $CUDA_PIP_PREFIX, else .cuda/ at the repository root (gitignored)
#   --with-nvrtc also installs libnvrtc.so.13 into PREFIX/nvidia/cu13/lib
#                (+90 MB download); run-time NVRTC then needs that dir on LD_LIBRARY_PATH
#
# Why these pins (see the git history of this file before changing them):
#  * CUDA 12 wheels (nvidia-cuda-nvcc-cu12) carry only ptxas + libnvvm, no nvcc/cicc;
#    the CUDA 13 wheels (no -cuXX suffix) carry the whole compiler.
#  * Target GPU machines run driver 580 = CUDA 13.0, which JITs PTX ISA <= 9.0 only;
#    PTX from nvcc 13.1+ fails there with CUDA_ERROR_UNSUPPORTED_PTX_VERSION. So 13.0.
#  * nvidia-cuda-nvcc depends on its siblings without version pins: every piece is
#    pinned here and installed with --no-deps.
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore

CUDA_PIP_VERSION=13.0   # bump all pins together
PKGS=(
  "nvidia-cuda-nvcc==13.0.88"     # nvcc, ptxas, fatbinary, nvlink, cudafe++, bin2c
  "nvidia-nvvm==13.0.88"          # cicc + libdevice (required by nvcc)
  "nvidia-cuda-crt==13.0.88"      # include/crt/* (host_defines.h ...) (required)
  "nvidia-cuda-runtime==13.0.96"  # cuda_runtime.h, cuda_fp16.h, cuda_bf16.h, libcudart
  "nvidia-cuda-cccl==13.0.85"     # cub/thrust/libcu++ (include/cccl, on nvcc's default -isystem)
)
NVRTC_PKG="nvidia-cuda-nvrtc==13.0.88"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${CUDA_PIP_PREFIX:-$REPO_ROOT/.cuda}"
WITH_NVRTC=0
for a in "$@"; do
  case "$a" in
    --with-nvrtc) WITH_NVRTC=1 ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    -*) echo "install-nvcc: unknown option $a" >&2; exit 2 ;;
    *) PREFIX="$a" ;;
  esac
done
[ "$WITH_NVRTC" = 1 ] && PKGS+=("$NVRTC_PKG")

mkdir -p "$PREFIX"
PREFIX="$(cd "$PREFIX" && pwd)"
NVCC="$PREFIX/nvidia/cu13/bin/nvcc"
STAMP="$PREFIX/.install-nvcc.stamp"
WANT="$(printf '%s\n' "${PKGS[@]}")"

# Already installed: every wanted pin is in the stamp (a superset is fine: a later run
# without --with-nvrtc keeps NVRTC).
installed() {
  [ -f "$STAMP" ] && "$NVCC" --version >/dev/null 2>&1 || return 1
  local p
  for p in "${PKGS[@]}"; do grep -qxF "$p" "$STAMP" || return 1; done
}
if installed; then
  echo "install-nvcc: CUDA $CUDA_PIP_VERSION toolchain already in $PREFIX" >&2
else
  PY="${PYTHON:-$(command -v python3 || command -v python || true)}"
  if [ -z "$PY" ] || ! "$PY" -m pip --version >/dev/null 2>&1; then
    echo "install-nvcc: need python3 with pip (Debian/Ubuntu: apt-get install -y python3-pip)" >&2
    exit 1
  fi
  echo "install-nvcc: installing ${PKGS[*]} into $PREFIX" >&2
  t0=$(date +%s)
  # Fresh tree, so a changed pin set never mixes versions (pip --target keeps old files).
  rm -rf "$PREFIX/nvidia" "$PREFIX"/nvidia_*.dist-info "$STAMP"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
      --no-deps --no-cache-dir --target "$PREFIX" "${PKGS[@]}" >&2
  "$NVCC" --version >/dev/null || { echo "install-nvcc: $NVCC does not run" >&2; exit 1; }
  printf '%s\n' "$WANT" > "$STAMP"
  echo "install-nvcc: done in $(( $(date +%s) - t0 ))s, $(du -sh "$PREFIX" | cut -f1) on disk" >&2
fi
# nvcc preprocesses with the host compiler: g++ must be on PATH.
command -v g++ >/dev/null 2>&1 || echo "install-nvcc: warning: no g++ on PATH; nvcc needs it (apt-get install -y g++)" >&2
"$NVCC" --version | tail -2 >&2
echo "$NVCC"
