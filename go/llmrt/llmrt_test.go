package llmrt

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// The llama_gqa fixture and its transformers reference (tests/fixtures/README.md).
var fixtureDir = filepath.Join("..", "..", "tests", "fixtures", "llama_gqa")

type reference struct {
	VocabSize    uint32   `json:"vocab_size"`
	Architecture string   `json:"architecture"`
	Tokens       []uint32 `json:"tokens"`
	GreedyPrompt []uint32 `json:"greedy_prompt"`
	GreedyIDs    []uint32 `json:"greedy_ids"`
}

func loadReference(t testing.TB) (reference, []float32) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(fixtureDir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref reference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(fixtureDir, "logits.f32"))
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != len(ref.Tokens)*int(ref.VocabSize)*4 {
		t.Fatalf("logits.f32: %d bytes for %d tokens x %d", len(raw), len(ref.Tokens), ref.VocabSize)
	}
	logits := make([]float32, len(raw)/4)
	for i := range logits {
		logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return ref, logits
}

func modelPath() string { return filepath.Join(fixtureDir, "llama_gqa.f32.gguf") }

// CPU, two threads: the tests are about the binding, and must agree everywhere.
func loadModel(t testing.TB) *Model {
	t.Helper()
	m, err := Load(modelPath(), &Options{Backend: BackendCPU, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func relL2(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(num / den)
}

// must unwraps (value, error), panicking on an error (the test fails with the
// error and its stack).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestHappyPath(t *testing.T) {
	ref, refLogits := loadReference(t)
	var fractions []float32
	m, err := Load(modelPath(), &Options{Backend: BackendCPU, Threads: 2,
		Progress: func(f float32) { fractions = append(fractions, f) }})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if len(fractions) == 0 || fractions[len(fractions)-1] != 1 {
		t.Errorf("progress callback: %v", fractions)
	}
	info := m.Info()
	if info.VocabSize != ref.VocabSize || info.Architecture != ref.Architecture {
		t.Fatalf("info %+v, reference vocab %d arch %s", info, ref.VocabSize, ref.Architecture)
	}
	if info.Backend != BackendCPU || info.DeviceName == "" || info.NKVHeads >= info.NHeads {
		t.Errorf("info %+v", info)
	}
	if Version() == "" {
		t.Error("empty Version()")
	}
	V := int(info.VocabSize)
	n := len(ref.Tokens)

	// Prefill: the last prompt token's logits against transformers.
	c := must(m.Reserve(0))
	last := must(c.Prefill(ref.Tokens))
	if e := relL2(last, refLogits[(n-1)*V:]); e >= 1e-4 {
		t.Errorf("prefill last logits: rel L2 %.3g >= 1e-4", e)
	} else {
		t.Logf("prefill last logits: rel L2 %.3g", e)
	}
	if l := must(c.Len()); l != uint32(n) {
		t.Errorf("Len %d after prefilling %d", l, n)
	}

	// PrefillAll: every row.
	c2 := must(m.Reserve(uint32(n + 8)))
	all := must(c2.PrefillAll(ref.Tokens))
	for i, row := range all {
		if e := relL2(row, refLogits[i*V:(i+1)*V]); e >= 1e-4 {
			t.Errorf("prefill_all row %d: rel L2 %.3g", i, e)
		}
	}

	// Fork, then one batched Decode over the cache, its twin and the fork.
	t0 := Argmax(last)
	f := must(c2.Fork())
	if f.ID() == c2.ID() || must(f.Len()) != uint32(n) {
		t.Errorf("fork id %d len %d", f.ID(), must(f.Len()))
	}
	rows := must(m.Decode([]*Cache{c, c2, f}, []uint32{t0, t0, (t0 + 1) % uint32(V)}))
	if len(rows) != 3 || len(rows[0]) != V {
		t.Fatalf("Decode gave %d rows", len(rows))
	}
	if e := relL2(rows[0], rows[1]); e > 1e-5 {
		t.Errorf("twin caches, same token: rows differ by %.3g", e)
	}
	if e := relL2(rows[2], rows[1]); e < 1e-3 {
		t.Errorf("the fork took another token but gave the same logits")
	}

	// DecodeGreedy agrees with the argmax of Decode.
	t1 := Argmax(rows[0])
	g := must(m.DecodeGreedy([]*Cache{c}, []uint32{t1}))
	want := must(m.Decode([]*Cache{c2}, []uint32{t1}))
	if g[0] != Argmax(want[0]) {
		t.Errorf("DecodeGreedy %d, argmax of Decode %d", g[0], Argmax(want[0]))
	}

	// Greedy generation equals transformers' float64 greedy ids.
	gc := must(m.Reserve(uint32(len(ref.GreedyPrompt) + len(ref.GreedyIDs))))
	cur := Argmax(must(gc.Prefill(ref.GreedyPrompt)))
	for i, wantID := range ref.GreedyIDs {
		if cur != wantID {
			t.Fatalf("greedy step %d: %d, transformers %d", i, cur, wantID)
		}
		if i+1 < len(ref.GreedyIDs) {
			cur = must(m.DecodeGreedy([]*Cache{gc}, []uint32{cur}))[0]
		}
	}

	// Truncate and replay the last prompt token.
	if err := c.Truncate(uint32(n - 1)); err != nil {
		t.Fatal(err)
	}
	replay := must(m.Decode([]*Cache{c}, []uint32{ref.Tokens[n-1]}))
	if e := relL2(replay[0], refLogits[(n-1)*V:]); e >= 1e-4 {
		t.Errorf("replay after truncate: rel L2 %.3g", e)
	}

	for _, x := range []*Cache{c, c2, f, gc} {
		if err := x.Release(); err != nil {
			t.Error(err)
		}
	}
	// A cache left live is freed by Close; Close twice is fine.
	must(m.Reserve(4))
	if err := m.Close(); err != nil {
		t.Error(err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// KVWindowOnly reaches the library: on a model with full attention (llama_gqa) it takes
// no effect (Info.KVWindow 0) and truncation stays free. The windowed case is tested in
// tests/sliding_window.rs, on models built there.
func TestKVWindowOnlyWithoutWindows(t *testing.T) {
	m, err := Load(modelPath(), &Options{Backend: BackendCPU, Threads: 1, KVWindowOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if w := m.Info().KVWindow; w != 0 {
		t.Fatalf("KVWindow %d on a model without sliding windows", w)
	}
	c := must(m.Reserve(64))
	if _, err := c.Prefill([]uint32{1, 2, 3, 4, 5}); err != nil {
		t.Fatal(err)
	}
	if err := c.Truncate(1); err != nil {
		t.Fatal(err)
	}
}
