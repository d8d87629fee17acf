// chat: a multi-turn chat with the Go binding.
//
//	go run ./examples/chat [-n 48] [-t 0] [-temp 0] [-template FILE] [-stop "\n\n"] MODEL.gguf [TURN ...]
//
// Each turn renders the whole conversation with the model's chat template
// (Model.ChatApply; -template FILE another Jinja template; a model without one falls
// back to ChatML), keeps the longest prefix the cache already holds (Cache.Truncate),
// and streams the answer from Model.GenerateFunc, which stops at the model's
// end-of-generation ids; -stop strings end it too (StopMatcher holds back text that
// may begin one). Ctrl-C cancels the answer being generated (a context.Context
// through the abort callback) and the chat goes on. Turns come from the command line
// when given, else one per line from stdin; "/quit" ends.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/llmrt/llmrt/go/llmrt"
)

const chatML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
	"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

func main() {
	n := flag.Uint("n", 48, "most tokens per answer")
	threads := flag.Uint("t", 0, "CPU threads (0 = all)")
	temp := flag.Float64("temp", 0, "temperature (0 = greedy)")
	tmplFile := flag.String("template", "", "a Jinja chat template file (default: the model's own)")
	var stops multi
	flag.Var(&stops, "stop", "a stop string (repeatable)")
	flag.Parse()
	if flag.NArg() < 1 || *n == 0 {
		fmt.Fprintln(os.Stderr, "usage: chat [flags] MODEL.gguf [TURN ...]")
		os.Exit(2)
	}
	var turns []string
	if flag.NArg() > 1 {
		turns = flag.Args()[1:]
	}
	if err := run(flag.Arg(0), *tmplFile, turns, os.Stdin, os.Stdout, uint32(*n), uint32(*threads), float32(*temp), stops); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

type chat struct {
	m        *llmrt.Model
	c        *llmrt.Cache
	template string // "" = the model's
	held     []uint32
	messages []llmrt.ChatMessage
	opts     llmrt.GenerateOptions
	stops    []string
	out      io.Writer
}

func run(path, tmplFile string, turns []string, in io.Reader, out io.Writer, n, threads uint32, temp float32, stops []string) error {
	m, err := llmrt.Load(path, &llmrt.Options{Threads: threads})
	if err != nil {
		return err
	}
	defer m.Close()
	ch := &chat{m: m, out: out, stops: stops, opts: llmrt.GenerateOptions{MaxTokens: n}}
	if temp > 0 {
		s := llmrt.DefaultSamplerParams()
		s.Temperature = temp
		ch.opts.Sampler = &s
	}
	if tmplFile != "" {
		b, err := os.ReadFile(tmplFile)
		if err != nil {
			return err
		}
		ch.template = string(b)
	} else if _, err := m.ChatApply([]llmrt.ChatMessage{{Role: "user", Content: "hi"}}, true); err != nil {
		fmt.Fprintf(out, "[no chat template in the model (%v): using ChatML]\n", err)
		ch.template = chatML
	}
	if ch.c, err = m.Reserve(0); err != nil {
		return err
	}
	defer ch.c.Release()
	info := m.Info()
	fmt.Fprintf(out, "llmrt %s | %s | %s | /undo, /quit\n", llmrt.Version(), info.Architecture, info.DeviceName)
	handle := func(line string) error {
		fmt.Fprintf(out, "you: %s\n", line)
		switch {
		case line == "/undo":
			if len(ch.messages) < 2 {
				fmt.Fprintln(out, "[nothing to undo]")
			} else {
				ch.messages = ch.messages[:len(ch.messages)-2]
			}
			return nil
		case line == "":
			return nil
		}
		return ch.turn(line)
	}
	if len(turns) > 0 {
		for _, t := range turns {
			if t == "/quit" {
				break
			}
			if err := handle(t); err != nil {
				return err
			}
		}
		return nil
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() && sc.Text() != "/quit" {
		if err := handle(sc.Text()); err != nil {
			return err
		}
	}
	return sc.Err()
}

func (ch *chat) render() (string, error) {
	if ch.template == "" {
		return ch.m.ChatApply(ch.messages, true)
	}
	return ch.m.ChatApplyTemplate(ch.template, ch.messages, true)
}

func (ch *chat) turn(line string) error {
	ch.messages = append(ch.messages, llmrt.ChatMessage{Role: "user", Content: line})
	prompt, err := ch.render()
	if err != nil {
		return err
	}
	// As transformers does: no BOS added (templates that need one write it).
	want, err := ch.m.Tokenize(prompt, false)
	if err != nil {
		return err
	}
	if len(want)+int(ch.opts.MaxTokens) > int(ch.m.Info().ContextLength) {
		ch.messages = ch.messages[:len(ch.messages)-1]
		fmt.Fprintln(ch.out, "[context full: /undo or restart]")
		return nil
	}
	keep := 0
	for keep < len(ch.held) && keep+1 < len(want) && ch.held[keep] == want[keep] {
		keep++
	}
	if err := ch.c.Truncate(uint32(keep)); err != nil {
		return err
	}
	var sm *llmrt.StopMatcher
	if len(ch.stops) > 0 {
		if sm, err = llmrt.NewStopMatcher(ch.stops); err != nil {
			return err
		}
		defer sm.Close()
	}
	// Ctrl-C cancels this answer only.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var answer strings.Builder
	fmt.Fprint(ch.out, "> ")
	var feedErr error
	g, err := ch.m.GenerateFunc(ctx, ch.c, want[keep:], ch.opts, func(t llmrt.Token) bool {
		if sm == nil {
			answer.WriteString(t.Piece)
			fmt.Fprint(ch.out, t.Piece)
			return true
		}
		text, hit, err := sm.Feed([]byte(t.Piece))
		answer.Write(text)
		fmt.Fprint(ch.out, string(text))
		if err != nil {
			feedErr = err
			return false
		}
		return hit < 0
	})
	if sm != nil && feedErr == nil && (err != nil || g.Reason != llmrt.StopCallback) {
		if rest, ferr := sm.Flush(); ferr == nil {
			answer.Write(rest)
			fmt.Fprint(ch.out, string(rest))
		}
	}
	switch {
	case feedErr != nil:
		return feedErr
	case errors.Is(err, context.Canceled):
		fmt.Fprintf(ch.out, "\n[cancelled after %d tokens]\n", len(g.Tokens))
	case err != nil:
		return err
	default:
		fmt.Fprintf(ch.out, "\n[%d tokens, %v, kept %d of %d prompt tokens]\n", len(g.Tokens), g.Reason, keep, len(want))
	}
	// The cache holds the prompt and every generated token but the last (also after a
	// cancelled step, which committed nothing).
	ch.held = append([]uint32{}, want...)
	if len(g.Tokens) > 0 {
		ch.held = append(ch.held, g.Tokens[:len(g.Tokens)-1]...)
	}
	ch.messages = append(ch.messages, llmrt.ChatMessage{Role: "assistant", Content: strings.ToValidUTF8(answer.String(), "\uFFFD")})
	return nil
}
