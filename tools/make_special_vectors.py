#!/usr/bin/env python3
"""Reference ids for special-token text with and without parse_special
(tests/fixtures/tokenizer/special.json), from HF tokenizers.

For each tokenizer.json below and each text holding its special tokens written out,
records `ids_parse` (HF's default: an added/special token written in the text is its id;
llama.cpp's parse_special = true) and `ids_text` (`encode_special_tokens = True`: the
token's text is tokenized as text, llama.cpp's parse_special = false), add_special_tokens
off. tests/tokenizer_special.rs checks llmrt's `llmrt_tokenize_ex` (the qwen2 GGUF) and
`Tokenizer::encode_with` (the tokenizer.json files) against them.

    /work/venv-chat/bin/python tools/make_special_vectors.py   # tokenizers 0.23.3
"""
import json
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, normalizers

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"

CASES = {
    # The qwen2 GGUF's vocabulary is this tokenizer.json's; the GGUF carries no NFC
    # normalizer, so it is dropped here (the texts are ASCII: it changes nothing).
    "qwen2": ("qwen2/hf/tokenizer.json", True, [
        "<|endoftext|>hello<|endoftext|> world",
        "a <|endoftext|>b",
        "<|endoftext|>",
        "x<|endoftext|",
        "<|endoftext|><|endoftext|>",
    ]),
    "llama3_bpe": ("tokenizer/llama3_bpe.tokenizer.json", False, [
        "<|begin_of_text|>hi<|end_of_text|>",
        "say <|end_of_text|> twice <|end_of_text|>",
        "<|begin_of_text|>",
    ]),
    "llama_gqa_hf": ("tokenizer/llama_gqa.tokenizer.json", False, [
        "<s>hello</s>",
        "a <s> b </s> c",
        "<unk>x",
        "</s>",
    ]),
}


def main():
    out = {"versions": {"tokenizers": tokenizers.__version__},
           "command": "python3 tools/make_special_vectors.py", "tokenizers": []}
    for name, (path, drop_nfc, texts) in CASES.items():
        t = Tokenizer.from_file(str(FIX / path))
        if drop_nfc:
            t.normalizer = normalizers.Sequence([])
        rows = []
        for s in texts:
            t.encode_special_tokens = False
            parse = t.encode(s, add_special_tokens=False).ids
            t.encode_special_tokens = True
            text = t.encode(s, add_special_tokens=False).ids
            rows.append({"text": s, "ids_parse": parse, "ids_text": text})
        out["tokenizers"].append({"name": name, "tokenizer_json": path, "cases": rows})
        print(name, [(r["text"], len(r["ids_parse"]), len(r["ids_text"])) for r in rows])
    (FIX / "tokenizer" / "special.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
