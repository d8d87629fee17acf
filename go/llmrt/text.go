//go:build llmrt_text

// Text and sampling: llmrt_tokenize, llmrt_detokenize, llmrt_sampler_params_default
// and llmrt_decode_sample. Built with -tags llmrt_text (the Makefile adds it when
// include/llmrt.h declares them); the tag goes away once every llmrt.h has them.

package llmrt

/*
#include <stdbool.h>
#include <stdlib.h>
#include "llmrt.h"
*/
import "C"

import (
	"errors"
	"runtime"
	"unsafe"
)

// Tokenize turns text into token ids, BOS first when addBOS.
func (m *Model) Tokenize(text string, addBOS bool) ([]uint32, error) {
	ctext := C.CString(text) // a copy: C must not keep Go memory
	defer C.free(unsafe.Pointer(ctext))
	tokens := make([]uint32, len(text)+2)
	for attempt := 0; ; attempt++ {
		var n C.size_t
		err := m.with(func(p *C.llmrt_model) error {
			return call(func() C.enum_llmrt_status {
				return C.llmrt_tokenize(p, ctext, C.size_t(len(text)), C.bool(addBOS),
					tokensPtr(tokens), C.size_t(len(tokens)), &n)
			})
		})
		if attempt == 0 && errors.Is(err, ErrBufferTooSmall) && int(n) > len(tokens) {
			tokens = make([]uint32, int(n))
			continue
		}
		if err != nil {
			return nil, err
		}
		return tokens[:n:n], nil
	}
}

// Detokenize turns token ids into text: the UTF-8 bytes the tokens stand for (a
// token may end inside a multi-byte character, so a single token's text need
// not be valid UTF-8).
func (m *Model) Detokenize(tokens []uint32) (string, error) {
	buf := make([]byte, len(tokens)*8+16)
	for attempt := 0; ; attempt++ {
		var n C.size_t
		err := m.with(func(p *C.llmrt_model) error {
			return call(func() C.enum_llmrt_status {
				return C.llmrt_detokenize(p, tokensPtr(tokens), C.size_t(len(tokens)),
					(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
			})
		})
		if attempt == 0 && errors.Is(err, ErrBufferTooSmall) && int(n) > len(buf) {
			buf = make([]byte, int(n))
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// SamplerParams are llmrt_sampler_params: start from DefaultSamplerParams.
type SamplerParams struct {
	Temperature       float32 // 0 = greedy
	TopK              uint32  // 0 = off
	TopP              float32 // 1 = off
	MinP              float32 // 0 = off
	RepetitionPenalty float32 // 1 = off, over the cache's tokens
	Seed              uint64  // same seed + same logits = same token, on every backend
}

// DefaultSamplerParams are the library's defaults (llmrt_sampler_params_default).
func DefaultSamplerParams() SamplerParams {
	var p C.llmrt_sampler_params
	C.llmrt_sampler_params_default(&p)
	return SamplerParams{
		Temperature:       float32(p.temperature),
		TopK:              uint32(p.top_k),
		TopP:              float32(p.top_p),
		MinP:              float32(p.min_p),
		RepetitionPenalty: float32(p.repetition_penalty),
		Seed:              uint64(p.seed),
	}
}

// Sample is DecodeGreedy with sampling: appends tokens[i] to caches[i] and
// returns one token sampled per cache, params shared by all.
func (m *Model) Sample(caches []*Cache, tokens []uint32, params SamplerParams) ([]uint32, error) {
	ids, err := m.batch(caches, tokens)
	if err != nil {
		return nil, err
	}
	var p C.llmrt_sampler_params
	C.llmrt_sampler_params_default(&p)
	p.temperature = C.float(params.Temperature)
	p.top_k = C.uint32_t(params.TopK)
	p.top_p = C.float(params.TopP)
	p.min_p = C.float(params.MinP)
	p.repetition_penalty = C.float(params.RepetitionPenalty)
	p.seed = C.uint64_t(params.Seed)
	next := make([]uint32, len(ids))
	err = m.with(func(pm *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status {
			return C.llmrt_decode_sample(pm, C.size_t(len(ids)), idsPtr(ids), tokensPtr(tokens), &p,
				tokensPtr(next))
		})
	})
	runtime.KeepAlive(caches)
	if err != nil {
		return nil, err
	}
	return next, nil
}
