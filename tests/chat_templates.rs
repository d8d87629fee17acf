//! Chat templates against Hugging Face transformers' renderer: every template of
//! tests/fixtures/chat/templates (llama.cpp's models/templates) over the conversations of
//! tools/make_chat_fixtures.py, expected strings in tests/fixtures/chat/expected.json made by
//! transformers' `render_jinja_template` (Python jinja2). llmrt must give the identical
//! string, and fail exactly where the reference raised.

mod common;

use llmrt::chat::{render, DateTime, Message, RenderOptions};
use serde_json::Value;

fn fixed_now(iso: &str) -> DateTime {
    // "YYYY-MM-DDTHH:MM:SS"
    let n = |a: usize, b: usize| iso[a..b].parse::<u32>().unwrap();
    DateTime {
        year: n(0, 4) as i32,
        month: n(5, 7),
        day: n(8, 10),
        hour: n(11, 13),
        minute: n(14, 16),
        second: n(17, 19),
    }
}

fn first_diff(a: &str, b: &str) -> String {
    let i = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let lo = a[..i.min(a.len())].char_indices().rev().nth(40).map(|(j, _)| j).unwrap_or(0);
    let cut = |s: &str| s.get(lo..(i + 40).min(s.len())).unwrap_or("<non-char boundary>").to_string();
    format!("at byte {i}: llmrt {:?} / reference {:?}", cut(a), cut(b))
}

#[test]
fn chat_templates_match_transformers() {
    let dir = common::fixtures().join("chat");
    let exp = common::read_json(&dir.join("expected.json"));
    let now = fixed_now(exp["now"].as_str().unwrap());
    let bos = exp["bos_token"].as_str().unwrap();
    let eos = exp["eos_token"].as_str().unwrap();
    let convs = exp["conversations"].as_object().unwrap();
    let templates = exp["templates"].as_object().unwrap();
    assert_eq!(templates.len(), 70, "the 70 templates of llama.cpp's models/templates");
    let (mut ok, mut err_ok, mut failed) = (0, 0, Vec::new());
    for (name, cases) in templates {
        let src = std::fs::read_to_string(dir.join("templates").join(name)).unwrap();
        for (key, want) in cases.as_object().unwrap() {
            let (conv, gen) = key.split_once('/').unwrap();
            let msgs: Vec<(String, String)> = convs[conv]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| (m["role"].as_str().unwrap().to_string(), m["content"].as_str().unwrap().to_string()))
                .collect();
            let msgs: Vec<Message> = msgs.iter().map(|(r, c)| Message { role: r, content: c }).collect();
            let opts =
                RenderOptions { add_generation_prompt: gen == "gen", bos_token: bos, eos_token: eos, now: Some(now) };
            let got = render(&src, &msgs, &opts);
            match (want.get("output").and_then(Value::as_str), got) {
                (Some(w), Ok(g)) if g == w => ok += 1,
                (Some(w), Ok(g)) => failed.push(format!("{name} {key}: {}", first_diff(&g, w))),
                (Some(_), Err(e)) => failed.push(format!("{name} {key}: llmrt failed: {}", e.message)),
                (None, Err(e)) => {
                    // LLMRT_CHAT_SHOW_ERRORS=1 prints both errors side by side (with --nocapture).
                    if std::env::var_os("LLMRT_CHAT_SHOW_ERRORS").is_some() {
                        eprintln!("{name} {key}: reference {} / llmrt {}", want["error"], e.message);
                    }
                    assert!(e.message.starts_with("chat template line"), "{name} {key}: {}", e.message);
                    // raise_exception's message reaches the caller.
                    let w = want["error"].as_str().unwrap();
                    if let Some(m) = w.strip_prefix("TemplateError: ") {
                        assert!(e.message.contains(m), "{name} {key}: {} lacks {m:?}", e.message);
                    }
                    err_ok += 1
                }
                (None, Ok(g)) => failed.push(format!(
                    "{name} {key}: reference raised {} but llmrt rendered {:?}",
                    want["error"],
                    &g[..g.len().min(80)]
                )),
            }
        }
    }
    let total = ok + err_ok + failed.len();
    eprintln!(
        "chat templates: {ok} identical renderings, {err_ok} expected errors, {} failed, of {total}",
        failed.len()
    );
    for f in &failed {
        eprintln!("  {f}");
    }
    assert!(failed.is_empty(), "{} of {total} renderings differ from transformers", failed.len());
    assert!(ok > 600, "{ok} renderings compared");
}

/// The work bound leaves room for long conversations: 2000 messages through the largest
/// templates of the set render.
#[test]
fn chat_templates_render_long_conversations() {
    let dir = common::fixtures().join("chat/templates");
    let texts: Vec<String> = (0..2000).map(|i| format!("message {i}: {}", "word ".repeat(20))).collect();
    let msgs: Vec<Message> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| Message { role: if i % 2 == 0 { "user" } else { "assistant" }, content: t })
        .collect();
    let now = DateTime { year: 2025, month: 3, day: 7, hour: 0, minute: 0, second: 0 };
    for name in ["meta-llama-Llama-3.1-8B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "openai-gpt-oss-120b.jinja"] {
        let src = std::fs::read_to_string(dir.join(name)).unwrap();
        let opts = RenderOptions { add_generation_prompt: true, bos_token: "<s>", eos_token: "</s>", now: Some(now) };
        let out = render(&src, &msgs, &opts).unwrap_or_else(|e| panic!("{name}: {}", e.message));
        assert!(out.contains("message 1999: word"), "{name}");
    }
}
