//! The status table of src/error.rs (`llmrt::error::STATUSES`) is the one list of statuses;
//! the other places that spell them out are held to it here, so any drift fails:
//! the C strings of `llmrt_status_name`, the enum of include/llmrt.h (names, codes, doc
//! comments), the Go constants, comments and sentinels of go/llmrt/errors.go, and the status
//! table of docs/API.md.

use std::ffi::CStr;
use std::path::Path;

use llmrt::error::{StatusInfo, STATUSES};
use llmrt::ffi::llmrt_status_name;

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn name(r: &StatusInfo) -> &str {
    r.name.to_str().unwrap()
}

/// (name, code, description) of every variant of `enum llmrt_status` in the header, whose
/// variants cbindgen writes as a `/** ... */` doc comment then `NAME = CODE,`.
fn header_statuses(h: &str) -> Vec<(String, u32, String)> {
    let start = h.find("enum llmrt_status {").expect("header declares enum llmrt_status");
    let body = &h[start..start + h[start..].find("\n}").expect("enum llmrt_status ends")];
    let mut out = vec![];
    let mut doc = String::new();
    for line in body.lines().skip(1) {
        let t = line.trim();
        if t.starts_with("/**") || t.starts_with("*/") {
            continue;
        } else if let Some(d) = t.strip_prefix("* ") {
            doc = if doc.is_empty() { d.to_string() } else { format!("{doc} {d}") };
        } else if let Some((n, c)) = t.trim_end_matches(',').split_once(" = ") {
            out.push((n.to_string(), c.parse().expect("numeric code"), std::mem::take(&mut doc)));
        }
    }
    out
}

/// LLMRT_INVALID_ARGUMENT -> InvalidArgument, LLMRT_IO -> IO (Go initialisms).
fn go_name(c: &str) -> String {
    let words = c.strip_prefix("LLMRT_").unwrap().split('_');
    words
        .map(|w| if ["OK", "IO"].contains(&w) { w.to_string() } else { w[..1].to_string() + &w[1..].to_lowercase() })
        .collect()
}

#[test]
fn c_status_name_comes_from_the_table() {
    for (code, r) in STATUSES.iter().enumerate() {
        // SAFETY: llmrt_status_name returns a static NUL-terminated string, never NULL.
        let got = unsafe { CStr::from_ptr(llmrt_status_name(code as u32)) };
        assert_eq!(got, r.name, "llmrt_status_name({code})");
    }
    for code in [STATUSES.len() as u32, 99, u32::MAX] {
        // SAFETY: as above.
        let got = unsafe { CStr::from_ptr(llmrt_status_name(code)) };
        assert_eq!(got.to_str().unwrap(), "LLMRT_UNKNOWN_STATUS");
    }
}

#[test]
fn header_enum_matches_the_table() {
    let h = header_statuses(&read("include/llmrt.h"));
    let want: Vec<(String, u32, String)> =
        STATUSES.iter().map(|r| (name(r).to_string(), r.status as u32, r.description.to_string())).collect();
    assert_eq!(h, want, "include/llmrt.h's enum llmrt_status (doc comments from src/error.rs) vs STATUSES");
}

#[test]
fn go_constants_and_sentinels_match_the_table() {
    let go = read("go/llmrt/errors.go");
    let consts: Vec<(String, u32, String)> = go
        .lines()
        .filter_map(|l| {
            let (decl, comment) = l.trim().split_once("//")?;
            let mut it = decl.split_whitespace();
            let (ident, ty, eq, code) = (it.next()?, it.next()?, it.next()?, it.next()?);
            if ty != "Status" || eq != "=" || !ident.starts_with("Status") {
                return None;
            }
            Some((ident.to_string(), code.parse().ok()?, comment.trim().to_string()))
        })
        .collect();
    let want: Vec<(String, u32, String)> = STATUSES
        .iter()
        .map(|r| (format!("Status{}", go_name(name(r))), r.status as u32, r.description.to_string()))
        .collect();
    assert_eq!(consts, want, "go/llmrt/errors.go's Status constants vs STATUSES");
    let norm: String = go.split_whitespace().collect::<Vec<_>>().join(" ");
    for r in &STATUSES[1..] {
        let g = go_name(name(r));
        let sentinel = format!("Err{g} = &Error{{Status: Status{g}}}");
        assert!(norm.contains(&sentinel), "go/llmrt/errors.go has no sentinel `{sentinel}`");
    }
    assert_eq!(norm.matches(" = &Error{Status: Status").count(), STATUSES.len() - 1, "one sentinel per failure status");
}

#[test]
fn api_doc_status_table_matches_the_table() {
    let doc = read("docs/API.md");
    let rows: Vec<(String, u32, String)> = doc
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim().strip_prefix('|')?.strip_suffix('|')?.split('|').map(str::trim).collect();
            let [code, n, d] = cells[..] else { return None };
            let n = n.strip_prefix("`LLMRT_")?.strip_suffix('`')?;
            Some((format!("LLMRT_{n}"), code.parse().ok()?, d.to_string()))
        })
        .filter(|(n, _, _)| !n.starts_with("LLMRT_BACKEND_"))
        .collect();
    let want: Vec<(String, u32, String)> =
        STATUSES.iter().map(|r| (name(r).to_string(), r.status as u32, r.description.to_string())).collect();
    assert_eq!(rows, want, "docs/API.md's status table (| code | `NAME` | description |) vs STATUSES");
}

/// Every function and type the header declares is in docs/API.md (the contract keeps up
/// with the header: an addition to src/ffi without its documentation fails here).
#[test]
fn api_doc_covers_every_header_declaration() {
    let h = read("include/llmrt.h");
    let doc = read("docs/API.md");
    let mut names: Vec<&str> = vec![];
    for line in h.lines().filter(|l| !l.starts_with(' ') && !l.starts_with('*') && !l.starts_with('#')) {
        if let Some(open) = line.find("llmrt_").filter(|_| line.contains('(')) {
            // `enum llmrt_status llmrt_prefill(...`: the identifier right before '('.
            let before = &line[..line.find('(').unwrap()];
            let f = before.rsplit(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap();
            if f.starts_with("llmrt_") && open <= before.len() {
                names.push(f);
            }
        } else if let Some(rest) = line.strip_prefix("typedef struct ").or(line.strip_prefix("typedef enum ")) {
            names.push(rest.split_whitespace().next().unwrap());
        }
    }
    assert!(names.len() >= 25, "parsed only {names:?} from the header");
    for n in names {
        assert!(doc.contains(n), "docs/API.md does not document `{n}`, which include/llmrt.h declares");
    }
}
