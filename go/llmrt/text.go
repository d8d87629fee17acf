// Text and sampling: llmrt_tokenize, llmrt_detokenize, llmrt_token_piece,
// llmrt_sampler_params_default, llmrt_decode_sample, llmrt_decode_sample_each and
// llmrt_sample_logits.

package llmrt

/*
#include <stdbool.h>
#include <stdlib.h>
#include "llmrt.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Tokenize turns text into token ids. addBOS puts BOS first where the model's
// tokenizer asks for one (Llama-style SentencePiece models; usually not
// byte-level BPE ones such as Qwen's), as llama.cpp's add_special.
func (m *Model) Tokenize(text string, addBOS bool) ([]uint32, error) {
	ctext := C.CString(text) // a copy: C must not keep Go memory
	defer C.free(unsafe.Pointer(ctext))
	tokens, err := grown(len(text)+2, func(tokens []uint32, n *C.size_t) error {
		return m.with(func(p *C.llmrt_model) error {
			return call(func() C.enum_llmrt_status {
				return C.llmrt_tokenize(p, ctext, C.size_t(len(text)), C.bool(addBOS),
					tokensPtr(tokens), C.size_t(len(tokens)), n)
			})
		})
	})
	if err != nil {
		return nil, err
	}
	return tokens, nil
}

// TokenizeEx is Tokenize with llama.cpp's parse_special (llmrt_tokenize_ex):
// parseSpecial false tokenizes special tokens written in the text ("<s>",
// "<|im_start|>") as text, so untrusted input cannot inject them; Tokenize is
// parseSpecial true.
func (m *Model) TokenizeEx(text string, addBOS, parseSpecial bool) ([]uint32, error) {
	ctext := C.CString(text) // a copy: C must not keep Go memory
	defer C.free(unsafe.Pointer(ctext))
	return grown(len(text)+2, func(tokens []uint32, n *C.size_t) error {
		return m.with(func(p *C.llmrt_model) error {
			return call(func() C.enum_llmrt_status {
				return C.llmrt_tokenize_ex(p, ctext, C.size_t(len(text)), C.bool(addBOS), C.bool(parseSpecial),
					tokensPtr(tokens), C.size_t(len(tokens)), n)
			})
		})
	})
}

// Detokenize turns token ids into the text they stand for:
// Detokenize(Tokenize(s, addBOS)) == s (one leading SentencePiece space is
// dropped, control tokens give nothing). A byte-fallback token may end inside a
// multi-byte character, so the text of a few tokens need not be valid UTF-8.
// To stream generated text, print TokenPiece of each token instead.
func (m *Model) Detokenize(tokens []uint32) (string, error) {
	buf, err := grown(len(tokens)*8+16, func(buf []byte, n *C.size_t) error {
		return m.with(func(p *C.llmrt_model) error {
			return call(func() C.enum_llmrt_status {
				return C.llmrt_detokenize(p, tokensPtr(tokens), C.size_t(len(tokens)),
					(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), n)
			})
		})
	})
	if err != nil {
		return "", err
	}
	return string(buf), nil
}

// TokenPiece is one token's bytes as they appear inside a text, for streaming
// output: unlike Detokenize its leading space is kept, so concatenating the
// pieces of generated tokens gives the text. Control tokens (BOS, EOS, ...) give
// "", a byte-fallback token one raw byte (possibly part of a UTF-8 character:
// hold back an incomplete tail until the next pieces complete it).
func (m *Model) TokenPiece(token uint32) (string, error) {
	buf, err := grown(32, func(buf []byte, n *C.size_t) error {
		return m.with(func(p *C.llmrt_model) error {
			return call(func() C.enum_llmrt_status {
				return C.llmrt_token_piece(p, C.uint32_t(token), (*C.char)(unsafe.Pointer(&buf[0])),
					C.size_t(len(buf)), n)
			})
		})
	})
	if err != nil {
		return "", err
	}
	return string(buf), nil
}

// SamplerParams are llmrt_sampler_params: start from DefaultSamplerParams (the
// zero value has penalties off: PenaltyLastN 0). Order: logit bias, penalties
// (llama.cpp's), temperature (0: greedy), top-k, top-p, min-p, the seeded draw.
type SamplerParams struct {
	Temperature       float32 // 0 = greedy
	TopK              uint32  // 0 = off
	TopP              float32 // 1 = off
	MinP              float32 // 0 = off
	RepetitionPenalty float32 // 1 = off, over the penalty window of the cache's tokens
	Seed              uint64  // same seed + same logits = same token, on every backend
	PenaltyLastN      int32   // the window: the cache's last n tokens; -1 = all (default), 0 = no penalties
	FrequencyPenalty  float32 // 0 = off; subtracted per occurrence in the window
	PresencePenalty   float32 // 0 = off; subtracted once for a token in the window
	LogitBias         []LogitBias
}

// LogitBias adds Bias to token Token's logit before the penalties; a Bias of
// float32(math.Inf(-1)) bans the token.
type LogitBias struct {
	Token uint32
	Bias  float32
}

// DefaultSamplerParams are the library's defaults (llmrt_sampler_params_default):
// llama.cpp's, temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repetition
// penalty 1, no frequency/presence penalty or logit bias, penalty window the
// whole cache (-1), seed 0.
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
		PenaltyLastN:      int32(p.penalty_last_n),
		FrequencyPenalty:  float32(p.frequency_penalty),
		PresencePenalty:   float32(p.presence_penalty),
	}
}

// cParams writes params into *p (C memory or a Go variable); the bias list is
// copied to C memory (cgo: C must not see Go pointers inside passed memory),
// released by the returned func.
func (params SamplerParams) cParams(p *C.llmrt_sampler_params) (free func()) {
	C.llmrt_sampler_params_init(p, C.size_t(unsafe.Sizeof(*p))) // never overrun by a newer library
	p.temperature = C.float(params.Temperature)
	p.top_k = C.uint32_t(params.TopK)
	p.top_p = C.float(params.TopP)
	p.min_p = C.float(params.MinP)
	p.repetition_penalty = C.float(params.RepetitionPenalty)
	p.seed = C.uint64_t(params.Seed)
	p.penalty_last_n = C.int32_t(params.PenaltyLastN)
	p.frequency_penalty = C.float(params.FrequencyPenalty)
	p.presence_penalty = C.float(params.PresencePenalty)
	n := len(params.LogitBias)
	if n == 0 {
		return func() {}
	}
	mem := C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.llmrt_logit_bias{}))) // cgo's malloc never returns NULL
	list := unsafe.Slice((*C.llmrt_logit_bias)(mem), n)
	for i, b := range params.LogitBias {
		list[i] = C.llmrt_logit_bias{token: C.uint32_t(b.Token), bias: C.float(b.Bias)}
	}
	p.logit_bias, p.n_logit_bias = (*C.llmrt_logit_bias)(mem), C.size_t(n)
	return func() { C.free(mem) }
}

// Sample is DecodeGreedy with sampling: appends tokens[i] to caches[i] and
// returns one token sampled per cache, params shared by all.
func (m *Model) Sample(caches []*Cache, tokens []uint32, params SamplerParams) ([]uint32, error) {
	ids, err := m.batch(caches, tokens)
	if err != nil {
		return nil, err
	}
	var p C.llmrt_sampler_params
	free := params.cParams(&p)
	defer free()
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

// SampleEach is Sample with one parameter set per cache (params[i] samples
// caches[i]; llmrt_decode_sample_each): each token is the one Sample of that
// cache alone with params[i] gives. Bad parameters anywhere fail the step
// before any cache changes.
func (m *Model) SampleEach(caches []*Cache, tokens []uint32, params []SamplerParams) ([]uint32, error) {
	ids, err := m.batch(caches, tokens)
	if err != nil {
		return nil, err
	}
	if len(params) != len(ids) {
		return nil, errArg("%d sampler parameter sets for %d caches", len(params), len(ids))
	}
	n := len(ids)
	// The structs and the pointer array live in C memory: a pointer array in Go
	// memory pointing at Go memory would break cgo's pointer rules.
	structs := C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.llmrt_sampler_params{})))
	ptrs := C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(structs)
	defer C.free(ptrs)
	ps := unsafe.Slice((*C.llmrt_sampler_params)(structs), n)
	pp := unsafe.Slice((**C.llmrt_sampler_params)(ptrs), n)
	for i := range params {
		free := params[i].cParams(&ps[i])
		defer free()
		pp[i] = &ps[i]
	}
	next := make([]uint32, n)
	err = m.with(func(pm *C.llmrt_model) error {
		return call(func() C.enum_llmrt_status {
			return C.llmrt_decode_sample_each(pm, C.size_t(n), idsPtr(ids), tokensPtr(tokens),
				(**C.llmrt_sampler_params)(ptrs), tokensPtr(next))
		})
	})
	runtime.KeepAlive(caches)
	if err != nil {
		return nil, err
	}
	return next, nil
}

// SampleLogits samples a token from caller-held logits (llmrt_sample_logits), as
// Sample does: history plays the cache's tokens for the penalties, position the
// new token's position for the seeded draw. With a cache's row (Decode), its
// tokens and its length it gives Sample's token. Needs no model.
func SampleLogits(params SamplerParams, logits []float32, history []uint32, position uint64) (uint32, error) {
	var p C.llmrt_sampler_params
	free := params.cParams(&p)
	defer free()
	var out C.uint32_t
	err := call(func() C.enum_llmrt_status {
		return C.llmrt_sample_logits(&p, floatsPtr(logits), C.size_t(len(logits)), tokensPtr(history), C.size_t(len(history)),
			C.uint64_t(position), &out)
	})
	runtime.KeepAlive(logits)
	runtime.KeepAlive(history)
	if err != nil {
		return 0, err
	}
	return uint32(out), nil
}
