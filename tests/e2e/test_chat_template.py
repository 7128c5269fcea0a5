"""--chat with a model's own Jinja chat template (coordinator/chat/jinja.c).

SmolLM2's GGUF carries tokenizer.chat_template. For a set of conversations
the CLI's rendered prompt (--show-prompt) must be byte-identical to
transformers' render of the same template (render_jinja_template, what
apply_chat_template(..., tokenize=False, add_generation_prompt=True) runs),
and its ids must equal the tokenize mode's ids of that text with special
tokens parsed. --chat-template-kwargs reaches the template; a bad value
exits 2. (All 16 published templates x 17 conversations are compared in
tests/unit/test_jinja.c.)
"""
from __future__ import annotations

import json

import pytest

from conftest import EXIT_USAGE, THREADS, run_cli, run_json

CONVS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye  \n"}],
    [{"role": "user", "content": "Grüße 世界 🎉 {{ x }} {% if %}"}],
]


def gguf_template(path):
    from gguf import GGUFReader

    field = GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def hf_render(template, messages, **kw):
    from transformers.utils.chat_template_utils import render_jinja_template

    (text,), _ = render_jinja_template(conversations=[messages], chat_template=template,
                                       add_generation_prompt=True, bos_token="<|im_start|>",
                                       eos_token="<|im_end|>", **kw)
    return text


def tokenize(smollm2, text):
    cp = run_cli(["tokenize", "--tokenizer", smollm2, "--no-bos", "--parse-special"], input_bytes=text.encode())
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)["ids"]


@pytest.mark.parametrize("conv", range(len(CONVS)))
def test_prompt_equals_transformers(conv, smollm2, ie_bin):
    msgs = CONVS[conv]
    out = run_json(["--model", smollm2, "--chat", json.dumps(msgs), "--threads", THREADS, "--max-new", "0",
                    "--show-prompt"])
    assert out["chat_format"] == "template"
    want = hf_render(gguf_template(smollm2), msgs)
    assert out["prompt"] == want
    assert out["prompt_ids"] == tokenize(smollm2, want)


def test_template_kwargs(smollm2, ie_bin):
    # SmolLM2's template ignores unknown variables: same prompt with or without
    msgs = CONVS[0]
    base = ["--model", smollm2, "--chat", json.dumps(msgs), "--threads", THREADS, "--max-new", "0", "--show-prompt"]
    a = run_json(base)
    b = run_json(base + ["--chat-template-kwargs", '{"enable_thinking": false}'])
    assert a["prompt"] == b["prompt"]
    cp = run_cli(base + ["--chat-template-kwargs", "[1]"])
    assert cp.returncode == EXIT_USAGE and "template arguments" in cp.stderr, cp.stderr
