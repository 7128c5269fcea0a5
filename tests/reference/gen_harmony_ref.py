#!/usr/bin/env python3
"""gen_harmony_ref.py — reference renderings of harmony (gpt-oss) conversations.

Renders each case of CASES with transformers' apply_chat_template and the
gpt-oss chat template (tests/data/openai-gpt-oss-120b.jinja; the tokenizer
is gpt-oss's, tests/data/gptoss_tokenizer.json.xz with
gptoss_tokenizer_config.json) and writes tests/data/harmony_ref.json:

  [{"name", "messages" (our JSON input, as ie_harmony_conv_from_json takes
    it), "effort", "date", "identity" (or null), "generation_prompt",
    "expected" (the template's text)}, ...]

Our message format puts an assistant's chain of thought in a separate
{"role": "assistant", "channel": "analysis"} message before its final one;
the template wants it as "thinking" on the final message, so to_hf() folds
it in. transformers' strftime_now reads datetime.now(); the script pins it
to each case's date. tests/unit/test_harmony.c renders the same cases and compares bytes;
tests/e2e/test_harmony_ref.py re-runs this script and checks the file.

Usage: gen_harmony_ref.py [OUT]   (default tests/data/harmony_ref.json)
"""
import json
import lzma
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"

SYS = {"role": "system", "content": "You are a terse assistant. Answer in one word."}
DEV = {"role": "developer", "content": "Always answer in French.\nNever use emoji."}

CASES = [
    ("user only", [{"role": "user", "content": "What is 2+2?"}], "medium", "2025-08-05", None),
    ("low effort", [{"role": "user", "content": "Hi"}], "low", "2024-12-31", None),
    ("high effort", [{"role": "user", "content": "Prove that sqrt(2) is irrational."}], "high", "2026-01-01", None),
    ("system becomes developer", [SYS, {"role": "user", "content": "Capital of France?"}], "medium", "2025-08-05",
     None),
    ("developer message", [DEV, {"role": "user", "content": "Hello"}], "low", "2025-08-05", None),
    ("empty system message", [{"role": "system", "content": ""}, {"role": "user", "content": "x"}], "medium",
     "2025-08-05", None),
    ("multi-turn with final channel",
     [SYS, {"role": "user", "content": "2+2?"}, {"role": "assistant", "channel": "final", "content": "4"},
      {"role": "user", "content": "And 3+3?"}], "high", "2025-08-05", None),
    ("analysis dropped",
     [{"role": "user", "content": "2+2?"},
      {"role": "assistant", "channel": "analysis", "content": "Simple arithmetic: 2+2=4."},
      {"role": "assistant", "channel": "final", "content": "4"},
      {"role": "user", "content": "Thanks!"}], "medium", "2025-08-05", None),
    ("thinking field",
     [{"role": "user", "content": "Name a colour"},
      {"role": "assistant", "thinking": "Pick one.", "content": "Blue"},
      {"role": "user", "content": "Another"}], "medium", "2025-08-05", None),
    ("assistant without channel", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                   {"role": "user", "content": "c"}], "low", "2025-08-05", None),
    ("unicode and newlines",
     [DEV, {"role": "user", "content": "Ünïcödé 日本語 🌍\n\nline two\ttab <b>html</b> <|notatoken|>"}],
     "medium", "2025-08-05", None),
    ("model identity", [{"role": "user", "content": "Who are you?"}], "medium", "2025-08-05",
     "You are Clocher, a small CPU model."),
    ("last assistant, no generation prompt",
     [{"role": "user", "content": "2+2?"},
      {"role": "assistant", "channel": "analysis", "content": "Add them."},
      {"role": "assistant", "channel": "final", "content": "4"}], "medium", "2025-08-05", None),
    ("assistant last, generation prompt",
     [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "medium", "2025-08-05", None),
]
NO_GEN_PROMPT = {"last assistant, no generation prompt"}


def to_hf(messages):
    """Our messages -> transformers chat messages (analysis -> thinking)."""
    out, pending = [], None
    for m in messages:
        if m["role"] == "assistant" and m.get("channel") == "analysis":
            pending = m["content"]
            continue
        h = {"role": m["role"], "content": m["content"]}
        if "thinking" in m:
            h["thinking"] = m["thinking"]
        if pending is not None:
            h["thinking"] = pending
            pending = None
        out.append(h)
    return out


def load_tokenizer():
    from transformers import PreTrainedTokenizerFast
    tmp = Path(tempfile.mkdtemp(prefix="harmony_ref_"))
    (tmp / "tokenizer.json").write_bytes(lzma.decompress((DATA / "gptoss_tokenizer.json.xz").read_bytes()))
    (tmp / "tokenizer_config.json").write_bytes((DATA / "gptoss_tokenizer_config.json").read_bytes())
    return PreTrainedTokenizerFast.from_pretrained(str(tmp))


class _PinnedClock:
    """Stands in for datetime in transformers' chat_template_utils."""
    day = None

    @classmethod
    def now(cls):
        return cls.day


def render_all():
    import datetime
    from transformers.utils import chat_template_utils
    tok = load_tokenizer()
    template = (DATA / "openai-gpt-oss-120b.jinja").read_text()
    out = []
    saved = chat_template_utils.datetime
    chat_template_utils.datetime = _PinnedClock
    try:
        for case in CASES:
            out.append(render_case(tok, template, *case, datetime=datetime))
    finally:
        chat_template_utils.datetime = saved
    return out


def render_case(tok, template, name, messages, effort, date, identity, datetime):
    """One case rendered by the jinja template, as a fixture entry."""
    _PinnedClock.day = datetime.datetime.strptime(date, "%Y-%m-%d")
    gen = name not in NO_GEN_PROMPT
    kwargs = {"reasoning_effort": effort}
    if identity is not None:
        kwargs["model_identity"] = identity
    text = tok.apply_chat_template(to_hf(messages), chat_template=template, tokenize=False,
                                   add_generation_prompt=gen, **kwargs)
    assert f"Current date: {date}\n" in text, "the pinned date did not take"
    return {"name": name, "messages": messages, "effort": effort, "date": date, "identity": identity,
            "generation_prompt": gen, "expected": text}


def main():
    dst = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA / "harmony_ref.json"
    cases = render_all()
    dst.write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {dst}")


if __name__ == "__main__":
    main()
