// Chat: llmrt_chat_apply, llmrt_chat_template, llmrt_token_is_eog,
// llmrt_eog_tokens and the stop-string matcher (llmrt_stop_matcher_*).

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

// ChatMessage is one message of a conversation: Role ("system", "user",
// "assistant", ...) and Content.
type ChatMessage struct {
	Role    string
	Content string
}

// ChatApply renders the model's own chat template (GGUF tokenizer.chat_template,
// Hugging Face chat_template.jinja or tokenizer_config.json) over messages, as
// Hugging Face transformers renders it, with the model's bos/eos strings.
// addGenerationPrompt ends the text with the assistant's turn header. A model
// without a template: ErrUnsupported; a template that raises or fails:
// ErrInvalidArgument with the template line in the message.
func (m *Model) ChatApply(messages []ChatMessage, addGenerationPrompt bool) (string, error) {
	var out string
	err := m.with(func(p *C.llmrt_model) error {
		var e error
		out, e = chatApply(p, nil, messages, addGenerationPrompt)
		return e
	})
	return out, err
}

// ChatApplyTemplate is ChatApply with a template of the caller's choice (the
// model's bos/eos strings still apply).
func (m *Model) ChatApplyTemplate(template string, messages []ChatMessage, addGenerationPrompt bool) (string, error) {
	var out string
	err := m.with(func(p *C.llmrt_model) error {
		var e error
		out, e = chatApply(p, &template, messages, addGenerationPrompt)
		return e
	})
	return out, err
}

// ApplyChatTemplate renders a template without a model (bos_token and
// eos_token are "").
func ApplyChatTemplate(template string, messages []ChatMessage, addGenerationPrompt bool) (string, error) {
	return chatApply(nil, &template, messages, addGenerationPrompt)
}

func chatApply(p *C.llmrt_model, template *string, messages []ChatMessage, gen bool) (string, error) {
	var ctmpl *C.char
	if template != nil {
		ctmpl = C.CString(*template)
		defer C.free(unsafe.Pointer(ctmpl))
	}
	// The message array and its strings live in C memory: C must not hold Go pointers.
	var cmsgs *C.llmrt_chat_message
	if len(messages) > 0 {
		size := C.size_t(len(messages)) * C.size_t(unsafe.Sizeof(C.llmrt_chat_message{}))
		cmsgs = (*C.llmrt_chat_message)(C.malloc(size))
		defer C.free(unsafe.Pointer(cmsgs))
		arr := unsafe.Slice(cmsgs, len(messages))
		for i, msg := range messages {
			arr[i].role = C.CString(msg.Role)
			arr[i].content = C.CString(msg.Content)
		}
		defer func() {
			for i := range arr {
				C.free(unsafe.Pointer(arr[i].role))
				C.free(unsafe.Pointer(arr[i].content))
			}
		}()
	}
	buf, err := grown(1024, func(buf []byte, n *C.size_t) error {
		return call(func() C.enum_llmrt_status {
			return C.llmrt_chat_apply(p, ctmpl, cmsgs, C.size_t(len(messages)), C.bool(gen),
				(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), n)
		})
	})
	if err != nil {
		return "", err
	}
	return string(buf), nil
}

// ChatTemplate is the model's own chat template text (ErrUnsupported if none).
func (m *Model) ChatTemplate() (string, error) {
	buf, err := grown(4096, func(buf []byte, n *C.size_t) error {
		return m.with(func(p *C.llmrt_model) error {
			return call(func() C.enum_llmrt_status {
				return C.llmrt_chat_template(p, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), n)
			})
		})
	})
	if err != nil {
		return "", err
	}
	return string(buf), nil
}

// IsEOG reports whether token ends a generation: the model's EOS, EOT, EOM ids,
// every id of a Hugging Face eos_token_id list, and special tokens such as
// <|im_end|> or <end_of_turn>. false on a closed model.
func (m *Model) IsEOG(token uint32) bool {
	r := false
	_ = m.with(func(p *C.llmrt_model) error {
		r = bool(C.llmrt_token_is_eog(p, C.uint32_t(token)))
		return nil
	})
	return r
}

// EOGTokens lists the end-of-generation ids (see IsEOG), ascending.
func (m *Model) EOGTokens() ([]uint32, error) {
	tokens, err := grown(16, func(tokens []uint32, n *C.size_t) error {
		return m.with(func(p *C.llmrt_model) error {
			return call(func() C.enum_llmrt_status {
				return C.llmrt_eog_tokens(p, tokensPtr(tokens), C.size_t(len(tokens)), n)
			})
		})
	})
	if err != nil {
		return nil, err
	}
	return tokens, nil
}

// NoStop is StopMatcher.Feed's stop index when no stop string matched.
const NoStop = -1

// StopMatcher holds back streamed text that may begin a stop string: Feed it
// each generated piece and show what it returns. It never returns part of a
// stop string nor half a UTF-8 character. Safe for use by several goroutines.
type StopMatcher struct {
	mu  sync.Mutex
	ptr *C.llmrt_stop_matcher
}

// NewStopMatcher makes a matcher for stops (none empty).
func NewStopMatcher(stops []string) (*StopMatcher, error) {
	var arr **C.char
	if len(stops) > 0 {
		arr = (**C.char)(C.malloc(C.size_t(len(stops)) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
		defer C.free(unsafe.Pointer(arr))
		s := unsafe.Slice(arr, len(stops))
		for i, stop := range stops {
			s[i] = C.CString(stop)
		}
		defer func() {
			for i := range s {
				C.free(unsafe.Pointer(s[i]))
			}
		}()
	}
	var p *C.llmrt_stop_matcher
	if err := call(func() C.enum_llmrt_status { return C.llmrt_stop_matcher_new(arr, C.size_t(len(stops)), &p) }); err != nil {
		return nil, err
	}
	sm := &StopMatcher{ptr: p}
	runtime.SetFinalizer(sm, func(sm *StopMatcher) { _ = sm.Close() })
	return sm, nil
}

// Feed passes the next generated piece (any bytes; a piece may end inside a
// character) and returns the text now safe to show, and the index of the stop
// string that matched (NoStop if none did). Once one matched, the generation is
// over: text is what came before it, and later feeds return nothing.
func (s *StopMatcher) Feed(piece []byte) (text []byte, stop int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr == nil {
		return nil, NoStop, errArg("stop matcher is closed")
	}
	// C memory for the piece: it is read during the call only, but a copy keeps
	// the cgo pointer rules trivially.
	var cp *C.char
	if len(piece) > 0 {
		cp = (*C.char)(C.CBytes(piece))
		defer C.free(unsafe.Pointer(cp))
	}
	var st C.uint32_t
	buf, err := grown(len(piece)+64, func(buf []byte, n *C.size_t) error {
		return call(func() C.enum_llmrt_status {
			return C.llmrt_stop_matcher_feed(s.ptr, cp, C.size_t(len(piece)),
				(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), n, &st)
		})
	})
	if err != nil {
		return nil, NoStop, err
	}
	idx := NoStop
	if st != C.uint32_t(^uint32(0)) {
		idx = int(st)
	}
	return buf, idx, nil
}

// Flush ends the generation: the text still held back (a prefix of a stop
// string that never completed, an incomplete character).
func (s *StopMatcher) Flush() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr == nil {
		return nil, errArg("stop matcher is closed")
	}
	buf, err := grown(64, func(buf []byte, n *C.size_t) error {
		return call(func() C.enum_llmrt_status {
			return C.llmrt_stop_matcher_flush(s.ptr, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), n)
		})
	})
	if err != nil {
		return nil, err
	}
	return buf, nil
}

// Close frees the matcher; later calls fail. Closing twice is a no-op.
func (s *StopMatcher) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr != nil {
		C.llmrt_stop_matcher_free(s.ptr)
		s.ptr = nil
		runtime.SetFinalizer(s, nil)
	}
	return nil
}
