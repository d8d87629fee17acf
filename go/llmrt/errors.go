package llmrt

import (
	"errors"
	"fmt"
)

// Status is an llmrt_status code.
type Status int32

// The llmrt_status codes (docs/API.md). The names, codes and comments are the
// status table of src/error.rs (STATUSES); tests/status_table.rs fails when they drift.
const (
	StatusOK              Status = 0  // Success.
	StatusInvalidArgument Status = 1  // NULL pointer, zero/oversized length, token id >= vocab.
	StatusIO              Status = 2  // File missing, unreadable, not a regular file.
	StatusBadModel        Status = 3  // Malformed, truncated or inconsistent model file.
	StatusUnsupported     Status = 4  // Architecture, tensor type or backend not available.
	StatusOutOfMemory     Status = 5  // Host/device allocation failed, KV pool exhausted.
	StatusContextFull     Status = 6  // Step would exceed the cache's reserved positions.
	StatusUnknownCache    Status = 7  // Cache id not live: released, never issued, other model.
	StatusDevice          Status = 8  // CUDA driver/kernel error.
	StatusInternal        Status = 9  // Caught panic or broken invariant (a bug).
	StatusBufferTooSmall  Status = 10 // Output buffer too small; the needed size is reported.
	StatusAborted         Status = 11 // The abort callback stopped the step; nothing was committed.
)

// String is the C name, as llmrt_status_name gives it ("LLMRT_IO", ...;
// "LLMRT_UNKNOWN_STATUS" outside the enum): the C library's table is the one list.
func (s Status) String() string {
	if s < 0 {
		return "LLMRT_UNKNOWN_STATUS"
	}
	return cStatusName(s)
}

// Error is a failed llmrt call: its status and llmrt_last_error() of that call.
// Compare with errors.Is against the Err* sentinels, which match on Status:
//
//	if errors.Is(err, llmrt.ErrUnknownCache) { ... }
//
// or get the details with errors.As(err, &e) for e of type *llmrt.Error.
type Error struct {
	Status Status
	Msg    string
	cause  error // ErrClosed for calls on a closed Model
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return "llmrt: " + e.Status.String()
	}
	return "llmrt: " + e.Status.String() + ": " + e.Msg
}

// Is reports whether target is an *Error with the same Status (the sentinels).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status
}

// Unwrap gives ErrClosed for calls on a closed Model, else nil.
func (e *Error) Unwrap() error { return e.cause }

// Sentinels, one per failure status: errors.Is(err, ErrIO) and so on.
var (
	ErrInvalidArgument = &Error{Status: StatusInvalidArgument}
	ErrIO              = &Error{Status: StatusIO}
	ErrBadModel        = &Error{Status: StatusBadModel}
	ErrUnsupported     = &Error{Status: StatusUnsupported}
	ErrOutOfMemory     = &Error{Status: StatusOutOfMemory}
	ErrContextFull     = &Error{Status: StatusContextFull}
	ErrUnknownCache    = &Error{Status: StatusUnknownCache}
	ErrDevice          = &Error{Status: StatusDevice}
	ErrInternal        = &Error{Status: StatusInternal}
	ErrBufferTooSmall  = &Error{Status: StatusBufferTooSmall}
	ErrAborted         = &Error{Status: StatusAborted}
)

// ErrClosed: the Model was closed. Such errors also match ErrInvalidArgument.
var ErrClosed = errors.New("llmrt: model is closed")

func errClosed() error {
	return &Error{Status: StatusInvalidArgument, Msg: "model is closed", cause: ErrClosed}
}

func errArg(format string, args ...interface{}) error {
	return &Error{Status: StatusInvalidArgument, Msg: fmt.Sprintf(format, args...)}
}
