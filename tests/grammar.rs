//! Grammar-constrained decoding through the C entry points (`llmrt_grammar_*`,
//! `llmrt_decode_sample_constrained`, `llmrt_sample_logits_constrained`), on two random-weight
//! fixtures with real tokenizers: qwen2 (byte-level BPE) and llama_gqa (SentencePiece with
//! byte fallback). The references are not ours: completions under a JSON schema must parse
//! with serde_json and validate with the `jsonschema` crate, regex (and regular Lark)
//! completions must match under the `regex` crate. Also: bad grammars fail at creation,
//! a failed step changes no cache and no grammar, batched equals lone, and the caller-held
//! logits variant equals the step.
mod common;
use common::*;
use llmrt::ffi::*;
use llmrt::Status;
use std::ffi::CString;

const JSON: u32 = llmrt_grammar_kind::LLMRT_GRAMMAR_JSON_SCHEMA as u32;
const REGEX: u32 = llmrt_grammar_kind::LLMRT_GRAMMAR_REGEX as u32;
const LARK: u32 = llmrt_grammar_kind::LLMRT_GRAMMAR_LARK as u32;

/// The JSON schema of the main test: a required string, a bounded integer, an enum and a
/// short array of booleans; compact JSON (no free whitespace, llguidance's x-guidance
/// option; validators ignore the unknown keyword) so a completion has a bounded length.
const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "s": {"type": "string", "pattern": "^[a-z]{1,6}$"},
    "n": {"type": "integer", "minimum": -5, "maximum": 42},
    "e": {"enum": ["red", "green", "blue"]},
    "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}
  },
  "required": ["s", "n", "e", "b"],
  "additionalProperties": false,
  "x-guidance": {"whitespace_flexible": false}
}"#;

/// A grammar handle, freed on drop.
struct G(*mut llmrt_grammar);

impl Drop for G {
    fn drop(&mut self) {
        // SAFETY: came from llmrt_grammar_new, freed only here.
        unsafe { llmrt_grammar_free(self.0) }
    }
}

fn try_grammar(m: &M, kind: u32, src: &str) -> Result<G, (Status, String)> {
    let c = CString::new(src).unwrap();
    let sentinel = 0x10 as *mut llmrt_grammar;
    let mut g = sentinel;
    // SAFETY: a live model, a NUL-terminated source, a local out-pointer.
    let s = unsafe { llmrt_grammar_new(m.ptr, kind, c.as_ptr(), &mut g) };
    if s == Status::LLMRT_OK {
        Ok(G(g))
    } else {
        assert_eq!(g, sentinel, "out_grammar written by a failed llmrt_grammar_new");
        Err((s, last_error()))
    }
}

fn grammar(m: &M, kind: u32, src: &str) -> G {
    try_grammar(m, kind, src).unwrap_or_else(|(s, e)| panic!("grammar {src:?}: {s:?} {e}"))
}

impl G {
    fn done(&self) -> bool {
        let mut d = false;
        // SAFETY: a live grammar and a local.
        ok(unsafe { llmrt_grammar_is_done(self.0, &mut d) }, "is_done");
        d
    }
    fn can_stop(&self) -> bool {
        let mut d = false;
        // SAFETY: a live grammar and a local.
        ok(unsafe { llmrt_grammar_can_stop(self.0, &mut d) }, "can_stop");
        d
    }
    fn accept(&self, t: u32) -> Status {
        // SAFETY: a live grammar.
        unsafe { llmrt_grammar_accept(self.0, t) }
    }
    fn reset(&self) {
        // SAFETY: a live grammar.
        ok(unsafe { llmrt_grammar_reset(self.0) }, "reset")
    }
}

fn params(seed: u64) -> llmrt_sampler_params {
    let mut p = default_sampler_params();
    // The whole masked distribution: every allowed token can be drawn.
    p.temperature = 1.0;
    p.top_k = 0;
    p.top_p = 1.0;
    p.min_p = 0.0;
    p.seed = seed;
    p
}

/// One constrained step; on failure checks that `next_tokens` was not written.
fn step(
    m: &M,
    caches: &[u64],
    toks: &[u32],
    ps: &[&llmrt_sampler_params],
    gs: &[*mut llmrt_grammar],
) -> Result<Vec<u32>, (Status, String)> {
    let mut next = vec![u32::MAX; caches.len()];
    let pp: Vec<*const llmrt_sampler_params> = ps.iter().map(|p| *p as *const _).collect();
    // SAFETY: a live model; every array is a live local of length n; every params pointer
    // points to a filled struct, every grammar is live or NULL.
    let s = unsafe {
        llmrt_decode_sample_constrained(
            m.ptr,
            caches.len(),
            caches.as_ptr(),
            toks.as_ptr(),
            pp.as_ptr(),
            gs.as_ptr(),
            next.as_mut_ptr(),
        )
    };
    if s == Status::LLMRT_OK {
        Ok(next)
    } else {
        assert!(next.iter().all(|&t| t == u32::MAX), "next_tokens written by a failed step");
        Err((s, last_error()))
    }
}

fn tokenize(m: &M, text: &str, bos: bool) -> Vec<u32> {
    let mut out = vec![0u32; text.len() + 8];
    let mut n = 0;
    // SAFETY: a live model; text and out are live buffers of the lengths passed.
    let s =
        unsafe { llmrt_tokenize(m.ptr, text.as_ptr().cast(), text.len(), bos, out.as_mut_ptr(), out.len(), &mut n) };
    ok(s, "tokenize");
    out.truncate(n);
    out
}

fn piece(m: &M, t: u32) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let mut n = 0;
    // SAFETY: a live model; buf a live buffer of the length passed.
    ok(unsafe { llmrt_token_piece(m.ptr, t, buf.as_mut_ptr().cast(), buf.len(), &mut n) }, "token_piece");
    buf.truncate(n);
    buf
}

fn is_eog(m: &M, t: u32) -> bool {
    // SAFETY: a live model.
    unsafe { llmrt_token_is_eog(m.ptr, t) }
}

fn fixture(name: &str) -> M {
    let f = Fixture::all().into_iter().find(|f| f.name == name).unwrap_or_else(|| panic!("{name} fixture"));
    load(&f.gguf("f32"))
}

/// A cache holding the prompt but its last token (fed by the first step).
fn prompt_cache(m: &M, text: &str) -> (u64, u32) {
    let toks = tokenize(m, text, true);
    assert!(toks.len() >= 2);
    let c = m.reserve(0);
    m.prefill(c, &toks[..toks.len() - 1]);
    (c, *toks.last().unwrap())
}

/// Completions of `grammars.len()` requests in one batch (forks of `base`, the first step
/// feeding `last`), seed `seeds[i]` each, until every grammar is done or `max` tokens. Checks
/// on the way: a done grammar's step gives the model's EOS; an end-of-generation token ends
/// a request and leaves its grammar done. Returns each request's bytes (the tokens' pieces,
/// the end token left out), or None for one that did not finish in `max` tokens.
fn complete(m: &M, base: u64, last: u32, gs: &[&G], seeds: &[u64], max: usize) -> Vec<Option<Vec<u8>>> {
    let eos = m.info().eos_token;
    let n = gs.len();
    let caches: Vec<u64> = (0..n).map(|_| m.fork(base)).collect();
    let ps: Vec<llmrt_sampler_params> = seeds.iter().map(|&s| params(s)).collect();
    let mut out: Vec<Option<Vec<u8>>> = vec![None; n];
    let mut text: Vec<Vec<u8>> = vec![vec![]; n];
    let mut active: Vec<usize> = (0..n).collect();
    let mut feed: Vec<u32> = vec![last; n];
    for _ in 0..=max {
        if active.is_empty() {
            break;
        }
        let was_done: Vec<bool> = active.iter().map(|&i| gs[i].done()).collect();
        let c: Vec<u64> = active.iter().map(|&i| caches[i]).collect();
        let t: Vec<u32> = active.iter().map(|&i| feed[i]).collect();
        let p: Vec<&llmrt_sampler_params> = active.iter().map(|&i| &ps[i]).collect();
        let g: Vec<*mut llmrt_grammar> = active.iter().map(|&i| gs[i].0).collect();
        let next = step(m, &c, &t, &p, &g).unwrap_or_else(|(s, e)| panic!("constrained step: {s:?} {e}"));
        let mut still = vec![];
        for (k, &i) in active.iter().enumerate() {
            let tok = next[k];
            if was_done[k] {
                assert_eq!(tok, eos, "a done grammar's step gives the model's EOS");
            }
            if is_eog(m, tok) {
                assert!(gs[i].done(), "the grammar is done after an end token");
                out[i] = Some(std::mem::take(&mut text[i]));
            } else {
                text[i].extend(piece(m, tok));
                feed[i] = tok;
                still.push(i);
            }
        }
        active = still;
    }
    for c in caches {
        assert_eq!(m.release(c), Status::LLMRT_OK);
    }
    out
}

/// `count` completions, `batch` at a time, each with its own grammar of (kind, src), seeds
/// from `seed0`; every one must finish in `max` tokens.
#[allow(clippy::too_many_arguments)]
fn completions(
    m: &M,
    prompt: &str,
    kind: u32,
    src: &str,
    count: usize,
    batch: usize,
    seed0: u64,
    max: usize,
) -> Vec<Vec<u8>> {
    let (base, last) = prompt_cache(m, prompt);
    let gs: Vec<G> = (0..batch).map(|_| grammar(m, kind, src)).collect();
    let mut all = vec![];
    let mut seed = seed0;
    while all.len() < count {
        let k = batch.min(count - all.len());
        let refs: Vec<&G> = gs[..k].iter().collect();
        for g in &refs {
            g.reset(); // every round starts from the start state
        }
        let seeds: Vec<u64> = (0..k as u64).map(|i| seed + i).collect();
        seed += k as u64;
        for (i, r) in complete(m, base, last, &refs, &seeds, max).into_iter().enumerate() {
            let r = r.unwrap_or_else(|| panic!("completion with seed {} did not finish in {max} tokens", seeds[i]));
            all.push(r);
        }
    }
    assert_eq!(m.release(base), Status::LLMRT_OK);
    all
}

#[test]
fn json_schema_completions_parse_and_validate() {
    let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the test schema is a valid JSON Schema");
    for name in ["qwen2", "llama_gqa"] {
        let m = fixture(name);
        let outs = completions(&m, "The record as JSON:", JSON, SCHEMA, 200, 8, 1000, 96);
        let mut distinct = std::collections::BTreeSet::new();
        for bytes in &outs {
            let text = String::from_utf8(bytes.clone()).unwrap_or_else(|e| panic!("{name}: not UTF-8: {e}"));
            let v: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {text:?} is not JSON: {e}"));
            let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{name}: {text} does not validate: {errors:?}");
            distinct.insert(text);
        }
        // Temperature 1 over the whole masked vocabulary explores: not one answer repeated.
        assert!(distinct.len() > 150, "{name}: only {} distinct completions of 200", distinct.len());
        // The checks can fail: an instance outside the schema is rejected.
        let bad: serde_json::Value = serde_json::from_str(r#"{"s":"abc","n":43,"e":"red","b":[]}"#).unwrap();
        assert!(!validator.is_valid(&bad));
    }
}

#[test]
fn regex_completions_match() {
    let rx = r"(ID|id)-[0-9]{2,4}(\.[a-f]{1,3})? (yes|no)";
    let re = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
    for name in ["qwen2", "llama_gqa"] {
        let m = fixture(name);
        let outs = completions(&m, "Code:", REGEX, rx, 48, 8, 7, 64);
        let mut distinct = std::collections::BTreeSet::new();
        for bytes in outs {
            let text = String::from_utf8(bytes).unwrap();
            assert!(re.is_match(&text), "{name}: {text:?} does not match {rx}");
            distinct.insert(text);
        }
        assert!(distinct.len() > 24, "{name}: {} distinct of 48", distinct.len());
    }
}

#[test]
fn lark_grammar_completions() {
    // A context-free grammar: rules, alternatives, a regex terminal, and a JSON schema
    // embedded with %json; checked by the regex crate and the jsonschema crate.
    let lark = r#"
start: greeting " " name "! " record
greeting: "hello" | "hi" | "good " daypart
daypart: "morning" | "night"
name: NAME
NAME: /[A-Z][a-z]{0,5}/
record: %json {"type": "object", "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 9}},
               "required": ["k"], "additionalProperties": false, "x-guidance": {"whitespace_flexible": false}}
"#;
    let re = regex::Regex::new(r#"^(hello|hi|good (morning|night)) [A-Z][a-z]{0,5}! (?P<j>.*)$"#).unwrap();
    let schema: serde_json::Value = serde_json::json!({"type": "object", "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 9}},
                           "required": ["k"], "additionalProperties": false});
    let validator = jsonschema::validator_for(&schema).unwrap();
    for name in ["qwen2", "llama_gqa"] {
        let m = fixture(name);
        for bytes in completions(&m, "Say:", LARK, lark, 32, 8, 99, 64) {
            let text = String::from_utf8(bytes).unwrap();
            let caps = re.captures(&text).unwrap_or_else(|| panic!("{name}: {text:?} does not match"));
            let v: serde_json::Value = serde_json::from_str(&caps["j"]).unwrap();
            assert!(validator.is_valid(&v), "{name}: {text:?}");
        }
    }
}

#[test]
fn bad_grammars_fail_at_creation_with_llguidance_message() {
    let m = fixture("qwen2");
    let cases: &[(u32, &str, &str)] = &[
        (JSON, "{\"type\": \"object\",", "not JSON"),
        (JSON, r#"{"type": "frobnicate"}"#, "frobnicate"),
        (JSON, r#"{"type": "integer", "minimum": 10, "maximum": 2}"#, "minimum (10) is greater than maximum (2)"),
        (JSON, r#"{"allOf": [{"type": "string"}, {"type": "integer"}]}"#, "Unsatisfiable schema"),
        (JSON, "false", "Unsatisfiable schema"),
        (REGEX, "(ab", "regex parse error"),
        (REGEX, r"[^\s\S]", "regex: cannot match anything"),
        (LARK, "start: foo\n", "foo"),
        (LARK, "start: \"a\" (\n", "Lark grammar: 1(13): Expected token"),
        (LARK, "start: /[^\\s\\S]/\n", "Lark grammar: cannot match anything"),
    ];
    for &(kind, src, needle) in cases {
        match try_grammar(&m, kind, src) {
            Ok(_) => panic!("{src:?} was accepted"),
            Err((s, e)) => {
                assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT, "{src:?}: {e}");
                assert!(e.starts_with("llmrt_grammar_new: "), "{e}");
                assert!(e.contains(needle), "{src:?}: {needle:?} not in {e:?}");
            }
        }
    }
    let (s, e) = try_grammar(&m, 7, "a").err().unwrap();
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert!(e.contains("kind = 7 is not an llmrt_grammar_kind"), "{e}");
    let mut g = std::ptr::null_mut();
    // SAFETY: a live model; a NUL-terminated string of invalid UTF-8; a local out-pointer.
    let s = unsafe { llmrt_grammar_new(m.ptr, REGEX, c"a\xffb".as_ptr(), &mut g) };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert!(last_error().contains("not valid UTF-8 at byte offset 1"), "{}", last_error());
    // SAFETY: NULL source.
    let s = unsafe { llmrt_grammar_new(m.ptr, REGEX, std::ptr::null(), &mut g) };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert!(g.is_null());
    // The same sources, fixed, are accepted (the failures are about the grammars).
    for (kind, src) in
        [(JSON, r#"{"type": "integer", "minimum": 2, "maximum": 10}"#), (REGEX, "(ab)"), (LARK, "start: \"a\"\n")]
    {
        grammar(&m, kind, src);
    }
}

#[test]
fn accept_reset_done_and_can_stop() {
    let m = fixture("qwen2");
    let eos = m.info().eos_token;
    let g = grammar(&m, REGEX, "ab|abcd");
    assert!(!g.done() && !g.can_stop());
    let ids = tokenize(&m, "abcd", false);
    let bytes: Vec<u8> = ids.iter().flat_map(|&t| piece(&m, t)).collect();
    assert_eq!(bytes, b"abcd");
    // A token the grammar does not allow: refused, state unchanged.
    let x = tokenize(&m, "x", false)[0];
    assert_eq!(g.accept(x), Status::LLMRT_INVALID_ARGUMENT);
    assert!(last_error().contains("not allowed by the grammar"), "{}", last_error());
    assert_eq!(g.accept(eos), Status::LLMRT_INVALID_ARGUMENT, "EOS before the text is complete");
    assert_eq!(g.accept(1 << 30), Status::LLMRT_INVALID_ARGUMENT);
    // Byte by byte through the prefix "ab": complete but not done ("cd" may follow).
    let single = |s: &str| {
        let t = tokenize(&m, s, false);
        assert_eq!(t.len(), 1, "{s:?} is one token");
        t[0]
    };
    ok(g.accept(single("a")), "accept a");
    ok(g.accept(single("b")), "accept b");
    assert!(g.can_stop() && !g.done());
    ok(g.accept(single("c")), "accept c");
    assert!(!g.can_stop());
    ok(g.accept(single("d")), "accept d");
    assert!(g.done() && g.can_stop());
    ok(g.accept(eos), "EOS once done");
    assert!(g.done());
    assert_eq!(g.accept(single("a")), Status::LLMRT_INVALID_ARGUMENT);
    g.reset();
    assert!(!g.done() && !g.can_stop());
    for &t in &ids {
        ok(g.accept(t), "accept the text's own tokens");
    }
    assert!(g.done());
}

/// A few constrained steps of one request, returning its tokens.
fn run_alone(m: &M, base: u64, last: u32, src: &str, seed: u64, steps: usize) -> Vec<u32> {
    let g = grammar(m, JSON, src);
    let c = m.fork(base);
    let p = params(seed);
    let mut tok = last;
    let mut out = vec![];
    for _ in 0..steps {
        tok = step(m, &[c], &[tok], &[&p], &[g.0]).unwrap()[0];
        out.push(tok);
    }
    m.release(c);
    out
}

#[test]
fn batched_equals_lone() {
    for name in ["qwen2", "llama_gqa"] {
        let m = fixture(name);
        let (base, last) = prompt_cache(&m, "JSON:");
        let srcs = [
            SCHEMA,
            r#"{"type": "array", "items": {"type": "integer"}, "x-guidance": {"whitespace_flexible": false}}"#,
        ];
        let steps = 20;
        // Four requests: two schemas, different seeds, and one unconstrained.
        let lone: Vec<Vec<u32>> =
            (0..3).map(|i| run_alone(&m, base, last, srcs[i % 2], 50 + i as u64, steps)).collect();
        let gs: Vec<G> = (0..3).map(|i| grammar(&m, JSON, srcs[i % 2])).collect();
        let caches: Vec<u64> = (0..4).map(|_| m.fork(base)).collect();
        let ps: Vec<llmrt_sampler_params> = (0..4).map(|i| params(50 + i as u64)).collect();
        let pr: Vec<&llmrt_sampler_params> = ps.iter().collect();
        let mut feed = vec![last; 4];
        let mut got: Vec<Vec<u32>> = vec![vec![]; 4];
        let mut gp: Vec<*mut llmrt_grammar> = gs.iter().map(|g| g.0).collect();
        gp.push(std::ptr::null_mut());
        for _ in 0..steps {
            feed = step(&m, &caches, &feed, &pr, &gp).unwrap();
            for (g, &t) in got.iter_mut().zip(&feed) {
                g.push(t);
            }
        }
        for i in 0..3 {
            assert_eq!(got[i], lone[i], "{name}: request {i} batched vs alone");
        }
        // The unconstrained entry is plain llmrt_decode_sample_each sampling.
        let c = m.fork(base);
        let mut tok = last;
        for (k, &want) in got[3].iter().enumerate() {
            let mut next = u32::MAX;
            let p: *const llmrt_sampler_params = &ps[3];
            // SAFETY: a live model; locals of length 1.
            ok(unsafe { llmrt_decode_sample_each(m.ptr, 1, &c, &tok, &p, &mut next) }, "decode_sample_each");
            assert_eq!(next, want, "{name}: unconstrained step {k}");
            tok = next;
        }
        // Constrained output differs from unconstrained (the mask does something).
        let free = {
            let c = m.fork(base);
            let mut tok = last;
            let mut v = vec![];
            for _ in 0..steps {
                let mut next = u32::MAX;
                let p: *const llmrt_sampler_params = &ps[0];
                // SAFETY: as above.
                ok(unsafe { llmrt_decode_sample_each(m.ptr, 1, &c, &tok, &p, &mut next) }, "decode_sample_each");
                v.push(next);
                tok = next;
            }
            v
        };
        assert_ne!(free, got[0], "{name}: the grammar changed nothing");
    }
}

#[test]
fn sample_logits_constrained_equals_the_step() {
    let m = fixture("llama_gqa");
    let prompt = tokenize(&m, "JSON:", true);
    let (base, last) = prompt_cache(&m, "JSON:");
    let g_step = grammar(&m, JSON, SCHEMA);
    let g_host = grammar(&m, JSON, SCHEMA);
    let (a, b) = (m.fork(base), m.fork(base));
    // Penalties on, so the history matters too.
    let mut p = params(5);
    p.repetition_penalty = 1.3;
    p.presence_penalty = 0.5;
    let (mut ta, mut tb) = (last, last);
    let mut hist = prompt.clone();
    let mut steps = 0;
    while steps < 80 && !g_step.done() {
        ta = step(&m, &[a], &[ta], &[&p], &[g_step.0]).unwrap()[0];
        // The same cache state through llmrt_decode + the caller-held variant + accept.
        let row = m.decode(&[b], &[tb]);
        if steps > 0 {
            hist.push(tb);
        }
        assert_eq!(hist.len() as u32, m.len(b));
        let mut t = u32::MAX;
        // SAFETY: p a filled struct; a live grammar; row and hist live slices.
        let s = unsafe {
            llmrt_sample_logits_constrained(
                &p,
                g_host.0,
                row.as_ptr(),
                row.len(),
                hist.as_ptr(),
                hist.len(),
                hist.len() as u64,
                &mut t,
            )
        };
        ok(s, "sample_logits_constrained");
        assert_eq!(t, ta, "step {steps}");
        ok(g_host.accept(t), "accept");
        tb = t;
        steps += 1;
    }
    assert!(g_step.done() && g_host.done(), "finished in {steps} steps");
    // Once done, the caller-held variant gives the EOS too.
    let row = vec![0f32; m.vocab];
    let mut t = u32::MAX;
    // SAFETY: as above.
    ok(
        unsafe {
            llmrt_sample_logits_constrained(&p, g_host.0, row.as_ptr(), row.len(), std::ptr::null(), 0, 0, &mut t)
        },
        "done",
    );
    assert_eq!(t, m.info().eos_token);
    // Wrong row length: refused, nothing written.
    let mut t = 77u32;
    let row = vec![0f32; m.vocab - 1];
    // SAFETY: as above with a shorter row.
    let s = unsafe {
        llmrt_sample_logits_constrained(&p, g_host.0, row.as_ptr(), row.len(), std::ptr::null(), 0, 0, &mut t)
    };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert_eq!(t, 77);
}

/// A step that must fail: caches, tokens, parameter sets, grammars, and a text of its message.
type Failure<'a> = (Vec<u64>, Vec<u32>, Vec<&'a llmrt_sampler_params>, Vec<*mut llmrt_grammar>, &'static str);

#[test]
fn failed_steps_change_no_cache_and_no_grammar() {
    let m = fixture("qwen2");
    let other = fixture("llama_gqa");
    let (base, last) = prompt_cache(&m, "JSON:");
    let steps = 12;
    // The reference: two requests stepped with no failed call in between.
    let reference = {
        let gs = [grammar(&m, JSON, SCHEMA), grammar(&m, REGEX, "[a-z]{3,30}")];
        let c = [m.fork(base), m.fork(base)];
        let (p0, p1) = (params(11), params(12));
        let mut feed = vec![last, last];
        let mut out = vec![];
        for _ in 0..steps {
            feed = step(&m, &c, &feed, &[&p0, &p1], &[gs[0].0, gs[1].0]).unwrap();
            out.push(feed.clone());
        }
        out
    };
    let gs = [grammar(&m, JSON, SCHEMA), grammar(&m, REGEX, "[a-z]{3,30}")];
    let broken = grammar(&m, REGEX, "[a-z]+");
    // SAFETY: a live grammar.
    unsafe { debug_break_grammar(broken.0) };
    let foreign = grammar(&other, REGEX, "[a-z]+");
    let c = [m.fork(base), m.fork(base)];
    let spare = m.fork(base);
    let (p0, p1) = (params(11), params(12));
    // Bans every letter and EOS: nothing the regex allows has a finite logit (fails after the forward pass).
    let bans: Vec<llmrt_logit_bias> = (0..m.vocab as u32)
        .filter(|&t| piece(&m, t).first().is_some_and(|b| b.is_ascii_lowercase()) || is_eog(&m, t))
        .map(|t| llmrt_logit_bias { token: t, bias: f32::NEG_INFINITY })
        .collect();
    let mut banned = params(12);
    banned.logit_bias = bans.as_ptr();
    banned.n_logit_bias = bans.len();
    let mut feed = vec![last, last];
    for (k, want) in reference.iter().enumerate() {
        let lens: Vec<u32> = c.iter().chain([&spare]).map(|&c| m.len(c)).collect();
        let failures: Vec<Failure<'_>> = vec![
            (vec![c[0], 999_999], feed.clone(), vec![&p0, &p1], vec![gs[0].0, gs[1].0], "999999"),
            (
                vec![c[0], c[1], spare],
                vec![feed[0], feed[1], last],
                vec![&p0, &p1, &p1],
                vec![gs[0].0, gs[1].0, broken.0],
                "grammars[2]",
            ),
            (vec![c[0], c[1]], feed.clone(), vec![&p0, &p1], vec![gs[0].0, gs[0].0], "grammars[1]"),
            (vec![c[0], c[1]], feed.clone(), vec![&p0, &p1], vec![gs[0].0, foreign.0], "another model"),
            (vec![c[0], c[1]], feed.clone(), vec![&p0, &banned], vec![gs[0].0, gs[1].0], "grammars[1]: no token"),
        ];
        for (caches, toks, ps, grs, needle) in &failures {
            let (s, e) = step(&m, caches, toks, ps, grs).err().unwrap_or_else(|| panic!("step {k}: {needle} passed"));
            assert_ne!(s, Status::LLMRT_OK);
            assert!(e.contains(needle), "step {k}: {needle:?} not in {e}");
            let now: Vec<u32> = c.iter().chain([&spare]).map(|&c| m.len(c)).collect();
            assert_eq!(now, lens, "step {k}: a cache moved in a failed step ({needle})");
        }
        feed = step(&m, &c, &feed, &[&p0, &p1], &[gs[0].0, gs[1].0]).unwrap();
        assert_eq!(&feed, want, "step {k}: the failed calls changed what comes next");
    }
}
