#!/usr/bin/env python3
"""Reference token ids for llmrt's tokenizers (tests/fixtures/tokenizer/).

Run with the fixtures venv (see tools/make_fixtures.py; plus `pip install protobuf` for
sentencepiece's model proto):

    /work/fixtures-venv/bin/python tools/make_tokenizer_vectors.py \
        --work /work/fixtures-tmp [--shared ../shared]

Tokenizers covered (each entry of vectors.json names its reference):

- `llama_gqa`   : tests/fixtures/llama_gqa/llama_gqa.f32.gguf (tokenizer.ggml.model = llama).
                  Oracle: sentencepiece on the .model tools/make_fixtures.py trained (taken from
                  <work>/llama_gqa/spm.model, or re-trained exactly as make_fixtures does; checked
                  piece-for-piece against the GGUF vocab).
- `qwen2`       : tests/fixtures/qwen2/qwen2.f32.gguf (gpt2, pre qwen2). Oracle: HF `tokenizers` on
                  the tokenizer.json make_fixtures trained (<work>/qwen2/hf/, or re-trained; checked
                  against the GGUF vocab), with its NFC normalizer removed (llama.cpp semantics: the
                  GGUF carries no normalizer).
- `llama3_bpe`  : a tiny byte-level BPE trained here with HF tokenizers and the Llama-3 split regex,
                  saved as tests/fixtures/tokenizer/llama3_bpe.tokenizer.json and as a vocab-only
                  GGUF tests/fixtures/tokenizer/llama3_bpe.gguf (gpt2, pre llama3). Oracle: HF tokenizers.
- `llama_gqa_hf`: the llama_gqa SentencePiece model converted by transformers to a tokenizer.json
                  (tests/fixtures/tokenizer/llama_gqa.tokenizer.json). Oracle: HF tokenizers on it.
- `llama2`      : Llama 2's SentencePiece model from <shared>/models/llama2-tokenizer.model (NOT
                  copied here). Oracle: sentencepiece.

llama.cpp semantics (what llmrt implements) where the libraries differ:
- special tokens written in the text (control / user-defined / unknown pieces, e.g. "<s>") are
  recognised as their ids (llama.cpp parse_special=true). sentencepiece never does that, so for
  SentencePiece the text is split on special tokens (longest first) and each text fragment is
  encoded on its own (llama.cpp adds the dummy-prefix space to every fragment that starts the
  text or follows a special token, which is what a separate sentencepiece call does).
- llama.cpp never collapses whitespace: sentencepiece's remove_extra_whitespaces (true by default
  in the fixture models, false in Llama 2) is switched off in the oracle. The ids with it on are
  recorded too (`ids_sentencepiece_default`) where they differ.
- no Unicode normalisation for GGUF byte-level BPE (the qwen2 tokenizer.json has NFC; the HF ids
  with NFC are recorded as `ids_hf_nfc` where they differ).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "tokenizer"

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

LONG = ("The quick brown fox jumps over the lazy dog. It was 3:45 pm on 2024-01-17, and the "
        "temperature had dropped to -12.5 degrees; nobody expected the river to freeze so fast! "
        "\"Really?\" she asked -- then laughed, because the cat (a very old, very grumpy tabby) had "
        "already claimed the warmest spot near the fire.\n\nChapter 2\n\tIndented line   with   gaps.")

CORPUS = [
    "", " ", "  ", "   ", " x", "x ", "  x  ", "a  b   c", "\n", "\n\n", "\n\n\n", "\t", "\t\t x",
    "Hello world", "Hello, world!", " Hello world", "Hello world ", "hello\nworld", "hello \n world",
    "12345", "3.14159", "1,000,000", "0", "007", "x=1234567890", "!!!", "...", "?!?!", "--- ***", "(a)[b]{c}",
    "don't I'm we'll they've she'd it's THEY'RE", "'s 's", "你好，世界", "日本語のテキストです。カタカナ",
    "안녕하세요", "😀", "👩\u200d👩\u200d👧", "👍🏽 ok", "e\u0301", "n\u0303", "ñ", "café naïve",
    "مرحبا بالعالم", "שלום עולם", "Привет, мир!", "Ελληνικά", "€ £ ¥ ₹", "\u0007bell", "\u00a0nbsp",
    "a\u3000b", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "<s>", "</s>", "<unk>", "<|endoftext|>", "<s>Hello</s>", "a<s>b", " <s> ",
    "text<|endoftext|>more", "<|endoftext|><|endoftext|>", "<|begin_of_text|>Hi<|end_of_text|>",
    "Mixed 中文 and English 123 と日本語 😀!", "  \t\n  x", "The quick cat runs.", "A\r\nB\rC",
    "tab\there", "trailing spaces   ", "     ", "x\n \n", LONG,
]


def log(*a):
    print(*a, flush=True)


def split_special(text: str, specials: list[str]) -> list[tuple[bool, str]]:
    """llama.cpp's tokenizer_st_partition: for each special token, longest first, split every
    remaining raw-text fragment at each occurrence (left to right)."""
    frags: list[tuple[bool, str]] = [(False, text)]
    for sp in sorted(specials, key=lambda s: (-len(s.encode()), s)):
        if not sp:
            continue
        nxt = []
        for is_sp, t in frags:
            if is_sp:
                nxt.append((is_sp, t))
                continue
            while True:
                i = t.find(sp)
                if i < 0:
                    break
                if i > 0:
                    nxt.append((False, t[:i]))
                nxt.append((True, sp))
                t = t[i + len(sp):]
            if t:
                nxt.append((False, t))
        frags = nxt
    return frags


def spm_oracle(model_bytes: bytes):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    m = pb.ModelProto()
    m.ParseFromString(model_bytes)
    default = spm.SentencePieceProcessor(model_proto=model_bytes)
    m.normalizer_spec.remove_extra_whitespaces = False
    sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
    # llama.cpp: CONTROL, USER_DEFINED and UNKNOWN pieces are matched in text.
    specials = {p.piece: i for i, p in enumerate(m.pieces) if p.type in (2, 3, 4)}

    def enc(proc, text):
        ids = []
        for is_sp, t in split_special(text, list(specials)):
            ids += [specials[t]] if is_sp else proc.encode(t, out_type=int)
        return ids
    return m, sp, default, specials, enc


def entries_spm(name, model_bytes, source, note):
    m, sp, default, specials, enc = spm_oracle(model_bytes)
    cases = []
    for s in CORPUS:
        ids = enc(sp, s)
        d = enc(default, s)
        c = {"text": s, "ids": ids}
        if d != ids:
            c["ids_sentencepiece_default"] = d
        # sentencepiece's own decode of the ids (control ids dropped, leading dummy space dropped)
        c["decoded_sentencepiece"] = sp.decode([i for i in ids if m.pieces[i].type not in (2, 3)])
        cases.append(c)
    return {"name": name, "kind": "spm", "source": source, "note": note,
            "vocab_size": len(m.pieces), "bos": 1, "eos": 2, "cases": cases}


def entries_hf(name, tk, source, note, extra_tk=None, extra_key=None):
    cases = []
    for s in CORPUS:
        ids = tk.encode(s, add_special_tokens=False).ids
        c = {"text": s, "ids": ids}
        if extra_tk is not None:
            e = extra_tk.encode(s, add_special_tokens=False).ids
            if e != ids:
                c[extra_key] = e
        c["decoded_hf"] = tk.decode(ids, skip_special_tokens=True)
        cases.append(c)
    return {"name": name, "kind": "bpe", "source": source, "note": note,
            "vocab_size": tk.get_vocab_size(), "cases": cases}


def gguf_module(work: Path):
    conv = work / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
    sys.path.insert(0, str(conv / "gguf-py"))
    import gguf
    return gguf


def gguf_tokens(gguf, path: Path):
    r = gguf.GGUFReader(str(path))
    f = r.fields["tokenizer.ggml.tokens"]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def spm_model(work: Path) -> bytes:
    p = work / "llama_gqa" / "spm.model"
    if not p.is_file():
        sys.path.insert(0, str(ROOT / "tools"))
        import make_fixtures as mf
        (work / "retrain_spm" / "hf").mkdir(parents=True, exist_ok=True)
        mf.make_spm(work / "retrain_spm" / "hf", work / "retrain_spm", 384, mf.make_corpus(1234 + 0))
        p = work / "retrain_spm" / "spm.model"
    return p.read_bytes()


def qwen2_tokenizer_json(work: Path) -> bytes:
    p = work / "qwen2" / "hf" / "tokenizer.json"
    if not p.is_file():
        sys.path.insert(0, str(ROOT / "tools"))
        import make_fixtures as mf
        d = work / "retrain_qwen2" / "hf"
        d.mkdir(parents=True, exist_ok=True)
        mf.make_bpe(d, 384, mf.make_corpus(1234 + 4))
        p = d / "tokenizer.json"
    return p.read_bytes()


def train_llama3_bpe(out: Path, gguf):
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers
    sys.path.insert(0, str(ROOT / "tools"))
    import make_fixtures as mf
    corpus = mf.make_corpus(4321, 3000) + [c for c in CORPUS if c] * 3
    tk = Tokenizer(models.BPE(ignore_merges=True))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(corpus, trainer=trainer)
    tj = out / "llama3_bpe.tokenizer.json"
    tk.save(str(tj))
    (out / "llama3_bpe.tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, indent=2) + "\n")
    # vocab-only GGUF, as llama.cpp's converter writes a llama3 tokenizer
    j = json.loads(tj.read_text())
    vocab = j["model"]["vocab"]
    n = max(vocab.values()) + 1
    for a in j["added_tokens"]:
        n = max(n, a["id"] + 1)
    toks = [None] * n
    types = [1] * n
    for t, i in vocab.items():
        toks[i] = t
    for a in j["added_tokens"]:
        toks[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4
    assert all(t is not None for t in toks)
    merges = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    w = gguf.GGUFWriter(str(out / "llama3_bpe.gguf"), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama3")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(toks.index("<|begin_of_text|>"))
    w.add_eos_token_id(toks.index("<|end_of_text|>"))
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Tokenizer.from_file(str(tj))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    gguf = gguf_module(args.work)
    from tokenizers import Tokenizer
    import sentencepiece, tokenizers, transformers

    tokenizers_out = []

    # 1. llama_gqa (SentencePiece BPE)
    mb = spm_model(args.work)
    m, _, _, _, _ = spm_oracle(mb)
    gt = gguf_tokens(gguf, ROOT / "tests/fixtures/llama_gqa/llama_gqa.f32.gguf")
    assert gt == [p.piece for p in m.pieces], "GGUF vocab differs from the sentencepiece model"
    tokenizers_out.append(entries_spm(
        "llama_gqa", mb, "tests/fixtures/llama_gqa/llama_gqa.f32.gguf",
        "sentencepiece on the training script's .model, remove_extra_whitespaces off, split on specials"))

    # 2. llama_gqa converted to tokenizer.json by transformers
    from transformers import AutoTokenizer
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        Path(d, "tokenizer.model").write_bytes(mb)
        Path(d, "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
            "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
        hft = AutoTokenizer.from_pretrained(d)
        assert len(hft) == len(m.pieces), len(hft)
        hft.save_pretrained(d)
        tj = json.loads(Path(d, "tokenizer.json").read_text())
    (OUT / "llama_gqa.tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False, indent=1) + "\n")
    (OUT / "llama_gqa.tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>"}, indent=2) + "\n")
    tk = Tokenizer.from_file(str(OUT / "llama_gqa.tokenizer.json"))
    tokenizers_out.append(entries_hf(
        "llama_gqa_hf", tk, "tests/fixtures/tokenizer/llama_gqa.tokenizer.json",
        "HF tokenizers on transformers' conversion of the llama_gqa .model"))

    # 3. qwen2 (byte-level BPE, qwen2 split)
    qj = json.loads(qwen2_tokenizer_json(args.work))
    qvocab = qj["model"]["vocab"]
    gt = gguf_tokens(gguf, ROOT / "tests/fixtures/qwen2/qwen2.f32.gguf")
    for t, i in qvocab.items():
        assert gt[i] == t, (i, t, gt[i])
    with_nfc = Tokenizer.from_str(json.dumps(qj))
    qj_plain = dict(qj, normalizer=None)
    plain = Tokenizer.from_str(json.dumps(qj_plain))
    tokenizers_out.append(entries_hf(
        "qwen2", plain, "tests/fixtures/qwen2/qwen2.f32.gguf",
        "HF tokenizers on the training script's tokenizer.json with its NFC normalizer removed "
        "(llama.cpp semantics); ids_hf_nfc: HF with NFC where different",
        extra_tk=with_nfc, extra_key="ids_hf_nfc"))

    # 4. llama3-style byte-level BPE, tokenizer.json + vocab-only GGUF
    l3 = train_llama3_bpe(OUT, gguf)
    tokenizers_out.append(entries_hf(
        "llama3_bpe", l3, "tests/fixtures/tokenizer/llama3_bpe.gguf + llama3_bpe.tokenizer.json",
        "HF tokenizers on the tokenizer.json trained here (Llama-3 split regex, ignore_merges)"))

    # 5. Llama 2
    lp = args.shared / "models" / "llama2-tokenizer.model"
    if lp.is_file():
        tokenizers_out.append(entries_spm(
            "llama2", lp.read_bytes(), "../shared/models/llama2-tokenizer.model (not committed)",
            "sentencepiece on Llama 2's model (remove_extra_whitespaces already off), split on specials"))
    else:
        log(f"{lp} missing: llama2 vectors not written")

    vers = {"sentencepiece": sentencepiece.__version__, "tokenizers": tokenizers.__version__,
            "transformers": transformers.__version__, "gguf-py": getattr(gguf, "__version__", "vendored 0.3.36"),
            "python": sys.version.split()[0]}
    doc = {"versions": vers,
           "command": "/work/fixtures-venv/bin/python tools/make_tokenizer_vectors.py --work /work/fixtures-tmp",
           "tokenizers": tokenizers_out}
    (OUT / "vectors.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    for t in tokenizers_out:
        log(t["name"], t["vocab_size"], sum(len(c["ids"]) for c in t["cases"]), "ids")
    log("versions", vers)


if __name__ == "__main__":
    main()
