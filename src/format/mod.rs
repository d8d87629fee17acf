//! Model file formats: where weights and hyperparameters come from.
//!
//! Every format hands the weight binder ([`crate::model::weights`]) files that
//! implement [`WeightFile`]: a read-only byte view (normally a memory map) in
//! which tensor data lives. A model's weights may span several such files (a
//! sharded safetensors checkpoint); `Matrix { file, offset, .. }` indexes them.
pub mod gguf;
pub mod gguf_write;
pub mod safetensors;
pub mod sigbus;

use std::path::Path;

/// A mapped (or owned) file that tensor data is read from, zero-copy.
pub trait WeightFile: Send + Sync {
    /// The file, for messages.
    fn path(&self) -> &Path;
    /// The whole file.
    fn bytes(&self) -> &[u8];
    /// `LLMRT_IO` when a mapped file changed (size or modification time) since
    /// it was opened, so reading the mapping could fault; owned bytes never fail.
    fn check_unchanged(&self) -> crate::Result<()> {
        Ok(())
    }
    /// Tells the OS that bytes `offset..offset + len` will not be read again (a
    /// backend keeps its own copy of them): a mapping drops those pages from the
    /// process; owned bytes stay. Advisory, never fails.
    fn release(&self, _offset: usize, _len: usize) {}
}

impl WeightFile for gguf::Gguf {
    fn path(&self) -> &Path {
        &self.path
    }
    fn bytes(&self) -> &[u8] {
        gguf::Gguf::bytes(self)
    }
    fn check_unchanged(&self) -> crate::Result<()> {
        gguf::Gguf::check_unchanged(self)
    }
    fn release(&self, offset: usize, len: usize) {
        gguf::Gguf::release(self, offset, len)
    }
}

/// Reads a small file of a model directory (tokenizer.json, tokenizer.model,
/// config.json, ...) whole. `Ok(None)` when it does not exist. The same
/// regular-file check as the mapped files ([`gguf::check_regular`]) runs on the
/// path before opening (opening a FIFO would block until a writer appears) and
/// on the open handle: a directory, FIFO, socket or device is `LLMRT_IO` naming
/// the file, never a hang.
pub(crate) fn read_small_file(path: &Path) -> crate::Result<Option<Vec<u8>>> {
    use crate::Error;
    use std::io::Read;
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("{shown}: {e}"))),
    };
    gguf::check_regular(path, &meta)?;
    let file = std::fs::File::open(path).map_err(|e| Error::io(format!("{shown}: cannot open: {e}")))?;
    let meta = file.metadata().map_err(|e| Error::io(format!("{shown}: cannot stat: {e}")))?;
    gguf::check_regular(path, &meta)?;
    let len = usize::try_from(meta.len())
        .map_err(|_| Error::out_of_memory(format!("{shown}: {} bytes do not fit in memory", meta.len())))?;
    let mut v: Vec<u8> = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| Error::out_of_memory(format!("{shown}: cannot allocate {len} bytes to read the file")))?;
    (&file).take(meta.len()).read_to_end(&mut v).map_err(|e| Error::io(format!("{shown}: cannot read: {e}")))?;
    Ok(Some(v))
}

/// Environment variable: when set to `1`, model files are read into owned memory
/// at load instead of being memory-mapped (see docs/RELIABILITY.md, "Files that
/// change under a mapping"). Costs a copy of the weights in RAM and the read time.
pub(crate) const LOAD_COPY_ENV: &str = "LLMRT_LOAD_COPY";

/// Whether [`LOAD_COPY_ENV`] asks for owned copies.
pub(crate) fn load_copy_requested() -> bool {
    std::env::var_os(LOAD_COPY_ENV).is_some_and(|v| v == "1")
}

/// A model file's bytes: a read-only mapping that remembers what the file was at
/// load (size and modification time, on the still-open descriptor), or an owned copy.
pub(crate) enum FileBytes {
    Mapped {
        /// Drops (unregisters) before `map` unmaps: field order is drop order.
        watch: Option<sigbus::Watch>,
        map: memmap2::Mmap,
        file: std::fs::File,
        len: u64,
        mtime: Option<std::time::SystemTime>,
    },
    Owned(Vec<u8>),
}

impl FileBytes {
    /// Maps `file` (already opened and checked regular, `len` bytes, non-empty), or
    /// reads it into owned memory when `LLMRT_LOAD_COPY=1`. An address-space or
    /// memory failure is `LLMRT_OUT_OF_MEMORY` naming the file and its size.
    pub(crate) fn open(file: std::fs::File, meta: &std::fs::Metadata, path: &Path) -> crate::Result<FileBytes> {
        use crate::Error;
        let shown = path.display();
        let len = meta.len();
        if load_copy_requested() {
            use std::io::Read;
            let n = usize::try_from(len)
                .map_err(|_| Error::out_of_memory(format!("{shown}: {len} bytes do not fit in the address space")))?;
            let mut v: Vec<u8> = Vec::new();
            v.try_reserve_exact(n).map_err(|_| {
                Error::out_of_memory(format!("{shown}: cannot allocate {len} bytes to read the model into memory"))
            })?;
            (&file).take(len).read_to_end(&mut v).map_err(|e| Error::io(format!("{shown}: cannot read: {e}")))?;
            if v.len() as u64 != len {
                return Err(Error::io(format!(
                    "{shown}: read {} of {len} bytes (the file shrank while loading)",
                    v.len()
                )));
            }
            return Ok(FileBytes::Owned(v));
        }
        // SAFETY: the mapping is read-only and only shared byte slices of it are
        // handed out. A file truncated or rewritten by another process while it is
        // mapped could fault (SIGBUS) or show changed bytes: the runtime checks the
        // descriptor's size and mtime against these values before and after every
        // CPU step ([`Self::check_unchanged`]) and refuses to run once they differ; a
        // read that faults is turned into a read of a zero page by the SIGBUS handler
        // of [`sigbus`], which flags the mapping (checked after the step, so the step
        // fails with LLMRT_IO and commits nothing). See docs/RELIABILITY.md.
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOMEM) {
                Error::out_of_memory(format!("{shown}: cannot map {len} bytes: {e} (address-space or memory limit)"))
            } else {
                Error::io(format!("{shown}: cannot map {len} bytes: {e}"))
            }
        })?;
        // A truncation while a step reads the mapping: see sigbus.rs.
        let watch = sigbus::register(map.as_ptr() as usize, map.len());
        Ok(FileBytes::Mapped { watch, map, file, len, mtime: meta.modified().ok() })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            FileBytes::Mapped { map, .. } => map,
            FileBytes::Owned(v) => v,
        }
    }

    /// Drops the whole pages inside `offset..offset + len` of a mapping from the
    /// process (MADV_DONTNEED); owned bytes are kept. Advisory: errors are ignored.
    pub(crate) fn release(&self, offset: usize, len: usize) {
        let FileBytes::Mapped { map, .. } = self else { return };
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
        let start = offset.div_ceil(page) * page;
        let end = (offset.saturating_add(len)).min(map.len()) / page * page;
        if end > start {
            // SAFETY: the mapping is read-only and file-backed: MADV_DONTNEED only
            // drops its page-table entries, and a later read faults the same file
            // bytes back in, so no slice of it ever observes other contents than
            // the file's (the change caveat of the mapping itself is unchanged).
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
    }

    /// `LLMRT_IO` when the mapped file's size or modification time differ from
    /// what they were at load (one fstat; owned copies never change).
    pub(crate) fn check_unchanged(&self, path: &Path) -> crate::Result<()> {
        let FileBytes::Mapped { file, len, mtime, watch, .. } = self else { return Ok(()) };
        let shown = path.display();
        let meta = file
            .metadata()
            .map_err(|e| crate::Error::io(format!("{shown}: cannot stat the loaded model file: {e}")))?;
        if meta.len() != *len || meta.modified().ok() != *mtime {
            return Err(crate::Error::io(format!(
                "{shown}: model file changed since load (size {len} -> {} bytes{}); its mapping can no longer be \
                 read safely: reload the model (or load with {LOAD_COPY_ENV}=1 to keep a private copy)",
                meta.len(),
                if meta.len() == *len { ", modification time changed" } else { "" }
            )));
        }
        if watch.as_ref().is_some_and(|w| w.faulted()) {
            return Err(crate::Error::io(format!(
                "{shown}: model file changed while it was being read (a page of its mapping faulted: SIGBUS) and \
                 reads as zeros now: reload the model (or load with {LOAD_COPY_ENV}=1 to keep a private copy)"
            )));
        }
        Ok(())
    }
}
