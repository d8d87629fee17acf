#!/usr/bin/env python3
"""llama.cpp's perplexity of the demo model (models/pystdlib/) over its held-out text:
writes models/pystdlib/perplexity.json, which tests/demo_model.rs holds llmrt to.

    python3 tools/demo_perplexity_reference.py [--bin /work/llama-build-noamx/bin] [--threads 2]

Needs only the Python standard library and two tools built from the llama.cpp of the
llama-cpp-python 0.3.36 source package (vendor/llama.cpp; cmake Release, GGML_NATIVE=ON;
targets llama-perplexity and llama-tokenize).

For each committed file (F16, Q8_0, Q4_K_M):
    llama-perplexity -m FILE -f heldout/textwrap.py.txt -c 256 -b 256 -t T --no-escape
and once, for the token ids it evaluates (the text less its trailing newline, on stdin:
llama-tokenize's own -f keeps that newline):
    llama-tokenize -m pystdlib.f16.gguf --stdin --ids --no-escape --log-disable
`--no-escape`: by default llama.cpp's common argument parser turns the escape sequences
of a -f text (`\\n`, `\\t`, `\\\\`, quotes) into the characters they name, which would change
Python source full of string literals; with it both tools see the file's bytes (less one
trailing newline, which -f always drops), the text llmrt's perplexity reads.
"""
import argparse
import datetime
import json
import platform
import re
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "models" / "pystdlib"
TEXT = DIR / "heldout" / "textwrap.py.txt"
N_CTX = 256
FILES = {"F16": "pystdlib.f16.gguf", "Q8_0": "pystdlib.q8_0.gguf", "Q4_K_M": "pystdlib.q4_k_m.gguf"}


def run(cmd):
    with tempfile.TemporaryFile("w+") as f:
        r = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, text=True)
        f.seek(0)
        out = f.read()
    if r.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({r.returncode}):\n{out}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", type=Path, default=Path("/work/llama-build-noamx/bin"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=DIR, help="the model folder (default models/pystdlib)")
    a = ap.parse_args()
    d = a.dir.resolve()
    text = d / TEXT.relative_to(DIR)

    # llama-tokenize reads a -f file verbatim (its trailing newline kept): give it, on stdin,
    # the text llama-perplexity -f evaluates
    body = text.read_bytes()
    body = body[:-1] if body.endswith(b"\n") else body
    r = subprocess.run([str(a.bin / "llama-tokenize"), "-m", str(d / FILES["F16"]), "--stdin", "--ids",
                        "--no-escape", "--log-disable"], input=body, capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"llama-tokenize failed:\n{r.stdout.decode()}{r.stderr.decode()}")
    ids = json.loads(re.search(r"^\[[0-9, ]*\]$", r.stdout.decode(), re.M).group(0))
    version = run([a.bin / "llama-perplexity", "--version"])
    m = re.search(r"version: .*", version)
    ref = {
        "text": str(TEXT.relative_to(DIR)),
        "n_ctx": N_CTX,
        "method": "llama-perplexity default mode: chunks of n_ctx, BOS first in each, second half scored",
        "command": f"llama-perplexity -m FILE -f {TEXT.relative_to(ROOT)} -c {N_CTX} -b {N_CTX} -t {a.threads} "
                   "--no-escape",
        "llama_cpp": f"{m.group(0) if m else '?'}: the llama.cpp of llama-cpp-python 0.3.36 (vendor/llama.cpp)",
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "date": datetime.date.today().isoformat(),
        "tokens": ids,
        "files": {},
    }
    for ty, name in FILES.items():
        # This llama.cpp's logger thread leaks on purpose and so loses the last lines at
        # exit about half the time (common/log.cpp, common_log_main): run again then.
        for _ in range(12):
            out = run([a.bin / "llama-perplexity", "-m", d / name, "-f", text, "-c", N_CTX, "-b", N_CTX,
                       "-t", a.threads, "--no-escape"])
            fin = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
            chunks = re.search(r"calculating perplexity over (\d+) chunks", out)
            if fin and chunks:
                break
        if not fin or not chunks:
            raise SystemExit(f"unexpected llama-perplexity output for {name}:\n{out}")
        per_chunk = [float(v) for _, v in re.findall(r"\[(\d+)\]([0-9.]+),", out)]
        if len(per_chunk) != int(chunks.group(1)):
            raise SystemExit(f"{name}: {len(per_chunk)} running values for {chunks.group(1)} chunks:\n{out}")
        ref["files"][ty] = {"file": name, "ppl": float(fin.group(1)), "ppl_err": float(fin.group(2)),
                            "chunks": int(chunks.group(1)), "per_chunk": per_chunk}
        print(f"{ty:7} {name}: PPL = {fin.group(1)} +/- {fin.group(2)} over {chunks.group(1)} chunks")
    js = json.dumps(ref, indent=1)
    # the id list on one line
    js = re.sub(r'"tokens": \[[^\]]*\]', lambda _: '"tokens": ' + json.dumps(ids), js)
    js = re.sub(r'"per_chunk": \[[^\]]*\]', lambda m: '"per_chunk": ' + json.dumps(json.loads(m.group(0)[13:])), js)
    (d / "perplexity.json").write_text(js + "\n")
    print(f"{len(ids)} tokens; wrote {d / 'perplexity.json'}")


if __name__ == "__main__":
    main()
