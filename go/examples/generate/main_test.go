package main

import (
	"path/filepath"
	"testing"
)

// The example runs on the fixture (ids and greedy: works with or without the text API).
func TestRun(t *testing.T) {
	model := filepath.Join("..", "..", "..", "tests", "fixtures", "llama_gqa", "llama_gqa.f32.gguf")
	if err := run(model, "", "211,15,197", 8, 1, sampling{topP: 1, repeatPenalty: 1}); err != nil {
		t.Fatal(err)
	}
}
