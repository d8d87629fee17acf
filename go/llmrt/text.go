// Text and sampling: llmrt_tokenize, llmrt_detokenize, llmrt_token_piece,
// llmrt_sampler_params_default and llmrt_decode_sample.

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

// Tokenize turns text into token ids. addBOS puts BOS first where the model's
// tokenizer asks for one (Llama-style SentencePiece models; usually not
// byte-level BPE ones such as Qwen's), as llama.cpp's add_special.
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

// Detokenize turns token ids into the text they stand for:
// Detokenize(Tokenize(s, addBOS)) == s (one leading SentencePiece space is
// dropped, control tokens give nothing). A byte-fallback token may end inside a
// multi-byte character, so the text of a few tokens need not be valid UTF-8.
// To stream generated text, print TokenPiece of each token instead.
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

// TokenPiece is one token's bytes as they appear inside a text, for streaming
// output: unlike Detokenize its leading space is kept, so concatenating the
// pieces of generated tokens gives the text. Control tokens (BOS, EOS, ...) give
// "", a byte-fallback token one raw byte (possibly part of a UTF-8 character:
// hold back an incomplete tail until the next pieces complete it).
func (m *Model) TokenPiece(token uint32) (string, error) {
	buf := make([]byte, 32)
	for attempt := 0; ; attempt++ {
		var n C.size_t
		err := m.with(func(p *C.llmrt_model) error {
			return call(func() C.enum_llmrt_status {
				return C.llmrt_token_piece(p, C.uint32_t(token), (*C.char)(unsafe.Pointer(&buf[0])),
					C.size_t(len(buf)), &n)
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

// DefaultSamplerParams are the library's defaults (llmrt_sampler_params_default):
// llama.cpp's, temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repetition
// penalty 1, seed 0.
func DefaultSamplerParams() SamplerParams {
	var p C.llmrt_sampler_params
	C.llmrt_sampler_params_init(&p, C.size_t(unsafe.Sizeof(p))) // never overrun by a newer library
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
	C.llmrt_sampler_params_init(&p, C.size_t(unsafe.Sizeof(p))) // never overrun by a newer library
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
