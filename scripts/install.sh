#!/bin/sh
# Installs llmrt under a prefix: what `make install` runs, and what the
# install_consumer_* ctests run into a temporary prefix.
#
#   scripts/install.sh PREFIX LIBDIR [DESTDIR]
#
# PREFIX: where it will live (written into llmrt.pc); LIBDIR: the cargo output
# holding libllmrt.so and libllmrt.a; DESTDIR: staging root (packaging), default
# none. Installs:
#   PREFIX/lib/libllmrt.so, PREFIX/lib/libllmrt.a
#   PREFIX/include/llmrt.h, PREFIX/include/llmrt.hpp
#   PREFIX/lib/pkgconfig/llmrt.pc
#   PREFIX/lib/cmake/llmrt/llmrtConfig.cmake, llmrtConfigVersion.cmake
set -eu
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 PREFIX LIBDIR [DESTDIR]" >&2
  exit 2
fi
prefix=$1
libdir=$2
destdir=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
case "$prefix" in
  /*) ;;
  *) echo "install.sh: PREFIX must be absolute, got '$prefix'" >&2; exit 2 ;;
esac
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[ -n "$version" ] || { echo "install.sh: no version in Cargo.toml" >&2; exit 1; }
for f in "$libdir/libllmrt.so" "$libdir/libllmrt.a"; do
  [ -f "$f" ] || { echo "install.sh: $f missing: run cargo build --release first" >&2; exit 1; }
done

dest=$destdir$prefix
install -d "$dest/lib/pkgconfig" "$dest/lib/cmake/llmrt" "$dest/include"
install -m 755 "$libdir/libllmrt.so" "$dest/lib/libllmrt.so"
install -m 644 "$libdir/libllmrt.a" "$dest/lib/libllmrt.a"
install -m 644 "$root/include/llmrt.h" "$root/include/llmrt.hpp" "$dest/include/"
subst() {
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" "$1" >"$2.tmp"
  chmod 644 "$2.tmp"
  mv "$2.tmp" "$2"
}
subst "$root/cmake/llmrt.pc.in" "$dest/lib/pkgconfig/llmrt.pc"
subst "$root/cmake/llmrtConfig.cmake.in" "$dest/lib/cmake/llmrt/llmrtConfig.cmake"
subst "$root/cmake/llmrtConfigVersion.cmake.in" "$dest/lib/cmake/llmrt/llmrtConfigVersion.cmake"
echo "installed llmrt $version into $dest"
