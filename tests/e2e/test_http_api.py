"""The OpenAI-compatible HTTP API (`inference-engine serve`, docs/HTTP.md).

The client is the official `openai` package (and httpx for what it cannot
send: bad JSON, wrong methods, huge bodies, an early hang-up). Servers run on
SmolLM2 (its GGUF chat template) and on the tiny random GPT-OSS model of
test_chat_harmony.py (harmony), each started with --port 0; the port comes
from the one stderr line "listening on http://HOST:PORT".

Checked: greedy completions and chat completions equal the CLI's --greedy
output for the same prompt / conversation (text and token counts), streamed
and not; the SSE chunks concatenate to the non-streamed text; seeded
sampling equals the CLI with the same seed and filters; stop strings; the
error statuses of ie_http.h in OpenAI's error shape (400 bad JSON / bad
parameter naming it, 401, 404 path / model, 405, 413, 429 busy); /v1/models,
/health, /metrics (promtool); a client that hangs up mid-stream has its
request cancelled while the server keeps serving; harmony chat returns the
final channel as content and the analysis channel as reasoning_content,
equal to the CLI's channels; SIGTERM ends the server with exit 0 (and, for
a sanitizer build, no sanitizer report — LSan runs at exit).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import openai
import pytest

try:                       # the openai package's own HTTP client (httpx, or its fork httpx2)
    import httpx
except ImportError:
    import httpx2 as httpx

from conftest import IE_BIN, REPO, THREADS, free_port, need_file, run_json
from test_chat_harmony import harmony_model  # noqa: F401  (the tiny GPT-OSS fixture)

KEY = "sk-test-8f2c1e"
PROMPT = "The capital of France is"
CHAT = [{"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three colors."}]


# ------------------------------------------------------------------ server
class Server:
    """`inference-engine serve` on a free port; stderr is kept in .log."""

    def __init__(self, model, *extra, api_key: str | None = KEY, timeout: float = 180):
        args = [str(IE_BIN), "serve", "--model", str(model), "--port", "0", "--threads", str(THREADS),
                *map(str, extra)]
        if api_key:
            args += ["--api-key", api_key]
        env = {k: v for k, v in os.environ.items() if k != "IE_API_KEY"}
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.log: list[str] = []
        self.model = os.path.basename(str(model))
        ready = threading.Event()
        self.port = None

        def drain():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace")
                self.log.append(line)
                m = re.match(r"listening on http://(\S+):(\d+)$", line.strip())
                if m and self.port is None:
                    self.port = int(m.group(2))
                    ready.set()
            ready.set()

        self.thread = threading.Thread(target=drain, daemon=True)
        self.thread.start()
        if not ready.wait(timeout) or self.port is None:
            self.proc.kill()
            pytest.fail(f"server did not start: {''.join(self.log)[-3000:]}", pytrace=False)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, api_key: str | None = KEY, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key or "none", max_retries=0,
                             timeout=kw.pop("timeout", 120), **kw)

    def stop(self):
        """SIGTERM; the server must exit 0 with no sanitizer report."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail("server did not stop within 60 s of SIGTERM", pytrace=False)
        self.thread.join(10)
        text = "".join(self.log)
        assert rc == 0, f"server exit {rc}: {text[-3000:]}"
        assert "Sanitizer" not in text and "runtime error:" not in text, text[-6000:]


@pytest.fixture(scope="module")
def server(smollm2, ie_bin):
    s = Server(smollm2, "--batch", 4, "--ctx", 1024, "--queue", 64)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def raw(server, method, path, *, key=KEY, **kw):
    headers = kw.pop("headers", {})
    if method == "POST":  # the server refuses other content types (415; test_cluster_security.py)
        headers.setdefault("Content-Type", "application/json")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.request(method, server.url + path, headers=headers, timeout=120, **kw)


def assert_error_shape(r: httpx.Response, status: int, code=None, param=None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}, body
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and e["message"], e
    assert isinstance(e["type"], str) and e["type"], e
    if code is not None:
        assert e["code"] == code, e
    if param is not None:
        assert e["param"] == param, e
    return e


def cli_greedy(model, *args):
    return run_json(["--model", model, "--threads", THREADS, "--greedy", *args], timeout=300)


def metric_value(text: str, name: str, labels: str = "") -> float:
    """Sum of the samples of `name` whose label set contains `labels`."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if m and m.group(1) == name and labels in (m.group(2) or ""):
            total += float(m.group(3))
            found = True
    return total if found else -1.0


# --------------------------------------------------------------- completions
def test_models_and_health(server, client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [server.model], ids
    assert client.models.retrieve(server.model).id == server.model
    r = raw(server, "GET", "/health", key=None)
    assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text
    assert_error_shape(raw(server, "GET", "/v1/models/nope"), 404, code="model_not_found")


def test_completion_greedy_equals_cli(server, client, smollm2):
    ref = cli_greedy(smollm2, "--prompt", PROMPT, "--max-new", 24)
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0)
    assert out.object == "text_completion" and out.id.startswith("cmpl-") and out.model == server.model
    assert len(out.choices) == 1
    ch = out.choices[0]
    assert ch.index == 0 and ch.text == ref["text"], (ch.text, ref["text"])
    assert ch.finish_reason == ("length" if ref["stop_reason"] in ("length", "context") else "stop")
    assert out.usage.prompt_tokens == ref["tokens_in"]
    assert out.usage.completion_tokens == len(ref["ids"])
    assert out.usage.total_tokens == ref["tokens_in"] + len(ref["ids"])
    # the model field is optional; a list of one string is one prompt
    r = raw(server, "POST", "/v1/completions", json={"prompt": [PROMPT], "max_tokens": 24, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == ref["text"]


def test_completion_prompt_as_ids(server, client, smollm2):
    a = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=8, temperature=0)
    cp = subprocess.run([str(IE_BIN), "tokenize", "--tokenizer", str(smollm2), "--parse-special"],
                        input=PROMPT.encode(), capture_output=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    ids = json.loads(cp.stdout)["ids"]
    b = client.completions.create(model=server.model, prompt=ids, max_tokens=8, temperature=0)
    assert b.choices[0].text == a.choices[0].text
    assert b.usage.prompt_tokens == len(ids) == a.usage.prompt_tokens


def test_completion_stream_concatenates(server, client):
    full = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0)
    chunks = list(client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len([t for t in texts if t]) >= 5, texts          # token by token, not one lump
    assert "".join(texts) == full.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason], finals
    assert all(c.id == chunks[0].id for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_stream_wire_format(server):
    """data: lines, the [DONE] sentinel, the event-stream type."""
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines), lines
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][6:])
    assert last["object"] == "text_completion" and last["choices"][0]["finish_reason"] == "length"


def test_stop_string_equals_cli(server, client, smollm2):
    ref = cli_greedy(smollm2, "--prompt", PROMPT, "--max-new", 32, "--stop", ".")
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=32, temperature=0, stop=["."])
    assert out.choices[0].text == ref["text"] and "." not in out.choices[0].text
    assert out.choices[0].finish_reason == "stop" and ref["stop_reason"] == "stop", ref
    s = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=32, temperature=0, stop=".",
                                  stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == ref["text"]


def test_seeded_sampling_equals_cli(server, client, smollm2):
    # OpenAI's defaults are top_k off, top_p 1, min_p 0; the CLI's are not
    ref = run_json(["--model", smollm2, "--threads", THREADS, "--prompt", PROMPT, "--max-new", 16,
                    "--temperature", "0.9", "--seed", "1234", "--top-k", "0", "--top-p", "1", "--min-p", "0"])
    a = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=16, temperature=0.9, seed=1234)
    b = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=16, temperature=0.9, seed=1234)
    assert a.choices[0].text == b.choices[0].text == ref["text"]
    c = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=16, temperature=0.9, seed=1234,
                                  extra_body={"top_k": 40, "min_p": 0.05})
    ref_c = run_json(["--model", smollm2, "--threads", THREADS, "--prompt", PROMPT, "--max-new", 16,
                      "--temperature", "0.9", "--seed", "1234", "--top-k", "40", "--top-p", "1", "--min-p", "0.05"])
    assert c.choices[0].text == ref_c["text"]


# ---------------------------------------------------------------------- chat
def test_chat_greedy_equals_cli(server, client, smollm2):
    ref = cli_greedy(smollm2, "--chat", json.dumps(CHAT), "--max-new", 24)
    out = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=24, temperature=0)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    msg = out.choices[0].message
    assert msg.role == "assistant" and msg.content == ref["text"], (msg.content, ref["text"])
    assert out.choices[0].finish_reason == ("length" if ref["stop_reason"] in ("length", "context") else "stop")
    assert out.usage.prompt_tokens == ref["tokens_in"]
    assert out.usage.completion_tokens == len(ref["ids"])
    # max_completion_tokens, and content as a list of text parts
    parts = [dict(m, content=[{"type": "text", "text": m["content"]}]) for m in CHAT]
    out2 = client.chat.completions.create(model=server.model, messages=parts, max_completion_tokens=24,
                                          temperature=0)
    assert out2.choices[0].message.content == ref["text"]


def test_chat_until_end_of_turn(server, client, smollm2):
    """No max_tokens: the answer ends where the model ends its turn."""
    ref = cli_greedy(smollm2, "--chat", json.dumps(CHAT), "--max-new", 512)
    out = client.chat.completions.create(model=server.model, messages=CHAT, temperature=0)
    assert out.choices[0].message.content == ref["text"]
    assert ref["stop_reason"] == "eos" and out.choices[0].finish_reason == "stop"


def test_chat_stream(server, client):
    full = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == full.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens


# -------------------------------------------------------------------- errors
def test_bad_json_400(server):
    e = assert_error_shape(raw(server, "POST", "/v1/completions", content=b'{"prompt": "x",'), 400,
                           code="invalid_json")
    assert e["type"] == "invalid_request_error"
    assert_error_shape(raw(server, "POST", "/v1/chat/completions", content=b"[1, 2]"), 400)


def test_random_malformed_requests(server):
    """A fuzz-style pass over the request parser on the live server: 300
    mutations (fixed seed) of valid completion and chat bodies — truncated,
    bytes flipped, fields replaced by values of every JSON type, wrong
    nesting, invalid UTF-8. Every answer is a 200 with a completion or a
    4xx in OpenAI's error shape (never a 5xx, a dropped connection or a
    hang), and the server still serves a normal request afterwards."""
    import random
    rng = random.Random(1234)
    bases = [("/v1/completions", {"model": server.model, "prompt": "Hello", "max_tokens": 2, "temperature": 0}),
             ("/v1/chat/completions", {"model": server.model, "messages": [{"role": "user", "content": "Hi"}],
                                       "max_tokens": 2, "temperature": 0})]
    odd = [None, True, False, 0, -1, 1e308, -1e308, 2 ** 63, 0.5, "", "x" * 300, "\u0000", [], [1, "a"], {},
           {"a": {"b": [None]}}, [[[]]], "<|im_end|>", {"5": 1}, {"5": -100, "x": 2}, {"1": 1e9},
           ["a", "b"], [["a"], "b"], [5, 7], {"choice": ["x"]}, {"json": {"type": "object"}}, {"type": "string"}]
    fields = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
              "min_p", "stop", "seed", "stream", "n", "priority", "stream_options", "frequency_penalty",
              "logprobs", "top_logprobs", "logit_bias", "ignore_eos", "min_tokens", "echo", "stop_token_ids",
              "include_stop_str_in_output", "skip_special_tokens", "guided_choice", "guided_json",
              "structured_outputs"]
    n_ok = n_4xx = 0
    for i in range(300):
        path, base = bases[i % 2]
        body = json.loads(json.dumps(base))
        kind = rng.randrange(4)
        if kind == 0:  # a field replaced by an odd value
            body[rng.choice(fields)] = rng.choice(odd)
            raw_body = json.dumps(body).encode()
        elif kind == 1:  # messages / content of the wrong shape
            body["messages"] = rng.choice(odd) if rng.random() < 0.5 else [{"role": rng.choice(odd),
                                                                           "content": rng.choice(odd)}]
            raw_body = json.dumps(body).encode()
        elif kind == 2:  # truncated
            full = json.dumps(body).encode()
            raw_body = full[:rng.randrange(len(full))]
        else:  # bytes flipped, invalid UTF-8 included
            b = bytearray(json.dumps(body).encode())
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            raw_body = bytes(b)
        r = raw(server, "POST", path, content=raw_body, headers={"Content-Type": "application/json"})
        if r.status_code == 200:
            n_ok += 1
            if r.headers.get("content-type", "").startswith("application/json"):
                assert "choices" in r.json(), r.text[:300]
        else:
            assert 400 <= r.status_code < 500, (r.status_code, raw_body[:200], r.text[:300])
            assert_error_shape(r, r.status_code)
            n_4xx += 1
    assert n_4xx > 100 and n_ok > 10, (n_ok, n_4xx)
    r = raw(server, "POST", "/v1/completions", json=bases[0][1])
    assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text[:300]


@pytest.mark.parametrize("param,value", [
    ("temperature", 2.5), ("temperature", "hot"), ("top_p", 0), ("top_p", 1.5), ("min_p", -0.1),
    ("max_tokens", 0), ("max_tokens", 1.5), ("frequency_penalty", 3), ("presence_penalty", -2.5),
    ("top_k", -2), ("n", 17), ("echo", "yes"), ("logprobs", 6), ("stop", 7), ("stream", "yes"),
    ("seed", 0.5), ("priority", "high"), ("repetition_penalty", 0),
])
def test_bad_param_400_names_it(client, server, param, value):
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=server.model, prompt="x", max_tokens=2, extra_body={param: value})
    err = ei.value.body
    assert err["param"] == param, err
    assert param in err["message"], err
    assert err["type"] == "invalid_request_error"


def test_bad_prompts_400(server, client):
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=server.model, prompt=["a"] * 257, max_tokens=2)
    assert ei.value.body["param"] == "prompt" and "at most 256 prompts" in ei.value.body["message"]
    for bad in (["a", 5], ["a", []], ["a", [1, "x"]]):
        with pytest.raises(openai.BadRequestError) as ei:
            client.completions.create(model=server.model, prompt=bad, max_tokens=2)
        assert ei.value.body["param"] == "prompt", bad
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=server.model, prompt=["a"] * 20, n=16, max_tokens=2)
    assert ei.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=server.model, prompt="hello " * 2000, max_tokens=2)
    assert ei.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=server.model, prompt=[10**9], max_tokens=2)
    assert ei.value.body["param"] == "prompt"
    for msgs in ([], [{"role": "user", "content": 7}], [{"role": "user"}], "hi"):
        with pytest.raises(openai.BadRequestError) as ei:
            client.chat.completions.create(model=server.model, messages=msgs, max_tokens=2)
        assert ei.value.body["param"] == "messages", ei.value.body
    assert_error_shape(raw(server, "POST", "/v1/completions", json={"max_tokens": 2}), 400, param="prompt")
    assert_error_shape(raw(server, "POST", "/v1/chat/completions", json={"max_tokens": 2}), 400, param="messages")


def test_chat_template_kwargs(server, client):
    """chat_template_kwargs (vLLM's name) reach the model's template; not an
    object -> 400 naming it."""
    r = raw(server, "POST", "/v1/chat/completions",
            json={"model": server.model, "messages": CHAT, "max_tokens": 1, "chat_template_kwargs": [1]})
    assert_error_shape(r, 400, param="chat_template_kwargs")
    ok = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=1,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_unknown_model_404(server, client):
    with pytest.raises(openai.NotFoundError) as ei:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert ei.value.body["code"] == "model_not_found" and ei.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=CHAT, max_tokens=2)


def test_api_key_401(server):
    for key in ("wrong", KEY + "x", KEY[:-1], "Bearer " + KEY):
        c = server.client(api_key=key)
        with pytest.raises(openai.AuthenticationError) as ei:
            c.completions.create(model=server.model, prompt="x", max_tokens=2)
        assert ei.value.body["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            c.models.list()
    e = assert_error_shape(raw(server, "GET", "/v1/models", key=None), 401, code="invalid_api_key")
    assert e["param"] is None
    assert_error_shape(raw(server, "POST", "/v1/completions", key=None, json={"prompt": "x"}), 401)
    assert_error_shape(raw(server, "GET", "/v1/models", key=None, headers={"Authorization": KEY}), 401)
    assert raw(server, "GET", "/v1/models", key="nope").headers.get("www-authenticate") == "Bearer"
    # health and metrics need no key
    assert raw(server, "GET", "/health", key=None).status_code == 200
    assert raw(server, "GET", "/metrics", key=None).status_code == 200


def test_wrong_method_405(server):
    r = raw(server, "GET", "/v1/completions")
    assert_error_shape(r, 405, code="method_not_allowed")
    assert r.headers["allow"] == "POST"
    r = raw(server, "POST", "/v1/models", json={})
    assert_error_shape(r, 405)
    assert r.headers["allow"] == "GET, HEAD"
    assert_error_shape(raw(server, "DELETE", "/health"), 405)


def test_unknown_path_404(server):
    assert_error_shape(raw(server, "GET", "/v1/nothing"), 404, code="not_found")
    assert_error_shape(raw(server, "POST", "/v2/completions", json={}), 404)


def test_huge_body_413(server):
    big = json.dumps({"prompt": "x" * (2 << 20), "max_tokens": 1}).encode()
    assert_error_shape(raw(server, "POST", "/v1/completions", content=big), 413, code="request_too_large")
    # declared far beyond the limit: refused before the body is sent
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n{")
        data = b""
        while b"\r\n\r\n" not in data:
            got = s.recv(65536)
            if not got:
                break
            data += got
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    # still serving
    assert raw(server, "GET", "/health").status_code == 200


# ------------------------------------------------------------------- metrics
def test_metrics(server, client):
    client.completions.create(model=server.model, prompt=PROMPT, max_tokens=2, temperature=0)
    raw(server, "GET", "/v1/nothing")
    r = raw(server, "GET", "/metrics", key=None)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert metric_value(text, "ie_http_requests_total", 'code="200"') >= 1, text
    assert metric_value(text, "ie_http_requests_total", 'code="404"') >= 1, text
    # the CLI's stage timers as histograms (docs/OPERATIONS.md, "Metrics")
    for stage in ("tokenize", "prefill", "decode", "sample", "detokenize"):
        assert metric_value(text, "ie_stage_seconds_count", f'stage="{stage}"') >= 1, (stage, text)
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install the prometheus package (scripts/setup.sh)"
    cp = subprocess.run([promtool, "check", "metrics"], input=r.content, capture_output=True, timeout=60)
    # promtool exits 0 when the text parses; lint warnings (none expected) go to stdout
    assert cp.returncode == 0, (cp.stdout, cp.stderr)


# ---------------------------------------------------------------- hang-ups
def test_client_disconnect_cancels(server, client):
    def gone():
        return metric_value(raw(server, "GET", "/metrics", key=None).text, "ie_http_client_disconnects_total")

    before = gone()
    body = {"prompt": "Once upon a time", "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break                      # one chunk, then hang up
    deadline = time.time() + 10
    while gone() < before + 1 and time.time() < deadline:
        time.sleep(0.1)
    assert gone() == before + 1
    # a non-streamed request whose client times out is cancelled too
    with pytest.raises(openai.APITimeoutError):
        server.client(timeout=1.0).completions.create(model=server.model, prompt="Once upon a time",
                                                      max_tokens=900, temperature=0)
    deadline = time.time() + 10
    while gone() < before + 2 and time.time() < deadline:
        time.sleep(0.1)
    assert gone() == before + 2
    # the server keeps serving, and the cancelled requests do not hold it up
    t0 = time.time()
    out = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4, temperature=0)
    assert out.choices[0].text and time.time() - t0 < 30
    text = raw(server, "GET", "/metrics", key=None).text
    cancelled = metric_value(text, "ie_requests_total", 'status="cancelled"')
    assert cancelled >= 2 or cancelled == -1.0, text     # the scheduler's own count, where it keeps one


# -------------------------------------------------------------- backpressure
def test_busy_429_and_timeout_504(smollm2, ie_bin):
    s = Server(smollm2, "--batch", 1, "--queue", 1, "--ctx", 2048, "--timeout-ms", 4000)
    try:
        c = s.client()
        results = []

        def one():
            try:
                c.completions.create(model=s.model, prompt="Once upon a time", max_tokens=1500, temperature=0)
                results.append("ok")
            except openai.RateLimitError as e:
                assert e.body["code"] == "busy", e.body
                results.append("busy")
            except openai.APIStatusError as e:
                results.append(e.status_code)

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(120)
        # one runs, one waits, the rest are refused at once; the long ones time out
        assert results.count("busy") >= 3, results
        assert 504 in results, results
        r = httpx.post(s.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                       json={"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0})
        assert_error_shape(r, 504, code="timeout")
    finally:
        s.stop()


# ------------------------------------------------------------------- harmony
def test_harmony_chat(harmony_model):  # noqa: F811
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    ref = run_json(["--model", harmony_model, "--chat", json.dumps(msgs), "--threads", THREADS, "--greedy",
                    "--max-new", 24])
    assert ref["chat_format"] == "harmony"
    s = Server(harmony_model, api_key=None)
    try:
        c = s.client()
        out = c.chat.completions.create(model=s.model, messages=msgs, max_tokens=24, temperature=0)
        msg = out.choices[0].message
        assert msg.content == ref["channels"]["final"] == ref["text"]
        assert msg.model_extra.get("reasoning_content") == ref["channels"]["analysis"]
        assert out.usage.prompt_tokens == ref["tokens_in"]
        assert out.usage.completion_tokens == len(ref["ids"])
        chunks = list(c.chat.completions.create(model=s.model, messages=msgs, max_tokens=24, temperature=0,
                                                stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == msg.content
        analysis = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                           for ch in chunks if ch.choices)
        assert analysis == ref["channels"]["analysis"]
        # reasoning_effort reaches the template
        ref_low = run_json(["--model", harmony_model, "--chat", json.dumps(msgs), "--threads", THREADS,
                            "--greedy", "--max-new", 8, "--reasoning", "low"])
        low = c.chat.completions.create(model=s.model, messages=msgs, max_tokens=8, temperature=0,
                                        reasoning_effort="low")
        assert low.usage.prompt_tokens == ref_low["tokens_in"]
        assert low.choices[0].message.content == ref_low["text"]
        assert low.usage.completion_tokens == len(ref_low["ids"])
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model=s.model, messages=msgs, max_tokens=1, extra_body={
                "reasoning_effort": "extreme"})
        assert ei.value.body["param"] == "reasoning_effort"
        # no API key configured: none needed
        assert httpx.get(s.url + "/v1/models", timeout=30).status_code == 200
    finally:
        s.stop()


# ------------------------------------------------------------ ie-coordinator
def test_coordinator_http(smollm2, ie_bin, tmp_path):
    """ie-coordinator --http-port: /health 503 until both pipeline workers
    are ready, then answers equal to the embedded engine's (pipeline stages
    compute what it does); SIGTERM exits 0."""
    build = os.environ.get("IE_BUILD_DIR")
    build = REPO / "build" if not build else __import__("pathlib").Path(build)
    coord_bin = need_file(build / "ie-coordinator", "ie-coordinator (set IE_BUILD_DIR or build it)")
    worker_bin = need_file(build / "ie-worker", "ie-worker (set IE_BUILD_DIR or build it)")
    wport, cport, hport = free_port(), free_port(), free_port()
    logs = [open(tmp_path / n, "wb") for n in ("coord.log", "w0.log", "w1.log")]
    coord = subprocess.Popen([str(coord_bin), "--model", str(smollm2), "--plan", "pipeline", "--workers", "2",
                              "--bind", f"tcp://127.0.0.1:{wport}", "--client-bind", f"tcp://127.0.0.1:{cport}",
                              "--http-port", str(hport), "--api-key", KEY], stderr=logs[0], stdout=logs[0])
    workers = []
    try:
        url = f"http://127.0.0.1:{hport}"
        deadline = time.time() + 60
        while True:
            try:
                r = httpx.get(url + "/health", timeout=5)
                break
            except httpx.TransportError:
                assert time.time() < deadline and coord.poll() is None, (tmp_path / "coord.log").read_text()
                time.sleep(0.1)
        assert r.status_code == 503 and r.json() == {"status": "unavailable"}, r.text
        workers = [subprocess.Popen([str(worker_bin), "--model", str(smollm2), "--coordinator",
                                     f"tcp://127.0.0.1:{wport}", "--threads", "1"], stderr=logs[i + 1],
                                    stdout=logs[i + 1]) for i in range(2)]
        while httpx.get(url + "/health", timeout=5).status_code != 200:
            assert time.time() < deadline + 60, (tmp_path / "coord.log").read_text()
            time.sleep(0.2)
        c = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        assert [m.id for m in c.models.list().data] == [smollm2.name]
        ref = cli_greedy(smollm2, "--prompt", PROMPT, "--max-new", 12)
        out = c.completions.create(model=smollm2.name, prompt=PROMPT, max_tokens=12, temperature=0)
        assert out.choices[0].text == ref["text"]
        streamed = "".join(ch.choices[0].text for ch in c.completions.create(
            model=smollm2.name, prompt=PROMPT, max_tokens=12, temperature=0, stream=True) if ch.choices)
        assert streamed == ref["text"]
        m = httpx.get(url + "/metrics", timeout=10)
        assert metric_value(m.text, "ie_http_requests_total", 'code="200"') >= 2, m.text
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(20)
            except subprocess.TimeoutExpired:
                w.kill()
        coord.send_signal(signal.SIGTERM)
        try:
            rc = coord.wait(30)
        except subprocess.TimeoutExpired:
            coord.kill()
            rc = "killed"
        for f in logs:
            f.close()
    assert rc == 0, (tmp_path / "coord.log").read_text()[-3000:]


# ---------------------------------------------------------------- the CLI
def test_serve_bad_flags_exit_2(smollm2, ie_bin):
    for args in (["--port", "70000"], ["--batch", "0"], ["--bogus"], [], ["--queue", "x"]):
        full = [str(IE_BIN), "serve"] + (["--model", str(smollm2)] if args else []) + args
        cp = subprocess.run(full, capture_output=True, timeout=60)
        assert cp.returncode == 2, (args, cp.returncode, cp.stderr)
        assert cp.stderr.decode().startswith("error: "), cp.stderr


def test_serve_port_taken_exits_1(smollm2, server):
    cp = subprocess.run([str(IE_BIN), "serve", "--model", str(smollm2), "--port", str(server.port),
                         "--threads", str(THREADS)], capture_output=True, timeout=120)
    assert cp.returncode == 1, cp
    assert b"cannot listen" in cp.stderr, cp.stderr
