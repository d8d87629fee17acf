//! Pre-tokenizers of byte-level BPE: hand-written scanners equivalent to the split regexes,
//! ported from llama.cpp's `unicode_regex_split_custom_gpt2` / `_llama3` (unicode.cpp), and the
//! GPT-2 byte-to-unicode map.
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
    /// No split: the whole fragment is one word.
    Whole,
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
}

fn flags(cs: &[char], pos: usize) -> F {
    match cs.get(pos) {
        None => F::default(),
        Some(&c) => F { valid: true, letter: is_letter(c), number: is_number(c), space: is_whitespace(c) },
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
        Pre::Llama3 => split_llama3(cs, 3),
        Pre::Qwen2 => split_llama3(cs, 1),
    }
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

fn split_llama3(cs: &[char], max_digits: usize) -> Result<Vec<(usize, usize)>> {
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
        if !(cpt == '\r' || cpt == '\n' || f.number) && (f.letter || flags(cs, pos + 1).letter) {
            pos += 1;
            while flags(cs, pos).letter {
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
        if !(f2.space || f2.letter || f2.number) && f.valid && f2.valid {
            pos += (cpt == ' ') as usize;
            while !(f2.space || f2.letter || f2.number) && f2.valid {
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
