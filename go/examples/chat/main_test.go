package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var fixtures = filepath.Join("..", "..", "..", "tests", "fixtures")

// The example chats on the fixtures (they carry no template: ChatML), undoes a turn,
// reuses the cache's prefix on the next, and stops on a stop string.
func TestChat(t *testing.T) {
	for _, model := range []string{
		filepath.Join(fixtures, "llama_gqa", "llama_gqa.f32.gguf"),
		filepath.Join(fixtures, "qwen2", "qwen2.f32.gguf"),
	} {
		var out bytes.Buffer
		err := run(model, "", []string{"Once upon a time", "/undo", "The cat", "sat on the mat"}, nil, &out, 6, 1, 0, []string{"zz"})
		if err != nil {
			t.Fatalf("%s: %v\n%s", model, err, out.String())
		}
		s := out.String()
		if !strings.Contains(s, "using ChatML") || strings.Contains(s, "nothing to undo") {
			t.Fatalf("%s: %s", model, s)
		}
		kept := regexp.MustCompile(`kept (\d+) of \d+ prompt tokens`).FindAllStringSubmatch(s, -1)
		if len(kept) != 3 || kept[0][1] != "0" || kept[2][1] == "0" {
			t.Fatalf("%s: prefix reuse %v\n%s", model, kept, s)
		}
	}
}
