package llmrt

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// Greedy generation equals transformers' greedy ids (reference.json), and the pieces
// yielded are TokenPiece of each token.
func TestGenerateFuncGreedyMatchesTransformers(t *testing.T) {
	ref, _ := loadReference(t)
	m := loadModel(t)
	c := must(m.Reserve(0))
	var pieces string
	var ids []uint32
	g, err := m.GenerateFunc(context.Background(), c, ref.GreedyPrompt,
		GenerateOptions{MaxTokens: uint32(len(ref.GreedyIDs))}, func(tok Token) bool {
			ids = append(ids, tok.ID)
			pieces += tok.Piece
			return true
		})
	if err != nil {
		t.Fatal(err)
	}
	if g.Reason != StopMaxTokens || len(g.Tokens) != len(ref.GreedyIDs) {
		t.Fatalf("stopped with %v after %d tokens", g.Reason, len(g.Tokens))
	}
	for i := range g.Tokens {
		if g.Tokens[i] != ref.GreedyIDs[i] || ids[i] != g.Tokens[i] {
			t.Fatalf("token %d: generated %d, yielded %d, transformers %d", i, g.Tokens[i], ids[i], ref.GreedyIDs[i])
		}
	}
	var want string
	for _, id := range ids {
		want += must(m.TokenPiece(id))
	}
	if pieces != want {
		t.Fatalf("pieces %q, TokenPiece %q", pieces, want)
	}
	if n := must(c.Len()); int(n) != len(ref.GreedyPrompt)+len(g.Tokens)-1 {
		t.Fatalf("cache holds %d positions", n)
	}
}

// A context cancelled between tokens stops the next step: the error matches ErrAborted
// and context.Canceled, the tokens before it are kept, the cache holds them but the
// last. A context done before the call feeds nothing. Plain calls are unaffected.
func TestGenerateFuncContextCancel(t *testing.T) {
	ref, _ := loadReference(t)
	m := loadModel(t)
	c := must(m.Reserve(0))
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	g, err := m.GenerateFunc(ctx, c, ref.GreedyPrompt, GenerateOptions{MaxTokens: 20}, func(Token) bool {
		n++
		if n == 3 {
			cancel()
		}
		return true
	})
	if !errors.Is(err, ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v: want ErrAborted and context.Canceled", err)
	}
	if len(g.Tokens) != 3 || n != 3 {
		t.Fatalf("%d tokens, %d yielded before the cancelled step", len(g.Tokens), n)
	}
	if l := must(c.Len()); int(l) != len(ref.GreedyPrompt)+2 {
		t.Fatalf("cache holds %d positions after the cancelled step", l)
	}
	d := must(m.Reserve(0))
	_, err = m.GenerateFunc(ctx, d, ref.GreedyPrompt, GenerateOptions{}, func(Token) bool { return true })
	if !errors.Is(err, ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("done context: err %v", err)
	}
	if l := must(d.Len()); l != 0 {
		t.Fatalf("a done context fed %d positions", l)
	}
	// The model's callback is installed now; a call without a context still runs.
	if _, err := d.Prefill(ref.GreedyPrompt); err != nil {
		t.Fatal(err)
	}
	// And so does one with a live context, sampled this time.
	s := DefaultSamplerParams()
	s.Temperature, s.Seed = 0.8, 3
	e := must(m.Reserve(0))
	g, err = m.GenerateFunc(context.Background(), e, ref.GreedyPrompt, GenerateOptions{MaxTokens: 5, Sampler: &s},
		func(Token) bool { return true })
	if err != nil || len(g.Tokens) == 0 {
		t.Fatalf("sampled generation: %v, %d tokens", err, len(g.Tokens))
	}
	// Bad arguments: nothing fed.
	if _, err := m.GenerateFunc(nil, e, nil, GenerateOptions{}, func(Token) bool { return true }); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("empty prompt: %v", err)
	}
}

// A panic in the callback reaches the caller (not through the C frames) and the
// generation stops.
func TestGenerateFuncCallbackPanic(t *testing.T) {
	ref, _ := loadReference(t)
	m := loadModel(t)
	c := must(m.Reserve(0))
	defer func() {
		if r := recover(); r != "boom" {
			t.Fatalf("recovered %v", r)
		}
		if l := must(c.Len()); int(l) != len(ref.GreedyPrompt) {
			t.Fatalf("cache holds %d positions after the panic at the first token", l)
		}
	}()
	_, _ = m.GenerateFunc(nil, c, ref.GreedyPrompt, GenerateOptions{MaxTokens: 8}, func(Token) bool { panic("boom") })
}

// Embed against transformers' hidden states (tools/make_embedding_fixtures.py).
func TestEmbedMatchesTransformers(t *testing.T) {
	ref, _ := loadReference(t)
	m := loadModel(t)
	raw, err := os.ReadFile(filepath.Join(fixtureDir, "embed_mean_norm.f32"))
	if err != nil {
		t.Fatal(err)
	}
	want := make([]float32, len(raw)/4)
	for i := range want {
		want[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	got := must(m.Embed(nil, ref.Tokens, PoolMean, true))
	if len(got) != int(m.Info().HiddenSize) || relL2(got, want) > 1e-5 {
		t.Fatalf("embed: %d floats, relative L2 %.3e", len(got), relL2(got, want))
	}
	rows := must(m.Embed(context.Background(), ref.Tokens, PoolNone, false))
	if len(rows) != len(ref.Tokens)*int(m.Info().HiddenSize) {
		t.Fatalf("PoolNone: %d floats", len(rows))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Embed(ctx, ref.Tokens, PoolMean, true); !errors.Is(err, ErrAborted) {
		t.Fatalf("cancelled embed: %v", err)
	}
}
