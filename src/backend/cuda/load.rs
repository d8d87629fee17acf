//! The kernel modules of `kernels/*.cu` on one context: the PTX build.rs embedded
//! (newest SM version the device runs), or the embedded sources compiled by NVRTC.
//! Shared headers (`kernels/*.cuh`, e.g. `common.cuh`) are embedded beside the sources
//! and spliced into them for NVRTC (see [`expand_includes`]), which has no file system.
//!
//! Depends on [`super::device`] (driver errors, `guarded`) and [`super::embedded`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{self, CompileOptions, Ptx};

use super::device::{driver_err, guarded};
use super::embedded;
use crate::error::{Error, Result};

/// Where the loaded kernels came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// PTX compiled by nvcc at build time for `sm_<sm>`, JIT-compiled by the driver.
    EmbeddedPtx { sm: u32 },
    /// The embedded sources compiled by NVRTC at run time for `compute_<sm>`.
    Nvrtc { sm: u32 },
}

impl std::fmt::Display for KernelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelSource::EmbeddedPtx { sm } => write!(f, "embedded PTX sm_{sm}"),
            KernelSource::Nvrtc { sm } => write!(f, "NVRTC compute_{sm}"),
        }
    }
}

/// Every kernel module on a context, by file stem (`norm` for kernels/norm.cu).
pub(crate) struct Modules(HashMap<&'static str, Arc<CudaModule>>);

impl Modules {
    /// Entry point `name` of kernels/`stem`.cu.
    pub(crate) fn function(&self, stem: &str, name: &str) -> Result<CudaFunction> {
        let m = self.0.get(stem).ok_or_else(|| Error::internal(format!("kernel module {stem}.cu not embedded")))?;
        m.load_function(name).map_err(|e| driver_err(&format!("cuModuleGetFunction({stem}.cu: {name})"), e))
    }
}

/// Every kernel module on `ctx` for a device of compute capability `sm`: the embedded
/// PTX of the newest SM version the device runs (sm_90 on 9.x and later, sm_80 on
/// 8.x) unless `force_nvrtc`; when none fits, or the driver rejects it (e.g. PTX newer
/// than the driver), the embedded sources compiled with NVRTC. Call under `guarded`.
pub(crate) fn load_modules(ctx: &Arc<CudaContext>, sm: u32, force_nvrtc: bool) -> Result<(Modules, KernelSource)> {
    let embedded_sm = embedded::ptx_archs().into_iter().rev().find(|&e| e <= sm);
    match embedded_sm {
        Some(e) if !force_nvrtc => match load_embedded(ctx, e) {
            Ok(m) => Ok((m, KernelSource::EmbeddedPtx { sm: e })),
            Err(ptx_err) => {
                let m = load_nvrtc(ctx, sm).map_err(|err| {
                    Error::device(format!("{}; NVRTC fallback failed too: {}", ptx_err.message, err.message))
                })?;
                Ok((m, KernelSource::Nvrtc { sm }))
            }
        },
        _ => Ok((load_nvrtc(ctx, sm)?, KernelSource::Nvrtc { sm })),
    }
}

/// Loads each (stem, PTX text) onto `ctx`; `origin` names where the PTX came from.
fn load_all<'a>(
    ctx: &Arc<CudaContext>,
    ptx: impl IntoIterator<Item = (&'static str, &'a str)>,
    origin: &str,
) -> Result<Modules> {
    let mut modules = HashMap::new();
    for (stem, text) in ptx {
        let m = ctx
            .load_module(Ptx::from_src(text))
            .map_err(|e| driver_err(&format!("cuModuleLoadData({stem}.cu, {origin})"), e))?;
        modules.insert(stem, m);
    }
    Ok(Modules(modules))
}

fn load_embedded(ctx: &Arc<CudaContext>, sm: u32) -> Result<Modules> {
    let ptx = embedded::PTX.iter().filter(|&&(_, s, _)| s == sm).map(|&(stem, _, text)| (stem, text));
    load_all(ctx, ptx, &format!("embedded PTX sm_{sm}"))
}

fn load_nvrtc(ctx: &Arc<CudaContext>, sm: u32) -> Result<Modules> {
    let compiled = nvrtc_compile(sm)?;
    load_all(ctx, compiled.iter().map(|(stem, text)| (*stem, text.as_str())), &format!("NVRTC compute_{sm}"))
}

/// `src` (kernels/`stem`.cu) with every `#include "<header>"` line of an embedded
/// header (`kernels/<header>`) replaced by the header's text, framed by `#line`
/// directives so NVRTC's messages still name the right file and line. Other
/// includes (`<cuda_fp16.h>`) stay. A header is spliced at most once per source, as
/// its include guard would have it. This is exactly the text [`nvrtc_compile`] hands
/// NVRTC (public so that an emulated NVRTC can recognise it).
pub fn expand_includes(stem: &str, src: &str) -> String {
    let mut out = String::with_capacity(src.len() + embedded::HEADERS.iter().map(|h| h.1.len()).sum::<usize>());
    let mut done: Vec<&str> = Vec::new();
    for (i, line) in src.lines().enumerate() {
        let quoted = line.trim().strip_prefix("#include").map(str::trim).and_then(|r| r.strip_prefix('"'));
        let header = quoted
            .and_then(|r| r.split('"').next())
            .and_then(|name| embedded::HEADERS.iter().find(|&&(h, _)| h == name));
        match header {
            Some(&(name, text)) => {
                if !done.contains(&name) {
                    done.push(name);
                    out.push_str(&format!("#line 1 \"{name}\"\n"));
                    out.push_str(text);
                    if !text.ends_with('\n') {
                        out.push('\n');
                    }
                }
                out.push_str(&format!("#line {} \"{stem}.cu\"\n", i + 2));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Compiles every embedded kernel source with NVRTC for `compute_<sm>`, returning
/// (file stem, PTX text). Needs no GPU, only libnvrtc (`LLMRT_UNSUPPORTED` when it
/// cannot be found) and cuda_fp16.h, searched in `LLMRT_CUDA_INCLUDE` (a PATH-style
/// list), `CUDA_HOME/include`, `CUDA_PATH/include`, `/usr/local/cuda/include` and the
/// repository's pip toolchain (scripts/install-nvcc.sh). The shared headers of
/// kernels/ are spliced in first ([`expand_includes`]).
pub fn nvrtc_compile(sm: u32) -> Result<Vec<(&'static str, String)>> {
    // SAFETY: is_culib_present only tries to dlopen NVRTC's library names; it calls nothing.
    if !unsafe { nvrtc::sys::is_culib_present() } {
        return Err(Error::unsupported("no NVRTC library (libnvrtc.so not found)"));
    }
    let include_paths = nvrtc_include_paths();
    guarded("NVRTC", || {
        embedded::SOURCES
            .iter()
            .map(|&(stem, src)| {
                let opts = CompileOptions {
                    include_paths: include_paths.clone(),
                    options: vec![format!("--gpu-architecture=compute_{sm}"), "--std=c++17".into()],
                    name: Some(format!("{stem}.cu")),
                    ..Default::default()
                };
                let ptx = nvrtc::compile_ptx_with_opts(expand_includes(stem, src), opts)
                    .map_err(|e| nvrtc_err(stem, sm, e))?;
                Ok((stem, ptx.to_src()))
            })
            .collect()
    })
}

fn nvrtc_err(stem: &str, sm: u32, e: nvrtc::CompileError) -> Error {
    let detail = match e {
        nvrtc::CompileError::CompileError { nvrtc, options, log } => {
            format!("{nvrtc:?} with options {options:?}:\n{}", log.to_string_lossy())
        }
        other => format!("{other:?}"),
    };
    Error::device(format!("NVRTC compiling {stem}.cu for compute_{sm}: {detail}"))
}

/// Folders holding cuda_fp16.h, in the order of [`nvrtc_compile`]'s documentation.
fn nvrtc_include_paths() -> Vec<String> {
    let mut dirs: Vec<std::path::PathBuf> = Vec::new();
    if let Some(list) = std::env::var_os("LLMRT_CUDA_INCLUDE") {
        dirs.extend(std::env::split_paths(&list));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            dirs.push(Path::new(&home).join("include"));
        }
    }
    dirs.push("/usr/local/cuda/include".into());
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(".cuda/nvidia/cu13/include"));
    let mut out: Vec<String> = Vec::new();
    for d in dirs {
        if d.join("cuda_fp16.h").is_file() {
            if let Some(s) = d.to_str().map(str::to_string).filter(|s| !out.contains(s)) {
                out.push(s);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_includes_common_and_expands_without_quoted_includes() {
        assert!(embedded::HEADERS.iter().any(|&(h, _)| h == "common.cuh"), "common.cuh embedded");
        for &(stem, src) in embedded::SOURCES {
            assert!(src.contains("#include \"common.cuh\""), "kernels/{stem}.cu does not include common.cuh");
            let x = expand_includes(stem, src);
            assert!(!x.contains("#include \""), "{stem}.cu: a quoted include is left after expansion");
            assert!(x.contains("__device__ __forceinline__ float warp_sum"), "{stem}.cu: common.cuh not spliced in");
            // The line after the include keeps its number: `#line N` then line N of the source.
            let (i, _) = src.lines().enumerate().find(|(_, l)| l.contains("#include \"common.cuh\"")).unwrap();
            let marker = format!("#line {} \"{stem}.cu\"\n", i + 2);
            let after = &x[x.find(&marker).expect("line marker") + marker.len()..];
            assert_eq!(after.lines().next(), src.lines().nth(i + 1), "{stem}.cu: line after the include");
        }
    }
}
