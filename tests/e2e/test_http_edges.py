"""End-to-end tests of the HTTP API's edges (issue 21, items 12 and 15):

  * requests that outgrow our limits on the URI (8 KiB) and the headers
    (16 KiB) are answered by us in OpenAI's JSON error shape (414, 431),
    not by libmicrohttpd's HTML pages, up to its raised connection memory
    (256 KiB); the first request head of a connection is checked before
    libmicrohttpd sees it, so a malformed request line or header line, an
    unsupported HTTP version or a head beyond 32 KiB get JSON too (400, 505,
    414, 431) instead of libmicrohttpd's HTML pages;
  * the request-read deadline runs from the accept, through the head check;
  * POST /tokenize and /detokenize in llama-server's and vLLM's shapes,
    round trips, bad ids (400), the API key.

Raw sockets for the oversized requests (an HTTP client would refuse to send
them or hide the status). Environment as in conftest.py.
"""
from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from conftest import IE_BIN, SMOLLM2, need_file
from test_serving import Serve, error_shape, httpx


@pytest.fixture(scope="module")
def model() -> Path:
    need_file(IE_BIN, "inference-engine binary (set IE_BIN or build it)")
    return need_file(SMOLLM2, "SmolLM2 GGUF (run scripts/setup.sh)")


@pytest.fixture(scope="module")
def srv(model, tmp_path_factory):
    s = Serve(model, tmp_path_factory.mktemp("edges"), ["--batch", 2], threads=1)
    yield s
    s.p.terminate(5.0)


@pytest.fixture(scope="module")
def keyed(model, tmp_path_factory):
    s = Serve(model, tmp_path_factory.mktemp("edges_key"), ["--batch", 1], threads=1, api_key="k3y")
    yield s
    s.p.terminate(5.0)


def raw(port: int, data: bytes, timeout: float = 20.0) -> tuple:
    """Send data, read one answer: (status, headers text, body bytes)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            out += b
            head, sep, body = out.partition(b"\r\n\r\n")
            m = re.search(rb"content-length:\s*(\d+)", head, re.I)
            if sep and m and len(body) >= int(m.group(1)):
                break
    finally:
        s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    assert m, f"no HTTP status line in {out[:300]!r}"
    return int(m.group(1)), head.decode("latin-1"), body


def json_error(status: int, head: str, body: bytes, want: int, code: str) -> dict:
    assert status == want, (status, head, body[:300])
    assert re.search(r"content-type:\s*application/json", head, re.I), (head, body[:300])
    e = error_shape(json.loads(body))
    assert e["code"] == code and e["type"] == "invalid_request_error", e
    return e


# ------------------------------------------------------------ oversized requests in JSON
@pytest.mark.parametrize("size", [20_000, 120_000])
def test_oversized_headers_answer_json_431(srv, size):
    req = (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n")
    st, head, body = raw(int(srv.port), req)
    e = json_error(st, head, body, 431, "headers_too_large")
    assert "16384" in e["message"], e


def test_many_headers_answer_json_431(srv):
    req = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 60)
                                                             for i in range(400)) + b"\r\n"
    st, head, body = raw(int(srv.port), req)
    json_error(st, head, body, 431, "headers_too_large")


@pytest.mark.parametrize("target", [b"/v1/models?q=" + b"a" * 10_000, b"/" + b"a" * 20_000])
def test_oversized_uri_answers_json_414(srv, target):
    st, head, body = raw(int(srv.port), b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    e = json_error(st, head, body, 414, "uri_too_long")
    assert "8192" in e["message"], e


def test_oversized_post_to_generation_answers_json(srv):
    body = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Cookie: " + b"c" * 30_000 + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    st, head, b = raw(int(srv.port), req)
    json_error(st, head, b, 431, "headers_too_large")


def test_limits_leave_normal_requests_alone(srv):
    """Just under the limits: answered normally (the limits are not off by
    a factor), on a connection that then serves another request."""
    req = (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 15_000 + b"\r\n\r\n")
    st, head, body = raw(int(srv.port), req)
    assert st == 200 and json.loads(body)["object"] == "list", (st, body[:300])
    st, head, body = raw(int(srv.port), b"GET /v1/models?q=" + b"a" * 8000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert st == 200, (st, body[:300])
    # both near their limits at once: a first head of about 24 KiB is not refused before libmicrohttpd
    st, head, body = raw(int(srv.port), b"GET /v1/models?q=" + b"a" * 8150 + b" HTTP/1.1\r\nHost: x\r\nX-Big: "
                         + b"b" * 16300 + b"\r\n\r\n")
    assert st == 200, (st, body[:300])


@pytest.mark.parametrize("line", [b"BREW /v1/models HTTP/1.1", b"GET  /v1/models  HTTP/1.1",
                                  b"GET /nowhere HTTP/1.1"])
def test_odd_request_lines_answer_json(srv, line):
    """Request lines libmicrohttpd passes on (unknown method, extra spaces,
    unknown path) are ours: JSON 404/405."""
    st, head, body = raw(int(srv.port), line + b"\r\nHost: x\r\n\r\n")
    assert st in (404, 405), (st, body[:300])
    error_shape(json.loads(body))


@pytest.mark.parametrize("req,want,code", [
    (b"GET /v1/models\r\nHost: x\r\n\r\n", 400, "malformed_request"),            # no HTTP version
    (b"GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
    (b"GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
    (b"GARBAGE\r\n\r\n", 400, "malformed_request"),                                 # no space at all
    (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n", 400, "malformed_request"),
    (b"GET /v1/models HTTP/1.1\r\n\r\n", 400, "malformed_request"),                 # HTTP/1.1 without Host
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n", 400, "malformed_request"),
    (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 300_000 + b"\r\n\r\n", 431, "headers_too_large"),
    (b"GET /" + b"a" * 300_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long"),
])
def test_malformed_request_heads_answer_json(srv, req, want, code):
    """What libmicrohttpd would answer with its HTML pages (or close without
    an answer) is checked before it sees the connection: OpenAI's JSON
    shape, the right status, Content-Length, Connection: close."""
    st, head, body = raw(int(srv.port), req)
    e = json_error(st, head, body, want, code)
    assert e["message"] and e["param"] is None, e
    assert re.search(r"connection:\s*close", head, re.I), head
    assert int(re.search(r"content-length:\s*(\d+)", head, re.I).group(1)) == len(body), (head, body)


def test_first_head_split_across_packets(srv):
    """A head that arrives in pieces is put together (peeked, not consumed)
    and then served by libmicrohttpd, body and all, keep-alive too."""
    import time
    s = socket.create_connection(("127.0.0.1", int(srv.port)), timeout=20)
    try:
        for part in (b"GE", b"T /v1/mod", b"els HTTP/1.1\r\nHo", b"st: x\r\n", b"\r\n"):
            s.sendall(part)
            time.sleep(0.05)
        out = b""
        while b"\r\n\r\n" not in out or len(out.partition(b"\r\n\r\n")[2]) < int(
                re.search(rb"content-length:\s*(\d+)", out, re.I).group(1)):
            out += s.recv(65536)
        assert out.startswith(b"HTTP/1.1 200"), out[:200]
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")   # the second request: libmicrohttpd's
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        s.close()


# ------------------------------------------------------------ /tokenize, /detokenize
def post(s, path: str, body, key: str | None = None):
    h = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(s.base + path, json=body, headers=h, timeout=30)


def test_tokenize_llama_server_shape(srv):
    r = post(srv, "/tokenize", {"content": "Hello world, how are you?"})
    assert r.status_code == 200, r.text
    toks = r.json()["tokens"]
    assert set(r.json()) == {"tokens"} and len(toks) >= 5 and all(isinstance(t, int) for t in toks), r.text
    d = post(srv, "/detokenize", {"tokens": toks})
    assert d.status_code == 200 and d.json()["content"] == "Hello world, how are you?", d.text
    p = post(srv, "/tokenize", {"content": "Hello 媽 🤗", "with_pieces": True}).json()["tokens"]
    assert all(set(t) == {"id", "piece"} for t in p), p
    # pieces are strings when valid UTF-8, else their bytes; together they are the text
    raw_bytes = b"".join(t["piece"].encode() if isinstance(t["piece"], str) else bytes(t["piece"]) for t in p)
    assert raw_bytes.decode() == "Hello 媽 🤗", p
    assert any(isinstance(t["piece"], list) for t in p), "the emoji's byte tokens should not be valid UTF-8 alone"


def test_tokenize_special_tokens(srv):
    parsed = post(srv, "/tokenize", {"content": "<|im_start|>"}).json()["tokens"]
    assert len(parsed) == 1, parsed
    plain = post(srv, "/tokenize", {"content": "<|im_start|>", "parse_special": False}).json()["tokens"]
    assert len(plain) > 1, plain
    d = post(srv, "/detokenize", {"tokens": parsed})
    assert d.json()["content"] == "<|im_start|>", d.text


def test_tokenize_vllm_shape(srv):
    r = post(srv, "/tokenize", {"model": srv.model_name, "prompt": "Hello world"})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["count"] == len(j["tokens"]) and j["max_model_len"] > 0, j
    assert j["tokens"] == post(srv, "/tokenize", {"content": "Hello world"}).json()["tokens"]
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    c = post(srv, "/tokenize", {"messages": msgs, "return_token_strs": True}).json()
    text = "".join(c["token_strs"])
    assert "What is 2+2?" in text and "<|im_start|>user" in text and c["count"] == len(c["tokens"]), c
    d = post(srv, "/detokenize", {"model": srv.model_name, "tokens": c["tokens"]}).json()
    assert d["prompt"] == text, d
    # the same ids a chat completion is generated from (its usage counts them)
    u = post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1}).json()["usage"]
    assert u["prompt_tokens"] == c["count"], (u, c["count"])


@pytest.mark.parametrize("path,body,param", [
    ("/detokenize", {"tokens": [1, 10 ** 9]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [1.5]}, "tokens"),
    ("/detokenize", {"tokens": "12"}, "tokens"),
    ("/detokenize", {}, "tokens"),
    ("/tokenize", {"content": 5}, "content"),
    ("/tokenize", {"prompt": ["a"]}, "prompt"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
    ("/tokenize", {"messages": "hi"}, "messages"),
])
def test_tokenize_bad_input_400(srv, path, body, param):
    r = post(srv, path, body)
    assert r.status_code == 400, (r.status_code, r.text)
    assert error_shape(r.json())["param"] == param, r.text


def test_tokenize_refuses_bad_bodies(srv):
    r = httpx.post(srv.base + "/tokenize", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error_shape(r.json())
    r = httpx.post(srv.base + "/tokenize", content=b'{"content": "x"}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 415, r.text
    assert httpx.get(srv.base + "/tokenize").status_code == 405
    r = post(srv, "/tokenize", {"model": "other", "content": "x"})
    assert r.status_code == 404, r.text


def test_tokenize_needs_the_api_key(keyed):
    for path, body in (("/tokenize", {"content": "Hi"}), ("/detokenize", {"tokens": [1]})):
        r = post(keyed, path, body)
        assert r.status_code == 401, (path, r.status_code, r.text)
        error_shape(r.json())
        assert post(keyed, path, body, key="wrong").status_code == 401
        assert post(keyed, path, body, key="k3y").status_code == 200, path


def test_read_deadline_runs_from_the_accept(model, tmp_path):
    """The request-read deadline is not restarted when the connection goes
    from the head check to libmicrohttpd: a head dribbled over ~1.2 s and
    then a dribbled body are cut at the 2 s deadline from the connect."""
    import time
    s = Serve(model, tmp_path, ["--batch", 1, "--http-read-timeout-ms", 2000], threads=1)
    try:
        c = socket.create_connection(("127.0.0.1", int(s.port)), timeout=5)
        t0 = time.monotonic()
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n")
        for i in range(0, len(head), 10):
            c.sendall(head[i:i + 10])
            time.sleep(0.12)
        c.settimeout(0.2)
        while time.monotonic() - t0 < 10:
            try:
                c.sendall(b" ")
                if c.recv(100) == b"":
                    break
            except socket.timeout:
                continue
            except OSError:
                break
        took = time.monotonic() - t0
        c.close()
        assert 1.8 < took < 3.0, f"cut {took:.2f} s after the connect (deadline 2 s from it)"
    finally:
        s.p.terminate(5.0)
