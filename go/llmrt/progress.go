package llmrt

// The load-progress trampoline: llmrt_model_options.progress points here (set
// in llmrt.go), user_data carries a cgo.Handle of the Go callback. Alone in its
// file because a file with //export may have no C definitions in its preamble.

// #include <stddef.h>
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

//export llmrtGoProgress
func llmrtGoProgress(fraction C.float, userData unsafe.Pointer) {
	if f, ok := cgo.Handle(uintptr(userData)).Value().(func(float32)); ok {
		f(float32(fraction))
	}
}
