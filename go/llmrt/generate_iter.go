//go:build go1.23

package llmrt

import (
	"context"
	"iter"
)

// Generate streams a generation (GenerateFunc) as an iterator:
//
//	for tok, err := range m.Generate(ctx, c, prompt, llmrt.GenerateOptions{MaxTokens: 64}) {
//		if err != nil { ... }
//		fmt.Print(tok.Piece)
//	}
//
// Breaking out of the loop stops the generation; an error (ctx cancelled: matches
// ErrAborted and ctx.Err()) comes as the last element. It stops at an
// end-of-generation id (not yielded).
func (m *Model) Generate(ctx context.Context, c *Cache, prompt []uint32, opts GenerateOptions) iter.Seq2[Token, error] {
	return func(yield func(Token, error) bool) {
		stopped := false
		_, err := m.GenerateFunc(ctx, c, prompt, opts, func(t Token) bool {
			if !yield(t, nil) {
				stopped = true
				return false
			}
			return true
		})
		if err != nil && !stopped {
			yield(Token{}, err)
		}
	}
}
