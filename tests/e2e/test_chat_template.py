"""--chat with a model's own Jinja chat template (coordinator/chat/jinja.c).

SmolLM2's GGUF carries tokenizer.chat_template. For a set of conversations
the CLI's rendered prompt (--show-prompt) must be byte-identical to
transformers' render of the same template (render_jinja_template, what
apply_chat_template(..., tokenize=False, add_generation_prompt=True) runs),
and its ids must equal the tokenize mode's ids of that text with special
tokens parsed. --chat-template-kwargs reaches the template; a bad value
exits 2. A Hugging Face folder's template (tokenizer_config.json or
chat_template.jinja, on the tiny Llama) is used the same way, with the
tokenizer's <s> / </s> as bos_token / eos_token tokens while a message's
"</s>" stays text; a template that does not compile fails --chat (exit 2,
naming its line) but not plain prompts. (All 16 published templates x 17
conversations are compared in tests/unit/test_jinja.c.)
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


def hf_render(template, messages, bos="<|im_start|>", eos="<|im_end|>", **kw):
    """transformers' render; bos / eos default to SmolLM2's tokens."""
    from transformers.utils.chat_template_utils import render_jinja_template

    (text,), _ = render_jinja_template(conversations=[messages], chat_template=template,
                                       add_generation_prompt=True, bos_token=bos, eos_token=eos, **kw)
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
    cp = run_cli(["--model", smollm2, "--prompt", "hi", "--chat-template-kwargs", "{}"])
    assert cp.returncode == EXIT_USAGE and "--chat" in cp.stderr, cp.stderr


def hf_dir_with(tmp_path, **files):
    """A copy of the tiny Llama HF folder plus the given files (name -> text;
    'tokenizer_config.json' is merged into the original)."""
    import shutil

    from conftest import fixture_path

    d = tmp_path / "model"
    shutil.copytree(fixture_path("tiny_llama"), d)
    for name, text in files.items():
        if name == "tokenizer_config.json":
            cfg = json.loads((d / name).read_text())
            cfg.update(json.loads(text))
            text = json.dumps(cfg)
        (d / name).write_text(text)
    return d


TINY_TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] | trim }}{{ eos_token }}"
                 "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")


@pytest.mark.parametrize("where", ["tokenizer_config.json", "chat_template.jinja"])
def test_hf_folder_template(where, tmp_path, ie_bin):
    files = ({"tokenizer_config.json": json.dumps({"chat_template": TINY_TEMPLATE})} if where == "tokenizer_config.json"
             else {"chat_template.jinja": TINY_TEMPLATE})
    d = hf_dir_with(tmp_path, **files)
    msgs = [{"role": "user", "content": " hi </s> there "}]
    out = run_json(["--model", str(d), "--chat", json.dumps(msgs), "--threads", THREADS, "--max-new", "0",
                    "--show-prompt"])
    assert out["chat_format"] == "template"
    assert out["prompt"] == hf_render(TINY_TEMPLATE, msgs, bos="<s>", eos="</s>")
    assert out["prompt"] == "<s>[user] hi </s> there</s>[assistant]"
    ids = out["prompt_ids"]
    cp = run_cli(["tokenize", "--tokenizer", str(d / "tokenizer.json"), "--no-bos", "--parse-special"],
                 input_bytes=b"<s></s>")
    bos, eos = json.loads(cp.stdout)["ids"]
    assert ids[0] == bos and ids.count(eos) == 1, ids  # the content's "</s>" stays text


def test_broken_template_fails_chat_only(tmp_path, ie_bin):
    d = hf_dir_with(tmp_path, **{"chat_template.jinja": "{% for m in messages %}{{ m | nosuchfilter }}{% endfor %}"})
    cp = run_cli(["--model", str(d), "--chat", json.dumps(CONVS[0]), "--threads", THREADS, "--max-new", "1"])
    assert cp.returncode == EXIT_USAGE, cp.stderr
    assert "chat template line 1" in cp.stderr and "nosuchfilter" in cp.stderr, cp.stderr
    out = run_json(["--model", str(d), "--prompt", "hello", "--threads", THREADS, "--max-new", "2", "--greedy"])
    assert out["tokens_in"] > 0
