#!/usr/bin/env python3
"""Reference ids for tokenizer.json normalizers (tests/fixtures/tokenizer/normalizers.json),
from HF tokenizers.

Takes two committed tokenizer.json files (byte-level BPE: the qwen2 fixture's and
llama3_bpe's), replaces their `normalizer` with each of the normalizers below (alone and
in sequences) and records the ids HF tokenizers gives for a set of strings that each
normalizer changes (decomposed and composed accents, ligatures, full-width forms, upper
case incl. final sigma and dotted I, surrounding whitespace). tests/tokenizer_normalizers.rs
loads the same JSON with the normalizer swapped and compares.

    /work/venv-chat/bin/python tools/make_normalizer_vectors.py   # tokenizers 0.23.3
"""
import json
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"

BASES = ["qwen2/hf/tokenizer.json", "tokenizer/llama3_bpe.tokenizer.json"]

NORMALIZERS = [
    None,
    {"type": "NFC"},
    {"type": "NFD"},
    {"type": "NFKC"},
    {"type": "NFKD"},
    {"type": "Lowercase"},
    {"type": "Strip", "strip_left": True, "strip_right": True},
    {"type": "Strip", "strip_left": False, "strip_right": True},
    {"type": "Replace", "pattern": {"String": "  "}, "content": " "},
    {"type": "Replace", "pattern": {"String": "a"}, "content": "XY"},
    {"type": "Prepend", "prepend": "> "},
    {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
    {"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": False},
        {"type": "Replace", "pattern": {"String": "the"}, "content": "THE"},
        {"type": "NFD"}, {"type": "Prepend", "prepend": "#"}]},
]

TEXTS = [
    "Hello World",
    "caf\u00e9 cafe\u0301",
    "\ufb01ne \uff11\uff12\uff13 \u2460",
    "\u00c5ngstr\u00f6m \u212b",
    "\u03a3\u039f\u03a6\u039f\u03a3 \u0130stanbul STRASSE \u1e9e",
    "  padded  text \t\n",
    "a banana and the cat",
    "",
    "\u1100\u1161\u11a8 \uac01",
    "x\u0327\u0301 \u00bd",
]


def main():
    out = {"versions": {"tokenizers": tokenizers.__version__},
           "command": "python3 tools/make_normalizer_vectors.py", "texts": TEXTS, "cases": []}
    for base in BASES:
        j = json.loads((FIX / base).read_text())
        for norm in NORMALIZERS:
            j["normalizer"] = norm
            t = Tokenizer.from_str(json.dumps(j))
            ids = [t.encode(s, add_special_tokens=False).ids for s in TEXTS]
            out["cases"].append({"base": base, "normalizer": norm, "ids": ids})
        print(base, len(NORMALIZERS), "normalizers")
    (FIX / "tokenizer" / "normalizers.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
