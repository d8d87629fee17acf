// Generation, embeddings and context cancellation: llmrt_generate, llmrt_embed and
// llmrt_set_abort_callback. The range-over-func iterator (Model.Generate) is in
// generate_iter.go (Go 1.23 and later); GenerateFunc works on every Go version.
package llmrt

/*
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include "llmrt.h"

extern _Bool llmrtGoAbort(void *user_data);
extern _Bool llmrtGoToken(void *user_data, uint32_t token, char *piece, size_t piece_len);

static uintptr_t llmrt_go_thread(void) { return (uintptr_t)pthread_self(); }

static enum llmrt_status llmrt_go_set_abort(llmrt_model *m) {
	return llmrt_set_abort_callback(m, llmrtGoAbort, NULL);
}

static bool llmrt_go_token(void *user_data, uint32_t token, const char *piece, size_t piece_len) {
	return llmrtGoToken(user_data, token, (char *)piece, piece_len);
}

static enum llmrt_status llmrt_go_generate(llmrt_model *m, llmrt_cache c, const uint32_t *prompt, size_t n_prompt,
		const llmrt_sampler_params *params, uint32_t max_tokens, uintptr_t handle,
		uint32_t *out, size_t capacity, size_t *out_n, llmrt_stop_reason *reason) {
	return llmrt_generate(m, c, prompt, n_prompt, params, max_tokens, llmrt_go_token, (void *)handle,
		out, capacity, out_n, reason);
}
*/
import "C"

import (
	"context"
	"runtime"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// Pooling says how Embed pools a sequence's hidden states.
type Pooling int32

const (
	PoolNone Pooling = 0 // every token's row: len(tokens) * HiddenSize floats
	PoolMean Pooling = 1 // their mean: HiddenSize floats
	PoolLast Pooling = 2 // the last token's row: HiddenSize floats
)

// Embed returns the final norm's output (the LM head's input; transformers'
// last_hidden_state) of tokens as one sequence, pooled, each row scaled to unit L2
// norm when normalize. It runs in a cache of its own; no Cache changes. A ctx done
// before or during the step fails it with an error matching ErrAborted and ctx.Err().
func (m *Model) Embed(ctx context.Context, tokens []uint32, pooling Pooling, normalize bool) ([]float32, error) {
	var out []float32
	err := m.with(func(p *C.llmrt_model) error {
		var err error
		out, err = grown(len(tokens)*int(m.info.HiddenSize)+1, func(buf []float32, n *C.size_t) error {
			return m.callCtx(ctx, p, func() C.enum_llmrt_status {
				return C.llmrt_embed(p, tokensPtr(tokens), C.size_t(len(tokens)), C.llmrt_pooling(pooling),
					C.bool(normalize), floatsPtr(buf), C.size_t(len(buf)), n)
			})
		})
		return err
	})
	return out, err
}

// ---- context cancellation through the abort callback ----

// The context of each call in flight that has one, by the OS thread it runs on (the
// callback runs on the thread that called the step; call locks the goroutine to it).
var ctxByThread sync.Map // uintptr -> context.Context

//export llmrtGoAbort
func llmrtGoAbort(_ unsafe.Pointer) C.bool {
	if v, ok := ctxByThread.Load(uintptr(C.llmrt_go_thread())); ok {
		return C.bool(v.(context.Context).Err() != nil)
	}
	return false
}

// callCtx is call with ctx polled by the model's abort callback (installed on the
// model's first call with a context): a ctx done before the call or during its step
// gives an *Error with StatusAborted whose Unwrap is ctx.Err(). ctx nil: plain call.
func (m *Model) callCtx(ctx context.Context, p *C.llmrt_model, f func() C.enum_llmrt_status) error {
	if ctx == nil || ctx.Done() == nil {
		return call(f)
	}
	if err := ctx.Err(); err != nil {
		return &Error{Status: StatusAborted, Msg: "context done before the step: " + err.Error(), cause: err}
	}
	var err error
	m.abortOnce.Do(func() {
		err = call(func() C.enum_llmrt_status { return C.llmrt_go_set_abort(p) })
	})
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t := uintptr(C.llmrt_go_thread())
	prev, had := ctxByThread.Load(t)
	ctxByThread.Store(t, ctx)
	defer func() {
		if had {
			ctxByThread.Store(t, prev)
		} else {
			ctxByThread.Delete(t)
		}
	}()
	err = call(f)
	if e, ok := err.(*Error); ok && e.Status == StatusAborted && ctx.Err() != nil {
		e.cause = ctx.Err()
	}
	return err
}

// ---- generation ----

// StopReason says why a generation ended.
type StopReason int32

const (
	StopEOG         StopReason = 0 // an end-of-generation id (the last token; not fed, not yielded)
	StopMaxTokens   StopReason = 1
	StopCallback    StopReason = 2 // the callback (or the range loop) stopped it
	StopContextFull StopReason = 3 // the cache's reserved positions are used up
)

func (r StopReason) String() string {
	switch r {
	case StopEOG:
		return "end of generation"
	case StopMaxTokens:
		return "max tokens"
	case StopCallback:
		return "stopped by the caller"
	case StopContextFull:
		return "context full"
	}
	return "unknown stop reason"
}

// Token is one generated token and its text piece (TokenPiece: concatenating the
// pieces gives the text; a piece may end inside a UTF-8 character).
type Token struct {
	ID    uint32
	Piece string
}

// GenerateOptions configures a generation. The zero value is greedy with
// MaxTokens 0 meaning 256.
type GenerateOptions struct {
	MaxTokens uint32
	Sampler   *SamplerParams // nil: greedy
}

// Generated is what GenerateFunc produced: every token (an end-of-generation id last
// when that stopped it) and why it stopped. The cache holds the prompt and every
// token but the last.
type Generated struct {
	Tokens []uint32
	Reason StopReason
}

type genState struct {
	yield func(Token) bool
	panic interface{}
}

//export llmrtGoToken
func llmrtGoToken(user unsafe.Pointer, token C.uint32_t, piece *C.char, n C.size_t) (keep C.bool) {
	s := cgo.Handle(uintptr(user)).Value().(*genState)
	if s.panic != nil {
		return false
	}
	defer func() {
		// A panic must not unwind through the C frames: keep it, stop, re-panic after.
		if r := recover(); r != nil {
			s.panic = r
			keep = false
		}
	}()
	return C.bool(s.yield(Token{ID: uint32(token), Piece: C.GoStringN(piece, C.int(n))}))
}

// GenerateFunc feeds prompt (at least one token; to continue a generation pass its
// last token) to c and generates (llmrt_generate): yield gets each token that is not
// an end-of-generation id and returns false to stop. ctx (may be nil) cancels it
// between layers: then the error matches ErrAborted and ctx.Err(), and Generated holds
// the tokens before the cancelled step. yield runs on the calling goroutine between
// steps and may call other methods of m.
func (m *Model) GenerateFunc(ctx context.Context, c *Cache, prompt []uint32, opts GenerateOptions,
	yield func(Token) bool) (Generated, error) {
	maxTokens := opts.MaxTokens
	if maxTokens == 0 {
		maxTokens = 256
	}
	var p *C.llmrt_sampler_params
	if opts.Sampler != nil {
		p = (*C.llmrt_sampler_params)(C.malloc(C.size_t(unsafe.Sizeof(C.llmrt_sampler_params{}))))
		defer C.free(unsafe.Pointer(p))
		free := opts.Sampler.cParams(p)
		defer free()
	}
	st := &genState{yield: yield}
	h := cgo.NewHandle(st)
	defer h.Delete()
	out := make([]uint32, maxTokens)
	var n C.size_t
	var reason C.llmrt_stop_reason
	err := c.with(func(pm *C.llmrt_model) error {
		return m.callCtx(ctx, pm, func() C.enum_llmrt_status {
			return C.llmrt_go_generate(pm, c.id, tokensPtr(prompt), C.size_t(len(prompt)), p, C.uint32_t(maxTokens),
				C.uintptr_t(h), tokensPtr(out), C.size_t(len(out)), &n, &reason)
		})
	})
	if st.panic != nil {
		panic(st.panic)
	}
	g := Generated{Tokens: out[:n]}
	if err != nil {
		return g, err
	}
	g.Reason = StopReason(reason)
	return g, nil
}
