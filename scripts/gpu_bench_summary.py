#!/usr/bin/env python3
"""The targets of issue 7 from one gpu-check run's JSON (scripts/gpu-check.sh step 5).

    python3 scripts/gpu_bench_summary.py LOG_DIR

Reads LOG_DIR/bench-*.json (llmrt-bench --json) and LOG_DIR/torch-peer.json
(scripts/torch_peer.py --json) and prints each target with the measured ratio:
  - 8B F16 batch-1 decode at 512 positions: >= 85% of (weight + KV bytes per token) /
    copy bandwidth (both measured in the same llmrt-bench process);
  - 8B F16 batch-64 aggregate t/s >= 25x batch-1;
  - 8B Q8_0 and Q4_0 batch-1 decode >= 70% of their own bytes bound;
  - 8B F16 pp2048 >= 50% of the cuBLAS bf16 8192^3 rate (same process);
  - the PyTorch peer on the same shapes (llmrt / torch).
"""
import glob
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"  (cannot read {path}: {e})")
        return []


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    recs = []
    for p in sorted(glob.glob(os.path.join(d, "bench-*.json"))):
        recs += load(p)
    peer = load(os.path.join(d, "torch-peer.json")) if os.path.exists(os.path.join(d, "torch-peer.json")) else []

    def find(model, test):
        for r in recs:
            if r.get("model_filename") == model and r.get("test") == test:
                return r
        return None

    def peer_find(test):
        for r in peer:
            if r.get("test") == test:
                return r
        return None

    print("targets (issue 7; ratios from this run):")
    ok_all = True

    def line(name, value, target, ok, extra=""):
        nonlocal ok_all
        if ok is None:
            verdict = "NOT MEASURED"
            ok_all = False
        else:
            verdict = "met" if ok else "NOT MET"
            ok_all = ok_all and ok
        print(f"  {name:<46} {value:>24}  target {target:<8} {verdict}{extra}")

    b1 = find("synth:llama3-8b:f16", "tg128 @ d512")
    if b1 and b1.get("fraction_of_bound") is not None:
        f = b1["fraction_of_bound"]
        line("8B F16 tg128 b1 @ d512 vs bytes bound", f"{b1['avg_ts']:.1f} t/s = {100 * f:.1f}%", ">= 85%", f >= 0.85,
             f"  (bound {b1['bound_ts']:.1f} t/s at {b1['d2d_GBps']:.0f} GB/s)")
    else:
        line("8B F16 tg128 b1 @ d512 vs bytes bound", "-", ">= 85%", None)
    b64 = find("synth:llama3-8b:f16", "tg128 b64 @ d512")
    if b1 and b64:
        x = b64["avg_ts"] / b1["avg_ts"]
        line("8B F16 tg128 b64 / b1 aggregate", f"{b64['avg_ts']:.0f} t/s = {x:.1f}x", ">= 25x", x >= 25)
    else:
        line("8B F16 tg128 b64 / b1 aggregate", "-", ">= 25x", None)
    for b in ("8", "32"):
        r = find("synth:llama3-8b:f16", f"tg128 b{b} @ d512")
        if r and b1:
            print(f"  {'  (8B F16 tg128 b' + b + ' @ d512)':<46} {r['avg_ts']:>10.0f} t/s = {r['avg_ts'] / b1['avg_ts']:.1f}x b1")
    for q in ("q8_0", "q4_0"):
        r = find(f"synth:llama3-8b:{q}", "tg128 @ d512")
        if r and r.get("fraction_of_bound") is not None:
            f = r["fraction_of_bound"]
            line(f"8B {q.upper()} tg128 b1 @ d512 vs its bytes bound", f"{r['avg_ts']:.1f} t/s = {100 * f:.1f}%", ">= 70%",
                 f >= 0.70, f"  (bound {r['bound_ts']:.1f} t/s)")
        else:
            line(f"8B {q.upper()} tg128 b1 @ d512 vs its bytes bound", "-", ">= 70%", None)
    pp = find("synth:llama3-8b:f16", "pp2048")
    if pp and pp.get("tflops") and pp.get("gemm_bf16_TFLOPs"):
        f = pp["tflops"] / pp["gemm_bf16_TFLOPs"]
        line("8B F16 pp2048 vs cuBLAS bf16 8192^3", f"{pp['tflops']:.0f} TFLOP/s = {100 * f:.1f}%", ">= 50%", f >= 0.5,
             f"  ({pp['avg_ts']:.0f} t/s; cuBLAS {pp['gemm_bf16_TFLOPs']:.0f} TFLOP/s)")
    else:
        line("8B F16 pp2048 vs cuBLAS bf16 8192^3", "-", ">= 50%", None)
    tt = find("synth:llama3-8b:f16", "ttft p2048")
    if tt:
        print(f"  {'8B F16 time to first token, 2048-token prompt':<46} {tt['avg_ns'] / 1e6:>17.1f} ms")

    print("")
    print("PyTorch peer (same shapes, F16, SDPA, CUDA graphs for decode):")
    if not peer:
        print("  (no torch-peer.json)")
    for test, mine in (("tg128 @ d512", b1), ("tg128 b64 @ d512", b64), ("pp2048", pp)):
        p = peer_find(test)
        if not p:
            print(f"  {test:<20} torch: not measured")
            continue
        ours = f"{mine['avg_ts']:.1f}" if mine else "-"
        ratio = f"{mine['avg_ts'] / p['avg_ts']:.2f}x" if mine else "-"
        extra = ""
        if mine and mine.get("bound_ts") and test.startswith("tg"):
            extra = f"  (torch at {100 * p['avg_ts'] / mine['bound_ts']:.1f}% of the same bound)"
        if test == "pp2048" and p.get("tflops") and pp and pp.get("gemm_bf16_TFLOPs"):
            extra = f"  (torch {p['tflops']:.0f} TFLOP/s = {100 * p['tflops'] / pp['gemm_bf16_TFLOPs']:.1f}% of cuBLAS bf16)"
        print(f"  {test:<20} llmrt {ours:>10} t/s   torch {p['avg_ts']:>10.1f} t/s   llmrt/torch {ratio}{extra}")
    print("")
    print("all targets met" if ok_all else "some targets not met or not measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
