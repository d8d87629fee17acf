//! Chat templates: Hugging Face Jinja chat templates rendered with `minijinja`, configured
//! as transformers configures Python jinja2 (`transformers/utils/chat_template_utils.py`,
//! `_compile_jinja_template` and `render_jinja_template`):
//!
//! - `trim_blocks` and `lstrip_blocks` on, a single trailing newline of the template dropped
//!   (jinja2's `keep_trailing_newline = False`), no auto-escaping;
//! - loop controls (`{% break %}`, `{% continue %}`), `loop.previtem` / `loop.nextitem`;
//! - `raise_exception(message)`: the render fails with that message;
//! - `strftime_now(format)`: the render's date (the caller's clock, or a fixed date for tests)
//!   formatted as Python's `datetime.strftime` formats it;
//! - `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//!   sort_keys=False)` with those keyword arguments (transformers overrides jinja2's filter so);
//! - Python string and dict methods (`.strip()`, `.split()`, `.items()`, `.format()`, ...)
//!   through minijinja-contrib's pycompat;
//! - `{% generation %}...{% endgeneration %}` (transformers' AssistantTracker) renders its body;
//! - variables: `messages` (a list of `{role, content}`), `add_generation_prompt`, `bos_token`,
//!   `eos_token`, and `tools` and `documents` as none (as transformers passes them).
//!
//! Bounded: minijinja's fuel ([`FUEL`] instructions) and recursion limit stop huge loops and
//! runaway recursion with an error; every error names the template line.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, ErrorKind, State};

use crate::{Error, Result};

/// Work a render may do (minijinja fuel: about one unit per instruction; running out takes
/// about half a second). Real templates need a few hundred per message; this allows
/// conversations of thousands of messages and stops runaway loops.
pub const FUEL: u64 = 5_000_000;

/// Largest rendered text (bytes): a render producing more fails.
pub const MAX_OUTPUT: usize = 64 << 20;

/// One chat message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    pub role: &'a str,
    pub content: &'a str,
}

/// A civil date and time (no time zone), what `strftime_now` formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DateTime {
    pub year: i32,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

impl DateTime {
    /// The date and time of `secs` seconds after 1970-01-01T00:00:00 (proleptic Gregorian).
    pub fn from_unix(secs: i64) -> DateTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        // Days to civil date (the well-known era algorithm).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
        DateTime { year, month, day, hour: rem / 3600, minute: rem / 60 % 60, second: rem % 60 }
    }

    /// Now, in UTC.
    pub fn now_utc() -> DateTime {
        let secs = match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => d.as_secs() as i64,
            Err(e) => -(e.duration().as_secs() as i64),
        };
        DateTime::from_unix(secs)
    }

    fn weekday(&self) -> u32 {
        // 0 = Monday, as Python's weekday(); 1970-01-01 was a Thursday (3).
        let d = days_from_civil(self.year, self.month, self.day);
        (d + 3).rem_euclid(7) as u32
    }

    fn day_of_year(&self) -> u32 {
        (days_from_civil(self.year, self.month, self.day) - days_from_civil(self.year, 1, 1) + 1) as u32
    }

    /// `self` formatted as Python's `datetime.strftime(fmt)` in the C locale (glibc): the
    /// directives of the C standard plus glibc's `%-d`-style no-padding flag. An unknown
    /// directive is kept as written, as glibc does.
    pub fn strftime(&self, fmt: &str) -> String {
        const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
        const MONTHS: [&str; 12] = [
            "January",
            "February",
            "March",
            "April",
            "May",
            "June",
            "July",
            "August",
            "September",
            "October",
            "November",
            "December",
        ];
        let mut out = String::new();
        let mut it = fmt.chars().peekable();
        while let Some(c) = it.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let pad = if it.peek() == Some(&'-') {
                it.next();
                false
            } else {
                true
            };
            let num = |v: u32, w: usize| if pad { format!("{v:0w$}") } else { v.to_string() };
            let h12 = if self.hour.is_multiple_of(12) { 12 } else { self.hour % 12 };
            let wd = self.weekday() as usize;
            let month = MONTHS[(self.month.clamp(1, 12) - 1) as usize];
            match it.next() {
                Some('Y') => out.push_str(&self.year.to_string()),
                Some('y') => out.push_str(&num(self.year.rem_euclid(100) as u32, 2)),
                Some('m') => out.push_str(&num(self.month, 2)),
                Some('d') => out.push_str(&num(self.day, 2)),
                Some('e') => out.push_str(&if pad { format!("{:2}", self.day) } else { self.day.to_string() }),
                Some('H') => out.push_str(&num(self.hour, 2)),
                Some('I') => out.push_str(&num(h12, 2)),
                Some('M') => out.push_str(&num(self.minute, 2)),
                Some('S') => out.push_str(&num(self.second, 2)),
                Some('j') => out.push_str(&num(self.day_of_year(), 3)),
                Some('p') => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                Some('A') => out.push_str(DAYS[wd]),
                Some('a') => out.push_str(&DAYS[wd][..3]),
                Some('B') => out.push_str(month),
                Some('b') | Some('h') => out.push_str(&month[..3]),
                Some('F') => out.push_str(&format!("{}-{:02}-{:02}", self.year, self.month, self.day)),
                Some('T') => out.push_str(&format!("{:02}:{:02}:{:02}", self.hour, self.minute, self.second)),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    if !pad {
                        out.push('-');
                    }
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        out
    }
}

fn days_from_civil(y: i32, m: u32, d: u32) -> i64 {
    let y = i64::from(y) - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// What a render sees besides the messages.
#[derive(Clone, Copy, Debug)]
pub struct RenderOptions<'a> {
    pub add_generation_prompt: bool,
    pub bos_token: &'a str,
    pub eos_token: &'a str,
    /// The date `strftime_now` formats; None: now, in UTC.
    pub now: Option<DateTime>,
}

/// The template name minijinja reports in its errors.
const NAME: &str = "chat template";

/// Renders the chat template `source` over `messages`. A template that does not parse or
/// fails while rendering (including `raise_exception`) is LLMRT_INVALID_ARGUMENT with a
/// message naming the template line and minijinja's (or the template's own) reason.
pub fn render(source: &str, messages: &[Message<'_>], opts: &RenderOptions<'_>) -> Result<String> {
    render_with_fuel(source, messages, opts, FUEL)
}

/// [`render`] with another work budget than [`FUEL`]: the same parser, filters and limits
/// otherwise. The fuzz harness renders with a small budget so that a runaway mutation
/// stops in milliseconds, not half a second, and the campaign reaches its executions.
pub fn render_with_fuel(source: &str, messages: &[Message<'_>], opts: &RenderOptions<'_>, fuel: u64) -> Result<String> {
    let source = rewrite_tags(source);
    let now = opts.now.unwrap_or_else(DateTime::now_utc);
    let env = environment(now, fuel);
    let tmpl = env.template_from_named_str(NAME, &source).map_err(template_error)?;
    let msgs: Vec<Value> = messages
        .iter()
        .map(|m| Value::from_pairs([("role", Value::from(m.role)), ("content", Value::from(m.content))]))
        .collect();
    let ctx = Value::from_pairs([
        ("messages", Value::from(msgs)),
        ("tools", py_none()),
        ("documents", py_none()),
        ("add_generation_prompt", Value::from(opts.add_generation_prompt)),
        ("bos_token", Value::from(opts.bos_token)),
        ("eos_token", Value::from(opts.eos_token)),
    ]);
    let out = tmpl.render(ctx).map_err(template_error)?;
    if out.len() > MAX_OUTPUT {
        return Err(Error::invalid(format!(
            "chat template: the rendered text of {} bytes exceeds {MAX_OUTPUT}",
            out.len()
        )));
    }
    Ok(out)
}

fn environment(now: DateTime, fuel: u64) -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .unwrap_or_default();
    env.set_syntax(syntax);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_fuel(Some(fuel));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    // jinja2's select/reject/selectattr/rejectattr/map give nothing for a falsy input (they
    // never iterate it); minijinja's would fail on the not-iterable `tools` none.
    let falsy_empty = |builtin: Value| {
        move |state: &mut State, args: minijinja::value::Rest<Value>| -> std::result::Result<Value, minijinja::Error> {
            if args.first().is_some_and(is_py_none) {
                return Ok(Value::from(Vec::<Value>::new()));
            }
            builtin.call(state, &args)
        }
    };
    env.add_filter("select", falsy_empty(Value::from_function(minijinja::filters::select)));
    env.add_filter("reject", falsy_empty(Value::from_function(minijinja::filters::reject)));
    env.add_filter("selectattr", falsy_empty(Value::from_function(minijinja::filters::selectattr)));
    env.add_filter("rejectattr", falsy_empty(Value::from_function(minijinja::filters::rejectattr)));
    env.add_filter("map", falsy_empty(Value::from_function(minijinja::filters::map)));
    // jinja2's tests where minijinja's differ on none: none is not iterable.
    env.add_test("none", |v: &Value| v.is_none() || is_py_none(v));
    env.add_test("iterable", |v: &Value| !v.is_none() && v.try_iter().is_ok());
    env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", move |fmt: String| now.strftime(&fmt));
    // One walk budget for the whole render (the walks are not charged to the fuel).
    let budget = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(NS_GUARD_NODES));
    env.add_function(NS_GUARD, move |v: Value| namespace_free(v, &budget));
    env
}

/// The function [`rewrite_tags`] wraps around the value of every
/// `{% set ns.attr = ... %}`.
const NS_GUARD: &str = "__llmrt_namespace_free";

/// Most values [`namespace_free`] walks (lists, maps and their items) in one render, all
/// its calls together, before it refuses: assigning a growing list to a namespace attribute
/// in a loop walks the list each time, and the walks are not charged to the fuel. Real
/// templates walk a few thousand.
const NS_GUARD_NODES: usize = 1 << 22;

/// The value of a `{% set ns.attr = value %}`, refused when it is or holds a namespace.
/// minijinja 3.1.0 recurses without end when it prints, hashes or sorts a namespace that
/// holds itself (a stack overflow kills the process); a namespace can only come to hold
/// itself through such an assignment (lists and maps are immutable; a namespace made by
/// `namespace(...)` is new, so nothing holds it yet). Refusing namespaces inside namespace
/// attributes keeps every namespace acyclic; real templates store strings, numbers, lists
/// and maps there. The walks of a render share `budget` ([`NS_GUARD_NODES`]).
fn namespace_free(
    value: Value,
    budget: &std::sync::atomic::AtomicUsize,
) -> std::result::Result<Value, minijinja::Error> {
    use std::sync::atomic::Ordering::Relaxed;
    let is_namespace = |v: &Value| v.as_object().is_some_and(|o| o.type_name().ends_with("Namespace"));
    let mut stack = vec![value.clone()];
    while let Some(v) = stack.pop() {
        if is_namespace(&v) {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "a namespace attribute may not hold a namespace (one holding itself would make rendering recurse without end)",
            ));
        }
        if budget.fetch_update(Relaxed, Relaxed, |left| left.checked_sub(1)).is_err() {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "the values assigned to namespace attributes hold more than {NS_GUARD_NODES} items in all \
                     (each assignment walks its value)"
                ),
            ));
        }
        match v.kind() {
            minijinja::value::ValueKind::Seq => {
                if let Ok(items) = v.try_iter() {
                    stack.extend(items);
                }
            }
            minijinja::value::ValueKind::Map => {
                if let Ok(keys) = v.try_iter() {
                    for k in keys {
                        if let Ok(item) = v.get_item(&k) {
                            stack.push(item);
                        }
                        stack.push(k);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(value)
}

/// The source as minijinja runs it, two rewrites made inside their own tags so that
/// whitespace-control marks, trimming and line numbers stay as written:
/// - `{% generation %}` / `{% endgeneration %}` (transformers' AssistantTracker tag, which
///   renders its body) become `{% if true %}` / `{% endif %}`;
/// - every `{% set a.b = expr %}` (a namespace attribute target, alone or in a target list)
///   becomes `{% set a.b = __llmrt_namespace_free((expr)) %}` ([`namespace_free`]). Block
///   sets (`{% set a.b %}` ... `{% endset %}`) assign strings and are left alone.
///
/// Tags are found as minijinja's lexer finds them, in one pass: outside `{# #}` comments,
/// `{% raw %}` blocks and `{{ }}` expressions, a tag or expression ending at the first
/// `%}` / `}}` outside string literals and brackets ([`block_end`]).
fn rewrite_tags(src: &str) -> std::borrow::Cow<'_, str> {
    if !src.contains("set") && !src.contains("generation") {
        return std::borrow::Cow::Borrowed(src);
    }
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len() + 64);
    let mut last = 0;
    let mut i = 0;
    let find = |from: usize, pat: &str| src.get(from..).and_then(|t| t.find(pat)).map(|o| from + o);
    while i + 1 < b.len() {
        if b[i] != b'{' {
            i += 1;
            continue;
        }
        let closer = match b[i + 1] {
            b'#' => {
                i = find(i + 2, "#}").map_or(b.len(), |e| e + 2);
                continue;
            }
            b'{' => b'}',
            b'%' => b'%',
            _ => {
                i += 1;
                continue;
            }
        };
        let mut j = i + 2;
        if j < b.len() && (b[j] == b'-' || b[j] == b'+') {
            j += 1;
        }
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        let word_end = (j..b.len()).find(|&k| !(b[k].is_ascii_alphanumeric() || b[k] == b'_')).unwrap_or(b.len());
        let word = if closer == b'%' { &src[j..word_end] } else { "" };
        if word == "raw" {
            // Up to the end of the matching {% endraw %} tag.
            i = find(word_end, "endraw").and_then(|e| find(e, "%}")).map_or(b.len(), |e| e + 2);
            continue;
        }
        let Some(close) = block_end(b, word_end, closer) else { break };
        // The tag's body before its closing whitespace-control mark.
        let mut body_end = close;
        if body_end > word_end && (b[body_end - 1] == b'-' || b[body_end - 1] == b'+') {
            body_end -= 1;
        }
        match word {
            "generation" | "endgeneration" if src[word_end..body_end].trim_ascii().is_empty() => {
                out.push_str(&src[last..j]);
                out.push_str(if word == "generation" { "if true" } else { "endif" });
                last = word_end;
            }
            "set" => {
                // Targets: names, dots, commas, parentheses; then a single `=`.
                let mut t = word_end;
                while t < close && (b[t].is_ascii_alphanumeric() || b"_., \t\r\n()".contains(&b[t])) {
                    t += 1;
                }
                let assigns = t < body_end && b[t] == b'=' && b.get(t + 1) != Some(&b'=');
                if assigns && src[word_end..t].contains('.') {
                    out.push_str(&src[last..t + 1]);
                    out.push_str(NS_GUARD);
                    out.push_str("((");
                    out.push_str(&src[t + 1..body_end]);
                    out.push_str("))");
                    last = body_end;
                }
            }
            _ => {}
        }
        i = close + 2;
    }
    if last == 0 {
        return std::borrow::Cow::Borrowed(src);
    }
    out.push_str(&src[last..]);
    std::borrow::Cow::Owned(out)
}

/// Where the tag or expression whose body starts at `from` ends: the first `closer` + `}`
/// (`%}` or `}}`) outside string literals (with their backslash escapes) and outside
/// `()`, `[]` and `{}`, as minijinja's lexer ends it; `None` when it never does.
fn block_end(b: &[u8], from: usize, closer: u8) -> Option<usize> {
    let mut depth = 0isize;
    let mut quote = 0u8;
    let mut k = from;
    while k < b.len() {
        let c = b[k];
        if quote != 0 {
            if c == b'\\' {
                k += 1;
            } else if c == quote {
                quote = 0;
            }
        } else if depth == 0 && c == closer && b.get(k + 1) == Some(&b'}') {
            return Some(k);
        } else {
            match c {
                b'"' | b'\'' => quote = c,
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                _ => {}
            }
        }
        k += 1;
    }
    None
}

/// Python's None where a template may iterate it (`tools`, `documents`): minijinja iterates
/// none as an empty sequence, jinja2 raises (`'NoneType' object is not iterable`), so these
/// are an object that is falsy, renders as "None", is `none` to the `none` test and to
/// tojson, and is not iterable.
#[derive(Debug)]
struct PyNone;

impl minijinja::value::Object for PyNone {
    fn repr(self: &std::sync::Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Plain
    }

    fn is_true(self: &std::sync::Arc<Self>) -> bool {
        false
    }

    fn render(self: &std::sync::Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("None")
    }
}

fn py_none() -> Value {
    Value::from_object(PyNone)
}

fn is_py_none(v: &Value) -> bool {
    v.downcast_object_ref::<PyNone>().is_some()
}

/// minijinja's error as an llmrt error naming the template line.
fn template_error(e: minijinja::Error) -> Error {
    let line = e.line().map(|l| format!(" line {l}")).unwrap_or_default();
    let what = match (e.kind(), e.detail()) {
        (_, Some(d)) if e.kind() == ErrorKind::InvalidOperation => d.to_string(),
        (k, Some(d)) => format!("{k}: {d}"),
        (k, None) => k.to_string(),
    };
    // The none that `tools` / `documents` stand for is a minijinja object (see PyNone).
    let what = what.replace("plain object is not iterable", "none is not iterable");
    let mut msg = format!("{NAME}{line}: {what}");
    // Errors inside a macro or filter call keep their cause.
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    Error::invalid(msg)
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(if let Some(s) = v.as_str() {
            s.to_string()
        } else if let Some(n) = v.as_i64() {
            " ".repeat(n.clamp(0, 64) as usize)
        } else {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: indent {v} is not an int"),
            ));
        }),
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let a = s.get_item(&Value::from(0))?;
            let b = s.get_item(&Value::from(1))?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        _ => ((if indent.is_some() { "," } else { ", " }).to_string(), ": ".to_string()),
    };
    let j = Json {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    j.write(&mut out, value, 0, 0)?;
    Ok(Value::from(out))
}

struct Json {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// Nesting depth tojson accepts (Python's own limit is its recursion limit, ~1000).
const JSON_DEPTH: usize = 200;

impl Json {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn write(
        &self,
        out: &mut String,
        v: &Value,
        level: usize,
        depth: usize,
    ) -> std::result::Result<(), minijinja::Error> {
        if depth > JSON_DEPTH || out.len() > MAX_OUTPUT {
            return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: value too deep or too large"));
        }
        if is_py_none(v) {
            out.push_str("null");
            return Ok(());
        }
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if v.is_integer() {
                    out.push_str(&v.to_string());
                } else {
                    let f = f64::try_from(v.clone())?;
                    out.push_str(&py_float_repr(f, true));
                }
            }
            ValueKind::String => self.string(out, v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.write(out, item, level + 1, depth + 1)?;
                }
                self.newline(out, level);
                out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.sort_keys {
                    keys.sort();
                }
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, level + 1);
                    let ks = match k.kind() {
                        ValueKind::String => k.as_str().unwrap_or_default().to_string(),
                        ValueKind::None => "null".to_string(),
                        ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).to_string(),
                        ValueKind::Number if k.is_integer() => k.to_string(),
                        ValueKind::Number => py_float_repr(f64::try_from(k.clone())?, true),
                        _ => {
                            return Err(minijinja::Error::new(
                                ErrorKind::InvalidOperation,
                                format!("tojson: keys must be str, int, float, bool or None, not {}", k.kind()),
                            ))
                        }
                    };
                    self.string(out, &ks);
                    out.push_str(&self.key_sep);
                    self.write(out, &v.get_item(k)?, level + 1, depth + 1)?;
                }
                self.newline(out, level);
                out.push('}');
            }
            ValueKind::Undefined => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: Object of type Undefined is not JSON serializable",
                ))
            }
            k => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: Object of type {k} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.ensure_ascii && (c as u32) > 0x7e => {
                    let mut buf = [0u16; 2];
                    for u in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr(float)` (json.dumps writes floats so; NaN/Infinity as json.dumps does).
fn py_float_repr(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.to_string();
    }
    if f.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if f < 0.0 { format!("-{s}") } else { s.to_string() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // Shortest round-trip digits and the decimal exponent, then Python's layout:
    // positional for -4 <= exp < 16, else d.ddde[+-]XX.
    let e = format!("{:e}", f.abs());
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    let n = digits.len() as i32;
    let body = if (-4..16).contains(&exp) {
        if exp < 0 {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        } else if exp + 1 >= n {
            format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
        } else {
            format!("{}.{}", &digits[..(exp + 1) as usize], &digits[(exp + 1) as usize..])
        }
    } else {
        let m = if n > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits.clone() };
        format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> RenderOptions<'static> {
        RenderOptions {
            add_generation_prompt: true,
            bos_token: "<s>",
            eos_token: "</s>",
            now: Some(DateTime { year: 2025, month: 3, day: 7, hour: 14, minute: 5, second: 9 }),
        }
    }

    #[test]
    fn chat_dates() {
        let d = DateTime::from_unix(1_741_356_309); // 2025-03-07T14:05:09Z
        assert_eq!(d, opts().now.unwrap());
        assert_eq!(
            d.strftime("%Y-%m-%d %d %b %Y|%B %d, %Y|%A %a %j %I%p %-d %e|%%"),
            "2025-03-07 07 Mar 2025|March 07, 2025|Friday Fri 066 02PM 7  7|%"
        );
        assert_eq!(DateTime::from_unix(0).strftime("%F %T %A"), "1970-01-01 00:00:00 Thursday");
        assert_eq!(DateTime::from_unix(951_782_400).strftime("%F %j"), "2000-02-29 060");
    }

    #[test]
    fn chat_float_repr() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (123456.789, "123456.789"),
            (-2.5, "-2.5"),
            (1e-4, "0.0001"),
            (1234567890123456.0, "1234567890123456.0"),
        ] {
            assert_eq!(py_float_repr(f, true), s, "{f}");
        }
    }

    #[test]
    fn chat_generation_tag_and_errors() {
        let m = [Message { role: "user", content: "hi" }];
        let t = "{% for m in messages %}{%- generation -%} [{{ m.content }}] {%- endgeneration %}{% endfor %}";
        assert_eq!(render(t, &m, &opts()).unwrap(), "[hi]");
        let e = render("a\n{{ raise_exception('nope: ' ~ messages[0].role) }}", &m, &opts()).unwrap_err();
        assert!(e.message.contains("line 2") && e.message.contains("nope: user"), "{}", e.message);
        let e = render("{% for %}", &m, &opts()).unwrap_err();
        assert!(e.message.contains("line 1"), "{}", e.message);
        let e = render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", &m, &opts())
            .unwrap_err();
        assert!(e.message.contains("fuel"), "{}", e.message);
        let e = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", &m, &opts()).unwrap_err();
        assert!(e.message.contains("recursion"), "{}", e.message);
        let e = render("{{ messages | nosuchfilter }}", &m, &opts()).unwrap_err();
        assert!(e.message.contains("nosuchfilter") || e.message.contains("unknown filter"), "{}", e.message);
    }

    /// A namespace may not come to hold itself (minijinja recursed without end printing it:
    /// a stack overflow, found by the chat_template fuzz target); every other namespace
    /// assignment renders as before, whitespace control, strings holding `%}`, comments,
    /// raw blocks and block sets included.
    #[test]
    fn chat_namespace_sets_are_guarded_and_unchanged() {
        let m = [Message { role: "user", content: "hi" }];
        for t in [
            "{% set ns = namespace() %}{% set ns.a = ns %}{{ ns }}",
            "{% set ns = namespace() %}{% set ns.a = [ns] %}{{ ns.a }}",
            "{% set ns = namespace() %}{%- set ns.a = {'k': [1, ns]} -%}{{ {ns: 1} }}",
            "{% set a = namespace() %}{% set b = namespace(x=a) %}{% set a.y = b %}{{ a }}",
            "{% set ns = namespace() %}{% set ns.a, z = (ns, 1) %}{{ ns|string }}",
            // Expressions whose brackets or strings hold `}}` do not hide the tag after them.
            "{% set ns = namespace() %}{{ {'a': {'b': 1}}['a']['b'] }}{{ '}}' }}{% set ns.a = ns %}{{ ns }}",
            "{% set ns = namespace() %}{% set ns.a = ns if {'k': '%}'} -%}{{ ns }}",
        ] {
            let e = render(t, &m, &opts()).unwrap_err();
            assert!(e.message.contains("may not hold a namespace"), "{t}: {}", e.message);
        }
        for (t, want) in [
            ("{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{%- set ns.n = ns.n + x -%}\n {% endfor %}{{ ns.n }}", "3"),
            ("{% set ns = namespace(s='') %}{% set ns.s = 'a%}b' ~ \"'%}\" %}{{ ns.s }}", "a%}b'%}"),
            ("{# {% set ns.a = 1 %} #}{% raw %}{% set ns.a = ns %}{% endraw %}", "{% set ns.a = ns %}"),
            ("{% set ns = namespace() %}{% set ns.t %}x{{ 1 }}{% endset %}{{ ns.t }}", "x1"),
            ("{% set ns = namespace(v=[]) %}{% set ns.v = ns.v + [messages[0]] %}{{ ns.v[0].role }}", "user"),
            ("{% set ns = namespace(a=1) %}\n  {% set ns.a = 2 %}\n{{ ns.a }}", "2"),
            // Tag-like text in strings, expressions and raw blocks is text.
            ("{{ '{% set ns.a = 1 %}' }}|{{ \"{% generation %}\" }}", "{% set ns.a = 1 %}|{% generation %}"),
            ("{% raw %}{% generation %}{% endraw %}{% generation %}x{% endgeneration %}", "{% generation %}x"),
            ("{% set generation = 1 %}{{ generation }}{% set ns = namespace(g=[]) %}{% set ns.g = [generation] %}{{ ns.g }}", "1[1]"),
        ] {
            assert_eq!(render(t, &m, &opts()).unwrap(), want, "{t}");
        }
        // A list assigned again and again as it grows: the walks share one budget, so the
        // render stops with an error instead of walking quadratically.
        let t =
            "{% set ns = namespace(v=range(3000)|list) %}{% for i in range(3000) %}{% set ns.v = ns.v %}{% endfor %}";
        let start = std::time::Instant::now();
        let e = render(t, &m, &opts()).unwrap_err();
        assert!(e.message.contains("namespace attributes hold more than"), "{}", e.message);
        assert!(start.elapsed().as_secs() < 5, "{:?}", start.elapsed());
    }

    #[test]
    fn chat_tojson_python_layout() {
        let m = [Message { role: "user", content: "é\"\n" }];
        let t = "{{ messages | tojson }}|{{ messages[0] | tojson(indent=2) }}|{{ messages[0].content | tojson(ensure_ascii=True) }}|{{ {'a': [1, 2.5, none, true]} | tojson(separators=(',', ':')) }}";
        assert_eq!(
            render(t, &m, &opts()).unwrap(),
            "[{\"role\": \"user\", \"content\": \"é\\\"\\n\"}]|{\n  \"role\": \"user\",\n  \"content\": \"é\\\"\\n\"\n}|\"\\u00e9\\\"\\n\"|{\"a\":[1,2.5,null,true]}"
        );
    }
}
