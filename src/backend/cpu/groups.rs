//! Storage of repacked weights (`qpack`, `fpack`): a matrix as groups of rows in
//! one 64-byte-aligned buffer, each group filled independently (on several
//! threads for large matrices). The buffer is a [`HostBuf`]: whole 2 MiB extents
//! of it are advised for transparent huge pages, which decode's streaming reads
//! of the weights need (one page walk per 2 MiB, prefetchers not stopped every
//! 4 KiB).

use crate::{Error, Result};

/// Size of a transparent huge page on x86-64 and most aarch64 kernels.
const HUGE: usize = 2 << 20;

/// A zeroed, read-write anonymous mapping of `len` bytes whose start is 2 MiB
/// aligned (64-byte aligned at least), with the whole 2 MiB extents inside it
/// advised `MADV_HUGEPAGE` (where the kernel has no transparent huge pages the
/// advice fails and is ignored: the buffer works on small pages).
pub struct HostBuf {
    /// The mapping as made (`map_len` bytes), unmapped on drop; null when `len == 0`.
    map: *mut u8,
    map_len: usize,
    /// The aligned start of the `len` usable bytes inside the mapping.
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `HostBuf` owns its mapping outright (no aliasing handles); shared
// references only read it, and writes need `&mut`.
unsafe impl Send for HostBuf {}
// SAFETY: as above: `&HostBuf` gives read-only access.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    /// Maps `len` zeroed bytes; `None` when the system refuses the memory.
    pub fn zeroed(len: usize) -> Option<HostBuf> {
        if len == 0 {
            return Some(HostBuf {
                map: std::ptr::null_mut(),
                map_len: 0,
                ptr: std::ptr::without_provenance_mut(64),
                len: 0,
            });
        }
        // One extra huge page of address space (never touched, so never backed)
        // to align the start.
        let map_len = len.checked_add(HUGE)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return None;
        }
        let map = map as *mut u8;
        let ptr = map.wrapping_add((HUGE - map as usize % HUGE) % HUGE);
        let whole = len / HUGE * HUGE;
        if whole > 0 {
            // SAFETY: `ptr..ptr + whole` lies inside the mapping just made; the
            // advice changes how pages are backed, never their (zero) contents.
            unsafe { libc::madvise(ptr as *mut libc::c_void, whole, libc::MADV_HUGEPAGE) };
        }
        Some(HostBuf { map, map_len, ptr, len })
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is inside the live mapping (or `len == 0`
        // with a dangling, aligned pointer), initialised (zero-filled by the
        // kernel), and only mutated through `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, with `&mut self` guaranteeing exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if !self.map.is_null() {
            // SAFETY: `map`/`map_len` are exactly the mapping made in `zeroed`,
            // unmapped once; no borrow of it outlives `self`.
            unsafe { libc::munmap(self.map as *mut libc::c_void, self.map_len) };
        }
    }
}

/// `groups` groups of `group_bytes` bytes each (a multiple of 64), back to back.
pub(crate) struct Groups {
    buf: HostBuf,
    group_bytes: usize,
}

impl Groups {
    /// Allocates zeroed groups and fills group `g` with `fill(g, its bytes)`, on up
    /// to `threads` threads. `what()` describes the tensor for the error when the
    /// memory cannot be had.
    pub(crate) fn build(
        groups: usize,
        group_bytes: usize,
        threads: usize,
        what: impl FnOnce() -> String,
        fill: impl Fn(usize, &mut [u8]) + Sync,
    ) -> Result<Groups> {
        assert!(group_bytes.is_multiple_of(64), "group of {group_bytes} bytes is not whole lines");
        let len = groups * group_bytes;
        let mut buf = HostBuf::zeroed(len).ok_or_else(|| {
            Error::out_of_memory(format!("cannot allocate {len} bytes of host memory to repack {}", what()))
        })?;
        let out = buf.bytes_mut();
        if group_bytes > 0 {
            let per = groups.div_ceil(threads.max(1)).max(1);
            if threads <= 1 || groups < 2 * threads {
                for (g, dst) in out.chunks_mut(group_bytes).enumerate() {
                    fill(g, dst);
                }
            } else {
                // Parts are taken from a queue by the calling thread and up to
                // `threads - 1` helpers; a helper that cannot be spawned (thread or
                // memory limit) only leaves more parts to the others.
                let parts = out.chunks_mut(per * group_bytes).enumerate();
                let n_parts = parts.len();
                let queue = std::sync::Mutex::new(parts);
                let work = || loop {
                    let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                    let Some((k, part)) = next else { return };
                    for (j, dst) in part.chunks_mut(group_bytes).enumerate() {
                        fill(k * per + j, dst);
                    }
                };
                std::thread::scope(|s| {
                    for _ in 1..n_parts {
                        let work = &work;
                        if std::thread::Builder::new().spawn_scoped(s, work).is_err() {
                            break;
                        }
                    }
                    work();
                });
            }
        }
        Ok(Groups { buf, group_bytes })
    }

    /// Bytes from one group to the next.
    pub(crate) fn group_bytes(&self) -> usize {
        self.group_bytes
    }

    /// The whole buffer.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.buf.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffers_are_zeroed_aligned_and_writable() {
        for len in [0usize, 1, 64, 4096 + 64, HUGE, HUGE + 4096 * 3 + 64] {
            let mut b = HostBuf::zeroed(len).unwrap();
            assert_eq!(b.bytes().len(), len);
            assert_eq!(b.bytes().as_ptr() as usize % 64, 0, "len {len}");
            if len >= HUGE {
                assert_eq!(b.bytes().as_ptr() as usize % HUGE, 0, "len {len}");
            }
            assert!(b.bytes().iter().all(|&v| v == 0), "len {len}");
            for (i, v) in b.bytes_mut().iter_mut().enumerate() {
                *v = i as u8;
            }
            assert!(b.bytes().iter().enumerate().all(|(i, &v)| v == i as u8), "len {len}");
        }
    }
}
