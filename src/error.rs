//! Errors of the safe core: a status (the C enum callers see) and a message that
//! names the thing at fault (file, tensor, offset, cache id, sizes).

use std::ffi::CStr;
use std::fmt;

// A new status: a variant here (cbindgen copies its doc comment into the header), its row
// in STATUSES below with the same description, and the same line in docs/API.md and
// go/llmrt/errors.go (constant and sentinel); tests/status_table.rs fails until all agree.
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
    /// The abort callback stopped the step; nothing was committed.
    LLMRT_ABORTED = 11,
}

/// Short alias used throughout the safe core.
pub use llmrt_status as Status;

/// One row of [`STATUSES`]: a status, its name as C callers spell it, and what it means.
#[derive(Clone, Copy, Debug)]
pub struct StatusInfo {
    pub status: Status,
    /// The constant's C name, e.g. `c"LLMRT_OK"` (what `llmrt_status_name` returns).
    pub name: &'static CStr,
    /// One line: when a call returns it. The enum's doc comments above (and so the header),
    /// docs/API.md and go/llmrt/errors.go say the same; tests/status_table.rs fails when they
    /// drift.
    pub description: &'static str,
}

/// The status table, in code order (`STATUSES[c].status as u32 == c`): the one list the C
/// strings of `llmrt_status_name`, [`llmrt_status::name`], and the tests holding the header,
/// the Go package and docs/API.md to it come from.
pub const STATUSES: [StatusInfo; 12] = {
    use llmrt_status::*;
    macro_rules! row {
        ($s:ident, $d:literal) => {
            StatusInfo {
                status: $s,
                name: match CStr::from_bytes_with_nul(concat!(stringify!($s), "\0").as_bytes()) {
                    Ok(c) => c,
                    Err(_) => panic!("status name with a NUL"),
                },
                description: $d,
            }
        };
    }
    [
        row!(LLMRT_OK, "Success."),
        row!(LLMRT_INVALID_ARGUMENT, "NULL pointer, zero/oversized length, token id >= vocab."),
        row!(LLMRT_IO, "File missing, unreadable, not a regular file."),
        row!(LLMRT_BAD_MODEL, "Malformed, truncated or inconsistent model file."),
        row!(LLMRT_UNSUPPORTED, "Architecture, tensor type or backend not available."),
        row!(LLMRT_OUT_OF_MEMORY, "Host/device allocation failed, KV pool exhausted."),
        row!(LLMRT_CONTEXT_FULL, "Step would exceed the cache's reserved positions."),
        row!(LLMRT_UNKNOWN_CACHE, "Cache id not live: released, never issued, other model."),
        row!(LLMRT_DEVICE, "CUDA driver/kernel error."),
        row!(LLMRT_INTERNAL, "Caught panic or broken invariant (a bug)."),
        row!(LLMRT_BUFFER_TOO_SMALL, "Output buffer too small; the needed size is reported."),
        row!(LLMRT_ABORTED, "The abort callback stopped the step; nothing was committed."),
    ]
};

/// What `llmrt_status_name` returns for a value outside the enum.
pub const UNKNOWN_STATUS_NAME: &CStr = c"LLMRT_UNKNOWN_STATUS";

impl llmrt_status {
    /// The status whose code is `code`, if any.
    pub fn from_code(code: u32) -> Option<Status> {
        STATUSES.get(code as usize).map(|r| r.status)
    }

    /// This status's row of [`STATUSES`].
    pub fn info(self) -> &'static StatusInfo {
        &STATUSES[self as usize]
    }

    /// The constant's name as C callers spell it, e.g. `"LLMRT_OK"`.
    pub fn name(self) -> &'static str {
        self.info().name.to_str().unwrap_or("LLMRT_UNKNOWN_STATUS")
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

/// `Error::$name(message)`: an error of that status, one constructor per failure status.
macro_rules! constructors {
    ($($name:ident => $status:ident),+ $(,)?) => {
        $(
            #[doc = concat!("An error with status `", stringify!($status), "`.")]
            pub fn $name(message: impl Into<String>) -> Error {
                Error::new(Status::$status, message)
            }
        )+
    };
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    constructors! {
        invalid => LLMRT_INVALID_ARGUMENT,
        io => LLMRT_IO,
        bad_model => LLMRT_BAD_MODEL,
        unsupported => LLMRT_UNSUPPORTED,
        out_of_memory => LLMRT_OUT_OF_MEMORY,
        context_full => LLMRT_CONTEXT_FULL,
        unknown_cache => LLMRT_UNKNOWN_CACHE,
        device => LLMRT_DEVICE,
        internal => LLMRT_INTERNAL,
        buffer_too_small => LLMRT_BUFFER_TOO_SMALL,
        aborted => LLMRT_ABORTED,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table_is_in_code_order_and_names_the_variants() {
        for (code, row) in STATUSES.iter().enumerate() {
            assert_eq!(row.status as usize, code, "{row:?}");
            assert_eq!(row.name.to_str().unwrap(), format!("{:?}", row.status));
            assert_eq!(Status::from_code(code as u32), Some(row.status));
            assert!(!row.description.is_empty());
        }
        assert_eq!(Status::from_code(STATUSES.len() as u32), None);
        assert_eq!(Status::LLMRT_BUFFER_TOO_SMALL.name(), "LLMRT_BUFFER_TOO_SMALL");
    }
}
