//! Errors of the safe core: a status (the C enum callers see) and a message that
//! names the thing at fault (file, tensor, offset, cache id, sizes).

use std::fmt;

/// Status of every fallible `llmrt_*` call.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum llmrt_status {
    /// Success.
    LLMRT_OK = 0,
    /// NULL pointer, zero/oversized length, token id >= vocab.
    LLMRT_INVALID_ARGUMENT = 1,
    /// File missing, unreadable, not a regular file.
    LLMRT_IO = 2,
    /// Malformed, truncated or inconsistent model file.
    LLMRT_BAD_MODEL = 3,
    /// Architecture, tensor type or backend not available.
    LLMRT_UNSUPPORTED = 4,
    /// Host/device allocation failed, KV pool exhausted.
    LLMRT_OUT_OF_MEMORY = 5,
    /// Step would exceed the cache's reserved positions.
    LLMRT_CONTEXT_FULL = 6,
    /// Cache id not live: released, never issued, other model.
    LLMRT_UNKNOWN_CACHE = 7,
    /// CUDA driver/kernel error.
    LLMRT_DEVICE = 8,
    /// Caught panic or broken invariant (a bug).
    LLMRT_INTERNAL = 9,
    /// Output buffer too small; the needed size is reported.
    LLMRT_BUFFER_TOO_SMALL = 10,
}

/// Short alias used throughout the safe core.
pub use llmrt_status as Status;

impl llmrt_status {
    /// The constant's name as C callers spell it, e.g. `"LLMRT_OK"`.
    pub fn name(self) -> &'static str {
        match self {
            Status::LLMRT_OK => "LLMRT_OK",
            Status::LLMRT_INVALID_ARGUMENT => "LLMRT_INVALID_ARGUMENT",
            Status::LLMRT_IO => "LLMRT_IO",
            Status::LLMRT_BAD_MODEL => "LLMRT_BAD_MODEL",
            Status::LLMRT_UNSUPPORTED => "LLMRT_UNSUPPORTED",
            Status::LLMRT_OUT_OF_MEMORY => "LLMRT_OUT_OF_MEMORY",
            Status::LLMRT_CONTEXT_FULL => "LLMRT_CONTEXT_FULL",
            Status::LLMRT_UNKNOWN_CACHE => "LLMRT_UNKNOWN_CACHE",
            Status::LLMRT_DEVICE => "LLMRT_DEVICE",
            Status::LLMRT_INTERNAL => "LLMRT_INTERNAL",
            Status::LLMRT_BUFFER_TOO_SMALL => "LLMRT_BUFFER_TOO_SMALL",
        }
    }
}

/// An error of the safe core: what kind (the status) and what exactly (the message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

/// Result of the safe core.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::LLMRT_INVALID_ARGUMENT, message)
    }
    pub fn io(message: impl Into<String>) -> Error {
        Error::new(Status::LLMRT_IO, message)
    }
    pub fn bad_model(message: impl Into<String>) -> Error {
        Error::new(Status::LLMRT_BAD_MODEL, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Error {
        Error::new(Status::LLMRT_UNSUPPORTED, message)
    }
    pub fn out_of_memory(message: impl Into<String>) -> Error {
        Error::new(Status::LLMRT_OUT_OF_MEMORY, message)
    }
    pub fn context_full(message: impl Into<String>) -> Error {
        Error::new(Status::LLMRT_CONTEXT_FULL, message)
    }
    pub fn unknown_cache(message: impl Into<String>) -> Error {
        Error::new(Status::LLMRT_UNKNOWN_CACHE, message)
    }
    pub fn device(message: impl Into<String>) -> Error {
        Error::new(Status::LLMRT_DEVICE, message)
    }
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(Status::LLMRT_INTERNAL, message)
    }
    pub fn buffer_too_small(message: impl Into<String>) -> Error {
        Error::new(Status::LLMRT_BUFFER_TOO_SMALL, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}
