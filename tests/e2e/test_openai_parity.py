"""OpenAI parity of the HTTP API (docs/HTTP.md): `n` choices and
log-probabilities, through the official `openai` client against
`inference-engine serve` on SmolLM2.

Checked: a greedy token's logprob is the largest of its top_logprobs and
equals the log-softmax of the engine's own logits (`inference-engine
logits`, the same prompt) within 1e-4, for the top alternatives too; the
top_logprobs' probabilities sum to <= 1; completions' legacy logprobs shape
(tokens, token_logprobs, top_logprobs dicts, text_offset) agrees with the
text; n=3 sampled with a seed gives 3 choices (index 0..2), the same on a
second call, not all equal, usage.completion_tokens their sum, and the
shared prompt computed once (prefix-cache hits in /metrics); n=2 streams
with each chunk's choice index, logprobs in the chunks, equal to the
non-streamed answer; logit_bias bans and forces tokens (logprobs stay
raw); ignore_eos / min_tokens (vLLM's) run past the model's end; bad n /
logprobs / top_logprobs / logit_bias / min_tokens answer 400 in OpenAI's
error shape.
"""
from __future__ import annotations

import json
import math
import subprocess
import time

import numpy as np
import openai
import pytest

from conftest import IE_BIN, engine_logits
from test_http_api import KEY, Server, assert_error_shape, httpx, metric_value, raw

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def server(smollm2, ie_bin):
    s = Server(smollm2, "--batch", 4, "--ctx", 1024, "--queue", 64)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    m = row.max()
    return row - (m + np.log(np.exp(row - m).sum()))


def tokenize(model, text: str) -> list[int]:
    """The ids the server gives a completions prompt string (BOS rules and
    all), from `inference-engine tokenize` on the same GGUF."""
    r = subprocess.run([str(IE_BIN), "tokenize", "--tokenizer", str(model)], input=text.encode(),
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [int(i) for i in json.loads(r.stdout)["ids"]]


# ------------------------------------------------------------ logprobs
def test_completion_logprobs_match_engine_logits(server, client, smollm2, tmp_path):
    """Every greedy token: its logprob and the top 5 against the log-softmax
    of the engine's own logits at that position (`inference-engine logits`
    over prompt + generated tokens)."""
    ids = tokenize(smollm2, PROMPT)
    r = client.completions.create(model=server.model, prompt=ids, max_tokens=6, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    assert lp is not None
    n = len(lp.tokens)
    assert n >= 2 and len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    gen = tokenize(smollm2, PROMPT + r.choices[0].text)[len(ids):]
    rows = engine_logits(smollm2, ids + gen, tmp_path)
    for i in range(min(n, len(gen))):
        ref = log_softmax(rows[len(ids) - 1 + i])
        top = lp.top_logprobs[i]
        assert 5 <= len(top) <= 6, top                    # 5 alternatives (+ the sampled token)
        assert lp.token_logprobs[i] == pytest.approx(max(top.values()), abs=1e-6)   # greedy: the max
        assert abs(lp.token_logprobs[i] - ref.max()) < 1e-4, (i, lp.token_logprobs[i], ref.max())
        got = sorted(top.values(), reverse=True)[:5]
        assert np.allclose(got, np.sort(ref)[::-1][:5], atol=1e-4), (i, got)
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-6


def test_logprobs_are_raw_under_penalties(server, client, smollm2, tmp_path):
    """Log-probabilities are the model's, before the sampler's penalties
    (which the sampler writes into the row): with a heavy frequency
    penalty on a prompt full of " Paris", the reported top 5 are still the
    raw log-softmax's, " Paris" first."""
    text = "The capital of France is Paris. Paris is big. The capital of France is"
    ids = tokenize(smollm2, text)
    r = client.completions.create(model=server.model, prompt=ids, max_tokens=1, temperature=0, logprobs=5,
                                  frequency_penalty=2.0, presence_penalty=2.0)
    lp = r.choices[0].logprobs
    ref = log_softmax(engine_logits(smollm2, ids, tmp_path)[-1])
    top = sorted(lp.top_logprobs[0].items(), key=lambda kv: -kv[1])
    assert top[0][0] == " Paris", top
    assert np.allclose([v for _, v in top[:5]], np.sort(ref)[::-1][:5], atol=1e-4), top
    assert np.min(np.abs(ref - lp.token_logprobs[0])) < 1e-4    # the sampled token's raw value
    assert lp.tokens[0] != " Paris"                              # the penalty did act on sampling


def test_chat_logprobs_shape(server, client):
    r = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=10, temperature=0,
                                       logprobs=True, top_logprobs=3)
    ch = r.choices[0]
    content = ch.logprobs.content
    assert len(content) >= 3
    # every generated token but the end of turn, in order: the bytes add up to the text
    assert b"".join(bytes(e.bytes) for e in content).decode() == ch.message.content
    if ch.finish_reason == "length":
        assert len(content) == r.usage.completion_tokens
    for e in content:
        assert isinstance(e.token, str) and isinstance(e.logprob, float) and e.logprob <= 0
        if "\ufffd" not in e.token:
            assert bytes(e.bytes) == e.token.encode()
        alts = e.top_logprobs
        assert len(alts) == 3
        assert [a.logprob for a in alts] == sorted((a.logprob for a in alts), reverse=True)
        assert alts[0].token == e.token and alts[0].logprob == pytest.approx(e.logprob, abs=1e-6)
        assert sum(math.exp(a.logprob) for a in alts) <= 1 + 1e-6
    # top_logprobs 0: the sampled token's logprob, no alternatives
    r0 = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=4, temperature=0,
                                        logprobs=True, top_logprobs=0)
    c0 = r0.choices[0].logprobs.content
    assert [e.token for e in c0] == [e.token for e in content[:len(c0)]]
    assert all(e.top_logprobs == [] for e in c0)
    # no logprobs asked: null
    assert client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=2,
                                          temperature=0).choices[0].logprobs is None


def test_completion_logprobs_text_offset(server, client):
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=2)
    ch = r.choices[0]
    lp, text = ch.logprobs, ch.text
    assert "".join(lp.tokens) == text
    assert lp.text_offset[0] == 0
    bounds = lp.text_offset + [len(text)]
    for i, tok in enumerate(lp.tokens):
        assert text[bounds[i]:bounds[i + 1]] == tok, (i, tok, bounds)
        d = lp.top_logprobs[i]
        assert tok in d and 2 <= len(d) <= 3, d
        assert d[tok] == pytest.approx(lp.token_logprobs[i], abs=1e-6)
        assert lp.token_logprobs[i] == pytest.approx(max(d.values()), abs=1e-6)   # greedy


# ------------------------------------------------------------------- n > 1
STORY = ("Once upon a time, in a small village by the sea, there lived an old fisherman who every morning "
         "walked down to the harbour with his nets, and one day he found")


def test_n_seeded_choices(server, client, smollm2):
    metrics0 = raw(server, "GET", "/metrics").text
    kw = dict(model=server.model, prompt=STORY, max_tokens=12, temperature=1.0, seed=1234, n=3, logprobs=0)
    a = client.completions.create(**kw)
    metrics1 = raw(server, "GET", "/metrics").text
    assert [c.index for c in a.choices] == [0, 1, 2]
    texts = [c.text for c in a.choices]
    assert len(set(texts)) > 1, texts                       # independent samples
    # usage sums the choices (an end of turn is a token without logprobs)
    n_tok = sum(len(c.logprobs.tokens) + (c.finish_reason == "stop") for c in a.choices)
    assert a.usage.completion_tokens == n_tok
    assert a.usage.prompt_tokens == len(tokenize(smollm2, STORY))
    b = client.completions.create(**kw)
    assert [c.text for c in b.choices] == texts             # a seed reproduces every choice
    # choice i is the request with seed + i
    one = client.completions.create(**{**kw, "n": 1, "seed": 1236})
    assert one.choices[0].text == texts[2]
    # the shared prompt was computed once: choices 1 and 2 took its full
    # KV blocks (16 positions) from the prefix cache
    p = a.usage.prompt_tokens
    hits = (metric_value(metrics1, "ie_prefix_cache_hit_tokens_total")
            - metric_value(metrics0, "ie_prefix_cache_hit_tokens_total"))
    assert hits >= 2 * ((p - 1) // 16) * 16, (hits, p)


def test_n_chat_stream(server, client):
    kw = dict(model=server.model, messages=CHAT, max_tokens=10, temperature=0.9, seed=7, n=2, logprobs=True,
              top_logprobs=2)
    full = client.chat.completions.create(**kw)
    assert [c.index for c in full.choices] == [0, 1]
    text = {0: "", 1: ""}
    toks: dict[int, list] = {0: [], 1: []}
    finish = {}
    usage = None
    roles = set()
    for chunk in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        if not chunk.choices:
            continue
        assert len(chunk.choices) == 1
        c = chunk.choices[0]
        assert c.index in (0, 1)
        if c.delta.role:
            roles.add(c.index)
        text[c.index] += c.delta.content or ""
        if c.logprobs:
            toks[c.index] += [e.token for e in c.logprobs.content]
        if c.finish_reason:
            assert c.index not in finish
            finish[c.index] = c.finish_reason
    assert roles == {0, 1} and set(finish) == {0, 1}
    for c in full.choices:
        assert text[c.index] == c.message.content
        assert toks[c.index] == [e.token for e in c.logprobs.content]
        assert finish[c.index] == c.finish_reason
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens


def test_n_stream_hangup_cancels_every_choice(server, client):
    """A client that hangs up on an n=3 stream has all three choices
    cancelled (the scheduler counts them), and the server keeps serving."""
    def cancelled():
        return metric_value(raw(server, "GET", "/metrics").text, "ie_requests_total", 'status="cancelled"')

    before = max(cancelled(), 0.0)
    body = {"prompt": STORY, "max_tokens": 900, "temperature": 1.0, "n": 3, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200
        seen = set()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen.add(json.loads(line[6:])["choices"][0]["index"])
                if len(seen) == 3:
                    break                  # every choice running, then hang up
    deadline = time.time() + 15
    while cancelled() < before + 3 and time.time() < deadline:
        time.sleep(0.1)
    assert cancelled() == before + 3
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=3, temperature=0)
    assert out.choices[0].text


# ------------------------------------------------------------ prompt batches
PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at"]


def test_prompt_batch_equals_single_requests(server, client, smollm2):
    """OpenAI's batch of prompts (strings and token-id lists mixed): one
    choice per prompt in order (index p * n + j), each the text of the same
    prompt sent alone; usage sums them; with n = 2 and a seed, choice
    (p, j) is prompt p alone with seed + j; echo and logprobs per prompt;
    streamed, the chunks of each index add up to its text."""
    batch = PROMPTS[:3] + [tokenize(smollm2, PROMPTS[3])]
    r = client.completions.create(model=server.model, prompt=batch, max_tokens=6, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    solo = [client.completions.create(model=server.model, prompt=p, max_tokens=6, temperature=0) for p in PROMPTS]
    assert [c.text for c in r.choices] == [x.choices[0].text for x in solo]
    assert r.usage.prompt_tokens == sum(x.usage.prompt_tokens for x in solo)
    assert r.usage.completion_tokens == sum(x.usage.completion_tokens for x in solo)
    r = client.completions.create(model=server.model, prompt=PROMPTS[:2], max_tokens=5, temperature=0.9, seed=11,
                                  n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for p in range(2):
        for j in range(2):
            one = client.completions.create(model=server.model, prompt=PROMPTS[p], max_tokens=5, temperature=0.9,
                                            seed=11 + j)
            assert r.choices[p * 2 + j].text == one.choices[0].text, (p, j)
    r = client.completions.create(model=server.model, prompt=PROMPTS[:2], max_tokens=0, echo=True, logprobs=1)
    for p in range(2):
        one = client.completions.create(model=server.model, prompt=PROMPTS[p], max_tokens=0, echo=True, logprobs=1)
        assert r.choices[p].text == PROMPTS[p]
        assert r.choices[p].logprobs.tokens == one.choices[0].logprobs.tokens
        assert r.choices[p].logprobs.token_logprobs[1:] == pytest.approx(one.choices[0].logprobs.token_logprobs[1:],
                                                                         abs=1e-6)
    texts = {}
    for ch in client.completions.create(model=server.model, prompt=PROMPTS, max_tokens=6, temperature=0,
                                        stream=True):
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert [texts[i] for i in range(4)] == [x.choices[0].text for x in solo]


def test_prompt_batch_larger_than_the_queue(smollm2, ie_bin):
    """A batch of more prompts than the server's slots and queue hold: the
    choices wait for each other rather than answering 429, and each is the
    text of its prompt alone."""
    srv = Server(smollm2, "--batch", 2, "--ctx", 256, "--queue", 2)
    try:
        cl = srv.client()
        prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(11)]
        r = cl.completions.create(model=srv.model, prompt=prompts, max_tokens=4, temperature=0)
        assert len(r.choices) == 11
        for i, p in enumerate(prompts):
            one = cl.completions.create(model=srv.model, prompt=p, max_tokens=4, temperature=0)
            assert r.choices[i].index == i and r.choices[i].text == one.choices[0].text, i
    finally:
        srv.stop()


def test_prompt_batch_with_a_failing_prompt(smollm2, ie_bin):
    """A batch whose second prompt cannot run (more KV blocks than the pool
    has): the request answers that prompt's error (not a hang on the
    choices never started), streamed or not, and the server goes on."""
    srv = Server(smollm2, "--batch", 2, "--ctx", 512, "--kv-block", 16, "--kv-blocks", 4)
    try:
        long = " ".join(["word"] * 120)
        for stream in (False, True):
            r = httpx.post(srv.url + "/v1/completions", timeout=60, headers={"Authorization": f"Bearer {KEY}"},
                           json={"prompt": [PROMPT, long], "n": 2, "max_tokens": 3, "temperature": 0.5,
                                 "stream": stream})
            if not stream:
                assert r.status_code == 400 and "KV blocks" in r.json()["error"]["message"], r.text
            else:  # before any token: the error's status; after one: an error event ends the stream
                assert ("KV blocks" in r.text) and (r.status_code == 400 or "data: [DONE]" in r.text), r.text
        ok = srv.client().completions.create(model=srv.model, prompt=PROMPT, max_tokens=2, temperature=0)
        assert ok.choices[0].text
    finally:
        srv.stop()


# --------------------------------------------------------------------- echo
def test_echo_prompt_logprobs_match_engine_logits(server, client, smollm2, tmp_path):
    """Completions' echo with logprobs and max_tokens 0 (how lm-evaluation-
    harness scores a continuation): the prompt's tokens, the first with a
    null logprob, every other's log p given the tokens before it equal to
    the log-softmax of the engine's own logits within 1e-4, the top
    alternatives too; the text is the prompt's."""
    text = "The capital of France is Paris, and the capital of Italy is Rome."
    ids = tokenize(smollm2, text)
    r = client.completions.create(model=server.model, prompt=ids, max_tokens=0, echo=True, logprobs=3)
    ch = r.choices[0]
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    assert ch.text == text and ch.finish_reason == "length"
    lp = ch.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids)
    assert "".join(lp.tokens) == text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    rows = engine_logits(smollm2, ids, tmp_path)
    for i in range(1, len(ids)):
        ref = log_softmax(rows[i - 1])
        assert abs(lp.token_logprobs[i] - ref[ids[i]]) < 1e-4, (i, lp.token_logprobs[i], ref[ids[i]])
        top = sorted(lp.top_logprobs[i].values(), reverse=True)[:3]
        assert np.allclose(top, np.sort(ref)[::-1][:3], atol=1e-4), (i, top)
    offs = lp.text_offset
    assert offs[0] == 0 and all(offs[i + 1] == offs[i] + len(lp.tokens[i]) for i in range(len(ids) - 1))


def test_echo_with_generation_and_stream(server, client, smollm2):
    """echo with tokens to generate: the text is the prompt (as sent) and the
    completion of the same request without echo; the logprobs list the
    prompt's tokens then the generated ones, whose offsets count from the
    prompt's text; a stream gives the same text and tokens (the prompt in
    the first chunk); every one of n choices echoes; chat refuses echo."""
    plain = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=1)
    r = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=1,
                                  echo=True)
    ch = r.choices[0]
    assert ch.text == PROMPT + plain.choices[0].text
    n_p = len(tokenize(smollm2, PROMPT))
    assert ch.logprobs.tokens[n_p:] == plain.choices[0].logprobs.tokens
    assert ch.logprobs.token_logprobs[n_p:] == pytest.approx(plain.choices[0].logprobs.token_logprobs, abs=1e-6)
    assert ch.logprobs.text_offset[n_p] == len(PROMPT)
    assert r.usage.completion_tokens == plain.usage.completion_tokens
    chunks = list(client.completions.create(model=server.model, prompt=PROMPT, max_tokens=5, temperature=0,
                                            logprobs=1, echo=True, stream=True))
    assert chunks[0].choices[0].text == PROMPT
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ch.text
    toks = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert toks == ch.logprobs.tokens
    # without logprobs the stream still opens with the prompt
    plain_stream = list(client.completions.create(model=server.model, prompt=PROMPT, max_tokens=3,
                                                  temperature=0, echo=True, stream=True))
    assert plain_stream[0].choices[0].text == PROMPT
    two = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=2, temperature=0.7, seed=5,
                                    n=2, echo=True, logprobs=0)
    assert len(two.choices) == 2
    for c in two.choices:
        assert c.text.startswith(PROMPT) and c.logprobs.token_logprobs[0] is None
        assert c.logprobs.token_logprobs[1:n_p] == pytest.approx(ch.logprobs.token_logprobs[1:n_p], abs=1e-6)
    r = raw(server, "POST", "/v1/chat/completions", json={"model": server.model, "messages": CHAT, "echo": True})
    assert_error_shape(r, 400, param="echo")
    r = raw(server, "POST", "/v1/completions", json={"model": server.model, "prompt": PROMPT, "max_tokens": 0})
    assert_error_shape(r, 400, param="max_tokens")


# ------------------------------------------- logit_bias, ignore_eos, min_tokens
def test_logit_bias_bans_and_forces(server, client, smollm2, tmp_path):
    """OpenAI's logit_bias: -100 on the greedy token makes the runner-up
    the answer (its reported logprob the raw second best: logprobs stay the
    model's); +100 on another token makes every token that one."""
    ids = tokenize(smollm2, PROMPT)
    ref = log_softmax(engine_logits(smollm2, ids, tmp_path)[-1])
    order = np.argsort(-ref)
    best, second = int(order[0]), int(order[1])
    assert ref[best] - ref[second] > 1e-3                          # no tie to blur the check
    r = client.completions.create(model=server.model, prompt=ids, max_tokens=1, temperature=0, logprobs=1,
                                  logit_bias={str(best): -100})
    assert abs(r.choices[0].logprobs.token_logprobs[0] - ref[second]) < 1e-4
    plain = client.completions.create(model=server.model, prompt=ids, max_tokens=1, temperature=0)
    assert plain.choices[0].text != r.choices[0].text
    force = tokenize(smollm2, " banana")[-1]
    word = client.completions.create(model=server.model, prompt=ids, max_tokens=1, temperature=0,
                                     logit_bias={str(force): 100}).choices[0].text
    f = client.completions.create(model=server.model, prompt=ids, max_tokens=4, temperature=0.8, seed=3,
                                  logit_bias={str(force): 100})
    assert f.choices[0].text == word * 4 and f.usage.completion_tokens == 4, (word, f.choices[0].text)
    # the chat endpoint takes it too (the official client's own parameter)
    c = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=3, temperature=0,
                                       logit_bias={str(force): 100})
    assert c.choices[0].message.content == word * 3


def test_ignore_eos_and_min_tokens(server, client):
    """vLLM's extensions: a chat answer that ends by itself before max_tokens
    runs to max_tokens with ignore_eos (finish "length"); with min_tokens it
    runs at least that far."""
    plain = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=120, temperature=0)
    n0 = plain.usage.completion_tokens
    assert plain.choices[0].finish_reason == "stop" and n0 < 100, (n0, plain.choices[0])   # ends by itself
    ign = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=n0 + 12, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert ign.usage.completion_tokens == n0 + 12 and ign.choices[0].finish_reason == "length"
    assert ign.choices[0].message.content.startswith(plain.choices[0].message.content)
    mt = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=n0 + 40, temperature=0,
                                        extra_body={"min_tokens": n0 + 5})
    assert mt.usage.completion_tokens >= n0 + 5, (n0, mt.usage)
    assert mt.choices[0].message.content.startswith(plain.choices[0].message.content)
    # completions, streamed: the chunks add up to max_tokens tokens
    ids_seen = 0
    for ch in client.completions.create(model=server.model, prompt=PROMPT, max_tokens=7, temperature=0,
                                        stream=True, extra_body={"ignore_eos": True, "min_tokens": 3}):
        if ch.choices and ch.choices[0].finish_reason:
            assert ch.choices[0].finish_reason == "length"
            ids_seen += 1
    assert ids_seen == 1


def test_stop_token_ids_include_stop_skip_special(server, client, smollm2):
    """vLLM's stop_token_ids end the answer at that token (its text left
    out, finish "stop"); include_stop_str_in_output keeps the stop string
    that ended it; skip_special_tokens false shows control tokens' text."""
    ids = tokenize(smollm2, PROMPT)
    plain = client.completions.create(model=server.model, prompt=ids, max_tokens=12, temperature=0)
    text = plain.choices[0].text
    gen = tokenize(smollm2, PROMPT + text)[len(ids):]
    k = next(k for k in range(1, len(gen)) if gen[k] not in gen[:k])
    cut = client.completions.create(model=server.model, prompt=ids, max_tokens=12, temperature=0,
                                    extra_body={"stop_token_ids": [gen[k]]})
    assert cut.choices[0].finish_reason == "stop" and cut.usage.completion_tokens == k + 1, cut
    assert text.startswith(cut.choices[0].text) and len(cut.choices[0].text) < len(text)
    # ignore_eos masks them too
    ign = client.completions.create(model=server.model, prompt=ids, max_tokens=12, temperature=0,
                                    extra_body={"stop_token_ids": [gen[k]], "ignore_eos": True})
    assert ign.usage.completion_tokens == 12 and ign.choices[0].finish_reason == "length"
    word = text.split()[1]
    inc = client.completions.create(model=server.model, prompt=ids, max_tokens=12, temperature=0, stop=[word],
                                    extra_body={"include_stop_str_in_output": True})
    exc = client.completions.create(model=server.model, prompt=ids, max_tokens=12, temperature=0, stop=[word])
    assert inc.choices[0].finish_reason == exc.choices[0].finish_reason == "stop"
    assert inc.choices[0].text == exc.choices[0].text + word and text.startswith(inc.choices[0].text)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=server.model, prompt=ids, max_tokens=12, temperature=0, stop=[word], stream=True,
        extra_body={"include_stop_str_in_output": True}) if c.choices)
    assert streamed == inc.choices[0].text
    out = subprocess.run([str(IE_BIN), "tokenize", "--tokenizer", str(smollm2), "--no-bos", "--parse-special"],
                         input=b"<|im_start|>", capture_output=True, timeout=120)
    (im_start,) = json.loads(out.stdout)["ids"]
    shown = client.completions.create(model=server.model, prompt=ids, max_tokens=2, temperature=0,
                                      logit_bias={str(im_start): 100}, extra_body={"skip_special_tokens": False})
    hidden = client.completions.create(model=server.model, prompt=ids, max_tokens=2, temperature=0,
                                       logit_bias={str(im_start): 100})
    assert shown.choices[0].text == "<|im_start|>" * 2 and hidden.choices[0].text == ""


# --------------------------------------------------------------- bad values
@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"n": 0}, "n"),
    ("/v1/chat/completions", {"n": 17}, "n"),
    ("/v1/completions", {"n": 17}, "n"),
    ("/v1/chat/completions", {"n": 1.5}, "n"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
    ("/v1/completions", {"logprobs": 6}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"logprobs": 1, "top_logprobs": 1}, "top_logprobs"),
    ("/v1/completions", {"logit_bias": [1, 2]}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"x": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"-1": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"49152": 1}}, "logit_bias"),      # SmolLM2: 49152 tokens
    ("/v1/chat/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"5": "1"}}, "logit_bias"),
    ("/v1/completions", {"ignore_eos": "yes"}, "ignore_eos"),
    ("/v1/completions", {"min_tokens": -1}, "min_tokens"),
    ("/v1/completions", {"min_tokens": 3}, "min_tokens"),                 # above max_tokens (2)
    ("/v1/completions", {"stop_token_ids": 5}, "stop_token_ids"),
    ("/v1/completions", {"stop_token_ids": [49152]}, "stop_token_ids"),
    ("/v1/completions", {"stop_token_ids": list(range(65))}, "stop_token_ids"),
    ("/v1/completions", {"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
    ("/v1/chat/completions", {"skip_special_tokens": "no"}, "skip_special_tokens"),
])
def test_bad_values(server, path, body, param):
    base = {"model": server.model, "max_tokens": 2}
    base.update({"messages": CHAT} if "chat" in path else {"prompt": PROMPT})
    r = raw(server, "POST", path, json={**base, **body})
    assert_error_shape(r, 400, param=param)


def test_bad_values_openai_client(server, client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=2, n=17)


# ------------------------------------------------------------------- ZeroMQ
def test_zmq_logprobs_equal_http(smollm2, ie_bin):
    """The ZeroMQ endpoint's "logprobs" (docs/PROTOCOL.md): token events
    and the done reply carry the same values as the HTTP answer."""
    import msgpack
    import zmq
    from conftest import free_port
    ep = f"tcp://127.0.0.1:{free_port()}"
    srv = Server(smollm2, "--batch", 2, "--ctx", 512, "--zmq-bind", ep)
    ctx = zmq.Context()
    try:
        ids = tokenize(smollm2, PROMPT)
        r = srv.client().completions.create(model=srv.model, prompt=ids, max_tokens=5, temperature=0, logprobs=3)
        want = r.choices[0].logprobs
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(ep)
        s.send(msgpack.packb({"v": 1, "type": "generate", "id": "z1", "prompt": PROMPT, "max_new": 5,
                              "temperature": 0.0, "stream": True, "logprobs": 3}))
        toks, done = [], None
        while done is None:
            assert s.poll(120000), "no ZeroMQ reply"
            m = msgpack.unpackb(s.recv(), raw=False)
            assert m["type"] in ("token", "done"), m
            if m["type"] == "token":
                toks.append(m)
            else:
                done = m
        assert len(toks) == 5 and len(done["logprobs"]) == 5
        for i, t in enumerate(toks):
            assert len(t["top_logprobs"]) == 3
            assert t["top_logprobs"][0][0] == t["token"]                       # greedy: the first
            assert t["logprob"] == pytest.approx(want.token_logprobs[i], abs=1e-6)
            assert done["logprobs"][i]["token"] == t["token"]
            assert done["logprobs"][i]["logprob"] == pytest.approx(t["logprob"], abs=1e-6)
            assert sorted(v for _, v in t["top_logprobs"]) == pytest.approx(
                sorted(want.top_logprobs[i].values())[-3:], abs=1e-6)
        # without "logprobs": no such keys
        s.send(msgpack.packb({"v": 1, "type": "generate", "id": "z2", "prompt": PROMPT, "max_new": 2,
                              "temperature": 0.0}))
        assert s.poll(120000)
        m = msgpack.unpackb(s.recv(), raw=False)
        assert m["type"] == "done" and "logprobs" not in m, m
        s.close()
    finally:
        ctx.term()
        srv.stop()


def test_zmq_logit_bias_ignore_eos(smollm2, ie_bin):
    """The ZeroMQ endpoint's "logit_bias" (a map of ids, integer or digit
    string keys), "ignore_eos", "min_new" and the OpenAI penalties
    (docs/PROTOCOL.md): the same answers as HTTP; bad values are error
    replies naming the key, and the server goes on."""
    from test_distributed import ie_client
    from conftest import free_port
    ep = f"tcp://127.0.0.1:{free_port()}"
    srv = Server(smollm2, "--batch", 2, "--ctx", 512, "--zmq-bind", ep)
    try:
        cl = srv.client()
        force = tokenize(smollm2, " banana")[-1]
        want = cl.completions.create(model=srv.model, prompt=PROMPT, max_tokens=3, temperature=0,
                                     logit_bias={str(force): 100}).choices[0].text
        for key in (force, str(force)):
            d = ie_client.generate(ep, prompt=PROMPT, max_new=3, temperature=0.0, logit_bias={key: 100.0},
                                   timeout_s=120)
            assert d["type"] == "done" and d["text"] == want, (key, d)
        h = cl.chat.completions.create(model=srv.model, messages=CHAT, max_tokens=120, temperature=0)
        n0 = h.usage.completion_tokens
        assert h.choices[0].finish_reason == "stop"
        d = ie_client.generate(ep, messages=CHAT, max_new=n0 + 9, temperature=0.0, ignore_eos=True,
                               timeout_s=120)
        assert d["n_gen"] == n0 + 9 and d["finish"] == "length", d
        d = ie_client.generate(ep, messages=CHAT, max_new=n0 + 30, temperature=0.0, min_new=n0 + 4,
                               timeout_s=120)
        assert d["n_gen"] >= n0 + 4, d
        hp = cl.completions.create(model=srv.model, prompt=PROMPT, max_tokens=12, temperature=0,
                                   frequency_penalty=1.5, presence_penalty=0.5).choices[0].text
        d = ie_client.generate(ep, prompt=PROMPT, max_new=12, temperature=0.0, repeat_penalty=1.0,
                               frequency_penalty=1.5, presence_penalty=0.5, timeout_s=120)
        assert d["text"] == hp, (d["text"], hp)
        # vLLM's stop_token_ids, include_stop_str_in_output, guided_choice as on HTTP
        ids = tokenize(smollm2, PROMPT)
        text = cl.completions.create(model=srv.model, prompt=ids, max_tokens=10, temperature=0).choices[0].text
        gen = tokenize(smollm2, PROMPT + text)[len(ids):]
        k = next(k for k in range(1, len(gen)) if gen[k] not in gen[:k])
        d = ie_client.generate(ep, prompt=PROMPT, max_new=10, temperature=0.0, stop_token_ids=[gen[k]],
                               timeout_s=120)
        assert d["n_gen"] == k + 1 and text.startswith(d["text"]) and len(d["text"]) < len(text), d
        word = text.split()[1]
        d = ie_client.generate(ep, prompt=PROMPT, max_new=10, temperature=0.0, stop=[word],
                               include_stop_str_in_output=True, timeout_s=120)
        assert d["text"].endswith(word) and text.startswith(d["text"]), d
        for seed in range(4):
            d = ie_client.generate(ep, prompt="The best city is", max_new=8, temperature=1.0, seed=seed,
                                   guided_choice=["Paris", "Rome"], timeout_s=120)
            assert d["text"] in ("Paris", "Rome") and d["finish"] == "eos", d
        for bad, word in ((dict(logit_bias={"x": 1.0}), "logit_bias"), (dict(logit_bias=[1]), "logit_bias"),
                          (dict(logit_bias={5: 101.0}), "logit_bias"), (dict(logit_bias={10**6: 1.0}), "logit_bias"),
                          (dict(ignore_eos=1), "ignore_eos"), (dict(min_new=9, max_new=4), "min_new"),
                          (dict(frequency_penalty=3.0), "frequency_penalty"),
                          (dict(stop_token_ids=[10**6]), "stop token id"), (dict(stop_token_ids=[-1]), "stop_token_ids"),
                          (dict(guided_choice=[]), "guided_choice"), (dict(guided_choice=["a", ""]), "guided_choice"),
                          (dict(guided_choice=["a"], json_schema=""), "choice"),
                          (dict(skip_special_tokens="no"), "skip_special_tokens")):
            with pytest.raises(ie_client.ClientError) as e:
                ie_client.generate(ep, prompt=PROMPT, timeout_s=60, **{"max_new": 4, **bad})
            assert word in e.value.message, (bad, e.value.message)
        assert ie_client.generate(ep, prompt=PROMPT, max_new=2, timeout_s=120)["type"] == "done"
    finally:
        srv.stop()


def test_cluster_greedy_logprobs_take_full_rows(smollm2, tmp_path):
    """A greedy request without penalties gets arg-max-only rows from a
    cluster's ranks (PROTOCOL.md, RESULT) unless it asks for logprobs:
    then the coordinator needs whole rows, and the cluster's logprobs equal
    the embedded engine's (pipeline: the same bits; tensor: within the ISA
    noise of its split reductions). Without full rows the sampled token
    would read log p = 0 and its alternatives -inf."""
    from test_distributed import Cluster, ie_client, serve_embedded
    logdir = tmp_path / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    req = dict(prompt=PROMPT, temperature=0.0, max_new=6, logprobs=3, timeout_s=120)
    serve, ep = serve_embedded(smollm2, logdir)
    try:
        ref = None
        deadline = time.monotonic() + 60
        while ref is None:
            try:
                ref = ie_client.generate(ep, **req)
            except ie_client.ClientTimeout:
                raise
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    assert ref["type"] == "done" and len(ref["logprobs"]) == 6, ref
    assert ref["logprobs"][0]["logprob"] < -0.25                        # far from a one-hot row's 0
    # tensor: Q8 activations quantized per slice move logits by up to ~0.1
    # (test_distributed.py's ISA-noise bound); a one-hot row would be off by
    # the whole log-probability (> 0.25 here) and its alternatives by inf
    for plan, tol in (("pipeline", 1e-5), ("tensor", 0.15)):
        (logdir / plan).mkdir()
        c = Cluster(smollm2, plan, 2, logdir / plan)
        try:
            c.start_worker(0)
            c.start_worker(1)
            assert c.generate(PROMPT, max_new=1)["type"] == "done"        # both ranks serve
            d = ie_client.generate(c.client_ep, **req)
            assert d["type"] == "done" and d["text"] == ref["text"], (plan, d)
            for a, b in zip(d["logprobs"], ref["logprobs"]):
                assert a["token"] == b["token"]
                assert abs(a["logprob"] - b["logprob"]) < tol, (plan, a, b)
                assert len(a["top_logprobs"]) == 3 and a["top_logprobs"][0][0] == a["token"], (plan, a)
                if plan == "pipeline":
                    assert [t for t, _ in a["top_logprobs"]] == [t for t, _ in b["top_logprobs"]], (a, b)
                for (_, x), (_, y) in zip(a["top_logprobs"], b["top_logprobs"]):
                    assert abs(x - y) < tol, (plan, a, b)
        finally:
            c.stop()


def test_cluster_echo_prompt_logprobs(server, client, smollm2, tmp_path):
    """Echo's prompt log-probabilities through a cluster's HTTP API (every
    prompt position a FULL logits row from the ranks): the embedded
    server's values, pipeline to the bit's noise, tensor within its split
    reductions' (test_cluster_greedy_logprobs_take_full_rows)."""
    from test_distributed import Cluster
    from conftest import free_port
    text = "The capital of France is Paris, and the capital of Italy is Rome."
    ids = tokenize(smollm2, text)
    ref = client.completions.create(model=server.model, prompt=ids, max_tokens=0, echo=True, logprobs=1)
    want = ref.choices[0].logprobs.token_logprobs
    for plan, tol in (("pipeline", 1e-5), ("tensor", 0.15)):
        (tmp_path / plan).mkdir()
        port = free_port()
        c = Cluster(smollm2, plan, 2, tmp_path / plan, coord_extra=["--http-port", str(port)])
        try:
            c.start_worker(0)
            c.start_worker(1)
            assert c.generate(PROMPT, max_new=1)["type"] == "done"        # both ranks serve
            r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                           json={"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 1})
            assert r.status_code == 200, r.text
            got = r.json()["choices"][0]["logprobs"]["token_logprobs"]
            assert got[0] is None and len(got) == len(want)
            assert max(abs(a - b) for a, b in zip(got[1:], want[1:])) < tol, (plan, got, want)
        finally:
            c.stop()


def test_spec_ngram_server(server, client, smollm2, ie_bin):
    """serve --spec-ngram 4: greedy answers as the server without drafts
    gives them (streamed too), drafts confirmed in /metrics; a sampled
    request is left alone."""
    text = ("Repeat the list exactly. List: apple, banana, cherry, date, elderberry, fig, grape. "
            "Again: apple, banana, cherry,")
    want = client.completions.create(model=server.model, prompt=text, max_tokens=40, temperature=0).choices[0].text
    srv = Server(smollm2, "--batch", 2, "--ctx", 512, "--spec-ngram", 4)
    try:
        cl = srv.client()
        got = cl.completions.create(model=srv.model, prompt=text, max_tokens=40, temperature=0).choices[0].text
        assert got == want, (got, want)
        streamed = "".join(c.choices[0].text for c in cl.completions.create(
            model=srv.model, prompt=text, max_tokens=40, temperature=0, stream=True) if c.choices)
        assert streamed == want
        m = raw(srv, "GET", "/metrics").text
        ok = metric_value(m, "ie_spec_accepted_tokens_total")
        drafted = metric_value(m, "ie_spec_draft_tokens_total")
        assert 0 < ok <= drafted, (ok, drafted)
        cl.completions.create(model=srv.model, prompt=text, max_tokens=20, temperature=0.8, seed=1)
        assert metric_value(raw(srv, "GET", "/metrics").text, "ie_spec_draft_tokens_total") == drafted
    finally:
        srv.stop()
