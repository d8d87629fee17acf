#!/usr/bin/env python3
"""Trains the demo model of `make demo` (models/pystdlib/): a small llama that writes Python.

    nice -n 10 python tools/train_demo_model.py --out models/pystdlib [--work DIR]

Everything is fixed (seed, corpus rule, shapes, steps), so a rerun on the same Python,
torch and CPU gives the same weights; another torch or CPU gives a model of the same
quality but not the same bits (float summation order).

Corpus: the .py files directly in the running interpreter's standard library directory
(`sysconfig.get_paths()["stdlib"]`, not its subfolders), in sorted order, minus the
held-out files HELD_OUT, taken while the total stays under CORPUS_CAP bytes. The held-out
files are scored at the end (loss, and perplexity as llama-perplexity computes it).
The model only makes sense for the Python the README names: another version has other files.

Steps:
1. byte-level BPE tokenizer (HF `tokenizers`: GPT-2's byte-level pre-tokenizer and split
   regex, no prefix space), VOCAB tokens, `<|endoftext|>` (id 0) as BOS, EOS and file
   separator; BOS is added in front of every text;
2. the token stream: `<|endoftext|>` + file, for every file in order;
3. a llama (SHAPE below; LlamaForCausalLM's computation with q/k/v and gate/up fused, under
   torch.compile) trained with AdamW for STEPS steps of BATCH windows of CTX tokens drawn
   from the stream by a seeded generator; the first token of each window is replaced by
   BOS, as llama-perplexity does for each chunk (so that is what the model expects at
   position 0);
4. the weights split back into a LlamaForCausalLM (its logits checked equal), the held-out
   files' perplexity, save_pretrained (float32 safetensors) + tokenizer files into WORK/hf;
5. llama.cpp's convert_hf_to_gguf.py --outtype f16 (from the llama-cpp-python 0.3.36 source
   package; LLAMA_CPP_DIR), which does not know this new tokenizer's pre-tokenizer hash:
   the wrapper answers "gpt-2" (llama.cpp's name for it) for that one NotImplementedError,
   which is the truth (the tokenizer's pre-tokenizer is exactly GPT-2's ByteLevel split);
6. llama-quantize (LLAMA_QUANTIZE) F16 -> Q8_0 and Q4_K_M;
7. OUT/train_log.json: the figures the README quotes.

Needs torch, transformers, tokenizers, safetensors, numpy (and the converter's gguf-py,
which it takes from LLAMA_CPP_DIR/gguf-py) and a C++ compiler (torch.compile). Cost: about
1500 CPU-seconds of training at 2 threads (12 minutes on an idle 2-core machine);
`--time-steps N` times N steps and stops, `--no-compile --steps 2` smoke-tests the pipeline.
"""
import argparse
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

SEED = 20261201
VOCAB = 4096
CTX = 256
SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, head_dim=32)
HELD_OUT = ["textwrap.py", "shlex.py", "fractions.py"]
CORPUS_CAP = 5 * 1024 * 1024
EPS = 1e-5
ROPE_THETA = 10000.0
BATCH = 16
STEPS = 640
LR = 3e-3
WARMUP = 40
MIN_LR_FRAC = 0.1
WEIGHT_DECAY = 0.1
NAME = "pystdlib"
BOS = "<|endoftext|>"
COMPILE = True  # torch.compile: about half the CPU time of eager mode here

LLAMA_CPP_DIR = Path(os.environ.get("LLAMA_CPP_DIR", "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp"))
LLAMA_QUANTIZE = Path(os.environ.get("LLAMA_QUANTIZE", "/work/llama-build-noamx/bin/llama-quantize"))


def log(*a):
    print(*a, flush=True)


def corpus_files():
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in lib.glob("*.py") if p.is_file())
    train, total = [], 0
    for p in files:
        if p.name in HELD_OUT:
            continue
        n = p.stat().st_size
        if total + n > CORPUS_CAP:
            break
        train.append(p)
        total += n
    held = [lib / n for n in HELD_OUT]
    return lib, train, held


def read_text(p):
    return p.read_bytes().decode("utf-8")


def train_tokenizer(texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # BOS in front of a text and nothing else (a BOS between the two texts of a pair would make
    # the converter write add_sep_token)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B:1",
                                                       special_tokens=[(BOS, 0)])
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=[BOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    assert tok.token_to_id(BOS) == 0
    return tok


def save_tokenizer(tok, d: Path):
    tok.save(str(d / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": BOS, "unk_token": None,
           "add_bos_token": True, "add_eos_token": False, "model_max_length": CTX, "clean_up_tokenization_spaces": False}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (d / "special_tokens_map.json").write_text(json.dumps({"bos_token": BOS, "eos_token": BOS}, indent=2) + "\n")


def ppl_like_llama_cpp(model, ids, n_ctx, torch):
    """llama-perplexity's number for token list `ids` (BOS first): chunks of n_ctx, the first
    token of each replaced by BOS, the second half of each chunk scored."""
    n_chunk = len(ids) // n_ctx
    first = n_ctx // 2
    nll, count = 0.0, 0
    with torch.no_grad():
        for c in range(n_chunk):
            chunk = list(ids[c * n_ctx:(c + 1) * n_ctx])
            chunk[0] = 0
            logits = model(torch.tensor([chunk])).logits[0].double()
            lp = torch.log_softmax(logits[first:n_ctx - 1], dim=-1)
            tgt = torch.tensor(chunk[first + 1:n_ctx])
            nll -= lp.gather(1, tgt[:, None]).sum().item()
            count += n_ctx - 1 - first
    return math.exp(nll / count), n_chunk, count


def Lean(torch):
    """The llama being trained: LlamaForCausalLM's computation (RMSNorm, half-split RoPE,
    GQA attention, SwiGLU), with q/k/v and gate/up fused into one matrix each so that
    torch.compile has fewer, larger products; `to_hf` splits them back."""
    nn, F = torch.nn, torch.nn.functional
    D, L, H, KV, HD, FF = (SHAPE[k] for k in ["hidden_size", "num_hidden_layers", "num_attention_heads",
                                              "num_key_value_heads", "head_dim", "intermediate_size"])

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm = nn.Parameter(torch.ones(D))
            self.ffn_norm = nn.Parameter(torch.ones(D))
            self.qkv = nn.Linear(D, (H + 2 * KV) * HD, bias=False)
            self.o = nn.Linear(H * HD, D, bias=False)
            self.gate_up = nn.Linear(D, 2 * FF, bias=False)
            self.down = nn.Linear(FF, D, bias=False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            q, k, v = self.qkv(F.rms_norm(x, (D,), self.attn_norm, EPS)).split([H * HD, KV * HD, KV * HD], -1)
            q = q.view(B, T, H, HD).transpose(1, 2)
            k = k.view(B, T, KV, HD).transpose(1, 2)
            v = v.view(B, T, KV, HD).transpose(1, 2)

            def rope(t):
                a, b = t.chunk(2, -1)
                return t * cos + torch.cat((-b, a), -1) * sin

            att = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True, enable_gqa=True)
            x = x + self.o(att.transpose(1, 2).reshape(B, T, H * HD))
            g, u = self.gate_up(F.rms_norm(x, (D,), self.ffn_norm, EPS)).chunk(2, -1)
            return x + self.down(F.silu(g) * u)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D)
            self.blocks = nn.ModuleList([Block() for _ in range(L)])
            self.norm = nn.Parameter(torch.ones(D))
            self.head = nn.Linear(D, VOCAB, bias=False)
            inv = 1.0 / (ROPE_THETA ** (torch.arange(0, HD, 2, dtype=torch.int64).float() / HD))
            f = torch.outer(torch.arange(CTX).float(), inv)
            e = torch.cat((f, f), -1)
            self.register_buffer("cos", e.cos(), persistent=False)
            self.register_buffer("sin", e.sin(), persistent=False)
            for name, p in self.named_parameters():
                if p.dim() == 2:  # GPT-2's init: N(0, 0.02), residual outputs scaled by 1/sqrt(2L)
                    std = 0.02 / math.sqrt(2 * L) if name.endswith(("o.weight", "down.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, ids):
            h = self.embed(ids)
            cos, sin = self.cos[:ids.shape[1]], self.sin[:ids.shape[1]]
            for b in self.blocks:
                h = b(h, cos, sin)
            return self.head(F.rms_norm(h, (D,), self.norm, EPS))

    return Model()


def to_hf(lean, torch):
    """The trained weights as a LlamaForCausalLM, checked to give the same logits."""
    from transformers import LlamaConfig, LlamaForCausalLM
    H, KV, HD, FF = (SHAPE[k] for k in ["num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"])
    cfg = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=CTX, rms_norm_eps=EPS, rope_theta=ROPE_THETA,
                      bos_token_id=0, eos_token_id=0, tie_word_embeddings=False, attention_bias=False,
                      mlp_bias=False, hidden_act="silu", **SHAPE)
    hf = LlamaForCausalLM(cfg).eval()
    sd = {"model.embed_tokens.weight": lean.embed.weight, "model.norm.weight": lean.norm,
          "lm_head.weight": lean.head.weight}
    for i, b in enumerate(lean.blocks):
        q, k, v = b.qkv.weight.split([H * HD, KV * HD, KV * HD], 0)
        g, u = b.gate_up.weight.chunk(2, 0)
        pre = f"model.layers.{i}."
        sd.update({pre + "input_layernorm.weight": b.attn_norm, pre + "post_attention_layernorm.weight": b.ffn_norm,
                   pre + "self_attn.q_proj.weight": q, pre + "self_attn.k_proj.weight": k,
                   pre + "self_attn.v_proj.weight": v, pre + "self_attn.o_proj.weight": b.o.weight,
                   pre + "mlp.gate_proj.weight": g, pre + "mlp.up_proj.weight": u,
                   pre + "mlp.down_proj.weight": b.down.weight})
    missing, unexpected = hf.load_state_dict({k: v.detach().clone().contiguous() for k, v in sd.items()}, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    lean.eval()
    with torch.no_grad():
        ids = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(1))
        a, b = lean(ids), hf(input_ids=ids).logits
        diff = (a - b).abs().max().item()
    assert diff < 1e-3, f"HF model differs from the trained one by {diff}"
    log(f"LlamaForCausalLM built from the trained weights: logits agree to {diff:.1e}")
    return hf


CONVERT_WRAPPER = r"""
import os, sys, runpy
conv = sys.argv[1]
sys.path.insert(0, conv)
sys.path.insert(1, os.path.join(conv, "gguf-py"))
import conversion.base as base
_orig = base.TextModel.get_vocab_base_pre
def _pre(self, tokenizer):
    try:
        return _orig(self, tokenizer)
    except NotImplementedError:
        print("[train_demo_model] new tokenizer, unknown pre-tokenizer hash: answering 'gpt-2'", flush=True)
        return "gpt-2"
base.TextModel.get_vocab_base_pre = _pre
sys.argv = [os.path.join(conv, "convert_hf_to_gguf.py")] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(hf_dir: Path, out: Path):
    env = dict(os.environ, NO_LOCAL_GGUF="1",
               PYTHONPATH=os.pathsep.join([str(LLAMA_CPP_DIR / "gguf-py"), str(LLAMA_CPP_DIR)]))
    cmd = [sys.executable, "-c", CONVERT_WRAPPER, str(LLAMA_CPP_DIR), str(hf_dir), "--outtype", "f16",
           "--outfile", str(out), "--model-name", NAME]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit("convert_hf_to_gguf.py failed")
    for line in (r.stdout + r.stderr).splitlines():
        if "train_demo_model" in line:
            log("   ", line)


def quantize(src: Path, dst: Path, ftype: str):
    r = subprocess.run([str(LLAMA_QUANTIZE), str(src), str(dst), ftype], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit(f"llama-quantize {ftype} failed")


def sha256(p: Path):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the GGUF files and train_log.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/train_demo_model"), help="HF checkpoint folder")
    ap.add_argument("--steps", type=int, default=STEPS, help="training steps (the committed model: the default)")
    ap.add_argument("--time-steps", type=int, default=0, help="only time this many steps and exit")
    ap.add_argument("--no-compile", action="store_true", help="eager mode (smoke tests of the pipeline)")
    args = ap.parse_args()

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import numpy as np
    import torch
    import tokenizers
    import transformers

    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()

    lib, train_files, held_files = corpus_files()
    texts = [read_text(p) for p in train_files]
    n_bytes = sum(len(t.encode()) for t in texts)
    log(f"corpus: {len(train_files)} files from {lib} ({train_files[0].name} .. {train_files[-1].name}), "
        f"{n_bytes} bytes; held out {HELD_OUT}")

    t0 = time.time()
    tok = train_tokenizer(texts)
    t_tok = time.time() - t0
    stream = []
    for t in texts:
        stream.append(0)
        stream.extend(tok.encode(t, add_special_tokens=False).ids)
    stream = torch.tensor(stream, dtype=torch.long)
    log(f"tokenizer: {VOCAB} tokens in {t_tok:.1f} s; stream {len(stream)} tokens "
        f"({n_bytes / len(stream):.2f} bytes/token)")

    torch.manual_seed(SEED)
    model = Lean(torch)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters ({SHAPE}, vocab {VOCAB}, context {CTX}, untied output)")

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95), eps=1e-8, fused=True)
    steps = args.time_steps or args.steps

    def lr_at(s):
        if s < WARMUP:
            return LR * (s + 1) / WARMUP
        f = (s - WARMUP) / max(1, steps - WARMUP)
        return LR * (MIN_LR_FRAC + (1 - MIN_LR_FRAC) * 0.5 * (1 + math.cos(math.pi * f)))

    def loss_of(x, y):
        return torch.nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))

    step_loss = torch.compile(loss_of) if COMPILE and not args.no_compile else loss_of
    gen = torch.Generator().manual_seed(SEED)
    model.train()
    losses = []
    t0, c0 = time.time(), time.process_time()
    offs = torch.arange(CTX + 1)
    for s in range(steps):
        starts = torch.randint(0, len(stream) - CTX - 1, (BATCH,), generator=gen)
        win = stream[starts[:, None] + offs]
        x, y = win[:, :-1].clone(), win[:, 1:]
        x[:, 0] = 0
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        loss = step_loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if s < 3 or s % 20 == 0 or s == steps - 1:
            el = time.time() - t0
            avg = sum(losses[-20:]) / len(losses[-20:])
            log(f"step {s:5d}/{steps} loss {loss.item():.4f} (avg20 {avg:.4f}) lr {lr_at(s):.2e} "
                f"{el:.0f} s, cpu {time.process_time() - c0:.0f} s ({(s + 1) * BATCH * CTX / el:.0f} tok/s)")
    t_train = time.time() - t0
    if args.time_steps:
        log(f"{steps} steps in {t_train:.1f} s: {t_train / steps:.2f} s/step, "
            f"{(time.process_time() - c0) / steps:.2f} cpu-s/step")
        return

    model = to_hf(model, torch)
    model.eval()
    held = {}
    for p in held_files:
        text = read_text(p)
        if text.endswith("\n"):
            text = text[:-1]  # as llama-perplexity -f does
        ids = tok.encode(text).ids  # BOS first
        ppl, n_chunk, count = ppl_like_llama_cpp(model, ids, CTX, torch)
        held[p.name] = {"bytes": len(text.encode()), "tokens": len(ids), "chunks": n_chunk, "scored": count,
                        "ppl_torch_f32": round(ppl, 4)}
        log(f"held out {p.name}: {len(ids)} tokens, perplexity (llama-perplexity method, torch f32) {ppl:.4f}")

    hf = args.work / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(hf, safe_serialization=True)
    # transformers 5 writes only `rope_parameters`; the usual Hub style has rope_theta on top too
    cj = json.loads((hf / "config.json").read_text())
    cj.setdefault("rope_theta", ROPE_THETA)
    (hf / "config.json").write_text(json.dumps(cj, indent=2) + "\n")
    save_tokenizer(tok, hf)
    args.out.mkdir(parents=True, exist_ok=True)
    f16 = args.out / f"{NAME}.f16.gguf"
    log("converting to GGUF F16 ...")
    convert(hf, f16)
    files = {"F16": f16}
    for ftype in ["Q8_0", "Q4_K_M"]:
        dst = args.out / f"{NAME}.{ftype.lower()}.gguf"
        quantize(f16, dst, ftype)
        files[ftype] = dst

    tail = losses[-20:]
    summary = {
        "name": NAME,
        "seed": SEED,
        "python": platform.python_version(),
        "stdlib_dir": str(lib),
        "corpus_rule": f"sorted(stdlib/*.py) minus {HELD_OUT}, while the total stays <= {CORPUS_CAP} bytes",
        "corpus_files": len(train_files),
        "corpus_first_last": [train_files[0].name, train_files[-1].name],
        "corpus_bytes": n_bytes,
        "corpus_sha256": hashlib.sha256("".join(texts).encode()).hexdigest(),
        "stream_tokens": len(stream),
        "held_out": held,
        "vocab": VOCAB,
        "context": CTX,
        "shape": SHAPE,
        "parameters": n_params,
        "batch": BATCH,
        "steps": steps,
        "tokens_seen": steps * BATCH * CTX,
        "lr": LR,
        "warmup": WARMUP,
        "min_lr_frac": MIN_LR_FRAC,
        "weight_decay": WEIGHT_DECAY,
        "loss_first": round(losses[0], 4),
        "loss_last20_mean": round(sum(tail) / len(tail), 4),
        "train_seconds": round(t_train, 1),
        "total_seconds": round(time.time() - t_start, 1),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "numpy": np.__version__},
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "files": {k: {"file": v.name, "bytes": v.stat().st_size, "sha256": sha256(v)} for k, v in files.items()},
        "loss_every_20": [round(sum(losses[i:i + 20]) / len(losses[i:i + 20]), 4) for i in range(0, steps, 20)],
    }
    (args.out / "train_log.json").write_text(json.dumps(summary, indent=1) + "\n")
    log(f"done in {summary['total_seconds']} s: {json.dumps({k: summary[k] for k in ['parameters', 'loss_last20_mean', 'train_seconds']})}")


if __name__ == "__main__":
    main()
