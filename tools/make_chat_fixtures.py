#!/usr/bin/env python3
"""Expected chat-template renderings for llmrt's chat templates (tests/fixtures/chat/).

The reference is Hugging Face transformers' own renderer, `render_jinja_template` in
`transformers/utils/chat_template_utils.py` (Python jinja2 configured as transformers
configures it: ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
the `{% generation %}` AssistantTracker extension, its `tojson`, `raise_exception`,
`strftime_now`, `dict` and `namespace`). It imports without torch.

    python3 -m venv /work/venv-chat && /work/venv-chat/bin/pip install jinja2 transformers
    /work/venv-chat/bin/python tools/make_chat_fixtures.py

Versions used for the committed expected.json: recorded in its "reference" field.

Templates: tests/fixtures/chat/templates/*.jinja, copied from llama.cpp's models/templates/
as vendored in the llama-cpp-python 0.3.36 source package (PyPI; see templates/README.md
there for where each came from). Every template is rendered with each conversation of
CONVERSATIONS, with add_generation_prompt true and false, bos_token/eos_token fixed to
BOS/EOS and `strftime_now` reading the fixed date NOW (datetime.now is patched in the
transformers module). A rendering that raises is recorded as {"error": "<type>: <message>"};
llmrt must fail on exactly those.
"""
import datetime as _dt
import json
import pathlib
import sys

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "chat"

BOS = "<|bos|>"
EOS = "<|eos|>"
# A fixed "now" for strftime_now: a day < 10 and a month name so %d, %b and %B are all seen.
NOW = _dt.datetime(2025, 3, 7, 14, 5, 9)

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "multi_turn": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 equals 4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    "system_multi_turn": [
        {"role": "system", "content": "Answer briefly.\nUse plain text."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
    ],
    "non_ascii": [
        {"role": "system", "content": "Réponds en français, s'il te plaît. «ok»"},
        {"role": "user", "content": "Grüße! 日本語で答えて 🙂 \"quoted\" <tag> & \\ back"},
        {"role": "assistant", "content": "はい、もちろん。Ça va ? 👍"},
        {"role": "user", "content": "Ελληνικά; 한국어\ttab"},
    ],
}


class FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


def main():
    ctu.datetime = FixedDatetime
    names = sorted(p.name for p in (FIX / "templates").glob("*.jinja"))
    out = {
        "reference": f"transformers {transformers.__version__} render_jinja_template, jinja2 {jinja2.__version__}",
        "bos_token": BOS,
        "eos_token": EOS,
        "now": NOW.isoformat(),
        "conversations": CONVERSATIONS,
        "templates": {},
    }
    n_ok = n_err = 0
    for name in names:
        src = (FIX / "templates" / name).read_text(encoding="utf-8")
        cases = {}
        for conv_name, conv in CONVERSATIONS.items():
            for agp in (True, False):
                key = f"{conv_name}/{'gen' if agp else 'nogen'}"
                try:
                    rendered, _ = ctu.render_jinja_template(
                        conversations=[conv],
                        chat_template=src,
                        add_generation_prompt=agp,
                        bos_token=BOS,
                        eos_token=EOS,
                    )
                    cases[key] = {"output": rendered[0]}
                    n_ok += 1
                except Exception as e:  # the reference raising is an expected error
                    cases[key] = {"error": f"{type(e).__name__}: {e}"}
                    n_err += 1
        out["templates"][name] = cases
    (FIX / "expected.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(names)} templates: {n_ok} renderings, {n_err} expected errors", file=sys.stderr)


if __name__ == "__main__":
    main()
