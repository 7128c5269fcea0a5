"""Fill in the middle: OpenAI's `suffix` on /v1/completions (docs/HTTP.md).

SmolLM2 has no FIM tokens, so the model here is SmolLM2 with the GGUF keys
llama.cpp's converter writes for FIM models (tokenizer.ggml.fim_pre_token_id,
fim_suf_token_id, fim_mid_token_id) pointing at three of its control tokens
(<repo_name>, <reponame>, <file_sep>): what is checked is the framing, not
the model's skill. Checked: a completion with a suffix is, token for token,
the completion of the id prompt <pre> prompt <suf> suffix <mid> (the texts
tokenized as plain text, /tokenize with add_special false), usage counts
those ids, a batch of prompts shares the suffix, and the server without
FIM tokens (plain SmolLM2), a suffix with `echo`, with token-id prompts, on
chat, or not a string answer 400 naming `suffix`. The tokenizer's lookup by
spelling (DeepSeek-Coder, Refact vocabularies) is test_tokenizer's.
"""
from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from test_http_api import Server, assert_error_shape, raw

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from gguf_rewrite import copy_keys  # noqa: E402

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(2, 3))\n"
FIM_IDS = (3, 4, 5)  # <repo_name>, <reponame>, <file_sep> in SmolLM2's vocabulary


@pytest.fixture(scope="module")
def fim_model(smollm2, tmp_path_factory):
    dst = tmp_path_factory.mktemp("fim") / "smollm2-fim.gguf"
    r = gguf.GGUFReader(str(smollm2))
    w = gguf.GGUFWriter(str(dst), bytes(r.fields["general.architecture"].parts[-1]).decode())
    copy_keys(r, w)
    for k, v in zip(("pre", "suf", "mid"), FIM_IDS):
        w.add_uint32(f"tokenizer.ggml.fim_{k}_token_id", v)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=np.asarray(t.data).shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def server(fim_model, ie_bin):
    s = Server(fim_model, "--batch", 4, "--ctx", 512)
    yield s
    s.stop()


def plain_ids(server, text):
    r = raw(server, "POST", "/tokenize", json={"content": text, "add_special": False})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def complete(server, **body):
    r = raw(server, "POST", "/v1/completions",
            json={"model": server.model, "max_tokens": 12, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_suffix_is_the_framed_id_prompt(server):
    ids = [FIM_IDS[0], *plain_ids(server, PREFIX), FIM_IDS[1], *plain_ids(server, SUFFIX), FIM_IDS[2]]
    a = complete(server, prompt=PREFIX, suffix=SUFFIX)
    b = complete(server, prompt=ids)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"] == len(ids)
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"] > 0
    # without the suffix the model sees another prompt
    c = complete(server, prompt=PREFIX)
    assert c["usage"]["prompt_tokens"] == len(plain_ids(server, PREFIX))
    # an empty suffix is no suffix (OpenAI's default)
    d = complete(server, prompt=PREFIX, suffix="")
    assert d["choices"][0]["text"] == c["choices"][0]["text"]


def test_suffix_batch(server):
    prompts = [PREFIX, "def mul(a, b):\n    "]
    r = complete(server, prompt=prompts, suffix=SUFFIX)
    assert [ch["index"] for ch in r["choices"]] == [0, 1]
    for i, p in enumerate(prompts):
        one = complete(server, prompt=p, suffix=SUFFIX)
        assert r["choices"][i]["text"] == one["choices"][0]["text"], i


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX, "echo": True}),
    ("/v1/completions", {"prompt": [1, 2, 3], "suffix": SUFFIX}),
    ("/v1/completions", {"prompt": [PREFIX, [1, 2, 3]], "suffix": SUFFIX}),
    ("/v1/completions", {"prompt": PREFIX, "suffix": 5}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "suffix": SUFFIX}),
])
def test_bad_suffix(server, path, body):
    r = raw(server, "POST", path, json={"model": server.model, "max_tokens": 2, **body})
    assert_error_shape(r, 400, param="suffix")


def test_no_fim_tokens(smollm2, ie_bin):
    s = Server(smollm2, "--ctx", 256)
    try:
        r = raw(s, "POST", "/v1/completions", json={"model": s.model, "prompt": PREFIX, "suffix": SUFFIX,
                                                     "max_tokens": 2})
        assert_error_shape(r, 400, param="suffix")
        assert "fill-in-the-middle" in r.json()["error"]["message"]
    finally:
        s.stop()
