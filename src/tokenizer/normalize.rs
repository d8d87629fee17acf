//! tokenizer.json normalizers, applied to every text fragment between special tokens
//! before pre-tokenization, as Hugging Face tokenizers does: NFC, NFD, NFKC, NFKD
//! (`unicode-normalization`), Lowercase (per character, like `tokenizers`: no
//! final-sigma rule), Strip (Unicode whitespace, left and/or right), Replace (a literal
//! string, all non-overlapping matches left to right), Prepend (on a non-empty text),
//! in the order of the file's `Sequence`.
//!
//! Not supported (the tokenizer then names it as unsupported): Replace with a regex
//! pattern, BertNormalizer, StripAccents, Precompiled (sentencepiece's charsmap),
//! ByteLevel normalizer, Nmt.

use unicode_normalization::UnicodeNormalization;

/// One normalizer step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Norm {
    Nfc,
    Nfd,
    Nfkc,
    Nfkd,
    Lowercase,
    Strip { left: bool, right: bool },
    Replace { from: String, to: String },
    Prepend(String),
}

/// `text` through `steps`, in order.
pub(crate) fn apply(steps: &[Norm], text: &str) -> String {
    let mut s = text.to_string();
    for step in steps {
        s = match step {
            Norm::Nfc => s.nfc().collect(),
            Norm::Nfd => s.nfd().collect(),
            Norm::Nfkc => s.nfkc().collect(),
            Norm::Nfkd => s.nfkd().collect(),
            Norm::Lowercase => s.chars().flat_map(char::to_lowercase).collect(),
            Norm::Strip { left, right } => {
                let t = if *left { s.trim_start() } else { &s[..] };
                let t = if *right { t.trim_end() } else { t };
                t.to_string()
            }
            Norm::Replace { from, to } if !from.is_empty() => s.replace(from.as_str(), to),
            Norm::Replace { .. } => s,
            Norm::Prepend(p) if !s.is_empty() => format!("{p}{s}"),
            Norm::Prepend(_) => s,
        };
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_in_order() {
        // "e" + combining acute: NFC composes, NFD keeps it apart.
        assert_eq!(apply(&[Norm::Nfc], "e\u{301}"), "\u{e9}");
        assert_eq!(apply(&[Norm::Nfd], "\u{e9}"), "e\u{301}");
        // The fi ligature and a full-width digit: compatibility forms.
        assert_eq!(apply(&[Norm::Nfkc], "\u{fb01}\u{ff11}"), "fi1");
        assert_eq!(apply(&[Norm::Lowercase], "ÀΣB"), "àσb");
        assert_eq!(apply(&[Norm::Strip { left: true, right: false }], " \t a \n"), "a \n");
        let rep = Norm::Replace { from: "aa".into(), to: "b".into() };
        assert_eq!(apply(&[rep], "aaa aa"), "ba b");
        assert_eq!(apply(&[Norm::Prepend("▁".into())], ""), "");
        assert_eq!(apply(&[Norm::Lowercase, Norm::Prepend("x".into())], "A"), "xa");
    }
}
