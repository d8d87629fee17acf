//! The sampler against llama.cpp's own samplers: tests/fixtures/sampling/llamacpp_sampler.txt
//! was written by tools/llamacpp_sampler.cpp (scripts/make-sampling-fixture.sh), which runs
//! llama.cpp's logit_bias, penalties (repeat / frequency / presence over the last n
//! tokens), greedy, temp, top_k, top_p, min_p and dist samplers on generated logits. The
//! greedy token must be the same id; the distribution the draw is made from must keep the
//! same tokens with probabilities within 1e-6. Checked through the Rust core and through
//! the C entry point `llmrt_sample_logits`.
mod common;
use common::*;
use llmrt::ffi::*;
use llmrt::sample::{self, SamplerParams};
use llmrt::Status;
use std::collections::HashMap;

struct Case {
    index: usize,
    params: SamplerParams,
    logits: Vec<f32>,
    history: Vec<u32>,
    greedy: u32,
    probs: Option<Vec<(u32, f64)>>,
}

/// `name n v0 v1 ...` (each item `per` words) -> the items' words.
fn counted<'a>(line: &'a str, name: &str, per: usize) -> Vec<&'a str> {
    let mut w = line.split_ascii_whitespace();
    assert_eq!(w.next(), Some(name), "{line:.80}");
    let n: usize = w.next().unwrap().parse().unwrap();
    let rest: Vec<&str> = w.collect();
    assert_eq!(rest.len(), n * per, "{name}: {n} items of {per}");
    rest
}

fn f(s: &str) -> f32 {
    s.parse().unwrap_or_else(|_| panic!("not a float: {s}"))
}

fn cases() -> Vec<Case> {
    let path = fixtures().join("sampling/llamacpp_sampler.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(head) = lines.next() {
        let index: usize = head.strip_prefix("case ").expect(head).parse().unwrap();
        let p: Vec<&str> = lines.next().unwrap().split_ascii_whitespace().collect();
        assert_eq!(p[0], "params");
        let logits: Vec<f32> = counted(lines.next().unwrap(), "logits", 1).into_iter().map(f).collect();
        let history: Vec<u32> =
            counted(lines.next().unwrap(), "history", 1).into_iter().map(|s| s.parse().unwrap()).collect();
        let b = counted(lines.next().unwrap(), "bias", 2);
        let logit_bias: Vec<(u32, f32)> = b.chunks(2).map(|c| (c[0].parse().unwrap(), f(c[1]))).collect();
        let g = lines.next().unwrap();
        let greedy: u32 = g.strip_prefix("greedy ").expect(g).parse().unwrap();
        let mut probs = None;
        let mut l = lines.next().unwrap();
        if l.starts_with("probs") {
            let v = counted(l, "probs", 2);
            probs = Some(v.chunks(2).map(|c| (c[0].parse().unwrap(), c[1].parse::<f64>().unwrap())).collect());
            l = lines.next().unwrap();
        }
        assert_eq!(l, "end");
        let params = SamplerParams {
            temperature: f(p[1]),
            top_k: p[2].parse().unwrap(),
            top_p: f(p[3]),
            min_p: f(p[4]),
            penalty_last_n: p[5].parse().unwrap(),
            repetition_penalty: f(p[6]),
            frequency_penalty: f(p[7]),
            presence_penalty: f(p[8]),
            logit_bias,
            seed: 5,
        };
        out.push(Case { index, params, logits, history, greedy, probs });
    }
    out
}

/// The fixture exercises what it claims to: every penalty, bias (with bans and repeats),
/// windows shorter than the history, filters, big and small vocabularies.
#[test]
fn fixture_covers_the_features() {
    let cs = cases();
    assert_eq!(cs.len(), 120);
    let any = |pred: &dyn Fn(&Case) -> bool| cs.iter().filter(|c| pred(c)).count();
    assert!(any(&|c| c.params.frequency_penalty != 0.0 && !c.history.is_empty()) >= 10);
    assert!(any(&|c| c.params.presence_penalty != 0.0 && !c.history.is_empty()) >= 10);
    assert!(any(&|c| c.params.repetition_penalty != 1.0 && !c.history.is_empty()) >= 10);
    assert!(any(&|c| c.params.penalty_last_n > 0 && (c.params.penalty_last_n as usize) < c.history.len()) >= 10);
    assert!(any(&|c| c.params.logit_bias.iter().any(|b| b.1 == f32::NEG_INFINITY)) >= 3);
    assert!(any(&|c| c.params.logit_bias.len() >= 3) >= 10);
    assert!(any(&|c| c.probs.is_some() && c.params.top_p < 1.0) >= 10);
    assert!(any(&|c| c.probs.is_some() && c.params.min_p > 0.0) >= 10);
    assert!(any(&|c| c.probs.is_some() && c.params.top_k > 0) >= 10);
    assert!(any(&|c| c.logits.len() > 1024) >= 4);
    // The penalties and biases matter: in many cases the greedy token is not the raw argmax.
    let flipped = any(&|c| llmrt::util::argmax(&c.logits) != c.greedy);
    assert!(flipped >= 20, "only {flipped} cases where bias/penalties change the greedy token");
}

#[test]
fn greedy_with_bias_and_penalties_matches_llamacpp() {
    for c in cases() {
        let p = SamplerParams { temperature: 0.0, ..c.params.clone() };
        for pos in [0u64, 17] {
            assert_eq!(sample::sample(&c.logits, &p, &c.history, pos), c.greedy, "case {}", c.index);
        }
    }
}

#[test]
fn distribution_matches_llamacpp() {
    let mut checked = 0;
    for c in cases() {
        let Some(want) = &c.probs else { continue };
        let got = sample::distribution(&c.logits, &c.params, &c.history);
        let got_ids: Vec<u32> = {
            let mut v: Vec<u32> = got.iter().map(|e| e.0).collect();
            v.sort_unstable();
            v
        };
        let mut want_ids: Vec<u32> = want.iter().map(|e| e.0).collect();
        want_ids.sort_unstable();
        assert_eq!(got_ids, want_ids, "case {}: kept tokens", c.index);
        let w: HashMap<u32, f64> = want.iter().copied().collect();
        for &(id, p) in &got {
            let d = (p - w[&id]).abs();
            assert!(d <= 1e-6, "case {}: token {id}: p {p} vs llama.cpp {} (diff {d:e})", c.index, w[&id]);
        }
        // The draw comes from that distribution: across positions, only kept tokens.
        for pos in 0..50 {
            let t = sample::sample(&c.logits, &c.params, &c.history, pos);
            assert!(w.contains_key(&t), "case {}: drew {t}, not kept by llama.cpp", c.index);
        }
        checked += 1;
    }
    assert!(checked >= 60, "{checked} cases with a distribution");
}

/// `llmrt_sample_logits` with a struct filled by the C default writer gives what the core
/// gives: the greedy ids match llama.cpp, and sampled draws match the core's.
#[test]
fn c_entry_point_matches_llamacpp() {
    for c in cases() {
        let mut p = std::mem::MaybeUninit::<llmrt_sampler_params>::uninit();
        // SAFETY: a pointer to a local MaybeUninit of the right type, written in full.
        unsafe { llmrt_sampler_params_default(p.as_mut_ptr()) };
        // SAFETY: filled in by llmrt_sampler_params_default just above.
        let mut p = unsafe { p.assume_init() };
        let bias: Vec<llmrt_logit_bias> =
            c.params.logit_bias.iter().map(|&(token, bias)| llmrt_logit_bias { token, bias }).collect();
        p.temperature = 0.0;
        p.top_k = c.params.top_k;
        p.top_p = c.params.top_p;
        p.min_p = c.params.min_p;
        p.penalty_last_n = c.params.penalty_last_n;
        p.repetition_penalty = c.params.repetition_penalty;
        p.frequency_penalty = c.params.frequency_penalty;
        p.presence_penalty = c.params.presence_penalty;
        p.logit_bias = if bias.is_empty() { std::ptr::null() } else { bias.as_ptr() };
        p.n_logit_bias = bias.len();
        p.seed = c.params.seed;
        let call = |p: &llmrt_sampler_params, pos: u64| -> u32 {
            let mut t = u32::MAX;
            // SAFETY: p is a filled struct whose logit_bias points into `bias` (alive); logits
            // and history are live slices of the lengths passed; t a local.
            let s = unsafe {
                llmrt_sample_logits(
                    p,
                    c.logits.as_ptr(),
                    c.logits.len(),
                    c.history.as_ptr(),
                    c.history.len(),
                    pos,
                    &mut t,
                )
            };
            assert_eq!(s, Status::LLMRT_OK, "case {}: {}", c.index, last_error());
            t
        };
        assert_eq!(call(&p, 3), c.greedy, "case {} greedy", c.index);
        if c.probs.is_some() {
            p.temperature = c.params.temperature;
            for pos in [0u64, 1, 99] {
                assert_eq!(call(&p, pos), sample::sample(&c.logits, &c.params, &c.history, pos), "case {}", c.index);
            }
        }
    }
}
