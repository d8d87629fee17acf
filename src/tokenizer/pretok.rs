//! Pre-tokenizers of BPE: hand-written scanners equivalent to the split regexes, after
//! llama.cpp's `unicode_regex_split_custom_gpt2` / `_llama3` / `_qwen35` (unicode.cpp); the
//! multi-regex pre-tokenizers (deepseek, falcon, starcoder, default) as [`Stage`] lists run
//! as llama.cpp's `unicode_regex_split` runs its std::regex lists; and the GPT-2
//! byte-to-unicode map.
//!
//! Character classes: `\p{L}` and `\p{N}` are the Unicode general categories L* and N*
//! (tables from `regex-syntax`, i.e. the Unicode version of that crate); whitespace is
//! llama.cpp's `unicode_set_whitespace` (the Unicode White_Space property).

use super::try_push;
use crate::error::Result;
use std::sync::OnceLock;

/// What the word list is called in an out-of-memory message.
const WORDS: &str = "the pre-tokenizer's word list";

/// Which split regex.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pre {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Llama3,
    /// As Llama3 with `\p{N}` (one digit per word).
    Qwen2,
    /// As Qwen2 with `[\p{L}\p{M}]+` words (marks join letters): llama.cpp `qwen35`.
    Qwen35,
    /// No split: the whole fragment is one word.
    Whole,
    /// llama.cpp's `default` BPE pre-tokenizer, four regexes in turn (see [`Stage`]):
    /// `[\p{P}\$\+<=>\^~\|]+`, the GPT-2 regex, `\p{N}+`, `[0-9][0-9][0-9]`.
    Default,
    /// `[\r\n]`, `\s?[Latin/Greek/Cyrillic/... letters]+`, `\s?[ASCII/full-width punctuation]+`,
    /// `\s+$`, `[CJK/Hangul]+`, `\p{N}+` (llama.cpp `deepseek-llm`).
    DeepseekLlm,
    /// `[\r\n]`, `\s?\p{L}+`, `\s?\p{P}+`, `[CJK/Hangul]+`, `\p{N}` (llama.cpp `deepseek-coder`).
    DeepseekCoder,
    /// `[\p{P}\$\+<=>\^~\|`]+`, the GPT-2 regex, `[0-9][0-9][0-9]` (llama.cpp `falcon`).
    Falcon,
    /// `\p{N}`, then the GPT-2 regex (llama.cpp `starcoder`, `refact`, `command-r`, ...).
    Starcoder,
    /// SentencePiece-style BPE (no byte map): runs of non-newlines and runs of newlines
    /// (llama.cpp `gemma4`).
    Newlines,
}

pub(crate) const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
pub(crate) const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(crate) const LLAMA3_REGEX_ADAPTED: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(crate) const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(crate) const QWEN2_REGEX_ADAPTED: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The scanner for a Split regex of a tokenizer.json, when it is one we know.
pub(crate) fn pre_for_regex(re: &str) -> Option<Pre> {
    match re {
        GPT2_REGEX => Some(Pre::Gpt2),
        LLAMA3_REGEX | LLAMA3_REGEX_ADAPTED => Some(Pre::Llama3),
        QWEN2_REGEX | QWEN2_REGEX_ADAPTED => Some(Pre::Qwen2),
        _ => None,
    }
}

fn ranges(pattern: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    let hir = regex_syntax::Parser::new().parse(pattern).expect("static class pattern");
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c.ranges().iter().map(|r| (r.start() as u32, r.end() as u32)).collect(),
        _ => unreachable!("static class pattern"),
    }
}

fn in_ranges(r: &[(u32, u32)], c: u32) -> bool {
    r.binary_search_by(|&(lo, hi)| {
        if hi < c {
            std::cmp::Ordering::Less
        } else if lo > c {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    })
    .is_ok()
}

fn letters() -> &'static [(u32, u32)] {
    static T: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    T.get_or_init(|| ranges(r"\p{L}"))
}

fn numbers() -> &'static [(u32, u32)] {
    static T: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    T.get_or_init(|| ranges(r"\p{N}"))
}

fn puncts() -> &'static [(u32, u32)] {
    static T: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    T.get_or_init(|| ranges(r"\p{P}"))
}

fn marks() -> &'static [(u32, u32)] {
    static T: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    T.get_or_init(|| ranges(r"\p{M}"))
}

/// General category P* (ASCII: `!"#%&'()*,-./:;?@[\]_{}`).
pub(crate) fn is_punct(c: char) -> bool {
    let u = c as u32;
    if u < 0x80 {
        return c.is_ascii_punctuation() && !matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '`' | '|' | '~');
    }
    in_ranges(puncts(), u)
}

/// General category M* (combining marks).
pub(crate) fn is_mark(c: char) -> bool {
    c as u32 >= 0x80 && in_ranges(marks(), c as u32)
}

pub(crate) fn is_letter(c: char) -> bool {
    let u = c as u32;
    if u < 0x80 {
        return c.is_ascii_alphabetic();
    }
    in_ranges(letters(), u)
}

pub(crate) fn is_number(c: char) -> bool {
    let u = c as u32;
    if u < 0x80 {
        return c.is_ascii_digit();
    }
    in_ranges(numbers(), u)
}

/// llama.cpp's `unicode_set_whitespace`.
pub(crate) fn is_whitespace(c: char) -> bool {
    matches!(
        c as u32,
        0x09..=0x0D
            | 0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

/// Flags of the character at `pos` (None past the end: llama.cpp's OUT_OF_RANGE, flags 0).
#[derive(Clone, Copy, Default)]
struct F {
    valid: bool,
    letter: bool,
    number: bool,
    space: bool,
    mark: bool,
}

fn flags(cs: &[char], pos: usize) -> F {
    match cs.get(pos) {
        None => F::default(),
        Some(&c) => {
            F { valid: true, letter: is_letter(c), number: is_number(c), space: is_whitespace(c), mark: is_mark(c) }
        }
    }
}

/// Split `text` into words (char index ranges) as the regex `pre` would. The word
/// list grows fallibly: running out of memory is `LLMRT_OUT_OF_MEMORY`, not an abort.
pub(crate) fn split(pre: Pre, cs: &[char]) -> Result<Vec<(usize, usize)>> {
    match pre {
        Pre::Whole => {
            if cs.is_empty() {
                Ok(vec![])
            } else {
                Ok(vec![(0, cs.len())])
            }
        }
        Pre::Gpt2 => split_gpt2(cs),
        Pre::Llama3 => split_llama3(cs, 3, false),
        Pre::Qwen2 => split_llama3(cs, 1, false),
        Pre::Qwen35 => split_llama3(cs, 1, true),
        Pre::Default => {
            stages(cs, &[Stage::Run(Class::DefaultPunct), Stage::Gpt2, Stage::Run(Class::Number), Stage::Digits3])
        }
        Pre::DeepseekLlm => stages(
            cs,
            &[
                Stage::One(Class::CrLf),
                Stage::SpaceRun(Class::DeepseekLetter),
                Stage::SpaceRun(Class::DeepseekPunct),
                Stage::TrailingSpace,
                Stage::Run(Class::Cjk),
                Stage::Run(Class::Number),
            ],
        ),
        Pre::DeepseekCoder => stages(
            cs,
            &[
                Stage::One(Class::CrLf),
                Stage::SpaceRun(Class::Letter),
                Stage::SpaceRun(Class::Punct),
                Stage::Run(Class::Cjk),
                Stage::One(Class::Number),
            ],
        ),
        Pre::Falcon => stages(cs, &[Stage::Run(Class::FalconPunct), Stage::Gpt2, Stage::Digits3]),
        Pre::Starcoder => stages(cs, &[Stage::One(Class::Number), Stage::Gpt2]),
        Pre::Newlines => stages(cs, &[Stage::Newlines]),
    }
}

/// Character classes of the regex stages. llama.cpp runs these regexes with std::regex on
/// text where every non-ASCII whitespace character reads as `\v` (so it is `\s` and in no
/// other class) and, for regexes with `\p{..}`, every non-ASCII character reads as its
/// general category: the predicates below are those semantics.
#[derive(Clone, Copy)]
enum Class {
    CrLf,
    Letter,
    Number,
    /// `\p{P}`
    Punct,
    /// `[\p{P}\$\+<=>\^~\|]`
    DefaultPunct,
    /// `[\p{P}\$\+<=>\^~\|`]`
    FalconPunct,
    /// `[一-龥ࠀ-一가-퟿]`: U+0800..U+9FA5 and U+AC00..U+D7FF
    Cjk,
    /// deepseek-llm's letter class (its ranges, below).
    DeepseekLetter,
    /// `[!-/:-~！-／：-～‘-‟　-。]` (U+3000 is whitespace: `\s`, not this class)
    DeepseekPunct,
}

/// deepseek-llm's letter ranges (from its tokenizer.json split regex, as llama.cpp lists them).
const DEEPSEEK_LETTERS: &[(u32, u32)] = &[
    (0x41, 0x5A),
    (0x61, 0x7A),
    (0xB5, 0xB5),
    (0xC0, 0xD6),
    (0xD8, 0xF6),
    (0xF8, 0x1BA),
    (0x1BC, 0x1BF),
    (0x1C4, 0x293),
    (0x295, 0x2AF),
    (0x370, 0x373),
    (0x376, 0x377),
    (0x37B, 0x37D),
    (0x37F, 0x37F),
    (0x386, 0x386),
    (0x388, 0x38A),
    (0x38C, 0x38C),
    (0x38E, 0x3A1),
    (0x3A3, 0x3F5),
    (0x3F7, 0x481),
    (0x48A, 0x52F),
    (0x531, 0x556),
    (0x10A0, 0x10C5),
    (0x13A0, 0x13F5),
    (0x13F8, 0x13FD),
    (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B),
    (0x1D6B, 0x1D77),
    (0x1D79, 0x1D9A),
    (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45),
    (0x1F48, 0x1F4D),
    (0x1F50, 0x1F57),
    (0x1F59, 0x1F59),
    (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D),
    (0x1F80, 0x1FB4),
    (0x1FB6, 0x1FBC),
    (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3),
    (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4),
    (0x1FF6, 0x1FFC),
    (0x2102, 0x2102),
    (0x2107, 0x2107),
    (0x210A, 0x2113),
    (0x2115, 0x2115),
    (0x2119, 0x211D),
    (0x2124, 0x2124),
    (0x2126, 0x2126),
    (0x2128, 0x2128),
    (0x212A, 0x212D),
    (0x212F, 0x2134),
    (0x2139, 0x2139),
    (0x213C, 0x213F),
    (0x2145, 0x2149),
    (0x214E, 0x214E),
    (0x2183, 0x2184),
    (0x2C00, 0x2C7B),
    (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D),
    (0xA680, 0xA69B),
    (0xA722, 0xA76F),
    (0xA771, 0xA787),
    (0xA78B, 0xA78E),
    (0xAB70, 0xABBF),
    (0xFB00, 0xFB06),
    (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A),
    (0x10400, 0x1044F),
    (0x104B0, 0x104D3),
    (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2),
    (0x10CC0, 0x10CF2),
    (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
];

impl Class {
    fn has(self, c: char) -> bool {
        let u = c as u32;
        match self {
            Class::CrLf => c == '\r' || c == '\n',
            Class::Letter => is_letter(c),
            Class::Number => is_number(c),
            Class::Punct => is_punct(c),
            Class::DefaultPunct => is_punct(c) || matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|'),
            Class::FalconPunct => is_punct(c) || matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|' | '`'),
            Class::Cjk => matches!(u, 0x0800..=0x9FA5 | 0xAC00..=0xD7FF),
            Class::DeepseekLetter => in_ranges(DEEPSEEK_LETTERS, u),
            Class::DeepseekPunct => {
                !is_whitespace(c)
                    && matches!(u, 0x21..=0x2F | 0x3A..=0x7E | 0xFF01..=0xFF0F | 0xFF1A..=0xFF5E | 0x2018..=0x201F | 0x3000..=0x3002)
            }
        }
    }
}

/// One regex of a multi-regex pre-tokenizer. Each runs over every word the previous ones
/// made: its matches become words and so does the text between them (llama.cpp's
/// `unicode_regex_split`).
#[derive(Clone, Copy)]
enum Stage {
    /// `C`: every character of the class alone.
    One(Class),
    /// `C+`
    Run(Class),
    /// `\s?C+`
    SpaceRun(Class),
    /// `\s+$`: the whitespace that ends a word.
    TrailingSpace,
    /// `[0-9][0-9][0-9]`
    Digits3,
    /// GPT-2's regex (`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`).
    Gpt2,
    /// `[^\n]+|[\n]+`
    Newlines,
}

/// The matches of `st` in `cs` (char ranges), in order.
fn matches(st: Stage, cs: &[char]) -> Result<Vec<(usize, usize)>> {
    let mut out = Vec::new();
    let n = cs.len();
    let ws = |i: usize| i < n && is_whitespace(cs[i]);
    let run = |c: Class, mut i: usize| {
        while i < n && c.has(cs[i]) {
            i += 1;
        }
        i
    };
    match st {
        Stage::Gpt2 => return split_gpt2(cs),
        Stage::Newlines => {
            let mut i = 0;
            while i < n {
                let nl = cs[i] == '\n';
                let s = i;
                while i < n && (cs[i] == '\n') == nl {
                    i += 1;
                }
                try_push(&mut out, (s, i), WORDS)?;
            }
        }
        Stage::One(c) => {
            for (i, &ch) in cs.iter().enumerate() {
                if c.has(ch) {
                    try_push(&mut out, (i, i + 1), WORDS)?;
                }
            }
        }
        Stage::Run(c) => {
            let mut i = 0;
            while i < n {
                if c.has(cs[i]) {
                    let e = run(c, i);
                    try_push(&mut out, (i, e), WORDS)?;
                    i = e;
                } else {
                    i += 1;
                }
            }
        }
        Stage::SpaceRun(c) => {
            let mut i = 0;
            while i < n {
                if c.has(cs[i]) {
                    let e = run(c, i);
                    try_push(&mut out, (i, e), WORDS)?;
                    i = e;
                } else if ws(i) && i + 1 < n && c.has(cs[i + 1]) {
                    let e = run(c, i + 1);
                    try_push(&mut out, (i, e), WORDS)?;
                    i = e;
                } else {
                    i += 1;
                }
            }
        }
        Stage::TrailingSpace => {
            let mut s = n;
            while s > 0 && ws(s - 1) {
                s -= 1;
            }
            if s < n {
                try_push(&mut out, (s, n), WORDS)?;
            }
        }
        Stage::Digits3 => {
            let mut i = 0;
            while i + 3 <= n {
                if cs[i..i + 3].iter().all(char::is_ascii_digit) {
                    try_push(&mut out, (i, i + 3), WORDS)?;
                    i += 3;
                } else {
                    i += 1;
                }
            }
        }
    }
    Ok(out)
}

/// The regexes of `list` in turn, each over the words of the ones before.
fn stages(cs: &[char], list: &[Stage]) -> Result<Vec<(usize, usize)>> {
    let mut words = Vec::new();
    if !cs.is_empty() {
        try_push(&mut words, (0, cs.len()), WORDS)?;
    }
    for &st in list {
        let mut next = Vec::new();
        for &(a, b) in &words {
            let mut at = a;
            for (s, e) in matches(st, &cs[a..b])? {
                if a + s > at {
                    try_push(&mut next, (at, a + s), WORDS)?;
                }
                try_push(&mut next, (a + s, a + e), WORDS)?;
                at = a + e;
            }
            if b > at {
                try_push(&mut next, (at, b), WORDS)?;
            }
        }
        words = next;
    }
    Ok(words)
}

fn lower(c: Option<&char>) -> Option<char> {
    c.map(|c| c.to_ascii_lowercase())
}

/// Matches `'s|'t|'re|'ve|'m|'ll|'d` at `pos`: the length, or 0.
fn contraction(cs: &[char], pos: usize, fold: bool) -> usize {
    if cs[pos] != '\'' || pos + 1 >= cs.len() {
        return 0;
    }
    let f = |c: Option<&char>| if fold { lower(c) } else { c.copied() };
    let n = f(cs.get(pos + 1));
    if matches!(n, Some('s' | 't' | 'm' | 'd')) {
        return 2;
    }
    if pos + 2 < cs.len() {
        let nn = f(cs.get(pos + 2));
        if matches!((n, nn), (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))) {
            return 3;
        }
    }
    0
}

fn split_gpt2(cs: &[char]) -> Result<Vec<(usize, usize)>> {
    let mut out = Vec::new();
    let end = cs.len();
    let mut pos = 0;
    while pos < end {
        let start = pos;
        let cpt = cs[pos];
        let k = contraction(cs, pos, false);
        if k > 0 {
            pos += k;
            try_push(&mut out, (start, pos), WORDS)?;
            continue;
        }
        let f = flags(cs, pos);
        let mut f2 = if cpt == ' ' { flags(cs, pos + 1) } else { f };
        if f2.letter || f2.number {
            let letter = f2.letter;
            pos += (cpt == ' ') as usize;
            while if letter { f2.letter } else { f2.number } {
                pos += 1;
                f2 = flags(cs, pos);
            }
            try_push(&mut out, (start, pos), WORDS)?;
            continue;
        }
        if !(f2.space || f2.letter || f2.number) && f2.valid {
            pos += (cpt == ' ') as usize;
            while !(f2.space || f2.letter || f2.number) && f2.valid {
                pos += 1;
                f2 = flags(cs, pos);
            }
            try_push(&mut out, (start, pos), WORDS)?;
            continue;
        }
        let mut nws = 0;
        while flags(cs, pos + nws).space {
            nws += 1;
        }
        if nws > 1 && pos + nws < end {
            pos += nws - 1;
            try_push(&mut out, (start, pos), WORDS)?;
            continue;
        }
        if nws > 0 {
            pos += nws;
            try_push(&mut out, (start, pos), WORDS)?;
            continue;
        }
        pos += 1;
        try_push(&mut out, (start, pos), WORDS)?;
    }
    Ok(out)
}

/// The llama3 / qwen2 scanner; `marks`: `[\p{L}\p{M}]+` words and no marks in the
/// punctuation class (qwen35).
fn split_llama3(cs: &[char], max_digits: usize, marks: bool) -> Result<Vec<(usize, usize)>> {
    // a "letter" of the word rule
    let wl = |f: F| f.letter || (marks && f.mark);
    let mut out = Vec::new();
    let end = cs.len();
    let mut pos = 0;
    let mut prev_end = 0;
    let add = |out: &mut Vec<(usize, usize)>, prev_end: &mut usize, e: usize| -> Result<()> {
        if e > *prev_end {
            try_push(out, (*prev_end, e), WORDS)?;
        }
        *prev_end = e;
        Ok(())
    };
    while pos < end {
        let cpt = cs[pos];
        let f = flags(cs, pos);
        let k = contraction(cs, pos, true);
        if k > 0 {
            pos += k;
            add(&mut out, &mut prev_end, pos)?;
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(cpt == '\r' || cpt == '\n' || f.number) && (wl(f) || wl(flags(cs, pos + 1))) {
            pos += 1;
            while wl(flags(cs, pos)) {
                pos += 1;
            }
            add(&mut out, &mut prev_end, pos)?;
            continue;
        }
        // \p{N}{1,max}
        if f.number {
            let mut ini = pos;
            while flags(cs, pos).number {
                pos += 1;
                if pos - ini >= max_digits {
                    add(&mut out, &mut prev_end, pos)?;
                    ini = pos;
                }
            }
            add(&mut out, &mut prev_end, pos)?;
            continue;
        }
        // <space>?[^\s\p{L}\p{N}]+[\r\n]*
        let mut f2 = if cpt == ' ' { flags(cs, pos + 1) } else { f };
        if !(f2.space || wl(f2) || f2.number) && f.valid && f2.valid {
            pos += (cpt == ' ') as usize;
            while !(f2.space || wl(f2) || f2.number) && f2.valid {
                pos += 1;
                f2 = flags(cs, pos);
            }
            while matches!(cs.get(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            add(&mut out, &mut prev_end, pos)?;
            continue;
        }
        let mut nws = 0;
        let mut last_rn = 0;
        while flags(cs, pos + nws).space {
            if matches!(cs[pos + nws], '\r' | '\n') {
                last_rn = pos + nws + 1;
            }
            nws += 1;
        }
        // \s*[\r\n]+
        if last_rn > 0 {
            pos = last_rn;
            add(&mut out, &mut prev_end, pos)?;
            continue;
        }
        // \s+(?!\S)
        if nws > 1 && pos + nws < end {
            pos += nws - 1;
            add(&mut out, &mut prev_end, pos)?;
            continue;
        }
        if nws > 0 {
            pos += nws;
            add(&mut out, &mut prev_end, pos)?;
            continue;
        }
        pos += 1;
        add(&mut out, &mut prev_end, pos)?;
    }
    Ok(out)
}

/// GPT-2's byte -> printable char map.
pub(crate) fn byte_to_char() -> &'static [char; 256] {
    static T: OnceLock<[char; 256]> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = ['\0'; 256];
        let mut n = 0u32;
        for b in 0..256u32 {
            let keep = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
            t[b as usize] = if keep {
                char::from_u32(b).unwrap_or('\0')
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap_or('\0')
            };
        }
        t
    })
}

/// Inverse of [`byte_to_char`].
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    if u >= 0x200 {
        return None;
    }
    byte_to_char().iter().position(|&x| x == c).map(|b| b as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: Pre, s: &str) -> Vec<String> {
        let cs: Vec<char> = s.chars().collect();
        split(pre, &cs).unwrap().into_iter().map(|(a, b)| cs[a..b].iter().collect()).collect()
    }

    /// Every scanner partitions its input: on random text over an alphabet of every
    /// class the scanners tell apart, the words are non-empty, in order, contiguous
    /// and cover the text (llama.cpp keeps what no regex matched as words too), and no
    /// scanner panics on odd mixes (marks after spaces, lone CR, full-width punctuation).
    #[test]
    fn every_scanner_partitions_random_text() {
        let alphabet: Vec<char> =
            "aZé'sTm ll d \r\n\t  09٣½!?.,;:$+<=>^~|`-_()[]{}\"你好세계こん\u{3000}\u{301}\u{300}\
             ！。、😀\u{200d}αβЖж\u{a0}\u{2028}"
                .chars()
                .collect();
        let pres = [
            Pre::Gpt2,
            Pre::Llama3,
            Pre::Qwen2,
            Pre::Qwen35,
            Pre::Whole,
            Pre::Default,
            Pre::DeepseekLlm,
            Pre::DeepseekCoder,
            Pre::Falcon,
            Pre::Starcoder,
            Pre::Newlines,
        ];
        let mut rng = crate::util::XorShift::new(0x5eed);
        for round in 0..20_000 {
            let n = (rng.next_u64() % 40) as usize;
            let cs: Vec<char> = (0..n).map(|_| alphabet[(rng.next_u64() % alphabet.len() as u64) as usize]).collect();
            for &pre in &pres {
                let ws = split(pre, &cs).unwrap();
                let mut at = 0;
                for &(a, b) in &ws {
                    assert!(a == at && b > a, "{pre:?} round {round}: words {ws:?} of {cs:?}");
                    at = b;
                }
                assert_eq!(at, cs.len(), "{pre:?} round {round}: words {ws:?} do not cover {cs:?}");
            }
        }
    }

    #[test]
    fn classes() {
        assert!(is_letter('你') && is_letter('é') && !is_letter('\u{301}') && !is_letter('1'));
        assert!(is_number('٣') && is_number('½') && !is_number('a'));
        assert!(is_whitespace('\u{3000}') && !is_whitespace('x'));
    }

    #[test]
    fn splits() {
        assert_eq!(
            words(Pre::Llama3, "Hello  world 12345!!\n\n x"),
            ["Hello", " ", " world", " ", "123", "45", "!!\n\n", " x"]
        );
        assert_eq!(words(Pre::Qwen2, "ab 123"), ["ab", " ", "1", "2", "3"]);
        assert_eq!(words(Pre::Gpt2, "I'm  ok 42"), ["I", "'m", " ", " ok", " 42"]);
        assert_eq!(words(Pre::Llama3, "  "), ["  "]);
    }

    #[test]
    fn byte_map() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char()[b as usize]), Some(b));
        }
        assert_eq!(byte_to_char()[b' ' as usize], 'Ġ');
    }
}
