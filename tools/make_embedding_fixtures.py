#!/usr/bin/env python3
"""Reference embeddings for llmrt's fixtures, from Hugging Face transformers.

For every tests/fixtures/<name>/ with an hf/ checkpoint (written by
tools/make_fixtures.py), loads it with transformers' AutoModel (the base model, no LM
head) in float64, runs the fixture's reference tokens (reference.json "tokens", no BOS,
use_cache=False) and writes into that folder:

  hidden.f32            last_hidden_state, [n_tokens, hidden_size] little-endian f32
  embed_mean.f32        its mean over the tokens (numpy, float64, then f32)
  embed_mean_norm.f32   that mean / its L2 norm
  embed_last.f32        the last token's row
  embedding.json        what the files hold, the versions used and this command

llmrt's `llmrt_embed` returns the final norm's output (the LM head's input), which is
transformers' last_hidden_state for these architectures (llama, mistral, qwen2, qwen3).
tests/embeddings.rs compares against these files.

Usage (a venv with torch and transformers 5.24):
  python3 tools/make_embedding_fixtures.py [tests/fixtures]
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModel


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
    done = 0
    for d in sorted(p for p in root.iterdir() if (p / "hf" / "config.json").exists()):
        ref = json.loads((d / "reference.json").read_text())
        tokens = ref["tokens"]
        model = AutoModel.from_pretrained(str(d / "hf"), dtype=torch.float64)
        model.eval()
        with torch.no_grad():
            out = model(torch.tensor([tokens]), use_cache=False)
        h = out.last_hidden_state[0].numpy().astype(np.float64)
        mean = h.mean(axis=0)
        files = {
            "hidden.f32": h,
            "embed_mean.f32": mean,
            "embed_mean_norm.f32": mean / np.linalg.norm(mean),
            "embed_last.f32": h[-1],
        }
        for name, a in files.items():
            a.astype("<f4").tofile(d / name)
        (d / "embedding.json").write_text(json.dumps({
            "model_class": type(model).__name__,
            "n_tokens": len(tokens),
            "hidden_size": int(h.shape[1]),
            "tokens": "reference.json tokens (no BOS)",
            "files": {
                "hidden.f32": "last_hidden_state [n_tokens, hidden_size], float64 forward, stored f32",
                "embed_mean.f32": "mean over tokens",
                "embed_mean_norm.f32": "mean / L2 norm",
                "embed_last.f32": "last token's row",
            },
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                         "numpy": np.__version__},
            "command": "python3 tools/make_embedding_fixtures.py",
        }, indent=2) + "\n")
        print(f"{d.name}: {type(model).__name__}, {len(tokens)} tokens, hidden {h.shape[1]}")
        done += 1
    if done == 0:
        sys.exit(f"no fixture with an hf/ checkpoint under {root}")


if __name__ == "__main__":
    main()
