#!/usr/bin/env python3
"""Regenerates the committed seed corpora fuzz/corpus/<target>/ from tests/fixtures
(kept small: < 2 MB in all). Run from the repository root:  python3 fuzz/make_corpus.py
The tiny model GGUFs in corpus/gguf/ (tiny_*.gguf) come from the gguf_structured
target's base models (LLMRT_FUZZ_DUMP); this script leaves them alone."""
import os, shutil, struct

F = "tests/fixtures"
C = "fuzz/corpus"

def out(target, name, data):
    os.makedirs(f"{C}/{target}", exist_ok=True)
    with open(f"{C}/{target}/{name}", "wb") as f:
        f.write(data)

def read(p):
    with open(p, "rb") as f:
        return f.read()

def skip_value(b, p, t):
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if t in sizes:
        return p + sizes[t]
    if t == 8:
        (n,) = struct.unpack_from("<Q", b, p)
        return p + 8 + n
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, p)
        p += 12
        for _ in range(n):
            p = skip_value(b, p, et)
        return p
    raise ValueError(t)

def vocab_only(gguf):
    """The header and metadata of a GGUF, with no tensors."""
    b = read(gguf)
    _, _, _, n_kv = struct.unpack_from("<4sIQQ", b, 0)
    p = 24
    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", b, p)
        p += 8 + n
        (t,) = struct.unpack_from("<I", b, p)
        p = skip_value(b, p + 4, t)
    return b[:8] + struct.pack("<Q", 0) + b[16:24] + b[24:p]

# gguf: two whole small models, the tokenizer-only fixture, truncated headers.
out("gguf", "llama_gqa.q8_0.gguf", read(f"{F}/llama_gqa/llama_gqa.q8_0.gguf"))
out("gguf", "llama_mha_tied.f16.gguf", read(f"{F}/llama_mha_tied/llama_mha_tied.f16.gguf"))
out("gguf", "llama3_bpe.gguf", read(f"{F}/tokenizer/llama3_bpe.gguf"))
for m in ["qwen2", "qwen3", "mistral"]:
    out("gguf", f"{m}.f16.head16k.gguf", read(f"{F}/{m}/{m}.f16.gguf")[:16384])

# tokenizer_gguf: vocabularies without tensors.
for m in ["llama_gqa", "qwen2", "qwen3", "mistral"]:
    out("tokenizer_gguf", f"{m}.vocab.gguf", vocab_only(f"{F}/{m}/{m}.f16.gguf"))
out("tokenizer_gguf", "llama3_bpe.gguf", read(f"{F}/tokenizer/llama3_bpe.gguf"))

# safetensors: headers (+ a little data) and one whole small file.
for m in ["llama_gqa", "qwen3", "llama_mha_tied"]:
    b = read(f"{F}/{m}/hf/model.safetensors")
    (n,) = struct.unpack_from("<Q", b, 0)
    out("safetensors", f"{m}.header.safetensors", b[: 8 + n + 64])
out("safetensors", "mistral-00002.safetensors", read(f"{F}/mistral/hf/model-00002-of-00002.safetensors"))

# hf_config: every config.json, and the shard index.
for m in ["llama_gqa", "llama_mha_tied", "llama3_rope", "mistral", "qwen2", "qwen3"]:
    out("hf_config", f"{m}.config.json", read(f"{F}/{m}/hf/config.json"))
out("hf_config", "mistral.index.json", read(f"{F}/mistral/hf/model.safetensors.index.json"))

# tokenizer_json: the qwen2/qwen3 ones, the llama3 BPE and the Metaspace one.
out("tokenizer_json", "qwen2.tokenizer.json", read(f"{F}/qwen2/hf/tokenizer.json"))
out("tokenizer_json", "qwen3.tokenizer.json", read(f"{F}/qwen3/hf/tokenizer.json"))
out("tokenizer_json", "llama3_bpe.tokenizer.json", read(f"{F}/tokenizer/llama3_bpe.tokenizer.json"))
out("tokenizer_json", "llama_gqa.tokenizer.json", read(f"{F}/tokenizer/llama_gqa.tokenizer.json"))

# sentencepiece_model: every tokenizer.model.
for m in ["llama_gqa", "llama_mha_tied", "llama3_rope", "mistral"]:
    out("sentencepiece_model", f"{m}.tokenizer.model", read(f"{F}/{m}/hf/tokenizer.model"))
