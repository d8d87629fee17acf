// generate: text generation with the Go binding.
//
//	go run ./examples/generate [-p "Once upon a time" | -i 1,2,3] [-n 32] [-t 0]
//	    [-temp 0.8 -top-k 40 -top-p 0.95 -min-p 0.05 -repeat-penalty 1.1 -seed 1] MODEL.gguf
//
// Greedy unless -temp > 0 (or -repeat-penalty != 1); the other sampling flags
// default to the library's (llama.cpp's) values. Generated tokens are streamed
// as text (Model.TokenPiece), or as ids for a model without a tokenizer.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/llmrt/llmrt/go/llmrt"
)

type sampling struct {
	temp, topP, minP, repeatPenalty float64
	topK                            uint
	seed                            uint64
}

func (s sampling) greedy() bool { return s.temp == 0 && s.repeatPenalty == 1 }

func main() {
	text := flag.String("p", "", "text prompt (default \"Once upon a time\")")
	ids := flag.String("i", "", "prompt as comma-separated token ids")
	n := flag.Uint("n", 32, "tokens to generate")
	threads := flag.Uint("t", 0, "CPU threads (0 = all)")
	var s sampling
	d := llmrt.DefaultSamplerParams()
	flag.Float64Var(&s.temp, "temp", 0, "temperature (0 = greedy)")
	flag.UintVar(&s.topK, "top-k", uint(d.TopK), "top-k (0 = off)")
	flag.Float64Var(&s.topP, "top-p", float64(d.TopP), "top-p (1 = off)")
	flag.Float64Var(&s.minP, "min-p", float64(d.MinP), "min-p (0 = off)")
	flag.Float64Var(&s.repeatPenalty, "repeat-penalty", float64(d.RepetitionPenalty),
		"repetition penalty (1 = off)")
	flag.Uint64Var(&s.seed, "seed", d.Seed, "sampling seed")
	flag.Parse()
	if flag.NArg() != 1 || (*text != "" && *ids != "") {
		fmt.Fprintln(os.Stderr, "usage: generate [flags] MODEL.gguf")
		flag.PrintDefaults()
		os.Exit(1)
	}
	if err := run(flag.Arg(0), *text, *ids, uint32(*n), uint32(*threads), s); err != nil {
		fmt.Fprintln(os.Stderr, "\nerror:", err)
		os.Exit(1)
	}
}

func run(path, text, idList string, n, threads uint32, s sampling) error {
	t0 := time.Now()
	m, err := llmrt.Load(path, &llmrt.Options{Threads: threads, Progress: func(f float32) {
		fmt.Fprintf(os.Stderr, "\rloading %3.0f%%", f*100)
	}})
	if err != nil {
		return err
	}
	defer m.Close()
	info := m.Info()
	fmt.Fprintln(os.Stderr)
	fmt.Printf("llmrt %s | %s | %s | loaded in %.2f s\n", llmrt.Version(), path, info.DeviceName,
		time.Since(t0).Seconds())

	var prompt []uint32
	switch {
	case idList != "":
		for _, f := range strings.Split(idList, ",") {
			v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
			if err != nil {
				return fmt.Errorf("-i: %v", err)
			}
			prompt = append(prompt, uint32(v))
		}
	default:
		if prompt, err = tokenize(m, text); err != nil {
			return err
		}
	}
	fmt.Println("prompt:", prompt)

	c, err := m.Reserve(uint32(len(prompt)) + n)
	if err != nil {
		return err
	}
	defer c.Release()
	out := newPrinter(m)
	tp := time.Now()
	logits, err := c.Prefill(prompt)
	if err != nil {
		return err
	}
	prefill := time.Since(tp)
	cur := llmrt.Argmax(logits) // greedy first token; sampling resamples below
	fmt.Print("output:")
	td := time.Now()
	decoded := 0
	for i := uint32(0); i < n; i++ {
		if i > 0 || !s.greedy() {
			var next []uint32
			if s.greedy() {
				next, err = m.DecodeGreedy([]*llmrt.Cache{c}, []uint32{cur})
			} else {
				if i == 0 { // sample the first token too: rewind and feed the last prompt token
					if err = c.Truncate(uint32(len(prompt) - 1)); err != nil {
						return err
					}
					cur = prompt[len(prompt)-1]
				}
				next, err = sample(m, c, cur, s)
			}
			if err != nil {
				return err
			}
			decoded++
			cur = next[0]
		}
		if out.text && cur == info.EOSToken {
			break
		}
		if err := out.token(cur); err != nil {
			return err
		}
	}
	out.flush()
	fmt.Println()
	fmt.Printf("prefill: %d tokens in %.3f s (%.1f tokens/s)\n", len(prompt), prefill.Seconds(),
		float64(len(prompt))/prefill.Seconds())
	if decoded > 0 {
		d := time.Since(td)
		fmt.Printf("decode:  %d tokens in %.3f s (%.1f tokens/s)\n", decoded, d.Seconds(),
			float64(decoded)/d.Seconds())
	}
	return nil
}
