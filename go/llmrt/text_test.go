//go:build llmrt_text

package llmrt

import (
	"errors"
	"strings"
	"testing"
)

func TestTokenizeRoundTrip(t *testing.T) {
	m := loadModel(t)
	const text = "Once upon a time"
	ids := must(m.Tokenize(text, true))
	if len(ids) == 0 || ids[0] != m.Info().BOSToken {
		t.Fatalf("Tokenize with BOS: %v", ids)
	}
	noBOS := must(m.Tokenize(text, false))
	if len(noBOS)+1 != len(ids) {
		t.Errorf("BOS adds %d tokens", len(ids)-len(noBOS))
	}
	if back := must(m.Detokenize(noBOS)); !strings.Contains(back, "upon a time") {
		t.Errorf("round trip gave %q", back)
	}
	// Long text: the BUFFER_TOO_SMALL resize path, both ways.
	long := strings.Repeat("été à la plage, ", 100)
	many := must(m.Tokenize(long, false))
	if back := strings.TrimPrefix(must(m.Detokenize(many)), " "); back != long {
		t.Errorf("long round trip: %d bytes back, want %d", len(back), len(long))
	}
	_, err := m.Detokenize([]uint32{^uint32(0)})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Detokenize(2^32-1): %v, want ErrInvalidArgument", err)
	}
}

func TestSample(t *testing.T) {
	ref, _ := loadReference(t)
	m := loadModel(t)
	p := DefaultSamplerParams()
	if p.TopP != 1 || p.RepetitionPenalty != 1 || p.MinP != 0 || p.TopK != 0 {
		t.Errorf("DefaultSamplerParams: %+v (want top_p 1, penalty 1, min_p 0, top_k 0)", p)
	}
	// Temperature 0 is greedy.
	a, b := must(m.Reserve(0)), must(m.Reserve(0))
	first := Argmax(must(a.Prefill(ref.GreedyPrompt)))
	must(b.Prefill(ref.GreedyPrompt))
	p.Temperature = 0
	s := must(m.Sample([]*Cache{a}, []uint32{first}, p))
	g := must(m.DecodeGreedy([]*Cache{b}, []uint32{first}))
	if s[0] != g[0] || s[0] != ref.GreedyIDs[1] {
		t.Errorf("temperature 0 sampled %d, greedy %d, reference %d", s[0], g[0], ref.GreedyIDs[1])
	}
	// Same seed, same logits: same token; a batch samples every cache.
	p.Temperature, p.Seed = 0.9, 7
	x, y := must(a.Fork()), must(a.Fork())
	out := must(m.Sample([]*Cache{x, y}, []uint32{3, 3}, p))
	if len(out) != 2 || out[0] != out[1] || out[0] >= m.Info().VocabSize {
		t.Errorf("seeded batch sample: %v", out)
	}
	_, err := m.Sample([]*Cache{a}, []uint32{m.Info().VocabSize}, p)
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Sample with token >= vocab: %v", err)
	}
}
