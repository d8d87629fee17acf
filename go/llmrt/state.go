// Saved cache states: llmrt_cache_save and llmrt_cache_load.

package llmrt

/*
#include <stdlib.h>
#include "llmrt.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

func bytesPtr(b []byte) *C.uint8_t {
	if len(b) == 0 {
		return nil
	}
	return (*C.uint8_t)(unsafe.Pointer(&b[0]))
}

// Save returns the cache's saved state: its KV, its tokens (the history the
// sampler's penalties read) and its capacity, as bytes that Model.LoadCache turns
// back into a cache (on this model, or on another load of the same model file on
// the same kind of backend). The cache is not changed. Format: docs/API.md.
func (c *Cache) Save() ([]byte, error) {
	var state []byte
	err := c.with(func(p *C.llmrt_model) error {
		var e error
		state, e = grown(0, func(buf []byte, n *C.size_t) error {
			return call(func() C.enum_llmrt_status {
				return C.llmrt_cache_save(p, c.id, bytesPtr(buf), C.size_t(len(buf)), n)
			})
		})
		return e
	})
	if err != nil {
		return nil, err
	}
	return state, nil
}

// LoadCache makes a new cache from a state of Cache.Save, reserving the capacity
// the saved cache had: the next step on it gives the saved cache's logits, bit
// for bit. Another model's state, a truncated or corrupt one, or one of another
// format version is ErrInvalidArgument naming the byte offset and the field; then
// no cache is made.
func (m *Model) LoadCache(state []byte) (*Cache, error) {
	var id C.llmrt_cache
	err := m.with(func(p *C.llmrt_model) error {
		if len(state) == 0 {
			return call(func() C.enum_llmrt_status {
				var none C.uint8_t
				return C.llmrt_cache_load(p, &none, 0, 0, &id)
			})
		}
		err := call(func() C.enum_llmrt_status {
			return C.llmrt_cache_load(p, bytesPtr(state), C.size_t(len(state)), 0, &id)
		})
		runtime.KeepAlive(state)
		return err
	})
	if err != nil {
		return nil, err
	}
	return m.newCache(id), nil
}
