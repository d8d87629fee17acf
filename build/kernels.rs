//! Kernel compilation for build.rs: every `kernels/*.cu` becomes PTX for each arch in
//! [`ARCHS`] when an nvcc is found, and `OUT_DIR/kernels.rs` embeds the PTX
//! (`PTX: &[(stem, sm, ptx)]`) and always the sources (`SOURCES: &[(stem, source)]`,
//! for NVRTC at run time) with the shared headers they include (`HEADERS: &[(file name,
//! text)]` of `kernels/*.cuh`, spliced into the sources for NVRTC). Without nvcc only
//! the sources are embedded and one cargo:warning says so; an nvcc error fails the
//! build with nvcc's output.

use std::path::{Path, PathBuf};
use std::process::Command;

/// SM versions PTX is generated for (sm_90 PTX for Hopper, sm_80 for Ampere/Ada).
pub const ARCHS: &[u32] = &[80, 90];

/// nvcc location relative to the crate root, where scripts/install-nvcc.sh puts it.
const PIP_NVCC: &str = ".cuda/nvidia/cu13/bin/nvcc";

pub fn build(crate_dir: &Path, out_dir: &Path) {
    let kernel_dir = crate_dir.join("kernels");
    println!("cargo:rerun-if-changed={}", kernel_dir.display());
    println!("cargo:rerun-if-changed=build/kernels.rs");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");

    let sources = list_files(&kernel_dir, "cu");
    let headers = list_files(&kernel_dir, "cuh");
    let nvcc = find_nvcc(crate_dir);
    let mut ptx: Vec<(String, u32, PathBuf)> = Vec::new();
    match &nvcc {
        Some(nvcc) => {
            // Rebuild when the pip-installed toolchain is replaced (only watched if present:
            // a missing path would make cargo rerun this script on every build).
            let stamp = crate_dir.join(".cuda/.install-nvcc.stamp");
            if stamp.exists() {
                println!("cargo:rerun-if-changed={}", stamp.display());
            }
            ptx = compile_all(nvcc, &sources, &out_dir.join("kernels"));
        }
        None => println!(
            "cargo:warning=no nvcc found (NVCC, {PIP_NVCC}, PATH, CUDA_HOME/bin, /usr/local/cuda/bin): \
             CUDA kernels embedded as source only, compiled by NVRTC at run time. \
             Run scripts/install-nvcc.sh, then `touch kernels/*.cu`, to embed PTX."
        ),
    }
    write_module(&out_dir.join("kernels.rs"), &sources, &headers, &ptx);
}

/// `kernels/*.<ext>`, sorted by name, as (file stem, path).
fn list_files(kernel_dir: &Path, ext: &str) -> Vec<(String, PathBuf)> {
    let mut sources: Vec<(String, PathBuf)> = match std::fs::read_dir(kernel_dir) {
        Ok(dir) => dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .filter_map(|p| Some((p.file_stem()?.to_str()?.to_string(), p)))
            .collect(),
        Err(_) => Vec::new(),
    };
    sources.sort();
    sources
}

/// NVCC (env), the repo's pip toolchain, PATH, CUDA_HOME/bin, /usr/local/cuda/bin.
fn find_nvcc(crate_dir: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVCC").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            panic!("NVCC={} is not a file; unset NVCC to search for nvcc", p.display());
        }
        return Some(p);
    }
    let mut candidates = vec![crate_dir.join(PIP_NVCC)];
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    if let Some(home) = std::env::var_os("CUDA_HOME").filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(home).join("bin/nvcc"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/bin/nvcc"));
    candidates.into_iter().find(|p| p.is_file())
}

/// Compiles every (source, arch) pair concurrently; panics with nvcc's output on failure.
fn compile_all(nvcc: &Path, sources: &[(String, PathBuf)], ptx_dir: &Path) -> Vec<(String, u32, PathBuf)> {
    std::fs::create_dir_all(ptx_dir).unwrap_or_else(|e| panic!("create {}: {e}", ptx_dir.display()));
    let jobs: Vec<(String, u32, PathBuf, &PathBuf)> = sources
        .iter()
        .flat_map(|(stem, src)| {
            ARCHS.iter().map(move |&sm| (stem.clone(), sm, ptx_dir.join(format!("{stem}.sm_{sm}.ptx")), src))
        })
        .collect();
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> =
            jobs.iter().map(|(_, sm, out, src)| s.spawn(move || run_nvcc(nvcc, src, *sm, out))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("nvcc thread panicked".to_string()))).collect()
    });
    let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if !errors.is_empty() {
        panic!("kernel compilation failed:\n{}", errors.join("\n"));
    }
    jobs.into_iter().map(|(stem, sm, out, _)| (stem, sm, out)).collect()
}

fn run_nvcc(nvcc: &Path, src: &Path, sm: u32, out: &Path) -> Result<(), String> {
    let mut cmd = Command::new(nvcc);
    cmd.args(["--ptx", &format!("-arch=sm_{sm}"), "-O3", "-std=c++17", "-o"]).arg(out).arg(src);
    let shown = format!("{cmd:?}");
    let output = cmd.output().map_err(|e| format!("{shown}: cannot run: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{shown} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Writes OUT_DIR/kernels.rs; include_str! of absolute paths also makes rustc track them.
fn write_module(
    path: &Path,
    sources: &[(String, PathBuf)],
    headers: &[(String, PathBuf)],
    ptx: &[(String, u32, PathBuf)],
) {
    let mut s = String::from("// Generated by build/kernels.rs. Do not edit.\n\n");
    s.push_str("/// PTX compiled by nvcc at build time: (file stem, SM version, PTX text).\n");
    s.push_str("pub const PTX: &[(&str, u32, &str)] = &[\n");
    for (stem, sm, p) in ptx {
        s.push_str(&format!("    ({stem:?}, {sm}, include_str!({:?})),\n", path_str(p)));
    }
    s.push_str("];\n\n/// Kernel sources for NVRTC: (file stem, CUDA C++ source).\n");
    s.push_str("pub const SOURCES: &[(&str, &str)] = &[\n");
    for (stem, p) in sources {
        s.push_str(&format!("    ({stem:?}, include_str!({:?})),\n", path_str(p)));
    }
    s.push_str("];\n\n/// Shared headers the sources include: (file name, text).\n");
    s.push_str("pub const HEADERS: &[(&str, &str)] = &[\n");
    for (stem, p) in headers {
        s.push_str(&format!("    (\"{stem}.cuh\", include_str!({:?})),\n", path_str(p)));
    }
    s.push_str("];\n");
    // Only rewrite on change, so an unchanged build does not recompile the crate.
    if std::fs::read_to_string(path).ok().as_deref() != Some(s.as_str()) {
        std::fs::write(path, s).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap_or_else(|| panic!("non-UTF-8 path {}", p.display()))
}
