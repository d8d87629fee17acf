package llmrt

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var chatFixtures = filepath.Join("..", "..", "tests", "fixtures", "chat")

type chatExpected struct {
	Conversations map[string][]struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"conversations"`
	Templates map[string]map[string]struct {
		Output *string `json:"output"`
		Error  *string `json:"error"`
	} `json:"templates"`
}

// Templates that use no bos/eos strings and no date render, without a model, as
// transformers rendered them (tests/fixtures/chat/expected.json).
func TestApplyChatTemplateMatchesTransformers(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chatFixtures, "expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var exp chatExpected
	if err := json.Unmarshal(raw, &exp); err != nil {
		t.Fatal(err)
	}
	compared := 0
	for _, name := range []string{"Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "Kimi-K2-Instruct.jinja", "GLM-4.6.jinja", "HuggingFaceTB-SmolLM3-3B.jinja"} {
		src, err := os.ReadFile(filepath.Join(chatFixtures, "templates", name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(src), "bos_token") || strings.Contains(string(src), "eos_token") || strings.Contains(string(src), "strftime") {
			t.Fatalf("%s uses bos/eos or the date: pick another", name)
		}
		for key, want := range exp.Templates[name] {
			conv, gen, _ := strings.Cut(key, "/")
			var msgs []ChatMessage
			for _, m := range exp.Conversations[conv] {
				msgs = append(msgs, ChatMessage{Role: m.Role, Content: m.Content})
			}
			got, err := ApplyChatTemplate(string(src), msgs, gen == "gen")
			if want.Output == nil {
				// The reference raised: so must llmrt, with the template's line.
				if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "chat template line") {
					t.Errorf("%s %s: reference raised %s, got %q, %v", name, key, *want.Error, got, err)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s %s: %v", name, key, err)
			} else if got != *want.Output {
				t.Errorf("%s %s:\n got %q\nwant %q", name, key, got, *want.Output)
			}
			compared++
		}
	}
	if compared < 30 {
		t.Fatalf("only %d renderings compared", compared)
	}
}

func TestChatWithModel(t *testing.T) {
	m := loadModel(t)
	// The fixture carries no chat template.
	if _, err := m.ChatApply([]ChatMessage{{"user", "hi"}}, true); !errors.Is(err, ErrUnsupported) {
		t.Errorf("ChatApply without a template: %v, want ErrUnsupported", err)
	}
	if _, err := m.ChatTemplate(); !errors.Is(err, ErrUnsupported) {
		t.Errorf("ChatTemplate: %v, want ErrUnsupported", err)
	}
	got := must(m.ChatApplyTemplate("{{ bos_token }}{% for m in messages %}[{{ m.role }}: {{ m.content }}]{% endfor %}{{ eos_token }}",
		[]ChatMessage{{"user", "héllo"}, {"assistant", strings.Repeat("x", 3000)}}, false))
	if want := "<s>[user: héllo][assistant: " + strings.Repeat("x", 3000) + "]</s>"; got != want {
		t.Errorf("ChatApplyTemplate: %q", got[:40])
	}
	_, err := m.ChatApplyTemplate("line 1\n{{ raise_exception('no ' + messages[0].role) }}", []ChatMessage{{"user", "x"}}, true)
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "no user") {
		t.Errorf("raising template: %v", err)
	}
	eog := must(m.EOGTokens())
	eos := m.Info().EOSToken
	if len(eog) != 1 || eog[0] != eos || !m.IsEOG(eos) || m.IsEOG(eos+1) {
		t.Errorf("EOGTokens %v, eos %d", eog, eos)
	}
}

func TestStopMatcher(t *testing.T) {
	stops := []string{"<|im_end|>", "\nUser:", "日本"}
	text := "Grüße\nUse 🙂 こんにちは日本語<|im_end|>"
	want := "Grüße\nUse 🙂 こんにちは"
	for cut := 0; cut <= len(text); cut++ {
		sm := must(NewStopMatcher(stops))
		var shown []byte
		stop := NoStop
		for _, piece := range [][]byte{[]byte(text[:cut]), []byte(text[cut:])} {
			out, s, err := sm.Feed(piece)
			if err != nil {
				t.Fatal(err)
			}
			if !isUTF8(out) {
				t.Fatalf("cut %d: chunk %q splits a character", cut, out)
			}
			shown = append(shown, out...)
			if s != NoStop {
				stop = s
			}
		}
		rest := must(sm.Flush())
		shown = append(shown, rest...)
		if string(shown) != want || stop != 2 {
			t.Fatalf("cut %d: shown %q stop %d", cut, shown, stop)
		}
		_ = sm.Close()
		if _, _, err := sm.Feed([]byte("x")); err == nil {
			t.Fatal("Feed after Close succeeded")
		}
	}
	// A prefix of a stop string at the end is held, then flushed.
	sm := must(NewStopMatcher([]string{"</s>"}))
	defer sm.Close()
	out, s, _ := sm.Feed([]byte("ok </"))
	if string(out) != "ok " || s != NoStop {
		t.Errorf("Feed: %q %d", out, s)
	}
	if rest := must(sm.Flush()); string(rest) != "</" {
		t.Errorf("Flush: %q", rest)
	}
	if _, err := NewStopMatcher([]string{"a", ""}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "stop string 1 is empty") {
		t.Errorf("empty stop string: %v", err)
	}
}

func isUTF8(b []byte) bool { return strings.ToValidUTF8(string(b), "\uFFFD") == string(b) }
