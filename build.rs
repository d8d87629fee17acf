//! Build script: generates include/llmrt.h from src/ffi with cbindgen (pinned in
//! Cargo.toml so the committed header can be checked against it), and compiles the
//! CUDA kernels in kernels/ (see build/kernels.rs).

use std::path::PathBuf;

#[path = "build/kernels.rs"]
mod kernels;

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=build.rs");
    generate_header(&crate_dir);
    kernels::build(&crate_dir, &out_dir);
}

fn generate_header(crate_dir: &std::path::Path) {
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    // LLMRT_HEADER_OUT lets `make check-header` generate into a temporary path and diff.
    let out = std::env::var_os("LLMRT_HEADER_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate_dir.join("include").join("llmrt.h"));
    match cbindgen::Builder::new().with_crate(crate_dir).with_config(config).generate() {
        Ok(bindings) => {
            bindings.write_to_file(&out);
        }
        Err(e) => {
            println!("cargo:warning=cbindgen failed, include/llmrt.h not regenerated: {e}");
        }
    }
}
