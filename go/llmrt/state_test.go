package llmrt

import (
	"bytes"
	"errors"
	"hash/crc32"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

func TestSaveLoadCache(t *testing.T) {
	m := loadModel(t)
	ref, _ := loadReference(t)
	c, err := m.Reserve(64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Prefill(ref.Tokens[:19]); err != nil {
		t.Fatal(err)
	}
	state, err := c.Save()
	if err != nil {
		t.Fatal(err)
	}
	if want := 52 + 4*19 + 19*int(m.Info().KVBytesPerPosition); len(state) != want {
		t.Fatalf("state of %d bytes, want %d", len(state), want)
	}
	// The format's own checksum: CRC-32 (IEEE) of everything before it.
	n := len(state) - 4
	if got := crc32.ChecksumIEEE(state[:n]); got != uint32(state[n])|uint32(state[n+1])<<8|uint32(state[n+2])<<16|uint32(state[n+3])<<24 {
		t.Fatalf("trailing checksum is not the CRC-32 of the state")
	}
	d, err := m.LoadCache(state)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Release()
	if l, _ := d.Len(); l != 19 {
		t.Fatalf("loaded length %d", l)
	}
	tok := ref.Tokens[20]
	for step := 0; step < 3; step++ {
		x, err := m.Decode([]*Cache{c}, []uint32{tok})
		if err != nil {
			t.Fatal(err)
		}
		y, err := m.Decode([]*Cache{d}, []uint32{tok})
		if err != nil {
			t.Fatal(err)
		}
		if !sameBits(x[0], y[0]) {
			t.Fatalf("step %d: logits of the loaded cache differ", step)
		}
		tok = Argmax(x[0])
	}
	// The state outlives its cache and its model's load.
	if err := c.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := d.Save()
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != len(state)+3*(4+int(m.Info().KVBytesPerPosition)) {
		t.Fatalf("the loaded cache's state after 3 steps: %d bytes", len(again))
	}
	m2 := loadModel(t)
	e, err := m2.LoadCache(state)
	if err != nil {
		t.Fatal(err)
	}
	_ = e.Release()

	// Refusals: truncated, flipped, empty, another model's; no cache made.
	for _, bad := range [][]byte{state[:len(state)-1], state[:10], nil, flip(state, 200), flip(state, 9)} {
		if got, err := m.LoadCache(bad); !errors.Is(err, ErrInvalidArgument) || got != nil {
			t.Fatalf("damaged state of %d bytes: %v", len(bad), err)
		}
	}
	other, err := Load(filepath.Join("..", "..", "tests", "fixtures", "llama3_rope", "llama3_rope.f32.gguf"),
		&Options{Backend: BackendCPU, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	_, err = other.LoadCache(state)
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "offset 16: model fingerprint") {
		t.Fatalf("another model's state: %v", err)
	}
	if !bytes.Equal(state[:8], []byte("LLMRTKV\x00")) {
		t.Fatalf("magic %q", state[:8])
	}
}

func flip(b []byte, at int) []byte {
	c := append([]byte(nil), b...)
	c[at] ^= 0x40
	return c
}
