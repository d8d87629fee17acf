#!/usr/bin/env python3
"""PyTorch peer for llmrt-bench on CUDA: the same Llama shapes with random weights,
run the way a fast plain-PyTorch implementation does (fused QKV and gate/up weights,
static KV cache, SDPA flash attention for prefill, CUDA graphs for decode), as a
sanity reference.

    python3 scripts/torch_peer.py [--shape llama3-8b|tinyllama] [--dtype f16|bf16]
                                  [--depth 512] [--gen 128] [--batch 1,64] [--prefill 2048]
                                  [--reps 3] [--json FILE] [--no-graph] [--device cuda|cpu]

Tests (as llmrt-bench names them):
  tgN bB @ dD  N decode steps of B sequences whose caches hold D positions first; the
               whole step (embedding .. argmax, feeding the argmax back) is one CUDA
               graph replayed N times; t/s = N * B / time. Decode attention: grouped
               matmuls over the static cache with a validity mask (each K/V row read
               once per group); --sdpa-decode uses SDPA with enable_gqa instead.
  ppN          one prefill of N tokens (batch 1) into an empty cache, SDPA causal
               (flash attention on sm_80+ when torch picks it); t/s = N / time.
Prints one "PEER {json}" line per test and, with --json, writes them all to FILE.
--device cpu with --shape tiny checks the script itself on a machine with no GPU.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {
    # hidden, layers, heads, kv_heads, ffn, vocab, rope theta
    "tinyllama": (2048, 22, 32, 4, 5632, 32000, 10000.0),
    "llama3-8b": (4096, 32, 32, 8, 14336, 128256, 500000.0),
    "tiny": (256, 2, 8, 2, 512, 1000, 10000.0),
}


class Model:
    def __init__(self, shape, dtype, device, max_batch, max_len, prefill_len):
        h, L, nh, nkv, ffn, vocab, theta = SHAPES[shape]
        self.h, self.L, self.nh, self.nkv, self.ffn, self.vocab = h, L, nh, nkv, ffn, vocab
        self.hd = h // nh
        self.dtype, self.device = dtype, device
        g = torch.Generator(device=device).manual_seed(1)

        def w(rows, cols):
            return (torch.randn(rows, cols, generator=g, device=device, dtype=torch.float32)
                    .mul_(1.0 / math.sqrt(cols)).to(dtype))

        qd, kvd = nh * self.hd, nkv * self.hd
        self.embed = w(vocab, h)
        self.layers = []
        for _ in range(L):
            self.layers.append(dict(
                attn_norm=torch.ones(h, device=device, dtype=dtype),
                wqkv=w(qd + 2 * kvd, h),
                wo=w(h, qd),
                ffn_norm=torch.ones(h, device=device, dtype=dtype),
                w13=w(2 * ffn, h),
                w2=w(h, ffn),
            ))
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.lm_head = w(vocab, h)
        inv = 1.0 / (theta ** (torch.arange(0, self.hd, 2, device=device, dtype=torch.float64) / self.hd))
        pos = torch.arange(max(max_len, prefill_len), device=device, dtype=torch.float64)
        ang = torch.outer(pos, inv)
        self.cos = ang.cos().to(torch.float32)
        self.sin = ang.sin().to(torch.float32)
        # [layer][batch][kv_heads][max_len][head_dim]
        self.k = torch.zeros(L, max_batch, nkv, max_len, self.hd, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        # The prefill's own cache (batch 1), so that decode attention reads only max_len.
        self.pk = torch.zeros(L, 1, nkv, max(prefill_len, 1), self.hd, device=device, dtype=dtype)
        self.pv = torch.zeros_like(self.pk)
        self.max_len = max_len
        self.sdpa_decode = False
        self.weight_bytes = sum(t.numel() * t.element_size() for lw in self.layers for t in lw.values())
        self.weight_bytes += self.lm_head.numel() * self.lm_head.element_size() + self.norm.numel() * 2

    @staticmethod
    def rmsnorm(x, w, eps=1e-5):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def rope(self, x, pos):
        # x: [B, heads, T, hd]; pos: [T] or [B] (decode: one position per sequence)
        cos, sin = self.cos[pos], self.sin[pos]  # [T, hd/2]
        if x.shape[2] == 1:  # decode: per-sequence position, shape [B, 1, 1, hd/2]
            cos, sin = cos[:, None, None, :], sin[:, None, None, :]
        x1, x2 = x.float()[..., ::2], x.float()[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
        return out.to(x.dtype)

    def decode_step(self, tok, pos, mask):
        """tok [B] ids, pos [B] positions (all equal here), mask [B, 1, 1, max_len] bool.
        Returns the argmax ids [B]."""
        B = tok.shape[0]
        x = self.embed[tok]  # [B, h]
        qd, kvd, hd = self.nh * self.hd, self.nkv * self.hd, self.hd
        for l, lw in enumerate(self.layers):
            hn = self.rmsnorm(x, lw["attn_norm"])
            qkv = hn @ lw["wqkv"].t()
            q = qkv[:, :qd].view(B, self.nh, 1, hd)
            k = qkv[:, qd:qd + kvd].view(B, self.nkv, 1, hd)
            v = qkv[:, qd + kvd:].view(B, self.nkv, 1, hd)
            q, k = self.rope(q, pos), self.rope(k, pos)
            kc, vc = self.k[l, :B], self.v[l, :B]
            kc.index_copy_(2, pos[:1], k)
            vc.index_copy_(2, pos[:1], v)
            if self.sdpa_decode:
                a = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
            else:
                # Grouped matmuls: each K/V row read once for the G query heads of its group.
                G = self.nh // self.nkv
                qg = q.reshape(B, self.nkv, G, hd)
                s = torch.matmul(qg, kc.transpose(-1, -2)).float() * (1.0 / math.sqrt(hd))
                s = s.masked_fill(~mask.view(B, 1, 1, -1), float("-inf")).softmax(-1).to(self.dtype)
                a = torch.matmul(s, vc)
            x = x + a.reshape(B, qd) @ lw["wo"].t()
            hn = self.rmsnorm(x, lw["ffn_norm"])
            gu = hn @ lw["w13"].t()
            x = x + (F.silu(gu[:, :self.ffn]) * gu[:, self.ffn:]) @ lw["w2"].t()
        logits = self.rmsnorm(x, self.norm) @ self.lm_head.t()
        return logits.argmax(-1)

    def prefill(self, tok):
        """tok [T] ids of one sequence into an empty cache; returns the last row's argmax."""
        T = tok.shape[0]
        qd, kvd, hd = self.nh * self.hd, self.nkv * self.hd, self.hd
        pos = torch.arange(T, device=self.device)
        x = self.embed[tok]
        rep = self.nh // self.nkv
        for l, lw in enumerate(self.layers):
            hn = self.rmsnorm(x, lw["attn_norm"])
            qkv = hn @ lw["wqkv"].t()
            q = qkv[:, :qd].view(T, self.nh, hd).transpose(0, 1)[None]
            k = qkv[:, qd:qd + kvd].view(T, self.nkv, hd).transpose(0, 1)[None]
            v = qkv[:, qd + kvd:].view(T, self.nkv, hd).transpose(0, 1)[None]
            q, k = self.rope(q, pos), self.rope(k, pos)
            self.pk[l, :, :, :T] = k
            self.pv[l, :, :, :T] = v
            # Expanded K/V so that the flash backend takes it (is_causal, no mask).
            a = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                               is_causal=True)
            x = x + a[0].transpose(0, 1).reshape(T, qd) @ lw["wo"].t()
            hn = self.rmsnorm(x, lw["ffn_norm"])
            gu = hn @ lw["w13"].t()
            x = x + (F.silu(gu[:, :self.ffn]) * gu[:, self.ffn:]) @ lw["w2"].t()
        logits = self.rmsnorm(x[-1:], self.norm) @ self.lm_head.t()
        return logits.argmax(-1)


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def bench_decode(m, B, depth, n, reps, use_graph, dev):
    """tg n at batch B, caches holding `depth` random positions first (the KV content
    does not change the work). Returns a list of t/s."""
    tok = torch.randint(0, m.vocab, (B,), device=dev)
    pos = torch.full((B,), depth, device=dev, dtype=torch.long)
    mask = torch.zeros(B, 1, 1, m.max_len, device=dev, dtype=torch.bool)

    def step():
        mask.index_fill_(3, pos[:1], True)
        nxt = m.decode_step(tok, pos, mask)
        tok.copy_(nxt)
        pos.add_(1)

    def reset():
        mask.zero_()
        mask[..., :depth] = True
        pos.fill_(depth)

    graph = None
    reset()
    if use_graph and dev == "cuda":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):  # warm-up on a side stream, as torch.cuda.graphs asks
                step()
        torch.cuda.current_stream().wait_stream(s)
        reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
    else:
        step()
    out = []
    for r in range(reps + 1):
        reset()
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(n):
            if graph is not None:
                graph.replay()
            else:
                step()
        sync(dev)
        dt = time.perf_counter() - t0
        if r > 0:  # the first is a warm-up
            out.append(n * B / dt)
    return out


def bench_prefill(m, T, reps, dev):
    tok = torch.randint(0, m.vocab, (T,), device=dev)
    out = []
    for r in range(reps + 1):
        sync(dev)
        t0 = time.perf_counter()
        m.prefill(tok)
        sync(dev)
        dt = time.perf_counter() - t0
        if r > 0:
            out.append(T / dt)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sdpa-decode", action="store_true",
                    help="decode attention through SDPA (enable_gqa, a mask) instead of grouped matmuls")
    a = ap.parse_args()
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("torch_peer: skipped: torch sees no CUDA device", file=sys.stderr)
        return 2
    dtype = torch.float16 if a.dtype == "f16" else torch.bfloat16
    batches = [int(b) for b in a.batch.split(",") if b]
    max_len = (a.depth + a.gen + 1 + 15) // 16 * 16
    t0 = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = True
    with torch.no_grad():
        m = Model(a.shape, dtype, dev, max(batches + [1]), max_len, a.prefill)
        m.sdpa_decode = a.sdpa_decode
        sync(dev)
        name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
        print(f"torch_peer: torch {torch.__version__} on {name}: {a.shape} {a.dtype}, weights "
              f"{m.weight_bytes / 1e9:.2f} GB made in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        kv_per_pos = m.L * 2 * m.nkv * m.hd * m.k.element_size()
        recs = []

        def emit(test, samples, extra, graphs=not a.no_graph):
            mean = sum(samples) / len(samples)
            sd = (sum((x - mean) ** 2 for x in samples) / max(1, len(samples) - 1)) ** 0.5
            r = dict(peer="torch", torch=torch.__version__, shape=a.shape, dtype=a.dtype, test=test,
                     avg_ts=mean, stddev_ts=sd, samples_ts=samples, graphs=graphs, **extra)
            recs.append(r)
            print("PEER " + json.dumps(r), flush=True)

        for B in batches:
            graphs = not a.no_graph
            try:
                ts = bench_decode(m, B, a.depth, a.gen, a.reps, graphs, dev)
            except Exception as e:  # a capture failure should not lose the other tests
                print(f"torch_peer: tg b{B} with CUDA graphs failed ({type(e).__name__}: {e}); "
                      "measuring it without graphs", file=sys.stderr, flush=True)
                graphs = False
                sync(dev)
                ts = bench_decode(m, B, a.depth, a.gen, a.reps, False, dev)
            kv = int(B * (a.depth + (a.gen + 1) / 2) * kv_per_pos)
            # Every matrix once (m.weight_bytes has no embedding table) + the B gathered rows.
            w = m.weight_bytes + B * m.h * m.embed.element_size()
            emit(f"tg{a.gen}" + (f" b{B}" if B > 1 else "") + (f" @ d{a.depth}" if a.depth else ""), ts,
                 dict(n_gen=a.gen, n_seqs=B, n_depth=a.depth, step_weight_bytes=w, step_kv_bytes=kv), graphs)
            if a.json:  # keep what was measured so far if a later test fails or times out
                with open(a.json, "w") as f:
                    json.dump(recs, f, indent=1)
        if a.prefill > 0:
            ts = bench_prefill(m, a.prefill, a.reps, dev)
            L, h, nh, nkv, hd, ffn = m.L, m.h, m.nh, m.nkv, m.hd, m.ffn
            flops_tok = 2.0 * L * (2 * h * nh * hd + 2 * h * nkv * hd + 3 * h * ffn)
            emit(f"pp{a.prefill}", ts, dict(n_prompt=a.prefill, tflops=flops_tok * (sum(ts) / len(ts)) / 1e12))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
