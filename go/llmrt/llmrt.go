// Package llmrt is the Go binding of llmrt, an LLM inference runtime with a C
// API (include/llmrt.h; the contract is docs/API.md).
//
//	m, err := llmrt.Load("model.gguf", nil)
//	if err != nil { ... }
//	defer m.Close()
//	c, _ := m.Reserve(64)
//	logits, _ := c.Prefill([]uint32{1, 450, 4996})
//	next, _ := m.DecodeGreedy([]*llmrt.Cache{c}, []uint32{llmrt.Argmax(logits)})
//
// Import path: github.com/llmrt/llmrt/go/llmrt (the module lives in go/ of the
// llmrt repository). Building needs cgo and the C library: by default the
// header and library of the enclosing source tree (`make build`), or an
// installed llmrt with `-tags llmrt_pkgconfig` (see cgo.go).
//
// Ownership: a Model owns the C model; Close frees it and every cache it holds.
// A Cache is one KV cache of one Model; Release frees it. Finalizers call Close
// and Release for objects that become unreachable, but only as a safety net:
// call them yourself, since the GC does not see the memory the C side holds.
//
// Concurrency: every method may be called from any goroutine. Calls on one
// Model are serialised inside the C library; different Models run in parallel.
// Close waits for calls in flight, after which every call returns an error
// matching ErrClosed (and ErrInvalidArgument).
//
// Text (Tokenize, Detokenize, TokenPiece for streaming) and sampling
// (DefaultSamplerParams, Sample) are in text.go.
package llmrt

/*
#include <stdint.h>
#include <stdlib.h>
#include "llmrt.h"

extern void llmrtGoProgress(float fraction, void *user_data);

static void llmrt_go_set_progress(llmrt_model_options *o, uintptr_t handle) {
	o->progress = llmrtGoProgress;
	o->progress_user_data = (void *)handle;
}
*/
import "C"

import (
	"errors"
	"runtime"
	"runtime/cgo"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Version is the C library's "MAJOR.MINOR.PATCH".
func Version() string { return C.GoString(C.llmrt_version()) }

// cStatusName is llmrt_status_name (Status.String must agree with it).
func cStatusName(s Status) string { return C.GoString(C.llmrt_status_name(C.llmrt_status(s))) }

// Backend selects where a model runs.
type Backend int32

const (
	BackendAuto Backend = 0 // CUDA when a usable device exists, else CPU
	BackendCPU  Backend = 1
	BackendCUDA Backend = 2 // fails (ErrUnsupported / ErrDevice) when there is none
)

func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendCPU:
		return "cpu"
	case BackendCUDA:
		return "cuda"
	}
	return "unknown"
}

// Options for Load. The zero value means the library's defaults.
type Options struct {
	Backend      Backend
	Device       int32                  // CUDA device ordinal
	Threads      uint32                 // CPU worker threads; 0 = all cores
	MaxContext   uint32                 // cap on positions per cache; 0 = the model's context
	KVCacheBytes uint64                 // KV pool budget; 0 = backend default
	Progress     func(fraction float32) // called during Load with 0..1; may be nil
	// KVWindowOnly: on a model whose every layer has a sliding window, each cache keeps
	// (and books) only the window's positions; truncating below the window then fails
	// (llmrt_model_options.kv_window_only). Info.KVWindow says whether it took effect.
	KVWindowOnly bool
}

// Info describes a loaded model (llmrt_model_info).
type Info struct {
	VocabSize          uint32
	ContextLength      uint32 // positions per cache, after MaxContext and device limits
	NLayers            uint32
	NHeads             uint32
	NKVHeads           uint32
	HeadDim            uint32
	HiddenSize         uint32
	BOSToken           uint32 // NoToken when the model has none
	EOSToken           uint32 // NoToken when the model has none
	Backend            Backend
	WeightBytes        uint64
	KVBytesPerPosition uint64
	Architecture       string // "llama", "qwen2", ...
	DeviceName         string // "cpu (N threads)" or the GPU's name
	KVPoolBytes        uint64 // the KV pool shared by all caches
	ScratchBytes       uint64 // device scratch set aside at load (0 on the CPU)
	DeviceFreeBytes    uint64 // device memory free after the load (0 on the CPU)
	DeviceTotalBytes   uint64 // the device's memory (0 on the CPU)
	KVWindow           uint32 // positions a cache keeps under Options.KVWindowOnly; 0 = all
}

// NoToken is Info.BOSToken / EOSToken for a model without that token.
const NoToken = ^uint32(0)

// Model is a loaded model.
type Model struct {
	mu        sync.RWMutex // read: any call; write: Close
	ptr       *C.llmrt_model
	info      Info
	abortOnce sync.Once // the abort callback for contexts, set on the first call with one
}

// call runs f on one OS thread (llmrt_last_error is per thread) and turns a
// failure into an *Error carrying the message.
func call(f func() C.enum_llmrt_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	if st == C.LLMRT_OK {
		return nil
	}
	return &Error{Status: Status(st), Msg: C.GoString(C.llmrt_last_error())}
}

// Load loads a GGUF model; opts nil means the defaults.
func Load(path string, opts *Options) (*Model, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var copts *C.llmrt_model_options
	if opts != nil {
		copts = (*C.llmrt_model_options)(C.malloc(C.size_t(unsafe.Sizeof(C.llmrt_model_options{}))))
		defer C.free(unsafe.Pointer(copts))
		C.llmrt_model_options_init(copts, C.size_t(unsafe.Sizeof(*copts))) // never overrun by a newer library
		copts.backend = C.llmrt_backend(opts.Backend)
		copts.device = C.int32_t(opts.Device)
		copts.threads = C.uint32_t(opts.Threads)
		copts.max_context = C.uint32_t(opts.MaxContext)
		copts.kv_cache_bytes = C.uint64_t(opts.KVCacheBytes)
		if opts.KVWindowOnly {
			copts.kv_window_only = 1
		}
		if opts.Progress != nil {
			h := cgo.NewHandle(opts.Progress)
			defer h.Delete()
			C.llmrt_go_set_progress(copts, C.uintptr_t(h))
		}
	}
	var ptr *C.llmrt_model
	if err := call(func() C.enum_llmrt_status { return C.llmrt_model_load(cpath, copts, &ptr) }); err != nil {
		return nil, err
	}
	m := &Model{ptr: ptr}
	var ci C.llmrt_model_info
	ci.struct_size = C.uint32_t(C.sizeof_llmrt_model_info)
	if err := call(func() C.enum_llmrt_status { return C.llmrt_model_get_info(ptr, &ci) }); err != nil {
		C.llmrt_model_free(ptr)
		return nil, err
	}
	m.info = Info{
		VocabSize:          uint32(ci.vocab_size),
		ContextLength:      uint32(ci.context_length),
		NLayers:            uint32(ci.n_layers),
		NHeads:             uint32(ci.n_heads),
		NKVHeads:           uint32(ci.n_kv_heads),
		HeadDim:            uint32(ci.head_dim),
		HiddenSize:         uint32(ci.hidden_size),
		BOSToken:           uint32(ci.bos_token),
		EOSToken:           uint32(ci.eos_token),
		Backend:            Backend(ci.backend),
		WeightBytes:        uint64(ci.weight_bytes),
		KVBytesPerPosition: uint64(ci.kv_bytes_per_position),
		Architecture:       C.GoString(&ci.architecture[0]),
		DeviceName:         C.GoString(&ci.device_name[0]),
		KVPoolBytes:        uint64(ci.kv_pool_bytes),
		ScratchBytes:       uint64(ci.scratch_bytes),
		DeviceFreeBytes:    uint64(ci.device_free_bytes),
		DeviceTotalBytes:   uint64(ci.device_total_bytes),
		KVWindow:           uint32(ci.kv_window),
	}
	runtime.SetFinalizer(m, func(m *Model) { _ = m.Close() })
	return m, nil
}

// Close frees the model and every cache it holds. It waits for calls in flight;
// later calls fail with ErrClosed. Closing twice is a no-op.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ptr != nil {
		C.llmrt_model_free(m.ptr)
		m.ptr = nil
		runtime.SetFinalizer(m, nil)
	}
	return nil
}

// Info describes the model (read once at Load).
func (m *Model) Info() Info { return m.info }

// with runs f with the live C model under the read lock.
func (m *Model) with(f func(p *C.llmrt_model) error) error {
	if m == nil {
		return errArg("nil *Model")
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.ptr == nil {
		return errClosed()
	}
	return f(m.ptr)
}

// Cache is one KV cache (one request) of a Model.
type Cache struct {
	m        *Model
	id       C.llmrt_cache
	released int32 // atomic: Release was called
}

func (m *Model) newCache(id C.llmrt_cache) *Cache {
	c := &Cache{m: m, id: id}
	runtime.SetFinalizer(c, func(c *Cache) { _ = c.Release() })
	return c
}

// ID is the C cache id (llmrt_cache).
func (c *Cache) ID() uint64 { return uint64(c.id) }

// Model is the model the cache belongs to.
func (c *Cache) Model() *Model { return c.m }

// Reserve reserves a cache able to hold positions tokens (0 = the full context).
func (m *Model) Reserve(positions uint32) (*Cache, error) {
	var id C.llmrt_cache
	err := m.with(func(p *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status { return C.llmrt_cache_reserve(p, C.uint32_t(positions), &id) })
	})
	if err != nil {
		return nil, err
	}
	return m.newCache(id), nil
}

func (c *Cache) with(f func(p *C.llmrt_model) error) error {
	if c == nil {
		return errArg("nil *Cache")
	}
	err := c.m.with(f)
	runtime.KeepAlive(c) // the finalizer must not release the id during the call
	return err
}

// Release frees the cache. A second Release returns ErrUnknownCache, as in C.
func (c *Cache) Release() error {
	if c == nil {
		return errArg("nil *Cache")
	}
	if atomic.SwapInt32(&c.released, 1) == 0 {
		runtime.SetFinalizer(c, nil)
	}
	return c.with(func(p *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status { return C.llmrt_cache_release(p, c.id) })
	})
}

// Len is the number of positions the cache holds.
func (c *Cache) Len() (uint32, error) {
	var n C.uint32_t
	err := c.with(func(p *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status { return C.llmrt_cache_length(p, c.id, &n) })
	})
	return uint32(n), err
}

// Truncate keeps the first positions tokens and drops the rest.
func (c *Cache) Truncate(positions uint32) error {
	return c.with(func(p *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status { return C.llmrt_cache_truncate(p, c.id, C.uint32_t(positions)) })
	})
}

// Fork makes a new cache holding the same tokens, sharing KV blocks copy-on-write.
func (c *Cache) Fork() (*Cache, error) {
	var id C.llmrt_cache
	err := c.with(func(p *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status { return C.llmrt_cache_fork(p, c.id, &id) })
	})
	if err != nil {
		return nil, err
	}
	return c.m.newCache(id), nil
}

// grown runs fill over a buffer of size elements; when the library answers
// ErrBufferTooSmall with the length it needs (*n), fill runs once more over a
// buffer of that length. It returns the first *n elements.
func grown[T any](size int, fill func(buf []T, n *C.size_t) error) ([]T, error) {
	buf := make([]T, size)
	var n C.size_t
	err := fill(buf, &n)
	if errors.Is(err, ErrBufferTooSmall) && int(n) > len(buf) {
		buf = make([]T, int(n))
		err = fill(buf, &n)
	}
	if err != nil {
		return nil, err
	}
	return buf[:n:n], nil
}

func tokensPtr(tokens []uint32) *C.uint32_t {
	if len(tokens) == 0 {
		return nil
	}
	return (*C.uint32_t)(unsafe.Pointer(&tokens[0]))
}

func floatsPtr(f []float32) *C.float {
	if len(f) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&f[0]))
}

// Prefill appends tokens to the cache as one prefill and returns the last
// token's logits (VocabSize floats).
func (c *Cache) Prefill(tokens []uint32) ([]float32, error) {
	logits := make([]float32, c.m.info.VocabSize)
	err := c.with(func(p *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status {
			return C.llmrt_prefill(p, c.id, tokensPtr(tokens), C.size_t(len(tokens)), floatsPtr(logits))
		})
	})
	if err != nil {
		return nil, err
	}
	return logits, nil
}

// PrefillAll is Prefill returning every token's logits: row i for tokens[i].
func (c *Cache) PrefillAll(tokens []uint32) ([][]float32, error) {
	v := int(c.m.info.VocabSize)
	flat := make([]float32, len(tokens)*v)
	err := c.with(func(p *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status {
			return C.llmrt_prefill_all(p, c.id, tokensPtr(tokens), C.size_t(len(tokens)), floatsPtr(flat))
		})
	})
	if err != nil {
		return nil, err
	}
	return rows(flat, len(tokens), v), nil
}

func rows(flat []float32, n, v int) [][]float32 {
	out := make([][]float32, n)
	for i := range out {
		out[i] = flat[i*v : (i+1)*v : (i+1)*v]
	}
	return out
}

// batch checks a decode batch and collects the cache ids.
func (m *Model) batch(caches []*Cache, tokens []uint32) ([]C.llmrt_cache, error) {
	if len(caches) != len(tokens) {
		return nil, errArg("%d caches but %d tokens", len(caches), len(tokens))
	}
	ids := make([]C.llmrt_cache, len(caches))
	for i, c := range caches {
		if c == nil {
			return nil, errArg("caches[%d] is nil", i)
		}
		ids[i] = c.id
	}
	return ids, nil
}

func idsPtr(ids []C.llmrt_cache) *C.llmrt_cache {
	if len(ids) == 0 {
		return nil
	}
	return &ids[0]
}

// Decode runs one step for several caches at once: appends tokens[i] to
// caches[i] and returns row i of logits for caches[i]. Either every cache
// advances or none does.
func (m *Model) Decode(caches []*Cache, tokens []uint32) ([][]float32, error) {
	ids, err := m.batch(caches, tokens)
	if err != nil {
		return nil, err
	}
	v := int(m.info.VocabSize)
	flat := make([]float32, len(ids)*v)
	err = m.with(func(p *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status {
			return C.llmrt_decode(p, C.size_t(len(ids)), idsPtr(ids), tokensPtr(tokens), floatsPtr(flat))
		})
	})
	runtime.KeepAlive(caches)
	if err != nil {
		return nil, err
	}
	return rows(flat, len(ids), v), nil
}

// DecodeGreedy is Decode returning each cache's argmax token instead of logits.
func (m *Model) DecodeGreedy(caches []*Cache, tokens []uint32) ([]uint32, error) {
	ids, err := m.batch(caches, tokens)
	if err != nil {
		return nil, err
	}
	next := make([]uint32, len(ids))
	err = m.with(func(p *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status {
			return C.llmrt_decode_greedy(p, C.size_t(len(ids)), idsPtr(ids), tokensPtr(tokens), tokensPtr(next))
		})
	})
	runtime.KeepAlive(caches)
	if err != nil {
		return nil, err
	}
	return next, nil
}

// Argmax is the index of the largest value (the first on ties); 0 when empty.
func Argmax(values []float32) uint32 {
	best := 0
	for i, v := range values {
		if v > values[best] {
			best = i
		}
	}
	return uint32(best)
}
