//! Storage of repacked weights (`qpack`, `fpack`): a matrix as groups of rows in
//! one 64-byte-aligned buffer, each group filled independently (on several
//! threads for large matrices).

use crate::{Error, Result};

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// `groups` groups of `group_bytes` bytes each (a multiple of 64), back to back.
pub struct Groups {
    lines: Vec<Line>,
    group_bytes: usize,
}

impl Groups {
    /// Allocates zeroed groups and fills group `g` with `fill(g, its bytes)`, on up
    /// to `threads` threads. `what()` describes the tensor for the error when the
    /// memory cannot be had.
    pub fn build(
        groups: usize,
        group_bytes: usize,
        threads: usize,
        what: impl FnOnce() -> String,
        fill: impl Fn(usize, &mut [u8]) + Sync,
    ) -> Result<Groups> {
        assert!(group_bytes.is_multiple_of(64), "group of {group_bytes} bytes is not whole lines");
        let n_lines = groups * group_bytes / 64;
        let mut lines: Vec<Line> = Vec::new();
        lines.try_reserve_exact(n_lines).map_err(|_| {
            Error::out_of_memory(format!("cannot allocate {} bytes of host memory to repack {}", n_lines * 64, what()))
        })?;
        lines.resize(n_lines, Line([0; 64]));
        // SAFETY: `Line` is 64 plain bytes with no padding; the byte view covers
        // exactly the vector's storage and the vector is not touched otherwise
        // while the view lives.
        let out = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut u8, lines.len() * 64) };
        if group_bytes > 0 {
            let per = groups.div_ceil(threads.max(1)).max(1);
            if threads <= 1 || groups < 2 * threads {
                for (g, dst) in out.chunks_mut(group_bytes).enumerate() {
                    fill(g, dst);
                }
            } else {
                std::thread::scope(|s| {
                    for (k, part) in out.chunks_mut(per * group_bytes).enumerate() {
                        let fill = &fill;
                        s.spawn(move || {
                            for (j, dst) in part.chunks_mut(group_bytes).enumerate() {
                                fill(k * per + j, dst);
                            }
                        });
                    }
                });
            }
        }
        Ok(Groups { lines, group_bytes })
    }

    /// Bytes from one group to the next.
    pub fn group_bytes(&self) -> usize {
        self.group_bytes
    }

    /// The whole buffer.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: as in `build`: plain bytes, shared view of the whole storage.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const u8, self.lines.len() * 64) }
    }
}
