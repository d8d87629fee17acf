package llmrt

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// 8 goroutines share one model, each with its own caches: reserve, prefill,
// greedy decode (checked against the reference), fork, batched decode, release.
// Run under -race by `make go-test`.
func TestConcurrentGoroutines(t *testing.T) {
	ref, _ := loadReference(t)
	m := loadModel(t)
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			errs <- worker(m, ref, w)
		}(w)
	}
	// Info and Version from yet another goroutine meanwhile.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 100; i++ {
			if m.Info().VocabSize != ref.VocabSize || Version() == "" {
				errs <- fmt.Errorf("Info/Version changed under load")
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func worker(m *Model, ref reference, w int) error {
	for round := 0; round < 3; round++ {
		c, err := m.Reserve(uint32(len(ref.GreedyPrompt) + len(ref.GreedyIDs) + 2))
		if err != nil {
			return fmt.Errorf("worker %d: %w", w, err)
		}
		logits, err := c.Prefill(ref.GreedyPrompt)
		if err != nil {
			return fmt.Errorf("worker %d: prefill: %w", w, err)
		}
		cur := Argmax(logits)
		for i, want := range ref.GreedyIDs[:12] {
			if cur != want {
				return fmt.Errorf("worker %d round %d: greedy step %d: %d, want %d", w, round, i, cur, want)
			}
			next, err := m.DecodeGreedy([]*Cache{c}, []uint32{cur})
			if err != nil {
				return fmt.Errorf("worker %d: decode: %w", w, err)
			}
			cur = next[0]
		}
		f, err := c.Fork()
		if err != nil {
			return fmt.Errorf("worker %d: fork: %w", w, err)
		}
		rows, err := m.Decode([]*Cache{c, f}, []uint32{cur, cur})
		if err != nil {
			return fmt.Errorf("worker %d: batched decode: %w", w, err)
		}
		if relL2(rows[0], rows[1]) > 1e-5 {
			return fmt.Errorf("worker %d: a cache and its fork disagree", w)
		}
		if err := f.Release(); err != nil {
			return err
		}
		if err := c.Release(); err != nil {
			return err
		}
		runtime.Gosched()
	}
	return nil
}

// Close while other goroutines are mid-call: each call either works or reports
// ErrClosed; nothing crashes or races.
func TestCloseWhileInUse(t *testing.T) {
	m := loadModel(t)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < 200; i++ {
				c, err := m.Reserve(4)
				if err == nil {
					_, err = c.Prefill([]uint32{1, 2})
				}
				if err == nil {
					err = c.Release()
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("before Close: %v", err)
					return
				}
			}
		}()
	}
	close(start)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// Unreachable caches and models are freed by their finalizers.
func TestFinalizers(t *testing.T) {
	func() {
		m, err := Load(modelPath(), &Options{Backend: BackendCPU, Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 4; i++ {
			if _, err := m.Reserve(4); err != nil {
				t.Fatal(err)
			}
		}
	}()
	for i := 0; i < 3; i++ {
		runtime.GC()
	}
}
