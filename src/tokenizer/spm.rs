//! Score-driven SentencePiece BPE encoding of one escaped text fragment.

use super::{try_grow, try_heap_room, try_push, Tokenizer};
use crate::error::Result;

impl Tokenizer {
    /// SentencePiece BPE (llama.cpp llm_tokenizer_spm_session).
    pub(super) fn spm(&self, s: &str, out: &mut Vec<u32>) -> Result<()> {
        #[derive(Clone, Copy)]
        struct Sym {
            start: usize,
            len: usize,
            prev: usize,
            next: usize,
        }
        const NONE: usize = usize::MAX;
        let mut syms: Vec<Sym> = Vec::new();
        try_grow(&mut syms, s.chars().count(), "the SentencePiece symbols")?;
        for (i, c) in s.char_indices() {
            let k = syms.len();
            syms.push(Sym { start: i, len: c.len_utf8(), prev: if k == 0 { NONE } else { k - 1 }, next: k + 1 });
        }
        if let Some(l) = syms.last_mut() {
            l.next = NONE;
        }
        #[derive(PartialEq)]
        struct Big {
            score: f32,
            left: usize,
            right: usize,
            size: usize,
        }
        impl Eq for Big {}
        impl Ord for Big {
            fn cmp(&self, o: &Self) -> std::cmp::Ordering {
                self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
            }
        }
        impl PartialOrd for Big {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }
        let mut heap = std::collections::BinaryHeap::new();
        let try_add = |heap: &mut std::collections::BinaryHeap<Big>, syms: &[Sym], l: usize, r: usize| -> Result<()> {
            if l == NONE || r == NONE {
                return Ok(());
            }
            let a = syms[l].start;
            let size = syms[l].len + syms[r].len;
            if let Some(&id) = self.ids.get(&s[a..a + size]) {
                try_heap_room(heap, "the SentencePiece merge queue")?;
                heap.push(Big { score: self.scores[id as usize], left: l, right: r, size });
            }
            Ok(())
        };
        for i in 1..syms.len() {
            try_add(&mut heap, &syms, i - 1, i)?;
        }
        while let Some(b) = heap.pop() {
            let (l, r) = (b.left, b.right);
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != b.size || syms[l].next != r {
                continue;
            }
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            if syms[r].next != NONE {
                let n = syms[r].next;
                syms[n].prev = l;
            }
            try_add(&mut heap, &syms, syms[l].prev, l)?;
            try_add(&mut heap, &syms, l, syms[l].next)?;
        }
        let mut i = if syms.is_empty() { NONE } else { 0 };
        while i != NONE {
            let p = &s[syms[i].start..syms[i].start + syms[i].len];
            match self.ids.get(p) {
                Some(&id) => try_push(out, id, super::IDS)?,
                None => self.fallback(p, out)?,
            }
            i = syms[i].next;
        }
        Ok(())
    }
}
