package llmrt

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
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
	for i, id := range noBOS {
		if ids[i+1] != id {
			t.Fatalf("Tokenize with BOS %v is not BOS + %v", ids, noBOS)
		}
	}
	if back := must(m.Detokenize(noBOS)); back != text {
		t.Errorf("round trip gave %q", back)
	}
	if back := must(m.Detokenize(ids)); back != text {
		t.Errorf("round trip with BOS gave %q", back)
	}
	// Long text: the BUFFER_TOO_SMALL resize path, both ways.
	long := strings.Repeat("été à la plage, ", 100)
	many := must(m.Tokenize(long, false))
	if back := must(m.Detokenize(many)); back != long {
		t.Errorf("long round trip: %d bytes back, want %d", len(back), len(long))
	}
	_, err := m.Detokenize([]uint32{^uint32(0)})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Detokenize(2^32-1): %v, want ErrInvalidArgument", err)
	}
	_, err = m.TokenPiece(m.Info().VocabSize)
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("TokenPiece(vocab): %v, want ErrInvalidArgument", err)
	}
	_, err = m.Tokenize("a\xffb", false)
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Tokenize(invalid UTF-8): %v, want ErrInvalidArgument", err)
	}
	for _, special := range []uint32{m.Info().BOSToken, m.Info().EOSToken} {
		if p := must(m.TokenPiece(special)); p != "" {
			t.Errorf("TokenPiece(%d) (control) = %q, want \"\"", special, p)
		}
	}
}

// The pieces of a tokenized sentence concatenate to the sentence as it appears
// inside a text: " " + sentence for SentencePiece (llama_gqa: the dummy-prefix
// space), the sentence itself for byte-level BPE (qwen2). Detokenize gives back
// the text it was tokenized from, with BOS or without.
func TestTokenPieces(t *testing.T) {
	sentences := []string{
		"The quick brown fox jumps over the lazy dog.",
		"Hello, world!  Two spaces,\ttab and\nnewline.",
		"café naïve 你好 😀 done",
	}
	for _, fx := range []struct{ path, prefix string }{
		{modelPath(), " "},
		{filepath.Join(fixtureDir, "..", "qwen2", "qwen2.f32.gguf"), ""},
	} {
		m, err := Load(fx.path, &Options{Backend: BackendCPU, Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sentences {
			var b strings.Builder
			for _, id := range must(m.Tokenize(s, false)) {
				b.WriteString(must(m.TokenPiece(id)))
			}
			if got := b.String(); got != fx.prefix+s {
				t.Errorf("%s: pieces of %q give %q, want %q", fx.path, s, got, fx.prefix+s)
			}
			withBOS := must(m.Tokenize(s, true))
			if back := must(m.Detokenize(withBOS)); back != s {
				t.Errorf("%s: Detokenize(Tokenize(%q, true)) = %q", fx.path, s, back)
			}
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSample(t *testing.T) {
	ref, _ := loadReference(t)
	m := loadModel(t)
	p := DefaultSamplerParams()
	want := SamplerParams{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, RepetitionPenalty: 1, Seed: 0, PenaltyLastN: -1}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("DefaultSamplerParams: %+v, want llama.cpp's %+v", p, want)
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
	// Invalid parameters: an error, and the cache does not advance.
	before := must(a.Len())
	for _, bad := range []SamplerParams{
		{Temperature: -1, TopP: 1, RepetitionPenalty: 1},
		{Temperature: 0.8, TopP: 0, RepetitionPenalty: 1},
		{Temperature: 0.8, TopP: 1.5, RepetitionPenalty: 1},
		{Temperature: 0.8, TopP: 1, MinP: 1, RepetitionPenalty: 1},
		{Temperature: 0.8, TopP: 1, RepetitionPenalty: 0},
	} {
		if _, err := m.Sample([]*Cache{a}, []uint32{3}, bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Sample(%+v): %v, want ErrInvalidArgument", bad, err)
		}
	}
	if after := must(a.Len()); after != before {
		t.Errorf("rejected samples moved the cache from %d to %d positions", before, after)
	}
}

// TokenizeEx against HF tokenizers (tests/fixtures/tokenizer/special.json, qwen2).
func TestTokenizeExParseSpecial(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "tests", "fixtures", "tokenizer", "special.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Tokenizers []struct {
			Name  string
			Cases []struct {
				Text     string
				IdsParse []uint32 `json:"ids_parse"`
				IdsText  []uint32 `json:"ids_text"`
			}
		}
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	m, err := Load(filepath.Join("..", "..", "tests", "fixtures", "qwen2", "qwen2.f32.gguf"), &Options{Backend: BackendCPU, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	n := 0
	for _, tk := range doc.Tokenizers {
		if tk.Name != "qwen2" {
			continue
		}
		for _, c := range tk.Cases {
			for _, ps := range []bool{true, false} {
				want := c.IdsText
				if ps {
					want = c.IdsParse
				}
				got, err := m.TokenizeEx(c.Text, false, ps)
				if err != nil || !reflect.DeepEqual(got, want) {
					t.Errorf("%q parseSpecial %v: %v %v, want %v", c.Text, ps, got, err, want)
				}
			}
			n++
		}
	}
	if n < 5 {
		t.Fatalf("%d qwen2 cases", n)
	}
}
