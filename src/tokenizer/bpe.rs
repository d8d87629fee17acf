//! Rank-driven BPE encoding of one word (byte-level or SentencePiece-style).

use super::{try_grow, try_heap_room, try_push, Tokenizer};
use crate::error::Result;

impl Tokenizer {
    /// Rank-driven BPE of one word (llama.cpp llm_tokenizer_bpe_session / HF BPE).
    pub(super) fn bpe_word(&self, w: &str, ignore_merges: bool, out: &mut Vec<u32>) -> Result<()> {
        const QUEUE: &str = "the BPE merge queue";
        if w.is_empty() {
            return Ok(());
        }
        if ignore_merges {
            if let Some(&id) = self.ids.get(w) {
                return try_push(out, id, super::IDS);
            }
        }
        const NONE: usize = usize::MAX;
        // (char start, char len, id, prev, next)
        struct Sym {
            start: usize,
            len: usize,
            id: Option<u32>,
            prev: usize,
            next: usize,
        }
        let mut syms: Vec<Sym> = Vec::new();
        try_grow(&mut syms, w.chars().count(), "the BPE symbols")?;
        for (i, c) in w.char_indices() {
            let k = syms.len();
            let id = self.ids.get(&w[i..i + c.len_utf8()]).copied();
            syms.push(Sym { start: i, len: c.len_utf8(), id, prev: if k == 0 { NONE } else { k - 1 }, next: k + 1 });
        }
        if let Some(l) = syms.last_mut() {
            l.next = NONE;
        }
        // min-heap on (rank, left)
        use std::cmp::Reverse;
        // (rank, left, right, left id, right id)
        type Entry = Reverse<(u32, usize, usize, u32, u32)>;
        let mut heap: std::collections::BinaryHeap<Entry> = Default::default();
        let rank_of = |syms: &[Sym], l: usize, r: usize| -> Option<(u32, u32, u32, u32)> {
            let (a, b) = (syms[l].id?, syms[r].id?);
            self.ranks.get(&(a, b)).map(|&(rank, m)| (rank, a, b, m))
        };
        for i in 1..syms.len() {
            if let Some((rank, a, b, _)) = rank_of(&syms, i - 1, i) {
                try_heap_room(&mut heap, QUEUE)?;
                heap.push(Reverse((rank, i - 1, i, a, b)));
            }
        }
        while let Some(Reverse((_, l, r, a, b))) = heap.pop() {
            if syms[l].len == 0
                || syms[r].len == 0
                || syms[l].next != r
                || syms[l].id != Some(a)
                || syms[r].id != Some(b)
            {
                continue;
            }
            let Some(&(_, m)) = self.ranks.get(&(a, b)) else { continue };
            syms[l].len += syms[r].len;
            syms[l].id = Some(m);
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            if syms[r].next != NONE {
                let n = syms[r].next;
                syms[n].prev = l;
            }
            let p = syms[l].prev;
            if p != NONE {
                if let Some((rank, a, b, _)) = rank_of(&syms, p, l) {
                    try_heap_room(&mut heap, QUEUE)?;
                    heap.push(Reverse((rank, p, l, a, b)));
                }
            }
            let n = syms[l].next;
            if n != NONE {
                if let Some((rank, a, b, _)) = rank_of(&syms, l, n) {
                    try_heap_room(&mut heap, QUEUE)?;
                    heap.push(Reverse((rank, l, n, a, b)));
                }
            }
        }
        let mut i = 0;
        while i != NONE {
            match syms[i].id {
                Some(id) => try_push(out, id, super::IDS)?,
                None => self.fallback(&w[syms[i].start..syms[i].start + syms[i].len], out)?,
            }
            i = syms[i].next;
        }
        Ok(())
    }
}
