//go:build !llmrt_pkgconfig

package llmrt

// Default: the header and library of this source tree (make build), found
// relative to this directory; the rpath lets binaries run from anywhere.
// Environment CGO_CFLAGS / CGO_LDFLAGS come before these lines, so
// CGO_LDFLAGS="-L/opt/llmrt/lib -Wl,-rpath,/opt/llmrt/lib" picks another build.
// With `-tags llmrt_pkgconfig` the flags come from `pkg-config llmrt` instead
// (an installed llmrt: make install).

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -L${SRCDIR}/../../target/release -Wl,-rpath,${SRCDIR}/../../target/release -lllmrt
*/
import "C"
