//! The chat C API on models built here: the model's own chat template (GGUF
//! `tokenizer.chat_template`, HF tokenizer_config.json / chat_template.jinja) rendered as
//! transformers renders it (expected strings from tests/fixtures/chat/expected.json), the
//! end-of-generation ids (GGUF eos/eot/eom, special tokens by text, every id of HF
//! config.json / generation_config.json eos lists), and the stop-string matcher fed the
//! same text split at every byte position, against a whole-text cut computed with `str::find`.

mod common;

use common::{fixtures, last_error, load, try_load, Fixture, M};
use llmrt::ffi::*;
use llmrt::format::gguf::{Gguf, Value};
use llmrt::format::gguf_write::GgufWriter;
use llmrt::Status;
use std::ffi::CString;
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("llmrt-chat-{}-{name}", std::process::id()))
}

/// llmrt_chat_apply through the C boundary, with the BUFFER_TOO_SMALL protocol.
fn chat_apply(m: *const llmrt_model, tmpl: Option<&str>, msgs: &[(&str, &str)], gen: bool) -> Result<String, Status> {
    let tmpl = tmpl.map(|t| CString::new(t).unwrap());
    let owned: Vec<(CString, CString)> =
        msgs.iter().map(|(r, c)| (CString::new(*r).unwrap(), CString::new(*c).unwrap())).collect();
    let cm: Vec<llmrt_chat_message> =
        owned.iter().map(|(r, c)| llmrt_chat_message { role: r.as_ptr(), content: c.as_ptr() }).collect();
    let tp = tmpl.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    let mut need = 0usize;
    // SAFETY: m is NULL or live; strings are NUL-terminated locals; NULL buffer with capacity 0.
    let s = unsafe { llmrt_chat_apply(m, tp, cm.as_ptr(), cm.len(), gen, std::ptr::null_mut(), 0, &mut need) };
    if s != Status::LLMRT_OK && s != Status::LLMRT_BUFFER_TOO_SMALL {
        return Err(s);
    }
    let mut buf = vec![0u8; need];
    let mut len = usize::MAX;
    if need > 0 {
        // One byte short: too small, the size again, nothing written.
        // SAFETY: as above; buf holds need - 1 bytes.
        let s =
            unsafe { llmrt_chat_apply(m, tp, cm.as_ptr(), cm.len(), gen, buf.as_mut_ptr().cast(), need - 1, &mut len) };
        assert_eq!((s, len), (Status::LLMRT_BUFFER_TOO_SMALL, need), "{}", last_error());
        assert!(buf.iter().all(|&b| b == 0));
    }
    // SAFETY: as above; buf holds need bytes.
    let s = unsafe { llmrt_chat_apply(m, tp, cm.as_ptr(), cm.len(), gen, buf.as_mut_ptr().cast(), need, &mut len) };
    assert_eq!(s, Status::LLMRT_OK, "{}", last_error());
    assert_eq!(len, need);
    Ok(String::from_utf8(buf).unwrap())
}

fn eog_tokens(m: &M) -> Vec<u32> {
    let mut n = 0usize;
    // SAFETY: live model; NULL with capacity 0; n a local.
    let s = unsafe { llmrt_eog_tokens(m.ptr, std::ptr::null_mut(), 0, &mut n) };
    assert!(s == Status::LLMRT_OK || s == Status::LLMRT_BUFFER_TOO_SMALL);
    let mut v = vec![0u32; n];
    // SAFETY: v holds n u32s.
    common::ok(unsafe { llmrt_eog_tokens(m.ptr, v.as_mut_ptr(), n, &mut n) }, "eog_tokens");
    for t in 0..m.vocab as u32 + 2 {
        // SAFETY: live model.
        assert_eq!(unsafe { llmrt_token_is_eog(m.ptr, t) }, v.contains(&t), "token {t}");
    }
    v
}

fn expected(template: &str, case: &str) -> String {
    let e = common::read_json(&fixtures().join("chat/expected.json"));
    e["templates"][template][case]["output"].as_str().unwrap().to_string()
}

fn conversation(name: &str) -> Vec<(String, String)> {
    let e = common::read_json(&fixtures().join("chat/expected.json"));
    e["conversations"][name]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_string(), m["content"].as_str().unwrap().to_string()))
        .collect()
}

fn template_src(name: &str) -> String {
    std::fs::read_to_string(fixtures().join("chat/templates").join(name)).unwrap()
}

/// llama_gqa's F32 GGUF with the tokenizer metadata changed by `edit`.
fn gguf_variant(edit: impl FnOnce(&mut Vec<(String, Value)>)) -> PathBuf {
    let f = Fixture::all().into_iter().find(|f| f.name == "llama_gqa").unwrap();
    let g = Gguf::open(&f.gguf("f32")).unwrap();
    let mut kvs: Vec<(String, Value)> = g.metadata().into_iter().filter(|(k, _)| k != "general.alignment").collect();
    edit(&mut kvs);
    let mut w = GgufWriter::new();
    for (k, v) in &kvs {
        w.kv(k, v.clone());
    }
    for t in &g.tensors {
        w.tensor(&t.name, &t.ne, t.dtype.unwrap(), g.tensor_data(t).to_vec());
    }
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let p = tmp(&format!("{}.gguf", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    w.write(&p).unwrap();
    p
}

fn set(kvs: &mut Vec<(String, Value)>, key: &str, v: Value) {
    kvs.retain(|(k, _)| k != key);
    kvs.push((key.to_string(), v));
}

#[test]
fn gguf_eog_ids_and_chat_template() {
    let n = 5usize; // renamed tokens sit at the end of the vocabulary
    let qwen = template_src("Qwen-Qwen2.5-7B-Instruct.jinja");
    let p = gguf_variant(|kvs| {
        let toks = kvs.iter_mut().find(|(k, _)| k == "tokenizer.ggml.tokens").unwrap();
        let Value::Array(t) = &mut toks.1 else { panic!() };
        let v = t.len();
        t[v - 1] = Value::Str("<|im_end|>".into());
        t[v - 2] = Value::Str("<end_of_turn>".into()); // a NORMAL token: not end of generation
        t[v - 3] = Value::Str("<|eot_id|>".into());
        let types = kvs.iter_mut().find(|(k, _)| k == "tokenizer.ggml.token_type").unwrap();
        let Value::Array(ty) = &mut types.1 else { panic!() };
        ty[v - 1] = Value::I32(3); // CONTROL
        ty[v - 2] = Value::I32(1); // NORMAL
        ty[v - 3] = Value::I32(4); // USER_DEFINED
        set(kvs, "tokenizer.ggml.eot_token_id", Value::U32(n as u32));
        set(kvs, "tokenizer.ggml.eom_token_id", Value::U32(n as u32 + 1));
        set(kvs, "tokenizer.chat_template", Value::Str(qwen.clone()));
    });
    let m = load(&p);
    let v = m.vocab as u32;
    let eos = m.info().eos_token;
    let mut want = vec![eos, n as u32, n as u32 + 1, v - 1, v - 3];
    want.sort();
    assert_eq!(eog_tokens(&m), want);

    // The model's own template, as transformers renders it (Qwen2.5's uses no bos/eos).
    for case in ["system_user", "multi_turn", "non_ascii"] {
        let conv = conversation(case);
        let msgs: Vec<(&str, &str)> = conv.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
        for gen in [true, false] {
            let key = format!("{case}/{}", if gen { "gen" } else { "nogen" });
            let got = chat_apply(m.ptr, None, &msgs, gen).unwrap();
            assert_eq!(got, expected("Qwen-Qwen2.5-7B-Instruct.jinja", &key), "{key}");
        }
    }
    // The template text, and the bos/eos strings a template sees (the tokens' texts).
    let mut need = 0usize;
    // SAFETY: live model; NULL with capacity 0.
    let s = unsafe { llmrt_chat_template(m.ptr, std::ptr::null_mut(), 0, &mut need) };
    assert_eq!((s, need), (Status::LLMRT_BUFFER_TOO_SMALL, qwen.len()));
    let got =
        chat_apply(m.ptr, Some("{{ bos_token }}|{{ eos_token }}|{{ messages[0].content }}"), &[("user", "é")], true);
    assert_eq!(got.unwrap(), "<s>|</s>|é");
    let _ = std::fs::remove_file(&p);

    // An eot id outside the vocabulary: the load fails naming the key.
    let p = gguf_variant(|kvs| set(kvs, "tokenizer.ggml.eot_token_id", Value::U32(1 << 20)));
    let (s, e) = try_load(&p, 1, 0).err().unwrap();
    assert_eq!(s, Status::LLMRT_BAD_MODEL);
    assert!(e.contains("tokenizer.ggml.eot_token_id"), "{e}");
    let _ = std::fs::remove_file(&p);
}

#[test]
fn a_model_without_template_and_bad_templates_say_so() {
    let f = Fixture::all().into_iter().find(|f| f.name == "llama_gqa").unwrap();
    let m = load(&f.gguf("f32"));
    // The fixture's tokenizer has no chat template.
    assert_eq!(chat_apply(m.ptr, None, &[("user", "hi")], true), Err(Status::LLMRT_UNSUPPORTED));
    assert!(
        last_error().starts_with("llmrt_chat_apply: ") && last_error().contains("no chat template"),
        "{}",
        last_error()
    );
    // A template that raises: its message and line.
    let t = "{% if messages[0].role == 'system' %}\n{{ raise_exception('System role not supported') }}{% endif %}";
    assert_eq!(chat_apply(m.ptr, Some(t), &[("system", "x")], true), Err(Status::LLMRT_INVALID_ARGUMENT));
    let e = last_error();
    assert!(e.contains("line 2") && e.contains("System role not supported"), "{e}");
    // Syntax errors, unknown filters, runaway loops and recursion: errors, not crashes.
    for (t, what) in [
        ("{% for m in messages %}", "line 1"),
        ("a\n\n{{ messages | no_such_filter }}", "line 3"),
        ("{% for i in range(99999) %}{% for j in range(99999) %}{{ i }}{% endfor %}{% endfor %}", "fuel"),
        ("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", "recursion"),
        ("{{ 'x' * 1000000000 }}", ""),
    ] {
        assert_eq!(chat_apply(m.ptr, Some(t), &[("user", "hi")], true), Err(Status::LLMRT_INVALID_ARGUMENT), "{t}");
        assert!(last_error().contains(what), "{t}: {}", last_error());
    }
    // NULL arguments and bad UTF-8 name what is wrong.
    let mut len = 0usize;
    let bad = [0xffu8, 0];
    let role = CString::new("user").unwrap();
    let msg = llmrt_chat_message { role: role.as_ptr(), content: bad.as_ptr().cast() };
    // SAFETY: live model; one message of NUL-terminated strings.
    let s = unsafe { llmrt_chat_apply(m.ptr, c"x".as_ptr(), &msg, 1, true, std::ptr::null_mut(), 0, &mut len) };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert!(last_error().contains("messages[0].content is not valid UTF-8 at byte offset 0"), "{}", last_error());
    let msg = llmrt_chat_message { role: role.as_ptr(), content: std::ptr::null() };
    // SAFETY: as above, content NULL (checked by the library).
    let s = unsafe { llmrt_chat_apply(m.ptr, c"x".as_ptr(), &msg, 1, true, std::ptr::null_mut(), 0, &mut len) };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert!(last_error().contains("messages[0].content is NULL"), "{}", last_error());
    // SAFETY: NULL model and NULL template: the model is required.
    let s = unsafe {
        llmrt_chat_apply(std::ptr::null(), std::ptr::null(), &msg, 0, true, std::ptr::null_mut(), 0, &mut len)
    };
    assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
    assert!(last_error().contains("model is NULL"), "{}", last_error());
    // A NULL model with a template of the caller's: bos/eos are "".
    assert_eq!(
        chat_apply(std::ptr::null(), Some("[{{ bos_token }}{{ messages|length }}]"), &[("user", "a")], true).unwrap(),
        "[1]"
    );
    // SAFETY: NULL model: false, no crash.
    assert!(!unsafe { llmrt_token_is_eog(std::ptr::null(), 2) });
    assert_eq!(eog_tokens(&m), vec![m.info().eos_token]);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn edit_json(p: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    f(&mut j);
    std::fs::write(p, serde_json::to_string_pretty(&j).unwrap()).unwrap();
}

#[test]
fn hf_eos_lists_all_count_and_templates_are_found() {
    let src = fixtures().join("qwen2/hf");
    let d = tmp("hf");
    let _ = std::fs::remove_dir_all(&d);
    copy_dir(&src, &d);
    // Several EOS ids in config.json and generation_config.json: all end generation (the
    // C struct's eos_token keeps the first).
    edit_json(&d.join("config.json"), |j| j["eos_token_id"] = serde_json::json!([0, 5]));
    edit_json(&d.join("generation_config.json"), |j| j["eos_token_id"] = serde_json::json!([7, 9, 5]));
    let chatml = template_src("Qwen-Qwen2.5-7B-Instruct.jinja");
    edit_json(&d.join("tokenizer_config.json"), |j| {
        j["chat_template"] = serde_json::json!([
            {"name": "tool_use", "template": "tool use"},
            {"name": "default", "template": chatml},
        ])
    });
    let m = load(&d);
    assert_eq!(m.info().eos_token, 0);
    assert_eq!(eog_tokens(&m), vec![0, 5, 7, 9]); // 0 is also <|endoftext|>, an added special token
    let conv = conversation("multi_turn");
    let msgs: Vec<(&str, &str)> = conv.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
    let got = chat_apply(m.ptr, None, &msgs, true).unwrap();
    assert_eq!(got, expected("Qwen-Qwen2.5-7B-Instruct.jinja", "multi_turn/gen"));
    // eos_token is tokenizer_config.json's string; there is no bos_token there: "".
    assert_eq!(chat_apply(m.ptr, Some("{{ bos_token }}|{{ eos_token }}"), &[], false).unwrap(), "|<|endoftext|>");
    drop(m);
    // chat_template.jinja wins over tokenizer_config.json.
    std::fs::write(d.join("chat_template.jinja"), "{{ messages[0].content }}!\n").unwrap();
    let m = load(&d);
    assert_eq!(chat_apply(m.ptr, None, &[("user", "hey")], true).unwrap(), "hey!");
    drop(m);
    // A malformed eos list: the load fails naming the file and key.
    edit_json(&d.join("generation_config.json"), |j| j["eos_token_id"] = serde_json::json!([7, "x"]));
    let (s, e) = try_load(&d, 1, 0).err().unwrap();
    assert_eq!(s, Status::LLMRT_BAD_MODEL);
    assert!(e.contains("generation_config.json") && e.contains("eos_token_id"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The stop matcher through the C API: pieces in, (text, stop index) out.
struct Matcher(*mut llmrt_stop_matcher);

impl Matcher {
    fn new(stops: &[&str]) -> Matcher {
        let c: Vec<CString> = stops.iter().map(|s| CString::new(*s).unwrap()).collect();
        let p: Vec<*const std::ffi::c_char> = c.iter().map(|s| s.as_ptr()).collect();
        let mut m = std::ptr::null_mut();
        // SAFETY: p holds stops.len() NUL-terminated strings; m a local out-pointer.
        common::ok(unsafe { llmrt_stop_matcher_new(p.as_ptr(), p.len(), &mut m) }, "stop_matcher_new");
        Matcher(m)
    }
    fn feed(&self, piece: &[u8]) -> (Vec<u8>, Option<u32>) {
        let (mut len, mut stop) = (0usize, 0u32);
        // SAFETY: a live matcher; piece a live slice; NULL with capacity 0 asks for the size.
        let s = unsafe {
            llmrt_stop_matcher_feed(
                self.0,
                piece.as_ptr().cast(),
                piece.len(),
                std::ptr::null_mut(),
                0,
                &mut len,
                &mut stop,
            )
        };
        let mut buf = vec![0u8; len];
        if s == Status::LLMRT_BUFFER_TOO_SMALL {
            // The matcher did not change: feeding the same piece again gives the text.
            // SAFETY: buf holds len bytes.
            let s = unsafe {
                llmrt_stop_matcher_feed(
                    self.0,
                    piece.as_ptr().cast(),
                    piece.len(),
                    buf.as_mut_ptr().cast(),
                    len,
                    &mut len,
                    &mut stop,
                )
            };
            assert_eq!(s, Status::LLMRT_OK, "{}", last_error());
        } else {
            assert_eq!((s, len), (Status::LLMRT_OK, 0), "{}", last_error());
        }
        (buf, (stop != u32::MAX).then_some(stop))
    }
    fn flush(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 64 << 10];
        let mut len = 0usize;
        // SAFETY: a live matcher; buf holds its length.
        common::ok(unsafe { llmrt_stop_matcher_flush(self.0, buf.as_mut_ptr().cast(), buf.len(), &mut len) }, "flush");
        buf.truncate(len);
        buf
    }
}

impl Drop for Matcher {
    fn drop(&mut self) {
        // SAFETY: came from llmrt_stop_matcher_new, freed once here.
        unsafe { llmrt_stop_matcher_free(self.0) }
    }
}

/// The whole-text answer: the text is cut where the first stop string ends (of two ending
/// there, the longer one). A string's earliest-ending occurrence is its first, `str::find`.
fn oracle(text: &str, stops: &[&str]) -> (String, Option<u32>) {
    let first = stops.iter().enumerate().filter_map(|(i, s)| text.find(s).map(|p| (p + s.len(), p, i as u32))).min();
    match first {
        Some((_, start, i)) => (text[..start].to_string(), Some(i)),
        None => (text.to_string(), None),
    }
}

/// Feeds `text` split at the given byte positions; checks every emitted chunk is whole UTF-8
/// characters (the text's own) and returns what was shown and the stop index.
fn run(stops: &[&str], text: &str, cuts: &[usize]) -> (String, Option<u32>) {
    let m = Matcher::new(stops);
    let b = text.as_bytes();
    let mut shown = Vec::new();
    let mut stop = None;
    let mut prev = 0;
    for &c in cuts.iter().chain(std::iter::once(&b.len())) {
        let (out, s) = m.feed(&b[prev..c]);
        assert!(
            std::str::from_utf8(&out).is_ok(),
            "{stops:?} {text:?} cuts {cuts:?}: chunk {out:?} splits a character"
        );
        shown.extend_from_slice(&out);
        // Never ahead of what has arrived, never past a stop.
        assert!(b[..c].starts_with(&shown), "{stops:?} {text:?} cuts {cuts:?}");
        if s.is_some() {
            stop = s;
        }
        prev = c;
    }
    shown.extend(m.flush());
    (String::from_utf8(shown).unwrap(), stop)
}

#[test]
fn stop_strings_at_every_split() {
    let cases: &[(&[&str], &str)] = &[
        (&["</s>"], "Hello </s> world"),
        (&["</s>"], "no stop here <"),
        (&["</s>", "\nUser:"], "line one\nUse the force\nUser: hi"),
        (&["abc", "b"], "xxabcx"),               // "b" ends first
        (&["abcd", "bc"], "abcd"),               // "bc" ends first
        (&["aab"], "aaab"),                      // overlapping prefix: the match starts late
        (&["aba"], "ababa"),                     // self-overlapping
        (&["ab", "b"], "xab"),                   // end together: the longer one
        (&["日本", "本語"], "これは日本語です"), // multi-byte stops
        (&["🙂"], "ok 🙂 fine"),
        (&["é"], "café au lait"),
        (&["<|im_end|>"], "Grüße 🙂 <|im_end|><|im_start|>"),
        (&["<|im_end|>"], "Grüße 🙂 <|im_"), // a prefix at the end: flushed
        (&[], "plain 日本語 text 🙂"),
    ];
    for &(stops, text) in cases {
        let want = oracle(text, stops);
        let n = text.len();
        // Whole, every single cut, every pair of cuts.
        assert_eq!(run(stops, text, &[]), want, "{stops:?} {text:?}");
        for i in 0..=n {
            assert_eq!(run(stops, text, &[i]), want, "{stops:?} {text:?} cut {i}");
            for j in i..=n {
                assert_eq!(run(stops, text, &[i, j]), want, "{stops:?} {text:?} cuts {i} {j}");
            }
        }
        // One byte at a time.
        let all: Vec<usize> = (1..n).collect();
        assert_eq!(run(stops, text, &all), want, "{stops:?} {text:?} bytewise");
    }
    // Pieces that end inside a character are held until it completes.
    let m = Matcher::new(&["zz"]);
    let e = "é".as_bytes();
    assert_eq!(m.feed(&e[..1]), (vec![], None));
    assert_eq!(m.feed(&e[1..]), (e.to_vec(), None));
    // After a stop, nothing more; bad stop strings are errors naming them.
    let m = Matcher::new(&["!"]);
    assert_eq!(m.feed(b"hi! there"), (b"hi".to_vec(), Some(0)));
    assert_eq!(m.feed(b"more"), (vec![], Some(0)));
    assert_eq!(m.flush(), Vec::<u8>::new());
    for (stops, what) in
        [(vec![c"ok".as_ptr(), c"".as_ptr()], "stop string 1 is empty"), (vec![std::ptr::null()], "stops[0] is NULL")]
    {
        let mut p = std::ptr::null_mut();
        // SAFETY: stops holds NUL-terminated strings or NULL (checked by the library).
        let s = unsafe { llmrt_stop_matcher_new(stops.as_ptr(), stops.len(), &mut p) };
        assert_eq!(s, Status::LLMRT_INVALID_ARGUMENT);
        assert!(p.is_null());
        assert!(last_error().contains(what), "{}", last_error());
    }
}
