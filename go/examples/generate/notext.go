//go:build !llmrt_text

package main

import (
	"fmt"

	"github.com/llmrt/llmrt/go/llmrt"
)

const haveSampling = false

// Without the text API: only ids (-i); the default prompt is BOS.
func tokenize(m *llmrt.Model, text string) ([]uint32, error) {
	if text != "" {
		return nil, fmt.Errorf("built without the text API (-tags llmrt_text): give ids with -i")
	}
	bos := m.Info().BOSToken
	if bos == llmrt.NoToken {
		bos = 1
	}
	return []uint32{bos}, nil
}

func sample(m *llmrt.Model, c *llmrt.Cache, tok uint32, s sampling) ([]uint32, error) {
	return nil, fmt.Errorf("built without the sampling API")
}

type printer struct{ text bool }

func newPrinter(m *llmrt.Model) *printer { return &printer{} }

func (p *printer) token(prev, tok uint32) error {
	fmt.Printf(" %d", tok)
	return nil
}

func (p *printer) flush() {}
