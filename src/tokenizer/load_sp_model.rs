//! The tokenizer from a sentencepiece `.model` file (a ModelProto of type BPE).

use super::protobuf::{proto_fields, PVal};
use super::{bad, Model, Parts, Prefix, TokType, Tokenizer};
use crate::error::{Error, Result};

impl Tokenizer {
    /// From a sentencepiece `.model` file (ModelProto) of type BPE (Llama 1/2, Mistral v0.1).
    /// Unigram models -> LLMRT_UNSUPPORTED; malformed protobuf -> LLMRT_BAD_MODEL.
    pub fn from_sentencepiece_model(bytes: &[u8], path_for_messages: &str) -> Result<Tokenizer> {
        let src = path_for_messages;
        let mut tokens = Vec::new();
        let mut scores = Vec::new();
        let mut types = Vec::new();
        let (mut model_type, mut unk, mut bos, mut eos) = (1i64, 0i64, 1i64, 2i64);
        let mut dummy = true;
        for f in proto_fields(bytes, src)? {
            match (f.num, f.val) {
                (1, PVal::Bytes(b)) => {
                    let (mut piece, mut score, mut ty) = (None, 0.0f32, 1i64);
                    for g in proto_fields(b, src)? {
                        match (g.num, g.val) {
                            (1, PVal::Bytes(s)) => {
                                piece = Some(
                                    String::from_utf8(s.to_vec())
                                        .map_err(|_| bad(src, format!("piece {} is not UTF-8", tokens.len())))?,
                                )
                            }
                            (2, PVal::Fixed32(x)) => score = f32::from_bits(x),
                            (3, PVal::Varint(x)) => ty = x as i64,
                            _ => {}
                        }
                    }
                    let piece = piece.ok_or_else(|| bad(src, format!("piece {} has no text", tokens.len())))?;
                    let t = TokType::from_i64(ty)
                        .ok_or_else(|| bad(src, format!("piece {} has type {ty}", tokens.len())))?;
                    tokens.push(piece);
                    scores.push(score);
                    types.push(t);
                }
                (2, PVal::Bytes(b)) => {
                    for g in proto_fields(b, src)? {
                        match (g.num, g.val) {
                            (3, PVal::Varint(x)) => model_type = x as i64,
                            (40, PVal::Varint(x)) => unk = x as i32 as i64,
                            (41, PVal::Varint(x)) => bos = x as i32 as i64,
                            (42, PVal::Varint(x)) => eos = x as i32 as i64,
                            _ => {}
                        }
                    }
                }
                (3, PVal::Bytes(b)) => {
                    for g in proto_fields(b, src)? {
                        if let (3, PVal::Varint(x)) = (g.num, g.val) {
                            dummy = x != 0;
                        }
                    }
                }
                _ => {}
            }
        }
        if model_type != 2 {
            return Err(Error::unsupported(format!(
                "{src}: sentencepiece model type {model_type} (only BPE = 2 is supported; 1 = unigram)"
            )));
        }
        let opt = |x: i64| u32::try_from(x).ok();
        Tokenizer::build(
            Parts {
                tokens,
                types,
                scores,
                merges: vec![],
                model: Model::Spm,
                prefix: if dummy { Prefix::Always } else { Prefix::Never },
                prefix_unless_space: false,
                bos: opt(bos),
                eos: opt(eos),
                unk: opt(unk),
                add_bos: true,
                specials: None,
                normalizer: Vec::new(),
            },
            src,
        )
    }
}
