//! `--perplexity FILE`: each model's perplexity over FILE, by llama-perplexity's method
//! (`llmrt::perplexity`), printed as llama-perplexity prints it.

use crate::run::fail;
use llmrt::perplexity::{perplexity_of_file_text, perplexity_of_text};
use llmrt::runtime::{LoadOptions, Model};
use std::path::Path;
use std::time::Instant;

pub(crate) fn perplexity(file: &Path, models: &[String], n_ctx: usize, opts: impl Fn() -> LoadOptions<'static>) {
    let bytes =
        std::fs::read(file).unwrap_or_else(|e| fail(&file.display().to_string(), llmrt::Error::io(e.to_string())));
    let text = perplexity_of_file_text(&bytes);
    for spec in models {
        let m = Model::load(Path::new(spec), opts()).unwrap_or_else(|e| fail(spec, e));
        let t0 = Instant::now();
        let r = perplexity_of_text(&m, text, n_ctx).unwrap_or_else(|e| fail(&format!("{spec}: perplexity"), e));
        let secs = t0.elapsed().as_secs_f64();
        let chunks: Vec<String> = r.per_chunk.iter().enumerate().map(|(i, p)| format!("[{}]{p:.4}", i + 1)).collect();
        println!("{}", chunks.join(","));
        println!(
            "{spec}: {}: {} tokens, {} chunks of n_ctx={}, {} scored, {secs:.2} s ({:.0} tokens/s)",
            file.display(),
            r.tokens,
            r.chunks,
            r.n_ctx,
            r.scored,
            (r.chunks * r.n_ctx) as f64 / secs
        );
        println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.ppl_err);
    }
}
