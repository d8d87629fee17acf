//go:build llmrt_pkgconfig

package llmrt

// An installed llmrt (make install): flags from `pkg-config llmrt`. Set
// PKG_CONFIG_PATH=PREFIX/lib/pkgconfig for a prefix pkg-config does not search,
// and an rpath or LD_LIBRARY_PATH for a libdir the loader does not search.

/*
#cgo pkg-config: llmrt
*/
import "C"
