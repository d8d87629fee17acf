//! `llmrt_embed` against Hugging Face transformers: tools/make_embedding_fixtures.py
//! wrote each fixture's `last_hidden_state` (float64 forward of the hf/ checkpoint) and
//! its mean, normalized mean and last row, computed by numpy.
mod common;
use common::*;
use llmrt::ffi::*;
use llmrt::Status;
use std::path::Path;

const NONE: u32 = llmrt_pooling::LLMRT_POOLING_NONE as u32;
const MEAN: u32 = llmrt_pooling::LLMRT_POOLING_MEAN as u32;
const LAST: u32 = llmrt_pooling::LLMRT_POOLING_LAST as u32;

fn with_embeddings() -> Vec<Fixture> {
    let all: Vec<Fixture> = Fixture::all().into_iter().filter(|f| f.dir.join("embedding.json").exists()).collect();
    assert!(all.len() >= 6, "expected the 6 fixtures with embedding.json, found {}", all.len());
    all
}

/// Every pooling of `m`'s embeddings of the fixture's tokens against transformers.
fn check(f: &Fixture, m: &M, what: &str, bound: f64) {
    let h = m.info().hidden_size as usize;
    let want = read_f32(&f.dir.join("hidden.f32"));
    assert_eq!(want.len(), f.tokens.len() * h, "{}: hidden.f32 size", f.name);
    let rows = m.embed(&f.tokens, NONE, false).unwrap_or_else(|e| panic!("{} {what}: {e:?}", f.name));
    assert_eq!(rows.len(), want.len());
    let mut worst = 0f64;
    for (t, (g, w)) in rows.chunks_exact(h).zip(want.chunks_exact(h)).enumerate() {
        let e = rel_l2(g, w);
        assert!(e < bound, "{} {what} token {t}: relative L2 {e:.3e} >= {bound:.0e}", f.name);
        worst = worst.max(e);
    }
    for (pooling, normalize, file) in
        [(MEAN, false, "embed_mean.f32"), (MEAN, true, "embed_mean_norm.f32"), (LAST, false, "embed_last.f32")]
    {
        let got = m.embed(&f.tokens, pooling, normalize).unwrap();
        let want = read_f32(&f.dir.join(file));
        assert_eq!(got.len(), h, "{} {what} {file}: one row", f.name);
        let e = rel_l2(&got, &want);
        assert!(e < bound, "{} {what} {file}: relative L2 {e:.3e} >= {bound:.0e}", f.name);
        worst = worst.max(e);
        if normalize {
            let n: f64 = got.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
            assert!((n - 1.0).abs() < 1e-6, "{} {what}: normalized norm {n}", f.name);
        }
    }
    println!("{:<14} {what:<8} worst relative L2 vs transformers {worst:.3e} (bound {bound:.0e})", f.name);
}

#[test]
fn hf_directories_match_transformers_hidden_states() {
    for f in with_embeddings() {
        let m = load(&f.dir.join("hf"));
        check(&f, &m, "hf dir", 1e-5);
    }
}

#[test]
fn f32_ggufs_match_transformers_hidden_states() {
    let mut n = 0;
    for f in with_embeddings() {
        // The GGUF f32 files hold the original float32 weights; only where hf/ holds the
        // same (float32) is transformers' forward of hf/ their reference.
        if f.json["hf"]["dtype"].as_str() == Some("float32") {
            let m = load(&f.gguf("f32"));
            check(&f, &m, "f32 gguf", 1e-5);
            n += 1;
        }
    }
    assert!(n >= 2, "expected 2 fixtures with float32 hf/ checkpoints, found {n}");
}

#[test]
fn last_pooling_is_the_last_row_and_normalize_scales_every_row() {
    let f = &with_embeddings()[0];
    let m = load(&f.gguf("f32"));
    let h = m.info().hidden_size as usize;
    let rows = m.embed(&f.tokens, NONE, false).unwrap();
    let last = m.embed(&f.tokens, LAST, false).unwrap();
    let e = rel_l2(&last, &rows[rows.len() - h..]);
    assert!(e < 1e-6, "last pooling vs the last row: {e:.3e}");
    let normed = m.embed(&f.tokens, NONE, true).unwrap();
    for (t, (g, r)) in normed.chunks_exact(h).zip(rows.chunks_exact(h)).enumerate() {
        let n: f64 = r.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
        let scaled: Vec<f32> = r.iter().map(|&x| (x as f64 / n) as f32).collect();
        assert!(rel_l2(g, &scaled) < 1e-6, "row {t}: normalized row is not the row over its norm");
    }
    // A prefix embeds as the prefix alone (no state carried between calls).
    let p = m.embed(&f.tokens[..5], LAST, false).unwrap();
    assert!(rel_l2(&p, &rows[4 * h..5 * h]) < 1e-5, "prefix embedding vs row 4");
}

#[test]
fn embedding_changes_no_cache_and_bad_calls_fail_cleanly() {
    let f = &with_embeddings()[0];
    let path = f.gguf("f32");
    let m = load(&path);
    let h = m.info().hidden_size as usize;
    // A caller's cache before and after: same length, same next logits.
    let c = m.reserve(0);
    m.prefill(c, &f.tokens[..6]);
    let fork = m.fork(c);
    m.embed(&f.tokens, MEAN, true).unwrap();
    assert_eq!(m.len(c), 6);
    let a = m.decode(&[c], &[f.tokens[6]]);
    let b = m.decode(&[fork], &[f.tokens[6]]);
    assert_eq!(a, b, "a cache's next logits changed across an embedding call");

    let bad = |toks: &[u32], pooling: u32, cap: usize, want: Status, msg: &str| {
        let mut out = vec![0f32; cap];
        let mut len = 7usize;
        // SAFETY: a live model; live slices of the lengths passed.
        let s =
            unsafe { llmrt_embed(m.ptr, toks.as_ptr(), toks.len(), pooling, false, out.as_mut_ptr(), cap, &mut len) };
        assert_eq!(s, want, "{}", last_error());
        assert!(last_error().contains(msg), "message {:?} lacks {msg:?}", last_error());
        len
    };
    bad(&[], MEAN, h, Status::LLMRT_INVALID_ARGUMENT, "n_tokens = 0");
    bad(&f.tokens, 3, h, Status::LLMRT_INVALID_ARGUMENT, "pooling = 3");
    bad(&[f.vocab as u32], MEAN, h, Status::LLMRT_INVALID_ARGUMENT, "outside the vocabulary");
    assert_eq!(bad(&f.tokens, NONE, h, Status::LLMRT_BUFFER_TOO_SMALL, "do not fit"), f.tokens.len() * h);
    assert_eq!(bad(&f.tokens, LAST, h - 1, Status::LLMRT_BUFFER_TOO_SMALL, "do not fit"), h);
    let long = vec![1u32; m.ctx as usize + 1];
    bad(&long, LAST, h, Status::LLMRT_CONTEXT_FULL, "more than the context");
    drop(m);

    // A KV pool that one full-context cache exhausts: the embedding's own cache
    // cannot be reserved (OUT_OF_MEMORY), the caller's cache is untouched, and once
    // it is released the embedding runs.
    let probe = load(&path);
    let per_pos = {
        let i = probe.info();
        (i.n_layers * 2 * i.n_kv_heads * i.head_dim * 4) as u64
    };
    let ctx = probe.ctx as u64;
    drop(probe);
    let m = try_load(Path::new(&path), 1, per_pos * ctx).unwrap();
    let full = m.reserve(0);
    match m.embed(&f.tokens, MEAN, false) {
        Err((Status::LLMRT_OUT_OF_MEMORY, _)) => {}
        other => panic!("embedding with the pool full: {other:?}"),
    }
    assert_eq!(m.len(full), 0);
    assert_eq!(m.release(full), Status::LLMRT_OK);
    m.embed(&f.tokens, MEAN, false).expect("embedding once the pool is free");
    let again = m.reserve(0);
    assert_eq!(m.len(again), 0, "the embedding's cache was released (a full context reserves again)");
}
