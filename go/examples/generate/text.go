package main

import (
	"errors"
	"fmt"
	"os"
	"unicode/utf8"

	"github.com/llmrt/llmrt/go/llmrt"
)

// tokenize is the prompt: the text (default "Once upon a time"), BOS first where
// the tokenizer asks for one; BOS alone for a model without a tokenizer.
func tokenize(m *llmrt.Model, text string) ([]uint32, error) {
	if !hasTokenizer(m) {
		if text != "" {
			return nil, fmt.Errorf("the model carries no tokenizer: give token ids with -i")
		}
		bos := m.Info().BOSToken
		if bos == llmrt.NoToken {
			bos = 1
		}
		return []uint32{bos}, nil
	}
	if text == "" {
		text = "Once upon a time"
	}
	return m.Tokenize(text, true)
}

// hasTokenizer: models without a tokenizer answer ErrUnsupported.
func hasTokenizer(m *llmrt.Model) bool {
	_, err := m.TokenPiece(0)
	return !errors.Is(err, llmrt.ErrUnsupported)
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

// printer streams text: each token's piece (its leading space kept), holding
// back a UTF-8 character split across tokens until it is complete. Models
// without a tokenizer print ids.
type printer struct {
	m       *llmrt.Model
	text    bool
	pending []byte
}

func newPrinter(m *llmrt.Model) *printer {
	return &printer{m: m, text: hasTokenizer(m)}
}

func (p *printer) token(tok uint32) error {
	if !p.text {
		fmt.Printf(" %d", tok)
		return nil
	}
	piece, err := p.m.TokenPiece(tok)
	if err != nil {
		return err
	}
	p.pending = append(p.pending, piece...)
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
