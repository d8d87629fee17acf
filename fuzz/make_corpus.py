#!/usr/bin/env python3
"""Regenerates the committed seed corpora fuzz/corpus/<target>/ from tests/fixtures
(kept small: < 2 MB in all). Run from the repository root:  python3 fuzz/make_corpus.py
The gguf_structured seeds are `arbitrary` encodings of fuzz/src/structured.rs's Plan,
written below (keep them in step with that file's enums). The tiny model GGUFs in
corpus/gguf/ (tiny_*.gguf) are base models of that target, written by running it on
those seeds with LLMRT_FUZZ_DUMP (`--dump` does that after a `cargo fuzz build`), as are the
cache_state seeds (valid saved states of that target's tiny model)."""
import os, shutil, struct, subprocess, sys

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
for m in ["qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "mixtral", "qwen2moe", "qwen3moe"]:
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
for m in ["llama_gqa", "llama_mha_tied", "llama3_rope", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
          "mixtral", "qwen2moe", "qwen3moe"]:
    out("hf_config", f"{m}.config.json", read(f"{F}/{m}/hf/config.json"))
out("hf_config", "mistral.index.json", read(f"{F}/mistral/hf/model.safetensors.index.json"))
# The Hub's older gemma3 spelling (rope_local_base_freq, sliding_window_pattern, rope_scaling)
# and Mistral with a window.
import json
g3 = json.loads(read(f"{F}/gemma3/hf/config.json"))
for k in ["rope_parameters", "layer_types", "_sliding_window_pattern"]:
    g3.pop(k, None)
g3.update(sliding_window_pattern=6, rope_scaling={"rope_type": "linear", "factor": 8.0})
out("hf_config", "gemma3.hub.config.json", (json.dumps(g3, indent=2, sort_keys=True) + "\n").encode())
mw = json.loads(read(f"{F}/mistral/hf/config.json"))
mw["sliding_window"] = 8
out("hf_config", "mistral.window8.config.json", (json.dumps(mw, indent=2, sort_keys=True) + "\n").encode())

# tokenizer_json: the qwen2/qwen3 ones, the llama3 BPE and the Metaspace one.
out("tokenizer_json", "qwen2.tokenizer.json", read(f"{F}/qwen2/hf/tokenizer.json"))
out("tokenizer_json", "qwen3.tokenizer.json", read(f"{F}/qwen3/hf/tokenizer.json"))
out("tokenizer_json", "llama3_bpe.tokenizer.json", read(f"{F}/tokenizer/llama3_bpe.tokenizer.json"))
out("tokenizer_json", "llama_gqa.tokenizer.json", read(f"{F}/tokenizer/llama_gqa.tokenizer.json"))

# sentencepiece_model: every tokenizer.model.
for m in ["llama_gqa", "llama_mha_tied", "llama3_rope", "mistral"]:
    out("sentencepiece_model", f"{m}.tokenizer.model", read(f"{F}/{m}/hf/tokenizer.model"))

# gguf_structured: arbitrary 1.5 encodings of a Plan { arch, tok, wide, types, tied, seed,
# edits }. An enum's variant is a u32 (LE) x with (x * n_variants) >> 32 == index; a bool
# is a byte (odd = true); the edits are a byte "one more" (odd) before each Edit.
def variant(i, n):
    return struct.pack("<I", ((2 * i + 1) << 32) // (2 * n))

ARCH = ["llama", "qwen2", "qwen3"]
TOK = ["spm", "gpt2", "llama3", "qwen2tok", "notok"]
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K",
         "Q5_K", "Q6_K", "IQ4_XS"]  # DType::all()
FILE_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K_S",
              "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_XS"]  # FileType::all()
N_EDITS = 26  # variants of structured::Edit; TensorRetype is the 13th (index 12)
SIZES = ["exact", "short", "long", "keep", "delta"]  # SizeChoice

def plan(arch, tok, wide, types, tied, seed=5, edits=b""):
    kind, arg = types
    if kind == "file":
        t = variant(0, 3) + bytes([FILE_TYPES.index(arg)])
    elif kind == "uniform":
        t = variant(1, 3) + bytes([TYPES.index(arg)])
    else:
        t = variant(2, 3) + bytes(TYPES.index(a) for a in arg)
    return (variant(ARCH.index(arch), 3) + variant(TOK.index(tok), 5) + bytes([wide]) + t
            + bytes([tied, seed]) + edits)

def retype(tensor, ty, size):
    return b"\x01" + variant(12, N_EDITS) + bytes([tensor, TYPES.index(ty)]) + variant(SIZES.index(size), 5)

# Base tensor order (llama, untied): 0 token_embd, 1 output, 2 output_norm, 3 attn_norm,
# 4 q, 5 k, 6 v, 7 attn_output, 8 ffn_norm, 9 gate, 10 up, 11 down.
SEEDS = {
    "small_llama_spm_f32": plan("llama", "spm", 0, ("file", "F32"), 0),
    "small_qwen2_gpt2_f16": plan("qwen2", "gpt2", 0, ("uniform", "F16"), 0),
    "small_qwen3_qwen2tok_q8_0_tied": plan("qwen3", "qwen2tok", 0, ("uniform", "Q8_0"), 1),
    "small_llama_llama3tok_q4_0": plan("llama", "llama3", 0, ("file", "Q4_0"), 0),
    "small_llama_notok_bf16_tied": plan("llama", "notok", 0, ("uniform", "BF16"), 1),
    "small_qwen2_gpt2_iq4_nl": plan("qwen2", "gpt2", 0, ("file", "IQ4_NL"), 0),
    "small_llama_spm_q5_k_m_fallback": plan("llama", "spm", 0, ("file", "Q5_K_M"), 0),
    "small_qwen3_notok_q4_1_q5_0_q5_1": plan("qwen3", "notok", 0, ("mixed", ["Q4_1", "Q5_0", "Q5_1", "Q4_1",
        "Q5_0", "Q5_1", "IQ4_NL", "Q4_0", "Q8_0"]), 0),
    "small_llama_notok_q_to_q4_k_rejected": plan("llama", "notok", 0, ("uniform", "F32"), 0,
                                                 edits=retype(4, "Q4_K", "exact")),
    "wide_llama_spm_q4_k_m": plan("llama", "spm", 1, ("file", "Q4_K_M"), 0),
    "wide_qwen2_gpt2_q3_k_m": plan("qwen2", "gpt2", 1, ("file", "Q3_K_M"), 0),
    "wide_qwen3_notok_q2_k_tied": plan("qwen3", "notok", 1, ("file", "Q2_K"), 1),
    "wide_llama_llama3tok_iq4_xs": plan("llama", "llama3", 1, ("file", "IQ4_XS"), 0),
    "wide_llama_notok_q6_k_tied": plan("llama", "notok", 1, ("uniform", "Q6_K"), 1),
    "wide_qwen3_qwen2tok_mixed": plan("qwen3", "qwen2tok", 1, ("mixed", ["Q5_K", "Q6_K", "Q4_K", "Q3_K", "Q2_K",
        "IQ4_XS", "Q5_1", "IQ4_NL", "Q4_K"]), 0),
    "wide_llama_notok_down_to_iq4_xs": plan("llama", "notok", 1, ("file", "Q5_K_S"), 0,
                                            edits=retype(11, "IQ4_XS", "exact")),
    "wide_llama_notok_down_one_block_short": plan("llama", "notok", 1, ("file", "Q4_K_S"), 0,
                                                  edits=retype(11, "Q6_K", "short")),
}
# chat_template: the smaller real templates of tests/fixtures/chat, and hand-written ones
# that only the renderer's limits stop (loops, recursion, growth) or that fail.
T = f"{F}/chat/templates"
shutil.rmtree(f"{C}/chat_template", ignore_errors=True)
for name in sorted(os.listdir(T)):
    size = os.path.getsize(f"{T}/{name}")
    if name.endswith(".jinja") and (size <= 2600 or name in (
            "Qwen-Qwen3-0.6B.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
            "mistralai-Mistral-Nemo-Instruct-2407.jinja", "google-gemma-2-2b-it.jinja")):
        out("chat_template", name, read(f"{T}/{name}"))
HAND = {
    "long_loop.jinja": "{% for i in range(1000000000) %}{{ i }}{% endfor %}",
    "nested_loops.jinja": "{% for m in messages %}{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}",
    "recursive_macro.jinja": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "string_growth.jinja": "{% set s = namespace(v='ab') %}{% for i in range(64) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v|length }}",
    "string_repeat.jinja": "{{ 'x' * 1000000000 }}",
    "raise.jinja": "{% if messages|length > 2 %}{{ raise_exception('too many: ' ~ messages|length) }}{% endif %}",
    "tojson_strftime.jinja": "{{ messages|tojson }}{{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %j') }}{{ bos_token }}",
    "methods.jinja": "{% for m in messages %}{{ m.role.upper() }}:{{ m.content.strip().split(' ')|join('|') }}{{ m.items()|list|length }}{% endfor %}{% if add_generation_prompt %}<gen>{% endif %}",
    "generation.jinja": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{{ eos_token }}{% endfor %}",
    "loop_controls.jinja": "{% for m in messages %}{% if loop.index > 3 %}{% break %}{% endif %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ loop.previtem.role if loop.previtem else '' }}{{ m.content }}{% endfor %}",
}
for name, text in HAND.items():
    out("chat_template", name, text.encode())

shutil.rmtree(f"{C}/gguf_structured", ignore_errors=True)
for name, data in SEEDS.items():
    out("gguf_structured", name, data)

# --dump: the base models into corpus/gguf/ (tiny_*.gguf), written by the built target.
DUMPS = {"small_llama_spm_f32": "tiny_llama_spm_f32.gguf", "small_qwen2_gpt2_f16": "tiny_qwen2_gpt2_f16.gguf",
         "small_qwen3_qwen2tok_q8_0_tied": "tiny_qwen3_qwen2tok_q8_tied.gguf",
         "small_llama_llama3tok_q4_0": "tiny_llama_llama3tok_q4_0.gguf",
         "small_llama_notok_bf16_tied": "tiny_llama_notok_bf16_tied.gguf",
         "small_qwen3_notok_q4_1_q5_0_q5_1": "tiny_qwen3_notok_q4_1_q5_0_q5_1.gguf",
         "wide_qwen3_notok_q2_k_tied": "tiny_wide_qwen3_notok_q2_k_tied.gguf"}
if "--dump" in sys.argv:
    # cache_state: valid saved states of the target's tiny model, each behind a mode byte.
    shutil.rmtree(f"{C}/cache_state", ignore_errors=True)
    exe = "fuzz/target/x86_64-unknown-linux-gnu/release/cache_state"
    env = dict(os.environ, LLMRT_FUZZ_DUMP=f"{C}/cache_state")
    empty = "fuzz/target/empty-input"
    open(empty, "wb").close()
    subprocess.run([exe, empty], env=env, check=True, capture_output=True)
    exe = "fuzz/target/x86_64-unknown-linux-gnu/release/gguf_structured"
    for f in os.listdir(f"{C}/gguf"):
        if f.startswith("tiny_"):
            os.remove(f"{C}/gguf/{f}")
    for seed, name in DUMPS.items():
        env = dict(os.environ, LLMRT_FUZZ_DUMP=f"{C}/gguf/{name}")
        subprocess.run([exe, f"{C}/gguf_structured/{seed}"], env=env, check=True, capture_output=True)
