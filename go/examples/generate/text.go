//go:build llmrt_text

package main

import (
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/llmrt/llmrt/go/llmrt"
)

const haveSampling = true

func tokenize(m *llmrt.Model, text string) ([]uint32, error) {
	if text == "" {
		text = "Once upon a time"
	}
	return m.Tokenize(text, true)
}

func sample(m *llmrt.Model, c *llmrt.Cache, tok uint32, s sampling) ([]uint32, error) {
	p := llmrt.DefaultSamplerParams()
	p.Temperature = float32(s.temp)
	p.TopK = uint32(s.topK)
	p.TopP = float32(s.topP)
	p.MinP = float32(s.minP)
	p.RepetitionPenalty = float32(s.repeatPenalty)
	p.Seed = s.seed
	return m.Sample([]*llmrt.Cache{c}, []uint32{tok}, p)
}

// printer streams text, holding back a UTF-8 character split across tokens.
type printer struct {
	m       *llmrt.Model
	text    bool
	pending []byte
}

func newPrinter(m *llmrt.Model) *printer {
	_, err := m.Detokenize([]uint32{0})
	return &printer{m: m, text: err == nil}
}

func (p *printer) token(prev, tok uint32) error {
	if !p.text {
		fmt.Printf(" %d", tok)
		return nil
	}
	// What tok adds after prev (keeps the space a lone first token would lose).
	before, err := p.m.Detokenize([]uint32{prev})
	if err != nil {
		return err
	}
	both, err := p.m.Detokenize([]uint32{prev, tok})
	if err != nil {
		return err
	}
	add := strings.TrimPrefix(both, before)
	if len(add) == len(both) {
		if add, err = p.m.Detokenize([]uint32{tok}); err != nil {
			return err
		}
	}
	p.pending = append(p.pending, add...)
	cut := completeUTF8(p.pending)
	os.Stdout.Write(p.pending[:cut])
	p.pending = append(p.pending[:0], p.pending[cut:]...)
	return nil
}

func (p *printer) flush() { os.Stdout.Write(p.pending) }

// completeUTF8 is the length of b without a trailing incomplete character.
func completeUTF8(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-3; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			break
		}
	}
	return len(b)
}
