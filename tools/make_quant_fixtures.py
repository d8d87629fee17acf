#!/usr/bin/env python3
"""Reference fixtures for llmrt's quantized tensor types (tests/fixtures/quant/), made by tools
nobody here wrote: gguf-py (`gguf.quants`) and llama.cpp (`llama-quantize`, and llama.cpp's
logits through tools/llamacpp_logits.cpp / greedy ids through tools/llamacpp_greedy.cpp), all
from the llama.cpp vendored in the llama-cpp-python 0.3.36 source package.

Usually run through tools/make_quant_fixtures.sh (fetches the sdist, builds llama.cpp outside the
repository, makes a venv with numpy, builds the two small C++ tools, then runs this script).
Directly:

    PYTHONPATH=$LLAMACPP_SRC/gguf-py VENV/bin/python tools/make_quant_fixtures.py \
        --out tests/fixtures/quant --llama-bin BUILD/bin --tools DIR --work /tmp/llmrt-qfix \
        [--parts dequant,models,stories]

Parts:
  dequant  tests/fixtures/quant/dequant/<TYPE>.blocks / <TYPE>.f32 + index.json: raw blocks and
           gguf.quants.dequantize's output for each type. Blocks 0..23 are crafted at the byte
           level (edge cases, random bytes); blocks 24..47 are quantized from seeded data of
           varied shapes/scales, by gguf.quants.quantize where gguf-py can quantize that type
           (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0), else by llama-quantize --pure on a one-tensor GGUF.
  models   a small seeded llama (F32), quantized by llama-quantize to every file type; per file
           a float64 numpy forward pass over the file's own dequantized weights (<file>.ref.f32)
           and llama.cpp's logits (<file>.llamacpp.f32), with their relative L2 error per row.
  stories  stories260K (../shared/models, not committed) quantized to Q8_0/Q6_K/Q4_K_M: llama.cpp's
           64 greedy ids and top-1/top-2 margins per step, and the quantized files' sha256.
Everything is deterministic (fixed seeds; llama.cpp's quantizers and single-threaded logits are
deterministic for a given build).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import struct
import subprocess
from pathlib import Path

import numpy as np

import gguf  # from vendor/llama.cpp/gguf-py (PYTHONPATH)
import gguf.quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

SEED = 20261201

# ----------------------------------------------------------------------------- part 1: dequant

DEQUANT_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
                 "Q8_K"]

# Byte layout of one block: f16 scale fields ("d" and the min/"dmin" where the type has one) and
# the byte ranges of quant values and of packed sub-block scales (ggml-common.h's block structs).
LAYOUT = {
    "Q4_0": dict(d=0, quants=[(2, 18)], scales=[]),
    "Q4_1": dict(d=0, m=2, quants=[(4, 20)], scales=[]),
    "Q5_0": dict(d=0, quants=[(2, 22)], scales=[]),
    "Q5_1": dict(d=0, m=2, quants=[(4, 24)], scales=[]),
    "Q8_0": dict(d=0, quants=[(2, 34)], scales=[]),
    "Q2_K": dict(d=80, m=82, quants=[(16, 80)], scales=[(0, 16)]),
    "Q3_K": dict(d=108, quants=[(0, 96)], scales=[(96, 108)]),
    "Q4_K": dict(d=0, m=2, quants=[(16, 144)], scales=[(4, 16)]),
    "Q5_K": dict(d=0, m=2, quants=[(16, 176)], scales=[(4, 16)]),
    "Q6_K": dict(d=208, quants=[(0, 192)], scales=[(192, 208)]),
    "IQ4_NL": dict(d=0, quants=[(2, 18)], scales=[]),
    "IQ4_XS": dict(d=0, quants=[(8, 136)], scales=[(2, 8)]),
}
GGUFPY_CAN_QUANTIZE = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}

F16_ONE, F16_MINUS_ONE = 0x3C00, 0xBC00

# the 24 crafted blocks (indices 0..23); the value is (d, m) as f16 bits (None: keep random)
# plus how the other bytes are filled.
CRAFTED = [
    ("d_pos_zero", 0x0000, None, "random"),
    ("d_neg_zero", 0x8000, None, "random"),
    ("d_negative", 0xBA00, None, "random"),             # -0.75
    ("d_subnormal_min", 0x0001, None, "random"),        # 2^-24
    ("d_subnormal_max", 0x03FF, None, "random"),        # largest subnormal
    ("d_subnormal_negative", 0x83FF, None, "random"),
    ("d_smallest_normal", 0x0400, None, "random"),
    ("d_large", 0x7BFF, None, "random"),                # 65504
    ("d_large_negative", 0xFBFF, None, "random"),
    ("min_large", F16_ONE, 0x7BFF, "random"),           # types without a min: d = 1, same bytes
    ("min_large_negative", F16_ONE, 0xFBFF, "random"),
    ("min_subnormal", F16_ONE, 0x0001, "random"),
    ("min_zero_d_large", 0x7BFF, 0x0000, "random"),
    ("quants_all_00", F16_ONE, F16_ONE, "quants00"),    # quant bytes 0x00, scale bytes random
    ("quants_all_FF", F16_ONE, F16_ONE, "quantsFF"),    # quant bytes 0xFF, scale bytes random
    ("block_all_00", 0x0000, 0x0000, "all00"),          # every byte 0x00
    ("nonf16_all_FF_d_one", F16_ONE, F16_ONE, "allFF"),  # every byte but the f16 fields 0xFF
    ("nonf16_all_FF_d_minus_one", F16_MINUS_ONE, F16_MINUS_ONE, "allFF"),
    ("random_bytes", None, None, "random"),             # random bytes, f16 fields random finite
    ("random_bytes", None, None, "random"),
    ("random_bytes", None, None, "random"),
    ("random_bytes", None, None, "random"),
    ("random_bytes", None, None, "random"),
    ("random_bytes", None, None, "random"),
]

# the 24 data blocks (indices 24..47), each block_size values
DATA_CASES = ["normal_1", "normal_0.02", "normal_1e-5", "normal_300", "uniform_1", "uniform_1000",
              "student_t_1.5", "normal_with_outlier", "positive_uniform", "positive_lognormal",
              "negative_uniform", "negative_abs_normal", "constant_0.37", "constant_-2.5", "zeros", "one_spike",
              "subblock_scales_varied", "subblock_offsets_varied", "alternating_pm1", "integers_-8..7",
              "normal_half_zeros", "uniform_01_one_negative", "normal_1e-3", "normal_10"]


def data_block(case: str, n: int, rng: np.random.Generator) -> np.ndarray:
    g = lambda s: rng.standard_normal(n) * s
    if case.startswith("normal_") and case[7:].replace(".", "").replace("e-", "").isdigit():
        return g(float(case[7:]))
    if case == "uniform_1":
        return rng.uniform(-1, 1, n)
    if case == "uniform_1000":
        return rng.uniform(-1000, 1000, n)
    if case == "student_t_1.5":
        return np.clip(rng.standard_t(1.5, n), -1000, 1000)
    if case == "normal_with_outlier":
        x = g(1.0)
        x[rng.integers(n)] = 50.0 * (1 if rng.random() < 0.5 else -1)
        return x
    if case == "positive_uniform":
        return rng.uniform(0.5, 2.0, n)
    if case == "positive_lognormal":
        return rng.lognormal(0.0, 1.0, n)
    if case == "negative_uniform":
        return rng.uniform(-2.0, -0.5, n)
    if case == "negative_abs_normal":
        return -np.abs(g(1.0))
    if case == "constant_0.37":
        return np.full(n, 0.37)
    if case == "constant_-2.5":
        return np.full(n, -2.5)
    if case == "zeros":
        return np.zeros(n)
    if case == "one_spike":
        x = np.zeros(n)
        x[rng.integers(n)] = 3.0
        return x
    if case == "subblock_scales_varied":  # each group of 16 values its own std, 1e-3..10
        s = np.repeat(10.0 ** rng.uniform(-3, 1, n // 16), 16)
        return rng.standard_normal(n) * s
    if case == "subblock_offsets_varied":  # each group of 32 values its own mean
        mu = np.repeat(rng.uniform(-2, 2, max(n // 32, 1)), min(32, n))
        return mu + 0.1 * rng.standard_normal(n)
    if case == "alternating_pm1":
        return np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    if case == "integers_-8..7":
        return rng.integers(-8, 8, n).astype(np.float64)
    if case == "normal_half_zeros":
        x = g(1.0)
        x[rng.random(n) < 0.5] = 0.0
        return x
    if case == "uniform_01_one_negative":
        x = rng.uniform(0, 1, n)
        x[rng.integers(n)] = -1.0
        return x
    raise ValueError(case)


def random_finite_f16(rng: np.random.Generator) -> int:
    v = int(rng.integers(0, 1 << 16))
    if (v >> 10) & 0x1F == 0x1F:  # inf/NaN exponent: replace it by a random finite one
        v = (v & 0x83FF) | (int(rng.integers(0, 31)) << 10)
    return v


def crafted_block(ty: str, spec, rng: np.random.Generator) -> bytes:
    _, d, m, fill = spec
    bs, ts = GGML_QUANT_SIZES[T[ty]]
    lay = LAYOUT[ty]
    b = bytearray(rng.integers(0, 256, ts, dtype=np.uint8).tobytes())
    if fill == "all00":
        b = bytearray(ts)
    elif fill == "allFF":
        b = bytearray(b"\xff" * ts)
    elif fill in ("quants00", "quantsFF"):
        for lo, hi in lay["quants"]:
            b[lo:hi] = (b"\x00" if fill == "quants00" else b"\xff") * (hi - lo)
    fields = [("d", d)] + ([("m", m)] if "m" in lay else [])
    for name, bits in fields:
        if bits is None:
            bits = random_finite_f16(rng)
        struct.pack_into("<H", b, lay[name], bits)
    return bytes(b)


NO_MIN_LABELS = {"min_large": "d_one_random_a", "min_large_negative": "d_one_random_b",
                 "min_subnormal": "d_one_random_c", "min_zero_d_large": "d_large_random_b"}

CASE_NOTES = {
    "d_pos_zero": "d = +0.0 (0x0000), other bytes random",
    "d_neg_zero": "d = -0.0 (0x8000), other bytes random",
    "d_negative": "d = -0.75 (0xBA00), other bytes random",
    "d_subnormal_min": "d = 0x0001 (2^-24, smallest f16 subnormal), other bytes random",
    "d_subnormal_max": "d = 0x03FF (largest f16 subnormal), other bytes random",
    "d_subnormal_negative": "d = 0x83FF (negative subnormal), other bytes random",
    "d_smallest_normal": "d = 0x0400 (2^-14), other bytes random",
    "d_large": "d = 0x7BFF (65504, largest finite f16), other bytes random",
    "d_large_negative": "d = 0xFBFF (-65504), other bytes random",
    "min_large": "d = 1.0, min/dmin = 0x7BFF (65504), other bytes random",
    "min_large_negative": "d = 1.0, min/dmin = 0xFBFF (-65504), other bytes random",
    "min_subnormal": "d = 1.0, min/dmin = 0x0001 (subnormal), other bytes random",
    "min_zero_d_large": "d = 0x7BFF, min/dmin = +0.0, other bytes random",
    "d_one_random_a": "d = 1.0, other bytes random (type without a min field)",
    "d_one_random_b": "d = 1.0, other bytes random (type without a min field)",
    "d_one_random_c": "d = 1.0, other bytes random (type without a min field)",
    "d_large_random_b": "d = 0x7BFF, other bytes random (type without a min field)",
    "quants_all_00": "d (and min) = 1.0, every quant byte 0x00, sub-block scale bytes random",
    "quants_all_FF": "d (and min) = 1.0, every quant byte 0xFF, sub-block scale bytes random",
    "block_all_00": "every byte 0x00 (d = min = +0.0)",
    "nonf16_all_FF_d_one": "d (and min) = 1.0, every other byte 0xFF (largest scales and quants)",
    "nonf16_all_FF_d_minus_one": "d (and min) = -1.0, every other byte 0xFF",
    "random_bytes": "random bytes; each f16 field random but finite (an inf/NaN exponent is replaced by a random "
                    "finite one): no inf/NaN anywhere in these vectors",
}


def crafted_label(ty: str, name: str) -> str:
    return name if "m" in LAYOUT[ty] else NO_MIN_LABELS.get(name, name)


def compact_json(obj, indent=1, level=0) -> str:
    """json with lists of scalars (and lists of short lists) on one line."""
    pad, pad1 = " " * (indent * level), " " * (indent * (level + 1))
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad1}{json.dumps(k)}: {compact_json(v, indent, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, dict) for v in obj):
        return "[\n" + ",\n".join(pad1 + compact_json(v, indent, level + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)


def f16_fields_finite(ty: str, blocks: np.ndarray) -> bool:
    lay = LAYOUT[ty]
    for k in ("d", "m"):
        if k in lay:
            v = blocks[:, lay[k]:lay[k] + 2].copy().view(np.uint16).reshape(-1)
            if np.any((v >> 10) & 0x1F == 0x1F):
                return False
    return True


def write_probe_gguf(path: Path, data: np.ndarray):
    """A one-tensor GGUF with llama hparams, for llama-quantize --pure (it loads hparams, not tensors)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(256)
    w.add_block_count(1)
    w.add_feed_forward_length(768)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(0)
    w.add_tensor("blk.0.ffn_up.weight", data.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_tensor_bytes(path: Path, name: str):
    r = gguf.GGUFReader(str(path))
    for t in r.tensors:
        if t.name == name:
            return t.tensor_type, np.asarray(t.data).view(np.uint8).reshape(-1)
    raise KeyError(name)


def llama_quantize(qbin: Path, src: Path, dst: Path, ftype: str, extra=(), log=None) -> subprocess.CompletedProcess:
    cmd = [str(qbin), *extra, str(src), str(dst), ftype, "1"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if log is not None:
        log.write(" ".join(cmd) + f"\n[rc {p.returncode}]\n" + p.stdout[-4000:] + p.stderr[-4000:] + "\n")
    return p


def make_dequant(out: Path, work: Path, qbin: Path | None) -> dict:
    d_out = out / "dequant"
    d_out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    index = {"generator": "tools/make_quant_fixtures.py --parts dequant", "seed": SEED,
             "f32": "gguf.quants.dequantize output, little-endian f32, n_blocks * block_size values",
             "blocks": "raw block bytes, n_blocks * type_size", "types": {}, "not_generated": {}}
    qlog = open(work / "dequant-llama-quantize.log", "w")
    for ti, ty in enumerate(DEQUANT_TYPES):
        qt = T[ty]
        bs, ts = GGML_QUANT_SIZES[qt]
        if ty not in LAYOUT or qt not in gguf.quants._type_traits:
            index["not_generated"][ty] = (f"gguf.quants (gguf-py {gguf_version()}) has no dequantize for {ty}; "
                                          "no vectors written")
            print(f"[dequant] {ty}: skipped (gguf.quants cannot dequantize it)", flush=True)
            continue
        rng = np.random.default_rng(SEED + 17 * ti)
        labels, sources = [], []
        crafted = [crafted_block(ty, spec, rng) for spec in CRAFTED]
        labels += [crafted_label(ty, spec[0]) for spec in CRAFTED]
        sources += ["crafted"] * len(CRAFTED)
        data = np.stack([data_block(c, bs, rng) for c in DATA_CASES]).astype(np.float32)
        if ty in GGUFPY_CAN_QUANTIZE:
            qb = gguf.quants.quantize(data, qt).reshape(len(DATA_CASES), ts)
            src = "gguf.quants.quantize"
        else:
            if qbin is None:
                raise SystemExit(f"{ty}: gguf-py cannot quantize it; --llama-bin (llama-quantize) is needed")
            probe, qfile = work / f"probe-{ty}.f32.gguf", work / f"probe-{ty}.gguf"
            write_probe_gguf(probe, data)
            p = llama_quantize(qbin, probe, qfile, ty, extra=["--pure"], log=qlog)
            if p.returncode != 0:
                raise SystemExit(f"llama-quantize {ty} failed:\n{p.stderr[-2000:]}")
            got, raw = read_tensor_bytes(qfile, "blk.0.ffn_up.weight")
            assert got == qt, (ty, got)
            qb = raw.reshape(len(DATA_CASES), ts)
            src = "llama-quantize --pure (ggml's reference quantizer, no imatrix)"
        labels += DATA_CASES
        sources += [src] * len(DATA_CASES)
        blocks = np.concatenate([np.frombuffer(b"".join(crafted), np.uint8).reshape(-1, ts), qb], axis=0)
        assert f16_fields_finite(ty, blocks), ty
        deq = gguf.quants.dequantize(blocks.reshape(-1), qt).astype(np.float32).reshape(-1)
        assert deq.size == blocks.shape[0] * bs
        assert np.all(np.isfinite(deq)), ty
        (d_out / f"{ty}.blocks").write_bytes(blocks.tobytes())
        (d_out / f"{ty}.f32").write_bytes(deq.astype("<f4").tobytes())
        edge = {}
        for i, l in enumerate(labels):
            edge.setdefault(l, []).append(i)
        index["types"][ty] = {
            "ggml_type": int(qt), "block_size": bs, "type_size": ts, "n_blocks": int(blocks.shape[0]),
            "f16_fields": {k: LAYOUT[ty][k] for k in ("d", "m") if k in LAYOUT[ty]},
            "quant_byte_ranges": LAYOUT[ty]["quants"], "scale_byte_ranges": LAYOUT[ty]["scales"],
            "block_labels": labels, "block_sources": sources, "cases": edge,
            "crafted_blocks": [0, len(CRAFTED) - 1], "data_blocks": [len(CRAFTED), int(blocks.shape[0]) - 1],
            "data_source": src,
        }
        print(f"[dequant] {ty}: {blocks.shape[0]} blocks ({src})", flush=True)
    qlog.close()
    index["case_notes"] = CASE_NOTES
    index["data_case_notes"] = ("blocks 24..47: block_size values per case, numpy default_rng(seed + 17 * i) with i "
                                "the type's position in " + " ".join(DEQUANT_TYPES) + " (after the crafted blocks' "
                                "draws); normal_S: N(0, S^2); see data_block() in the generator")
    (d_out / "index.json").write_text(compact_json(index) + "\n")
    return index


def gguf_version() -> str:
    try:
        import tomllib
        pp = Path(gguf.__file__).resolve().parent.parent / "pyproject.toml"
        return tomllib.loads(pp.read_text())["project"]["version"]
    except Exception:
        return "unknown"


# ----------------------------------------------------------------------------- part 2: models

FILE_TYPES = ["F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
              "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS"]
SPEC = dict(vocab=512, hidden=256, n_head=4, head_dim=64, n_kv=2, ffn=768, n_layer=2, ctx=256, eps=1e-5, theta=10000.0)
MODEL_SEED = SEED + 1000
PROMPT_SEED = SEED + 7
N_PROMPT = 24
LLAMACPP_BUILD_NOTE = ("llama.cpp vendored in llama-cpp-python 0.3.36, CPU, cmake Release GGML_NATIVE=ON with AMX off "
                       "(-mno-amx-tile -mno-amx-int8 -mno-amx-bf16: ggml's AMX mul_mat dies with SIGILL here), "
                       "static, 1 thread")


def vocab_tokens(n: int):
    """SentencePiece-style vocab: <unk> <s> </s>, the 256 byte tokens, then plain pieces."""
    toks, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [2, 3, 3]
    for b in range(256):
        toks.append(f"<0x{b:02X}>"); scores.append(0.0); types.append(6)
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = ["\u2581"] + ["\u2581" + c for c in letters] + list(letters)
    pieces += ["\u2581" + a + b for a in letters for b in letters]
    i = 0
    while len(toks) < n:
        toks.append(pieces[i]); scores.append(-float(i)); types.append(1); i += 1
    return toks, scores, types


def write_small_llama(path: Path) -> dict:
    s = SPEC
    rng = np.random.default_rng(MODEL_SEED)
    H, hd, nh, nkv, F, V = s["hidden"], s["head_dim"], s["n_head"], s["n_kv"], s["ffn"], s["vocab"]
    lin = lambda out, inp: (rng.standard_normal((out, inp)) / math.sqrt(inp)).astype(np.float32)
    norm = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("llmrt-quant-fixture-llama")
    w.add_context_length(s["ctx"])
    w.add_embedding_length(H)
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(F)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_rope_freq_base(s["theta"])
    w.add_vocab_size(V)
    w.add_file_type(0)
    toks, scores, types = vocab_tokens(V)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_tensor("token_embd.weight", (0.5 * rng.standard_normal((V, H))).astype(np.float32))
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(H))
        w.add_tensor(p + "attn_q.weight", lin(nh * hd, H))
        w.add_tensor(p + "attn_k.weight", lin(nkv * hd, H))
        w.add_tensor(p + "attn_v.weight", lin(nkv * hd, H))
        w.add_tensor(p + "attn_output.weight", lin(H, nh * hd))
        w.add_tensor(p + "ffn_norm.weight", norm(H))
        w.add_tensor(p + "ffn_gate.weight", lin(F, H))
        w.add_tensor(p + "ffn_up.weight", lin(F, H))
        w.add_tensor(p + "ffn_down.weight", lin(H, F))
    w.add_tensor("output_norm.weight", norm(H))
    w.add_tensor("output.weight", lin(V, H))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return s


def gguf_fields(reader) -> dict:
    out = {}
    for k, f in reader.fields.items():
        try:
            out[k] = f.contents()
        except Exception:
            out[k] = None
    return out


def load_gguf_f64(path: Path):
    """Every tensor dequantized by gguf.quants.dequantize, as float64 in row-major [..., ne0] order."""
    r = gguf.GGUFReader(str(path))
    ts, types = {}, {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape))
        if t.tensor_type == T.F32:
            a = np.asarray(t.data).astype(np.float64)
        else:
            a = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64)
        ts[t.name] = a.reshape(shape)
        types[t.name] = t.tensor_type.name
    return gguf_fields(r), ts, types


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def np_forward(fields, ts, tokens):
    """Plain float64 forward pass of arch llama over GGUF tensors: RMSNorm, adjacent-pair RoPE
    (llama.cpp's rope mode 0 for llama), causal GQA attention, SwiGLU; logits of every row."""
    g = lambda k: fields[f"llama.{k}"]
    n_embd, n_layer = int(g("embedding_length")), int(g("block_count"))
    n_head, n_kv = int(g("attention.head_count")), int(g("attention.head_count_kv"))
    eps, theta = float(g("attention.layer_norm_rms_epsilon")), float(g("rope.freq_base"))
    hd = int(fields.get("llama.attention.key_length", n_embd // n_head))
    Tn = len(tokens)
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(Tn, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):
        a, b = x[..., 0::2], x[..., 1::2]
        o = np.empty_like(x)
        o[..., 0::2] = a * cos - b * sin
        o[..., 1::2] = a * sin + b * cos
        return o

    x = ts["token_embd.weight"][tokens]
    mask = np.triu(np.full((Tn, Tn), -np.inf), 1)
    for i in range(n_layer):
        p = f"blk.{i}."
        h = rmsnorm(x, ts[p + "attn_norm.weight"], eps)
        q = (h @ ts[p + "attn_q.weight"].T).reshape(Tn, n_head, hd)
        k = (h @ ts[p + "attn_k.weight"].T).reshape(Tn, n_kv, hd)
        v = (h @ ts[p + "attn_v.weight"].T).reshape(Tn, n_kv, hd)
        q, k = rope(q), rope(k)
        grp = n_head // n_kv
        o = np.empty((Tn, n_head, hd))
        for hh in range(n_head):
            sc = q[:, hh, :] @ k[:, hh // grp, :].T / math.sqrt(hd) + mask
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            o[:, hh, :] = sc @ v[:, hh // grp, :]
        x = x + o.reshape(Tn, n_head * hd) @ ts[p + "attn_output.weight"].T
        h = rmsnorm(x, ts[p + "ffn_norm.weight"], eps)
        gt = h @ ts[p + "ffn_gate.weight"].T
        up = h @ ts[p + "ffn_up.weight"].T
        x = x + (gt / (1 + np.exp(-gt)) * up) @ ts[p + "ffn_down.weight"].T
    x = rmsnorm(x, ts["output_norm.weight"], eps)
    return x @ ts.get("output.weight", ts["token_embd.weight"]).T


def rel_l2_rows(a: np.ndarray, ref: np.ndarray) -> list[float]:
    return [float(np.linalg.norm(a[i] - ref[i]) / np.linalg.norm(ref[i])) for i in range(ref.shape[0])]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run_logits_tool(tool: Path, model: Path, out: Path, tokens) -> np.ndarray:
    cmd = [str(tool), str(model), str(out), "1", *map(str, tokens)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return np.fromfile(out, "<f4").reshape(len(tokens), -1)


def run_greedy_tool(tool: Path, model: Path, kv: str, n_steps: int, logits_out, tokens) -> dict:
    cmd = [str(tool), str(model), "1", kv, str(n_steps), str(logits_out) if logits_out else "-", *map(str, tokens)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)


def type_histogram(types: dict) -> dict:
    h = {}
    for t in types.values():
        h[t] = h.get(t, 0) + 1
    return dict(sorted(h.items()))


def make_models(out: Path, work: Path, qbin: Path | None, tools: Path | None, commit_f32: bool = False) -> dict:
    if qbin is None or tools is None:
        raise SystemExit("part models needs --llama-bin and --tools")
    mdir = out / "models"
    mdir.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    # the F32 source (7.4 MB) stays in the work folder unless --commit-f32: it is regenerated bit for
    # bit by write_small_llama() (numpy + gguf-py only); its sha256 is in index.json.
    src = (mdir if commit_f32 else work) / "llama-q.F32.gguf"
    spec = write_small_llama(src)
    prompt = [1] + [int(t) for t in np.random.default_rng(PROMPT_SEED).integers(3, SPEC["vocab"], N_PROMPT - 1)]
    qlog = open(work / "models-llama-quantize.log", "w")
    files = {"F32": src}
    refused = {}
    for ft in FILE_TYPES:
        dst = mdir / f"llama-q.{ft}.gguf"
        p = llama_quantize(qbin, src, dst, ft, log=qlog)
        if p.returncode != 0 or not dst.exists():
            refused[ft] = (p.stderr or p.stdout)[-1500:]
            print(f"[models] llama-quantize refused {ft} (rc {p.returncode})", flush=True)
            if dst.exists():
                dst.unlink()
            continue
        files[ft] = dst
    qlog.close()
    index = {"generator": "tools/make_quant_fixtures.py --parts models", "model_seed": MODEL_SEED,
             "prompt_seed": PROMPT_SEED, "spec": spec, "prompt": prompt,
             "ref": ("<file>.ref.f32: float64 numpy forward pass over the file's own weights dequantized by "
                     "gguf.quants.dequantize (adjacent-pair RoPE, causal GQA attention, SwiGLU), logits of every "
                     "row, computed in float64 and stored as little-endian f32, [n_prompt, n_vocab]"),
             "llamacpp": ("<file>.llamacpp.f32: llama.cpp's logits for every row (tools/llamacpp_logits.cpp, 1 "
                          "thread, llama.cpp's default context: f16 KV cache, flash attention auto), little-endian "
                          "f32 [n_prompt, n_vocab]; rel_l2 = ||llamacpp - ref|| / ||ref|| per row"),
             "llamacpp_f32kv": ("llama.cpp with an f32 KV cache and flash attention off "
                                "(tools/llamacpp_greedy.cpp), rel L2 per row against ref; not stored"),
             "llamacpp_build": LLAMACPP_BUILD_NOTE,
             "refused_by_llama_quantize": refused, "files": {}}
    logits_tool, greedy_tool = tools / "llamacpp_logits", tools / "llamacpp_greedy"
    for ft, path in files.items():
        fields, ts, types = load_gguf_f64(path)
        ref = np_forward(fields, ts, prompt)
        ref.astype("<f4").tofile(mdir / f"{path.name}.ref.f32")
        lc = run_logits_tool(logits_tool, path, mdir / f"{path.name}.llamacpp.f32", prompt)
        errs = rel_l2_rows(lc.astype(np.float64), ref)
        run_greedy_tool(greedy_tool, path, "f32", 1, work / f"{path.name}.f32kv.f32", prompt)
        lc32 = np.fromfile(work / f"{path.name}.f32kv.f32", "<f4").reshape(len(prompt), -1)
        errs32 = rel_l2_rows(lc32.astype(np.float64), ref)
        index["files"][ft] = {
            "file": path.name, "committed": path.parent == mdir, "bytes": path.stat().st_size, "sha256": sha256(path),
            "ref": f"{path.name}.ref.f32", "llamacpp": f"{path.name}.llamacpp.f32",
            "tensor_types": types, "type_counts": type_histogram(types),
            "llamacpp_rel_l2": errs, "llamacpp_rel_l2_max": max(errs),
            "llamacpp_f32kv_rel_l2_max": max(errs32),
            "ref_argmax": [int(v) for v in ref.argmax(-1)],
            "llamacpp_argmax_agree": int(np.sum(ref.argmax(-1) == lc.argmax(-1))),
        }
        print(f"[models] {ft:7s} {type_histogram(types)} llama.cpp rel L2 max {max(errs):.3e} "
              f"(f32 kv {max(errs32):.3e})", flush=True)
        if ft == "F32" and max(errs32) > 1e-4:
            raise SystemExit(f"F32: llama.cpp (f32 KV) differs from the numpy pass by {max(errs32):.3e} > 1e-4: "
                             "the reference pass is wrong")
    (mdir / "index.json").write_text(compact_json(index) + "\n")
    return index


# ----------------------------------------------------------------------------- part 3: stories260K

STORIES_TYPES = ["Q8_0", "Q6_K", "Q4_K_M"]
STORIES_PROMPT = [1]
STORIES_STEPS = 64


def make_stories(out: Path, work: Path, qbin: Path | None, tools: Path | None, sdir: Path) -> dict:
    if qbin is None or tools is None:
        raise SystemExit("part stories needs --llama-bin and --tools")
    src = sdir / "stories260K.gguf"
    if not src.exists():
        print(f"[stories] {src} not found: skipped", flush=True)
        return {}
    wdir = work / "stories"
    wdir.mkdir(parents=True, exist_ok=True)
    res = {"generator": "tools/make_quant_fixtures.py --parts stories", "source": "../shared/models/stories260K/"
           "stories260K.gguf (not committed)", "source_sha256": sha256(src), "prompt": STORIES_PROMPT,
           "n_steps": STORIES_STEPS, "llamacpp_build": LLAMACPP_BUILD_NOTE,
           "greedy": ("llama.cpp's greedy ids (tools/llamacpp_greedy.cpp, 1 thread), from the prompt, never stopping "
                      "at EOS; margin = top1 - top2 logit at each step. kv 'f32': f32 KV cache, flash attention "
                      "off; kv 'default': llama.cpp's defaults (f16 KV cache, flash attention auto)"),
           "files": {}}
    qlog = open(work / "stories-llama-quantize.log", "w")
    for ft in ["F32"] + STORIES_TYPES:
        if ft == "F32":
            path = src
        else:
            path = wdir / f"stories260K.{ft}.gguf"
            p = llama_quantize(qbin, src, path, ft, log=qlog)
            if p.returncode != 0:
                res["files"][ft] = {"refused": (p.stderr or p.stdout)[-1500:]}
                continue
        r = gguf.GGUFReader(str(path))
        types = {t.name: t.tensor_type.name for t in r.tensors}
        entry = {"file": path.name, "bytes": path.stat().st_size, "sha256": sha256(path),
                 "type_counts": type_histogram(types), "tensor_types": types,
                 "k_or_iq_tensors": sum(1 for v in types.values() if v.endswith("_K") or v.startswith("IQ"))}
        for kv in ("f32", "default"):
            g = run_greedy_tool(tools / "llamacpp_greedy", path, kv, STORIES_STEPS, None, STORIES_PROMPT)
            st = g["steps"]
            entry[f"greedy_{kv}"] = {"ids": [s["id"] for s in st], "second_ids": [s["second_id"] for s in st],
                                     "margins": [s["margin"] for s in st],
                                     "min_margin": min(s["margin"] for s in st),
                                     "min_margin_step": int(np.argmin([s["margin"] for s in st]))}
        res["files"][ft] = entry
        print(f"[stories] {ft}: {type_histogram(types)} min margin (f32 kv) {entry['greedy_f32']['min_margin']:.4f}",
              flush=True)
    qlog.close()
    exp = sdir / "expected.json"
    if exp.exists():
        want = json.loads(exp.read_text())["greedy_ids"]
        for ft, e in res["files"].items():
            if "greedy_f32" in e:
                got = e["greedy_f32"]["ids"]
                e["matches_run_c_f32_expected"] = sum(int(a == b) for a, b in zip(got, want))
    res["note"] = ("stories260K has dim 64 and ffn 172: no row length is a multiple of 256, so llama-quantize "
                   "falls back (K-quant -> Q8_0/Q5_0, rows of 172 -> F16) and these files hold no K-quant tensor; "
                   "the quantized files are derived from ../shared data and are not committed (sha256 above)")
    (out / "stories260K.json").write_text(compact_json(res) + "\n")
    return res


# ----------------------------------------------------------------------------- README

README_HEAD = """# tests/fixtures/quant — reference data for llmrt's quantized tensor types (issue 13)

Made by tools nobody here wrote — gguf-py {gguf_version} (`gguf.quants`) and llama.cpp
(`llama-quantize`, and its logits / greedy ids through the two small programs
tools/llamacpp_logits.cpp and tools/llamacpp_greedy.cpp written against llama.h) — both from the
llama.cpp vendored in the llama-cpp-python 0.3.36 source package; numpy {numpy_version}, Python
{python_version}. Generated {date} by:

    tools/make_quant_fixtures.sh            # = dequant,models,stories; WORK=/tmp/llmrt-qfix by default

which fetches the sdist (`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`)
into WORK, builds llama.cpp there (cmake Release, GGML_NATIVE=ON, static, **AMX off**:
`-mno-amx-tile -mno-amx-int8 -mno-amx-bf16` — on this machine the CPU reports AMX but ggml's AMX
mul_mat dies with SIGILL on `tilezero` for a Q4_0 prompt batch), builds the two tools with the g++
line of scripts/bench-vs-llamacpp.sh --logits, makes a venv with numpy, and runs
`tools/make_quant_fixtures.py --out tests/fixtures/quant --work WORK --llama-bin BUILD/bin
--tools WORK/tools --parts dequant,models,stories` with `PYTHONPATH=<sdist>/vendor/llama.cpp/gguf-py`.
Everything is deterministic: two runs gave byte-identical files (fixed numpy seeds; llama.cpp's
quantizers, and its logits at 1 thread).
Nothing of llama.cpp and nothing from ../shared is committed here.
"""


def write_readme(out: Path):
    import datetime
    import platform
    L = [README_HEAD.format(gguf_version=gguf_version(), numpy_version=np.__version__,
                            python_version=platform.python_version(), date=datetime.date.today().isoformat())]
    A = L.append
    dq = out / "dequant" / "index.json"
    if dq.exists():
        ix = json.loads(dq.read_text())
        A("## dequant/ — dequantization vectors\n")
        A("Per type: `<TYPE>.blocks` (raw blocks, n_blocks * type_size bytes) and `<TYPE>.f32` "
          "(`gguf.quants.dequantize` of those bytes, little-endian f32, n_blocks * block_size values); "
          "`index.json` gives per type the ggml type id, block_size, type_size, n_blocks, the byte offsets of "
          "the f16 `d` / min fields, the quant and sub-block-scale byte ranges, a label per block "
          "(`block_labels`), label -> indices (`cases`), what made each block (`block_sources`), and "
          "`case_notes` explaining each label.\n")
        A("| type | ggml id | block_size | type_size | n_blocks | blocks 24..47 made by |")
        A("| --- | ---: | ---: | ---: | ---: | --- |")
        for t, e in ix["types"].items():
            A(f"| {t} | {e['ggml_type']} | {e['block_size']} | {e['type_size']} | {e['n_blocks']} | {e['data_source']} |")
        A("")
        A("Blocks 0..23 are crafted at the byte level: d = +0 / -0 / -0.75 / subnormal (0x0001, 0x03FF, 0x83FF) "
          "/ smallest normal / ±65504 (0x7BFF, 0xFBFF); for the types with a min (Q4_1 Q5_1 Q2_K Q4_K Q5_K) "
          "min/dmin = ±65504, subnormal, zero (the same slots hold d = 1 or 65504 blocks in the others); "
          "quant bytes all 0x00 / all 0xFF; every byte 0x00; every non-f16 byte 0xFF with d = ±1; 6 blocks of "
          "random bytes. No f16 field anywhere is inf or NaN (random ones are redrawn into finite values), and "
          "every f32 output is finite. Blocks 24..47 are quantized from seeded data of varied shape and scale "
          "(normal at 1e-5..300, uniform, Student-t 1.5, an outlier, all-positive, all-negative, constants, "
          "zeros, one spike, per-sub-block scales and offsets, ...): by `gguf.quants.quantize` where gguf-py "
          "can quantize the type, else by `llama-quantize --pure` (ggml's reference quantizers, no imatrix) on "
          "a one-tensor GGUF (`blk.0.ffn_up.weight`, one block per row). Some data blocks (normal_1e-5 for "
          "Q5_K, Q6_K, IQ4_XS) get a zero or subnormal super-block scale: that is what llama.cpp writes there.\n")
        for t, why in ix.get("not_generated", {}).items():
            A(f"**{t}: not generated** — {why}. (ggml uses Q8_K only as the activation type of the K-quant "
              "dot products; no file stores it.)\n")
        A("The `.f32` values are gguf-py's float32 numpy arithmetic bit for bit, -0.0 included where its "
          "products give it; e.g. Q4_K/Q5_K compute `(d * sc) * q - (dmin * m)` with each product rounded "
          "to f32, Q2_K `(d * sc) * q - (dmin * m)` per 16 values, Q6_K `(d * sc) * q`. Compare with == on "
          "values (or bits, allowing ±0).\n")
    md = out / "models" / "index.json"
    if md.exists():
        ix = json.loads(md.read_text())
        sp = ix["spec"]
        A("## models/ — a small llama quantized by llama-quantize, with logits references\n")
        A(f"`llama-q.F32.gguf` (not committed, {ix['files']['F32']['bytes']} bytes, sha256 "
          f"`{ix['files']['F32']['sha256']}`; `write_small_llama()` rewrites it bit for bit with numpy + gguf-py "
          f"only, `--commit-f32` writes it here) is written with gguf-py's GGUFWriter: arch llama, hidden "
          f"{sp['hidden']}, {sp['n_head']} heads x head_dim {sp['head_dim']}, {sp['n_kv']} kv heads, ffn {sp['ffn']}, "
          f"{sp['n_layer']} layers, vocab {sp['vocab']} (SentencePiece-style `tokenizer.ggml.model` llama: <unk> <s> "
          f"</s>, 256 byte tokens, plain pieces), rms eps {sp['eps']}, rope theta {sp['theta']}, context "
          f"{sp['ctx']}; seeded weights (numpy default_rng({ix['model_seed']})): embeddings N(0, 0.5^2), every "
          "matrix N(0, 1/in), every RMSNorm weight 1 + 0.1 N(0, 1), untied output. Each `llama-q.<FT>.gguf` is "
          "`llama-quantize llama-q.F32.gguf llama-q.<FT>.gguf <FT> 1` (types asked for by name).\n")
        A(f"Prompt (24 ids, `index.json` `prompt`): {ix['prompt']}.\n")
        A("Per file: `<file>.ref.f32` = a float64 numpy forward pass over the file's own tensors dequantized by "
          "`gguf.quants.dequantize` (RMSNorm, adjacent-pair RoPE as llama.cpp's llama arch, causal GQA "
          "attention, SwiGLU), logits of every row, **computed in float64, stored as little-endian f32** "
          "[24, 512]; `<file>.llamacpp.f32` = llama.cpp's logits of every row (tools/llamacpp_logits.cpp, 1 "
          "thread, llama.cpp's default context: f16 KV cache, flash attention auto), f32 [24, 512]. "
          "`index.json` per file: tensor types (per tensor and counted), sha256, llama.cpp's relative L2 "
          "error per row against the reference (`llamacpp_rel_l2`, ||llama.cpp - ref|| / ||ref||) and its max, "
          "the same max with an f32 KV cache and flash attention off (`llamacpp_f32kv_rel_l2_max`, not "
          "stored), the reference's argmax per row and on how many rows llama.cpp's argmax agrees.\n")
        A("Sanity check of the reference pass: on F32, llama.cpp with an f32 KV cache lands "
          f"{ix['files']['F32']['llamacpp_f32kv_rel_l2_max']:.1e} from it (the generator stops if > 1e-4); "
          "with its default f16 KV cache "
          f"{ix['files']['F32']['llamacpp_rel_l2_max']:.1e}.\n")
        refused = ix.get("refused_by_llama_quantize", {})
        A("llama-quantize refused: " + (", ".join(refused) if refused else "nothing (no type asked for an imatrix)")
          + ".\n")
        A("| file type | tensor types (count) | bytes | llama.cpp max rel L2 per row | same, f32 KV cache | argmax agree (of 24) |")
        A("| --- | --- | ---: | ---: | ---: | ---: |")
        for ft, e in ix["files"].items():
            tc = ", ".join(f"{k} {v}" for k, v in e["type_counts"].items())
            A(f"| {ft}{'' if e['committed'] else ' (not committed)'} | {tc} | {e['bytes']} | "
              f"{e['llamacpp_rel_l2_max']:.3e} | {e['llamacpp_f32kv_rel_l2_max']:.3e} | {e['llamacpp_argmax_agree']} |")
        A("")
        A("In every file the 5 F32 tensors are the RMSNorm weights. Issue 13's bound: llmrt's logits "
          "(prefill_all, every row) within 1.5x llama.cpp's `llamacpp_rel_l2` of `<file>.ref.f32`.\n")
    st = out / "stories260K.json"
    if st.exists():
        r = json.loads(st.read_text())
        A("## stories260K.json — llama.cpp's greedy ids on stories260K quantized\n")
        A("`../shared/models/stories260K/stories260K.gguf` (F32, sha256 in the file) quantized by "
          "`llama-quantize <src> <dst> <FT> 1` to " + ", ".join(STORIES_TYPES) + " in the work folder (not "
          "committed: derived from ../shared data; their sha256 are recorded). Per file and per KV setting "
          "(`greedy_f32`: f32 KV cache, flash attention off; `greedy_default`: llama.cpp's defaults) the 64 "
          "greedy ids from BOS (tools/llamacpp_greedy.cpp, 1 thread, never stopping at EOS), the runner-up id "
          "and the top-1/top-2 margin at each step. " + r.get("note", "") + ".\n")
        A("| file | tensor types | K/IQ tensors | matches run.c's F32 ids (of 64) | min margin (f32 KV) at step | f32-KV ids = default-KV ids (of 64) |")
        A("| --- | --- | ---: | ---: | --- | ---: |")
        for ft, e in r["files"].items():
            if "refused" in e:
                A(f"| {ft} | refused by llama-quantize | | | | |")
                continue
            a, b = e["greedy_f32"], e["greedy_default"]
            tc = ", ".join(f"{k} {v}" for k, v in e["type_counts"].items())
            same = sum(int(x == y) for x, y in zip(a["ids"], b["ids"]))
            A(f"| {ft} | {tc} | {e['k_or_iq_tensors']} | {e.get('matches_run_c_f32_expected', '')} | "
              f"{a['min_margin']:.4f} at {a['min_margin_step']} | {same} |")
        A("")
        A("Greedy ids on the quantized files are fragile (measured 2026-12-01): llama.cpp's two settings part ways at step 4 (Q8_0, "
          "Q6_K) and 5 (Q4_K_M) although the f32-KV margins there are 0.47 and 0.10. llama.cpp rounds the "
          "activations to 8 bits in front of every Q8_0/Q5_0 matmul, so a 1e-3 perturbation (f16 KV cache, "
          "flash attention) re-rolls that rounding: at step 0 (one token) its two settings differ by 2.1e-2 "
          "relative L2 (0.22 max abs) on the Q8_0 file, 8.9e-4 on F32. Compare llmrt to `greedy_f32` (an f32 "
          "KV cache) and report the first divergence's margin, as issue 13 asks.\n")
    A("This README is written by the generator (`write_readme()`), from the three index files.\n")
    (out / "README.md").write_text("\n".join(L))


# ----------------------------------------------------------------------------- main

def make_types(out: Path):
    """gguf-py's table of every ggml type: name, id, (block size, type size)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    types = {t.name: {"ggml_type": int(t.value), "block_size": bs, "type_size": ts}
             for t, (bs, ts) in sorted(GGML_QUANT_SIZES.items(), key=lambda kv: int(kv[0].value))}
    doc = {"generator": "tools/make_quant_fixtures.py --parts types",
           "source": "gguf.constants.GGML_QUANT_SIZES (gguf-py " + gguf_version() + ")", "types": types}
    (out / "ggml_types.json").write_text(json.dumps(doc, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/quant"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/llmrt-qfix"))
    ap.add_argument("--llama-bin", type=Path, default=None, help="llama.cpp build's bin/ (llama-quantize)")
    ap.add_argument("--tools", type=Path, default=None, help="dir with built llamacpp_logits / llamacpp_greedy")
    ap.add_argument("--stories", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/models/stories260K")
    ap.add_argument("--parts", default="types,dequant,models,stories")
    ap.add_argument("--commit-f32", action="store_true", help="write the F32 source model into --out too")
    a = ap.parse_args()
    parts = a.parts.split(",")
    qbin = a.llama_bin / "llama-quantize" if a.llama_bin else None
    if "types" in parts:
        make_types(a.out)
    if "dequant" in parts:
        make_dequant(a.out, a.work, qbin)
    if "models" in parts:
        make_models(a.out, a.work, qbin, a.tools, a.commit_f32)
    if "stories" in parts:
        make_stories(a.out, a.work, qbin, a.tools, a.stories)
    write_readme(a.out)


if __name__ == "__main__":
    main()
