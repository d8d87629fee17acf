package llmrt

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var sentinels = map[Status]error{
	StatusInvalidArgument: ErrInvalidArgument,
	StatusIO:              ErrIO,
	StatusBadModel:        ErrBadModel,
	StatusUnsupported:     ErrUnsupported,
	StatusOutOfMemory:     ErrOutOfMemory,
	StatusContextFull:     ErrContextFull,
	StatusUnknownCache:    ErrUnknownCache,
	StatusDevice:          ErrDevice,
	StatusInternal:        ErrInternal,
	StatusBufferTooSmall:  ErrBufferTooSmall,
	StatusAborted:         ErrAborted,
}

// Each status maps to its sentinel and no other; names are the C library's, and
// the C library knows exactly the statuses declared here (OK and the sentinels).
func TestStatusMapping(t *testing.T) {
	for s := Status(-1); s <= Status(len(sentinels)+1); s++ {
		_, declared := sentinels[s]
		declared = declared || s == StatusOK
		got := s.String()
		if known := got != "LLMRT_UNKNOWN_STATUS"; known != declared || !strings.HasPrefix(got, "LLMRT_") {
			t.Errorf("Status(%d).String() = %s; declared in Go: %v", s, got, declared)
		}
	}
	if StatusOK.String() != "LLMRT_OK" || StatusIO.String() != "LLMRT_IO" {
		t.Errorf("names: %s %s", StatusOK, StatusIO)
	}
	for s, sentinel := range sentinels {
		err := error(&Error{Status: s, Msg: "m"})
		for s2, other := range sentinels {
			if errors.Is(err, other) != (s == s2) {
				t.Errorf("errors.Is(%v, %v) = %v", err, other, s != s2)
			}
		}
		if !strings.Contains(err.Error(), s.String()) || !strings.Contains(err.Error(), "m") {
			t.Errorf("Error() = %q", err.Error())
		}
		if sentinel.(*Error).Status != s {
			t.Errorf("sentinel for %v has status %v", s, sentinel.(*Error).Status)
		}
	}
}

// wantErr checks err matches sentinel, is an *Error with a message, and (when
// needle is set) that the message names it.
func wantErr(t *testing.T, what string, err error, sentinel error, needle string) {
	t.Helper()
	var e *Error
	switch {
	case err == nil:
		t.Errorf("%s: no error, want %v", what, sentinel)
	case !errors.Is(err, sentinel):
		t.Errorf("%s: %v, want %v", what, err, sentinel)
	case !errors.As(err, &e) || e.Msg == "":
		t.Errorf("%s: %v is not an *Error with a message", what, err)
	case needle != "" && !strings.Contains(e.Msg, needle):
		t.Errorf("%s: message %q does not name %q", what, e.Msg, needle)
	}
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.gguf")
	_, err := Load(missing, nil)
	wantErr(t, "missing file", err, ErrIO, "missing.gguf")
	_, err = Load(dir, nil)
	wantErr(t, "directory", err, ErrIO, "")
	junk := filepath.Join(dir, "junk.gguf")
	if err := os.WriteFile(junk, []byte("this is not a GGUF file, just some bytes......"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(junk, nil)
	wantErr(t, "random bytes", err, ErrBadModel, "")
	_, err = Load(modelPath(), &Options{Backend: BackendCUDA})
	if !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrDevice) && err != nil {
		t.Errorf("CUDA backend: %v, want ErrUnsupported / ErrDevice or success", err)
	}

	m := loadModel(t)
	info := m.Info()
	V := info.VocabSize

	_, err = m.Reserve(info.ContextLength + 1)
	wantErr(t, "reserve over context", err, ErrContextFull, "")

	c := must(m.Reserve(8))
	_, err = c.Prefill([]uint32{1, V, 2})
	wantErr(t, "token >= vocab", err, ErrInvalidArgument, "token")
	_, err = m.Decode([]*Cache{c}, []uint32{^uint32(0)})
	wantErr(t, "token 2^32-1", err, ErrInvalidArgument, "")
	_, err = m.DecodeGreedy([]*Cache{c}, []uint32{V})
	wantErr(t, "greedy token >= vocab", err, ErrInvalidArgument, "")
	_, err = c.Prefill(nil)
	wantErr(t, "empty prefill", err, ErrInvalidArgument, "")
	_, err = c.PrefillAll([]uint32{})
	wantErr(t, "empty prefill_all", err, ErrInvalidArgument, "")
	_, err = m.Decode(nil, nil)
	wantErr(t, "empty decode", err, ErrInvalidArgument, "")
	_, err = m.Decode([]*Cache{c}, []uint32{1, 2})
	wantErr(t, "mismatched batch", err, ErrInvalidArgument, "")
	_, err = m.DecodeGreedy([]*Cache{nil}, []uint32{1})
	wantErr(t, "nil cache", err, ErrInvalidArgument, "")
	_, err = m.Decode([]*Cache{c, c}, []uint32{1, 2})
	wantErr(t, "same cache twice in a batch", err, ErrInvalidArgument, "")
	if n := must(c.Len()); n != 0 {
		t.Errorf("failed steps advanced the cache to %d", n)
	}
	must(c.Prefill([]uint32{1, 2, 3, 4, 5, 6}))
	_, err = c.Prefill([]uint32{1, 2, 3})
	wantErr(t, "past the reserved positions", err, ErrContextFull, "")
	wantErr(t, "truncate past the length", c.Truncate(7), ErrInvalidArgument, "")

	// Unknown caches: released, released twice, another model's.
	dead := must(m.Reserve(4))
	if err := dead.Release(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "second release", dead.Release(), ErrUnknownCache, "")
	_, err = dead.Prefill([]uint32{1})
	wantErr(t, "prefill on a released cache", err, ErrUnknownCache, "")
	_, err = dead.Len()
	wantErr(t, "length of a released cache", err, ErrUnknownCache, "")
	_, err = dead.Fork()
	wantErr(t, "fork of a released cache", err, ErrUnknownCache, "")
	m2 := loadModel(t)
	other := must(m2.Reserve(4))
	_, err = m.Decode([]*Cache{other}, []uint32{1})
	wantErr(t, "another model's cache", err, ErrUnknownCache, "")

	// KV pool exhausted.
	small, err := Load(modelPath(), &Options{Backend: BackendCPU, Threads: 1,
		KVCacheBytes: 4 * info.KVBytesPerPosition})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	_, err = small.Reserve(info.ContextLength)
	wantErr(t, "KV pool exhausted", err, ErrOutOfMemory, "")

	// A closed model: ErrClosed, which is also ErrInvalidArgument.
	if err := m2.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = m2.Reserve(4)
	wantErr(t, "reserve on a closed model", err, ErrInvalidArgument, "closed")
	if !errors.Is(err, ErrClosed) {
		t.Errorf("closed model: %v does not match ErrClosed", err)
	}
	_, err = other.Len()
	if !errors.Is(err, ErrClosed) {
		t.Errorf("cache of a closed model: %v", err)
	}
	if err := other.Release(); !errors.Is(err, ErrClosed) {
		t.Errorf("Release after Close: %v", err)
	}
	var nilModel *Model
	_, err = nilModel.Reserve(1)
	wantErr(t, "nil model", err, ErrInvalidArgument, "")
}
