//! A minimal protobuf wire-format reader (enough for a sentencepiece ModelProto).

use super::bad;
use crate::error::Result;

pub(super) enum PVal<'a> {
    Varint(u64),
    Fixed64,
    Fixed32(u32),
    Bytes(&'a [u8]),
}

pub(super) struct PField<'a> {
    pub(super) num: u64,
    pub(super) val: PVal<'a>,
}

pub(super) fn proto_fields<'a>(b: &'a [u8], src: &str) -> Result<Vec<PField<'a>>> {
    let mut out = Vec::new();
    let mut p = 0usize;
    let err = |p: usize, what: &str| bad(src, format!("malformed sentencepiece model at byte {p}: {what}"));
    let varint = |p: &mut usize| -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*p)?;
            *p += 1;
            v |= ((byte & 0x7F) as u64) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    };
    while p < b.len() {
        let at = p;
        let key = varint(&mut p).ok_or_else(|| err(at, "bad varint"))?;
        let (num, wt) = (key >> 3, key & 7);
        let val = match wt {
            0 => PVal::Varint(varint(&mut p).ok_or_else(|| err(at, "bad varint"))?),
            1 => {
                let s = b.get(p..p + 8).ok_or_else(|| err(at, "truncated fixed64"))?;
                p += 8;
                let _ = s;
                PVal::Fixed64
            }
            2 => {
                let len = varint(&mut p).ok_or_else(|| err(at, "bad length"))?;
                let len = usize::try_from(len).map_err(|_| err(at, "length too large"))?;
                let end = p.checked_add(len).filter(|&e| e <= b.len()).ok_or_else(|| err(at, "truncated field"))?;
                let s = &b[p..end];
                p = end;
                PVal::Bytes(s)
            }
            5 => {
                let s = b.get(p..p + 4).ok_or_else(|| err(at, "truncated fixed32"))?;
                p += 4;
                PVal::Fixed32(u32::from_le_bytes(s.try_into().unwrap_or([0; 4])))
            }
            _ => return Err(err(at, &format!("wire type {wt}"))),
        };
        out.push(PField { num, val });
    }
    Ok(out)
}
