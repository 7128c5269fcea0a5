#!/usr/bin/env python3
"""gen_chat_templates.py — transformers' renders of models' chat templates.

For every tests/data/templates/*.jinja and every case of CASES, renders the
case with transformers.utils.chat_template_utils.render_jinja_template
(what tokenizer.apply_chat_template(..., tokenize=False,
add_generation_prompt=True) calls: jinja2's sandbox with trim_blocks,
lstrip_blocks, transformers' tojson / raise_exception / strftime_now, the
reasoning-field aliasing) and writes

  tests/data/templates/conversations.json
      [{"name", "messages", "kwargs" (extra template variables)}, ...]
  tests/data/templates/expected.json
      {"<template file>": {"bos_token", "eos_token",
                            "renders": {"<case>": {"text": ...} |
                                        {"error": ..., "raised": bool}}}}

"raised" is true when the template itself called raise_exception (the case
is one the template rejects); other errors are jinja runtime errors, which
our renderer must also report. strftime_now is pinned to NOW (UTC). The
unit test tests/unit/test_jinja.c renders the same and compares bytes.

Usage: gen_chat_templates.py [OUT_DIR]   (default tests/data/templates)
"""
import datetime as _dt
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "tests" / "data" / "templates"
NOW = 1768478400  # 2026-01-15 12:00:00 UTC

# (bos, eos) per template family, as the models' tokenizers define them
TOKENS = [
    ("Llama-3", ("<|begin_of_text|>", "<|eot_id|>")),
    ("Hermes-3", ("<|begin_of_text|>", "<|im_end|>")),
    ("DeepSeek-R1-Distill-Llama", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")),
    ("DeepSeek-R1-Distill-Qwen", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")),
    ("Qwen", ("", "<|im_end|>")),
    ("SmolLM", ("", "<|im_end|>")),
    ("gemma", ("<bos>", "<eos>")),
    ("granite", ("<|end_of_text|>", "<|end_of_text|>")),
    ("Phi-3", ("<s>", "<|endoftext|>")),
    ("Mistral", ("<s>", "</s>")),
    ("gpt-oss", ("<|startoftext|>", "<|return|>")),
]

SYS = {"role": "system", "content": "You are a careful assistant."}
U1 = {"role": "user", "content": "Hello! What is 2+2?"}
A1 = {"role": "assistant", "content": "2+2 is 4."}
U2 = {"role": "user", "content": "And 3+3?"}

CASES = [
    ("single_user", [U1], {}),
    ("system_user", [SYS, U1], {}),
    ("multi_turn", [SYS, U1, A1, U2], {}),
    ("multi_turn_no_system", [U1, A1, U2], {}),
    ("ends_with_assistant", [U1, A1], {}),
    ("special_text", [{"role": "user", "content": "What does <|im_end|> mean? {{ not a tag }} {% if x %} <s></s> [INST] <|eot_id|>"}], {}),
    ("unicode", [SYS, {"role": "user", "content": "Grüße, 世界! 🎉 ¿Qué tal? \u00a0tab\there"}], {}),
    ("whitespace", [{"role": "user", "content": "\n  padded question  \n\n"}, {"role": "assistant", "content": "  padded answer \n"}, {"role": "user", "content": "ok"}], {}),
    ("empty_user", [{"role": "user", "content": ""}], {}),
    ("reasoning_field", [U1, {"role": "assistant", "content": "It is 4.", "reasoning_content": "2 plus 2 makes 4."}, U2], {}),
    ("think_inline", [U1, {"role": "assistant", "content": "<think>\nLet me add.\n</think>\n\nIt is 4."}, U2], {}),
    ("thinking_on", [SYS, U1, A1, U2], {"enable_thinking": True}),
    ("thinking_off", [SYS, U1, A1, U2], {"enable_thinking": False}),
    ("thinking_off_single", [U1], {"enable_thinking": False}),
    ("not_alternating", [U1, U2], {}),
    ("assistant_first", [A1, U1], {}),
    ("long_multi", [SYS, U1, A1, U2, {"role": "assistant", "content": "6."}, {"role": "user", "content": "Thanks, bye"}], {}),
]


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime.fromtimestamp(NOW, tz or _dt.timezone.utc).replace(tzinfo=None) if tz is None else _dt.datetime.fromtimestamp(NOW, tz)


def tokens_for(name):
    for key, pair in TOKENS:
        if key.lower() in name.lower():
            return pair
    return ("<s>", "</s>")


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else TEMPLATES
    os.environ["TZ"] = "UTC"
    import jinja2
    from transformers.utils import chat_template_utils as ctu

    ctu.datetime = _FixedDatetime  # strftime_now reads datetime.now()
    expected = {}
    for path in sorted(TEMPLATES.glob("*.jinja")):
        tmpl = path.read_text(encoding="utf-8")
        bos, eos = tokens_for(path.name)
        renders = {}
        for name, messages, kwargs in CASES:
            try:
                (text,), _ = ctu.render_jinja_template(
                    conversations=[json.loads(json.dumps(messages))],
                    chat_template=tmpl,
                    add_generation_prompt=True,
                    bos_token=bos,
                    eos_token=eos,
                    **kwargs,
                )
                renders[name] = {"text": text}
            except jinja2.exceptions.TemplateError as e:
                raised = type(e) is jinja2.exceptions.TemplateError  # raise_exception's own class
                renders[name] = {"error": str(e), "raised": raised}
            except Exception as e:  # noqa: BLE001 - a template's runtime error is a result too
                renders[name] = {"error": f"{type(e).__name__}: {e}", "raised": False}
        expected[path.name] = {"bos_token": bos, "eos_token": eos, "renders": renders}
    out.mkdir(parents=True, exist_ok=True)
    convs = [{"name": n, "messages": m, "kwargs": k} for n, m, k in CASES]
    (out / "conversations.json").write_text(json.dumps(convs, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    n_err = sum("error" in r for t in expected.values() for r in t["renders"].values())
    print(f"{len(expected)} templates x {len(CASES)} cases, {n_err} rejected", file=sys.stderr)


if __name__ == "__main__":
    main()
