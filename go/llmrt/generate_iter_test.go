//go:build go1.23

package llmrt

import (
	"context"
	"errors"
	"testing"
)

// The iterator yields what GenerateFunc does; break stops the generation; a cancelled
// context ends it with the error as the last element.
func TestGenerateIterator(t *testing.T) {
	ref, _ := loadReference(t)
	m := loadModel(t)
	c := must(m.Reserve(0))
	var ids []uint32
	for tok, err := range m.Generate(context.Background(), c, ref.GreedyPrompt, GenerateOptions{MaxTokens: 10}) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tok.ID)
	}
	if len(ids) != 10 {
		t.Fatalf("%d tokens", len(ids))
	}
	for i, id := range ids {
		if id != ref.GreedyIDs[i] {
			t.Fatalf("token %d: %d, transformers %d", i, id, ref.GreedyIDs[i])
		}
	}
	d := must(m.Reserve(0))
	n := 0
	for range m.Generate(context.Background(), d, ref.GreedyPrompt, GenerateOptions{MaxTokens: 10}) {
		n++
		if n == 2 {
			break
		}
	}
	if l := must(d.Len()); n != 2 || int(l) != len(ref.GreedyPrompt)+1 {
		t.Fatalf("break after 2: %d yielded, cache %d", n, l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := must(m.Reserve(0))
	var last error
	for _, err := range m.Generate(ctx, e, ref.GreedyPrompt, GenerateOptions{MaxTokens: 10}) {
		cancel()
		last = err
	}
	if !errors.Is(last, context.Canceled) {
		t.Fatalf("last element %v", last)
	}
}
