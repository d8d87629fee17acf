// Grammar-constrained decoding: llmrt_grammar_* (llguidance), llmrt_decode_sample_constrained
// and llmrt_sample_logits_constrained.

package llmrt

/*
#include <stdbool.h>
#include <stdlib.h>
#include "llmrt.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// GrammarKind says what a grammar source is.
type GrammarKind uint32

const (
	// GrammarJSONSchema: the output is JSON valid under a JSON Schema.
	GrammarJSONSchema GrammarKind = C.LLMRT_GRAMMAR_JSON_SCHEMA
	// GrammarRegex: the whole output matches a regular expression (Rust regex syntax).
	GrammarRegex GrammarKind = C.LLMRT_GRAMMAR_REGEX
	// GrammarLark: a Lark-style context-free grammar (llguidance's syntax; rule start).
	GrammarLark GrammarKind = C.LLMRT_GRAMMAR_LARK
)

// Grammar is one request's grammar state (llmrt_grammar). It may outlive its
// Model but is used only with that model's caches. Free releases it (a
// finalizer does too). One call at a time: a call while another goroutine's
// call on the same grammar runs fails with ErrInvalidArgument.
type Grammar struct {
	mu  sync.RWMutex // read: any call; write: Free
	ptr *C.llmrt_grammar
}

// NewGrammar compiles source of kind for m. A source that does not parse, or a
// grammar that cannot match anything with the model's vocabulary: ErrInvalidArgument
// with llguidance's message; a model without a tokenizer: ErrUnsupported.
func (m *Model) NewGrammar(kind GrammarKind, source string) (*Grammar, error) {
	cs := C.CString(source)
	defer C.free(unsafe.Pointer(cs))
	var p *C.llmrt_grammar
	err := m.with(func(pm *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status {
			return C.llmrt_grammar_new(pm, C.llmrt_grammar_kind(kind), cs, &p)
		})
	})
	if err != nil {
		return nil, err
	}
	g := &Grammar{ptr: p}
	runtime.SetFinalizer(g, func(g *Grammar) { g.Free() })
	return g, nil
}

// Free releases the grammar; later calls fail. Freeing twice is a no-op.
func (g *Grammar) Free() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ptr != nil {
		C.llmrt_grammar_free(g.ptr)
		g.ptr = nil
		runtime.SetFinalizer(g, nil)
	}
}

func (g *Grammar) with(f func(p *C.llmrt_grammar) C.enum_llmrt_status) error {
	if g == nil {
		return errArg("nil *Grammar")
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.ptr == nil {
		return errArg("grammar is freed")
	}
	return call(func() C.enum_llmrt_status { return f(g.ptr) })
}

// Accept advances the grammar by a token chosen outside the constrained step (a
// prompt's tail, a SampleLogitsConstrained token). A token it does not allow:
// ErrInvalidArgument, the grammar unchanged.
func (g *Grammar) Accept(token uint32) error {
	return g.with(func(p *C.llmrt_grammar) C.enum_llmrt_status { return C.llmrt_grammar_accept(p, C.uint32_t(token)) })
}

// Reset puts the grammar back in its start state.
func (g *Grammar) Reset() error {
	return g.with(func(p *C.llmrt_grammar) C.enum_llmrt_status { return C.llmrt_grammar_reset(p) })
}

// IsDone says whether only end-of-sequence can follow (a constrained step then
// gives the model's EOS).
func (g *Grammar) IsDone() (bool, error) {
	var b C.bool
	err := g.with(func(p *C.llmrt_grammar) C.enum_llmrt_status { return C.llmrt_grammar_is_done(p, &b) })
	return bool(b), err
}

// CanStop says whether the output so far is complete (end-of-sequence allowed now).
func (g *Grammar) CanStop() (bool, error) {
	var b C.bool
	err := g.with(func(p *C.llmrt_grammar) C.enum_llmrt_status { return C.llmrt_grammar_can_stop(p, &b) })
	return bool(b), err
}

// DecodeSampleConstrained is SampleEach under grammars (llmrt_decode_sample_constrained):
// grammars[i] (nil = unconstrained) constrains caches[i]'s token and is advanced
// by it; a done grammar gives the model's EOS. Any failure (a grammar listed
// twice, one of another model, one that allows nothing, ...) changes no cache
// and no grammar.
func (m *Model) DecodeSampleConstrained(caches []*Cache, tokens []uint32, params []SamplerParams, grammars []*Grammar) ([]uint32, error) {
	ids, err := m.batch(caches, tokens)
	if err != nil {
		return nil, err
	}
	n := len(ids)
	if len(params) != n || len(grammars) != n {
		return nil, errArg("%d sampler parameter sets and %d grammars for %d caches", len(params), len(grammars), n)
	}
	// Each distinct grammar read-locked once (a repeated one is passed on twice and
	// refused by the library).
	seen := map[*Grammar]bool{}
	for _, g := range grammars {
		if g == nil || seen[g] {
			continue
		}
		seen[g] = true
		g.mu.RLock()
		defer g.mu.RUnlock()
		if g.ptr == nil {
			return nil, errArg("grammar is freed")
		}
	}
	// Structs and pointer arrays in C memory (cgo's pointer rules).
	structs := C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.llmrt_sampler_params{})))
	ptrs := C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(uintptr(0))))
	gptrs := C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(structs)
	defer C.free(ptrs)
	defer C.free(gptrs)
	ps := unsafe.Slice((*C.llmrt_sampler_params)(structs), n)
	pp := unsafe.Slice((**C.llmrt_sampler_params)(ptrs), n)
	gp := unsafe.Slice((**C.llmrt_grammar)(gptrs), n)
	for i := range params {
		free := params[i].cParams(&ps[i])
		defer free()
		pp[i] = &ps[i]
		gp[i] = nil
		if grammars[i] != nil {
			gp[i] = grammars[i].ptr
		}
	}
	next := make([]uint32, n)
	err = m.with(func(pm *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status {
			return C.llmrt_decode_sample_constrained(pm, C.size_t(n), idsPtr(ids), tokensPtr(tokens),
				(**C.llmrt_sampler_params)(ptrs), (**C.llmrt_grammar)(gptrs), tokensPtr(next))
		})
	})
	runtime.KeepAlive(caches)
	if err != nil {
		return nil, err
	}
	return next, nil
}

// SampleLogitsConstrained is SampleLogits under g (llmrt_sample_logits_constrained):
// logits holds the model's vocabulary size of values. g is not advanced: Accept
// the token.
func SampleLogitsConstrained(params SamplerParams, g *Grammar, logits []float32, history []uint32, position uint64) (uint32, error) {
	var p C.llmrt_sampler_params
	free := params.cParams(&p)
	defer free()
	var out C.uint32_t
	err := g.with(func(gp *C.llmrt_grammar) C.enum_llmrt_status {
		return C.llmrt_sample_logits_constrained(&p, gp, floatsPtr(logits), C.size_t(len(logits)), tokensPtr(history),
			C.size_t(len(history)), C.uint64_t(position), &out)
	})
	runtime.KeepAlive(logits)
	runtime.KeepAlive(history)
	if err != nil {
		return 0, err
	}
	return uint32(out), nil
}
