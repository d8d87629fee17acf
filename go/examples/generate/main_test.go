package main

import (
	"path/filepath"
	"testing"

	"github.com/llmrt/llmrt/go/llmrt"
)

var fixtures = filepath.Join("..", "..", "..", "tests", "fixtures")

// The example runs on the fixtures: ids and greedy, a text prompt with the
// library's default sampling, and a byte-level BPE model.
func TestRun(t *testing.T) {
	model := filepath.Join(fixtures, "llama_gqa", "llama_gqa.f32.gguf")
	if err := run(model, "", "211,15,197", 8, 1, sampling{topP: 1, repeatPenalty: 1}); err != nil {
		t.Fatal(err)
	}
	d := llmrt.DefaultSamplerParams()
	s := sampling{temp: float64(d.Temperature), topK: uint(d.TopK), topP: float64(d.TopP),
		minP: float64(d.MinP), repeatPenalty: float64(d.RepetitionPenalty), seed: 7}
	if err := run(model, "Once upon a time", "", 8, 1, s); err != nil {
		t.Fatal(err)
	}
	qwen := filepath.Join(fixtures, "qwen2", "qwen2.f32.gguf")
	if err := run(qwen, "Hello world", "", 8, 1, s); err != nil {
		t.Fatal(err)
	}
}

func TestCompleteUTF8(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"", 0}, {"abc", 3}, {"caf\xc3", 3}, {"caf\xc3\xa9", 5}, {"\xe4\xbd", 0},
		{"a\xe4\xbd\xa0", 4}, {"a\xf0\x9f\x98", 1}, {"a\xf0\x9f\x98\x80", 5}, {"\xff", 1},
	} {
		if got := completeUTF8([]byte(c.in)); got != c.want {
			t.Errorf("completeUTF8(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}
