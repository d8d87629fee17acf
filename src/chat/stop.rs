//! Stop strings over streamed text: a matcher fed the generated pieces one by one that
//! passes on only text that can no longer be part of a stop string.
//!
//! What it emits, over a whole generation, does not depend on how the text was split into
//! pieces: the text is cut where the first stop string *ends* (the earliest end position; of
//! two stop strings ending there, the longer one, which starts earlier), and everything
//! before that cut is emitted, nothing after it. While no stop string has matched, the
//! longest tail of the text that is a proper prefix of some stop string is held back, and so
//! is an incomplete UTF-8 character at the end: an emitted chunk never ends inside a
//! character that the pieces so far split, and never contains the start of a match.
//! [`StopMatcher::finish`] gives the held text at the end of generation.

use crate::{Error, Result};

/// Most stop strings one matcher takes.
pub const MAX_STOPS: usize = 1024;
/// Longest stop string (bytes).
pub const MAX_STOP_LEN: usize = 4096;

/// The streaming matcher.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<Vec<u8>>,
    held: Vec<u8>,
    stopped: Option<usize>,
}

/// What one [`StopMatcher::feed`] gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fed {
    /// Text now safe to show.
    pub text: Vec<u8>,
    /// The index of the stop string that matched (in this feed or an earlier one): the
    /// generation is over and nothing more will be emitted.
    pub stop: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops` (UTF-8 strings, none empty; at most [`MAX_STOPS`] of at most
    /// [`MAX_STOP_LEN`] bytes, else LLMRT_INVALID_ARGUMENT naming the string). No stop
    /// strings at all is allowed: then only incomplete characters are held back.
    pub fn new<S: AsRef<[u8]>>(stops: &[S]) -> Result<StopMatcher> {
        if stops.len() > MAX_STOPS {
            return Err(Error::invalid(format!("{} stop strings: at most {MAX_STOPS}", stops.len())));
        }
        let mut v = Vec::with_capacity(stops.len());
        for (i, s) in stops.iter().enumerate() {
            let s = s.as_ref();
            if s.is_empty() {
                return Err(Error::invalid(format!("stop string {i} is empty")));
            }
            if s.len() > MAX_STOP_LEN {
                return Err(Error::invalid(format!("stop string {i} has {} bytes: at most {MAX_STOP_LEN}", s.len())));
            }
            if let Err(e) = std::str::from_utf8(s) {
                return Err(Error::invalid(format!(
                    "stop string {i} is not valid UTF-8 at byte offset {}",
                    e.valid_up_to()
                )));
            }
            v.push(s.to_vec());
        }
        Ok(StopMatcher { stops: v, held: Vec::new(), stopped: None })
    }

    /// Bytes held back now (a possible start of a stop string, an incomplete character).
    pub fn held(&self) -> &[u8] {
        &self.held
    }

    /// The stop string that matched, if one did.
    pub fn stopped(&self) -> Option<usize> {
        self.stopped
    }

    /// What feeding `piece` would give, and the held bytes after it, without changing the
    /// matcher (so a caller whose buffer is too small can retry).
    pub fn peek(&self, piece: &[u8]) -> Result<(Fed, Vec<u8>)> {
        if let Some(i) = self.stopped {
            return Ok((Fed { text: Vec::new(), stop: Some(i) }, self.held.clone()));
        }
        let mut buf = Vec::new();
        buf.try_reserve(self.held.len().saturating_add(piece.len())).map_err(|_| {
            Error::out_of_memory(format!("stop matcher: cannot hold {} + {} bytes", self.held.len(), piece.len()))
        })?;
        buf.extend_from_slice(&self.held);
        buf.extend_from_slice(piece);
        // A match that ends earliest (then the longest); any match lies in the new bytes'
        // reach, since the held bytes alone hold none.
        if let Some((start, i)) = first_match(&self.stops, &buf, self.held.len()) {
            buf.truncate(start);
            return Ok((Fed { text: buf, stop: Some(i) }, Vec::new()));
        }
        let keep = self.hold_from(&buf);
        let held = buf.split_off(keep);
        Ok((Fed { text: buf, stop: None }, held))
    }

    /// Feeds the next piece of generated text (any bytes: a piece may end inside a
    /// character); returns the text now safe to show and whether a stop string matched.
    pub fn feed(&mut self, piece: &[u8]) -> Result<Fed> {
        let (fed, held) = self.peek(piece)?;
        self.held = held;
        self.stopped = fed.stop;
        Ok(fed)
    }

    /// End of generation: the held text (nothing after a stop string matched); the matcher
    /// is then empty and may be fed again.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }

    /// Where the tail to hold back starts in `buf` (no full match in it).
    fn hold_from(&self, buf: &[u8]) -> usize {
        let mut from = buf.len();
        for s in &self.stops {
            // The longest proper prefix of s that ends buf.
            let max = (s.len() - 1).min(buf.len());
            for l in (1..=max).rev() {
                if buf.len() - l < from && buf.ends_with(&s[..l]) {
                    from = buf.len() - l;
                    break;
                }
            }
        }
        utf8_complete_prefix(&buf[..from])
    }
}

/// The earliest-ending match of any of `stops` in `buf` that ends after `after` bytes (the
/// longest of those ending there): its start and the stop string's index.
fn first_match(stops: &[Vec<u8>], buf: &[u8], after: usize) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize, usize)> = None; // (end, start, index)
    for (i, s) in stops.iter().enumerate() {
        let lo = (after + 1).max(s.len());
        for end in lo..=buf.len() {
            if best.is_some_and(|(e, _, _)| end > e) {
                break;
            }
            if &buf[end - s.len()..end] == s.as_slice() {
                let start = end - s.len();
                if best.is_none_or(|(e, st, _)| end < e || (end == e && start < st)) {
                    best = Some((end, start, i));
                }
                break;
            }
        }
    }
    best.map(|(_, start, i)| (start, i))
}

/// The length of `b` without a trailing incomplete UTF-8 character (a lead byte followed by
/// fewer continuation bytes than it announces). Invalid bytes are not held: they can never
/// complete.
pub fn utf8_complete_prefix(b: &[u8]) -> usize {
    let n = b.len();
    for back in 1..=n.min(3) {
        let c = b[n - back];
        if c & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for its lead
        }
        let need = match c {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return n,
        };
        return if back < need { n - back } else { n };
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_stop_basic() {
        let mut m = StopMatcher::new(&["</s>", "\n\nUser:"]).unwrap();
        assert_eq!(m.feed(b"Hello <").unwrap(), Fed { text: b"Hello ".to_vec(), stop: None });
        assert_eq!(m.feed(b"b>").unwrap(), Fed { text: b"<b>".to_vec(), stop: None });
        assert_eq!(m.feed(b" x\n\nUs").unwrap(), Fed { text: b" x".to_vec(), stop: None });
        assert_eq!(m.feed(b"er: hi").unwrap(), Fed { text: b"".to_vec(), stop: Some(1) });
        assert_eq!(m.feed(b"more").unwrap(), Fed { text: b"".to_vec(), stop: Some(1) });
        assert!(StopMatcher::new(&[""]).is_err());
        assert!(StopMatcher::new(&[b"\xff".as_slice()]).is_err());
    }

    #[test]
    fn chat_stop_utf8_tail() {
        assert_eq!(utf8_complete_prefix("aé".as_bytes()), 3);
        assert_eq!(utf8_complete_prefix(&"aé".as_bytes()[..2]), 1);
        assert_eq!(utf8_complete_prefix(&"a🙂".as_bytes()[..4]), 1);
        assert_eq!(utf8_complete_prefix(b"a\x80"), 2);
        let mut m = StopMatcher::new::<&str>(&[]).unwrap();
        assert_eq!(m.feed(&"日".as_bytes()[..2]).unwrap().text, b"");
        assert_eq!(m.feed(&"日".as_bytes()[2..]).unwrap().text, "日".as_bytes());
    }
}
